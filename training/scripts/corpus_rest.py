"""Writes the corpus without the prompts a rows directory already holds, so that `approxy train
collect --corpus` on it adds new prompts only (collect takes the first N of each kind, and a
larger N over the same corpus would repeat the first ones). Used for the learning curve in
training/README.md ("Would more rows help?").

Usage (numpy and safetensors from PyPI):
  python3 training/scripts/corpus_rest.py ROWS_DIR training/data/prompts.jsonl > rest.jsonl
"""
import json, sys

from rows import load_shards

used = {int(i) for t in load_shards(sys.argv[1]) for i in t["prompt_ids"]}
for line in open(sys.argv[2]):
    if json.loads(line)["id"] not in used:
        sys.stdout.write(line)
