"""Offline probe: does a tree model, or features of the drafted token itself, separate good from
bad draft tokens better than the draft's confidence on the rows `approxy train collect` gathered?

Not part of serving or of `approxy train fit`: it answers whether such a head is worth building
in Rust. It splits the rows as `train fit` does (by prompt, seed 7), fits scikit-learn's
histogram gradient boosting and logistic regression on the logit statistics, the answer's
context and nine token-class features (leading space, newline, whitespace only, punctuation
only, digits, letters, capitalised, length, special token), and prints held-out ROC AUC per
kind, for live rows, and per prompt source.

Usage (numpy, safetensors and scikit-learn from PyPI):
  python3 -m venv /tmp/probe && /tmp/probe/bin/pip install numpy safetensors scikit-learn
  /tmp/probe/bin/python training/scripts/probe_features.py \
      "$APPROXY_HOME/training/rows-v2-int4-block_size128-s-p300-m48-l100" \
      "$APPROXY_HOME/models/draft-onnx/tokenizer.json" training/data/prompts.jsonl
"""
import json, pathlib, sys
import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from rows import held_out, load_shards

data = pathlib.Path(sys.argv[1])
tok = json.load(open(sys.argv[2]))
vocab = {i: t for t, i in tok["model"]["vocab"].items()}
for a in tok.get("added_tokens", []):
    vocab[a["id"]] = a["content"]
corpus = {}
for l in open(sys.argv[3]):
    r = json.loads(l)
    corpus[r["id"]] = r["source"]

parts = load_shards(data)
cat = lambda k: np.concatenate([t[k] for t in parts])
stats, ctx, labels, pids, kinds, tokens, live = (cat(k) for k in ["stats", "context", "labels", "prompt_ids", "kinds", "tokens", "live"])


def token_class(i):
    # Byte-level BPE spells a leading space "Ġ", a newline "Ċ" and a tab "ĉ".
    s = vocab.get(int(i), "")
    core = s.replace("Ġ", "").replace("Ċ", "").replace("ĉ", "")
    return [
        float(s.startswith("Ġ")),
        float("Ċ" in s),
        float(core == "" ),
        float(core != "" and all(not c.isalnum() for c in core)),
        float(core.isdigit()),
        float(core.isalpha()),
        float(core[:1].isupper()) if core else 0.0,
        float(len(core)),
        float(int(i) >= 151643),
    ]


tc = np.array([token_class(i) for i in tokens], dtype=np.float32)
held = np.array([held_out(int(p)) for p in pids])
src = np.array([corpus.get(int(p), "unknown") for p in pids])
y = labels.astype(int)
print(f"{len(y)} rows, {held.sum()} held out, agreement {y[held].mean():.3f}")
sets = {
    "stats": stats,
    "stats+context": np.hstack([stats, ctx]),
    "stats+context+token": np.hstack([stats, ctx, tc]),
    "stats+token": np.hstack([stats, tc]),
}
scores = {"confidence": stats[:, 0]}
for name, X in sets.items():
    X = np.hstack([X, kinds[:, None].astype(np.float32)])
    m = HistGradientBoostingClassifier(max_iter=300, learning_rate=0.05, max_leaf_nodes=15, l2_regularization=1.0, random_state=7, early_stopping=True, validation_fraction=0.2)
    m.fit(X[~held], y[~held])
    scores["gbdt " + name] = m.predict_proba(X)[:, 1]
    lr = LogisticRegression(max_iter=2000, C=1.0)
    mu, sd = X[~held].mean(0), X[~held].std(0) + 1e-6
    lr.fit((X[~held] - mu) / sd, y[~held])
    scores["logistic " + name] = lr.predict_proba((X - mu) / sd)[:, 1]


def auc(s, mask):
    m = held & mask
    return roc_auc_score(y[m], s[m]) if len(set(y[m])) == 2 else float("nan")


print(f"{'model':40s} all    code   chat   live")
for n, s in scores.items():
    print(f"{n:40s} {auc(s, np.ones_like(held)):.4f} {auc(s, kinds == 0):.4f} {auc(s, kinds == 1):.4f} {auc(s, live):.4f}")
print("by source (confidence / gbdt stats+context+token):")
for so in dict.fromkeys(src):
    m = src == so
    print(f"  {so:24s} rows {int((held & m).sum()):5d} agree {y[held & m].mean():.3f} {auc(scores['confidence'], m):.4f} {auc(scores['gbdt stats+context+token'], m):.4f}")
