"""A sample of chat importance labels to read by hand, to choose the likelihood margin.

Each chat label (`approxy train importance --chat`, training/data/importance-chat/) keeps, for
every position where the draft's token differs from the target's, the finished answer with the
draft's token and its mean negative log-likelihood per token under the target, over the whole
answer (`nll`) and from that position on (`suffix_nll`). This prints, per band of the rise
against the target's own answer, a few pairs (the target's answer and the one with the draft's
token, from the position where they part), so a reader can say in which band the differences
start to change what the answer says. Positions where an instruction's verdict flips are
important whatever the margin and are left out.

Usage (a python with `tokenizers`, e.g. `pip install tokenizers`):
  python training/scripts/chat_margin_sample.py training/data/importance-chat \
      --tokenizer $APPROXY_HOME/models/draft-onnx/tokenizer.json [--per-band 4] [--seed 1]
      [--measure suffix|whole]
"""
import argparse
import json
import pathlib
import random

from tokenizers import Tokenizer

BANDS = [(-9.0, 0.0), (0.0, 0.05), (0.05, 0.1), (0.1, 0.2), (0.2, 0.4), (0.4, 9.0)]

ap = argparse.ArgumentParser()
ap.add_argument("labels")
ap.add_argument("--tokenizer", required=True)
ap.add_argument("--per-band", type=int, default=4)
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--measure", choices=["suffix", "whole"], default="suffix")
args = ap.parse_args()

tok = Tokenizer.from_file(args.tokenizer)
END = "<|im_end|>"


def mean_nll(lps):
    return -sum(lps) / len(lps) if lps else 0.0


rows = []
for f in sorted(pathlib.Path(args.labels).glob("*.jsonl")):
    for line in f.read_text().splitlines():
        if not line.strip():
            continue
        a = json.loads(line)
        for d in a["disagreements"]:
            if d["instructions"] != a["instructions"]:
                continue
            if args.measure == "suffix":
                rise = d["suffix_nll"] - mean_nll(a["logprobs"][d["at"]:])
            else:
                rise = d["nll"] - mean_nll(a["logprobs"])
            rows.append((rise, f.name, a, d))

print(f"{len(rows)} positions without an instruction flip ({args.measure} measure)")
rng = random.Random(args.seed)
for lo, hi in BANDS:
    band = [r for r in rows if lo <= r[0] < hi]
    print(f"\n======== rise in [{lo}, {hi}): {len(band)} positions ========")
    for rise, shard, a, d in rng.sample(band, min(args.per_band, len(band))):
        head = tok.decode(a["answer"][: d["at"]], skip_special_tokens=False)
        target = tok.decode(a["answer"][d["at"]:], skip_special_tokens=False).replace(END, "")
        drafted = d["text"][len(head):] if d["text"].startswith(head) else d["text"]
        print(f"\n--- {shard} {a['id']} at {d['at']}: rise {rise:+.3f} "
              f"(draft token {tok.decode([d['draft']])!r} for {tok.decode([d['target']])!r})")
        print(f"  shared: ...{head[-120:]!r}")
        print(f"  target: {target[:300]!r}")
        print(f"  draft : {drafted[:300]!r}")
