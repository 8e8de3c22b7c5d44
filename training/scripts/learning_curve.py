"""Offline probe: would more rows let a head on the draft's hidden state beat the draft's
confidence? Fits each head on a growing share of the training prompts and prints held-out ROC AUC
per kind and label, so the slope says whether collecting more rows is worth it.

Not part of serving or of `approxy train fit`. It splits the rows as `train fit` does (by prompt,
seed 7: the same held-out prompts at every share; shares take whole training prompts, nested, in a
fixed order), and labels each row by identity (the stored label) and by `ratio:R` from the stored
target log-probabilities (`verifier/src/verify/rule.rs`: the draft's token is accepted when its
probability is at least R times the target's top one; a token outside the target's top-20 is a
negative). Heads, all standardised:
  confidence   the draft's top-1 probability (the baseline; no fit)
  lr-stats     logistic regression on the logit statistics and the answer's context
  lr-hidden    the same plus the 896-wide hidden state, L2 strength chosen on an inner split
               of the training prompts (so it may shrink the hidden state to nothing)
  mlp-hidden   a 64-unit MLP on the same inputs, early-stopped on an inner split
  lr-tokens    lr-stats plus a one-hot of the draft's token (the 2,000 commonest tokens)

Usage (numpy, safetensors and scikit-learn from PyPI):
  python3 -m venv /tmp/probe && /tmp/probe/bin/pip install numpy safetensors scikit-learn
  /tmp/probe/bin/python training/scripts/learning_curve.py ROWS_DIR [--rules identical,ratio:0.5] \
      [--shares 0.25,0.5,1] [--eval all|live|teacher-forced] [--extra MORE_ROWS_DIR]
"""
import argparse
import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.neural_network import MLPClassifier
from sklearn.preprocessing import StandardScaler
from sklearn.metrics import roc_auc_score
from scipy import sparse

from rows import held_out, load_shards

ap = argparse.ArgumentParser()
ap.add_argument("rows")
ap.add_argument("--extra", action="append", default=[],
                help="more row directories, for training only: the held-out prompts stay those of ROWS, so "
                     "every share is judged on the same rows; shares take ROWS' training prompts first")
ap.add_argument("--rules", default="identical,ratio:0.5,ratio:0.8")
ap.add_argument("--shares", default="0.25,0.5,1",
                help="training prompts per fit: a share of them (up to 1) or a count (above 1)")
ap.add_argument("--heads", default="lr-stats,lr-hidden,mlp-hidden,lr-tokens")
ap.add_argument("--eval", choices=["all", "live", "teacher-forced"], default="all",
                help="which held-out rows the AUC is taken on (training always uses both)")
args = ap.parse_args()

parts = []
for d in [args.rows] + args.extra:
    for t in load_shards(d):
        t["extra"] = np.full(len(t["labels"]), d != args.rows)
        parts.append(t)
cat = lambda k: np.concatenate([t[k] for t in parts])
stats, ctx, hidden, ident, pids, kinds, tokens, live, extra = (
    cat(k) for k in ["stats", "context", "hidden", "labels", "prompt_ids", "kinds", "tokens", "live", "extra"]
)
tok_lp, top_lp, outside = cat("target_token_logprob"), cat("target_top_logprobs"), cat("target_token_outside")
has_target = np.isfinite(top_lp[:, 0])
print(f"{len(ident)} rows ({live.sum()} live), {len(set(pids))} prompts, {has_target.mean():.3f} with target probabilities")


def label(rule):
    if rule == "identical":
        return ident.astype(int)
    r = float(rule.split(":")[1])
    return ((tok_lp - top_lp[:, 0] >= np.log(r)) & (outside == 0)).astype(int)


held = np.array([held_out(int(p)) for p in pids]) & ~extra
rng = np.random.default_rng(7)
order = np.concatenate([
    rng.permutation(sorted({int(p) for p, h, e in zip(pids, held, extra) if not h and e == side}))
    for side in (False, True)
]).astype(int)
n_base = len({int(p) for p, h, e in zip(pids, held, extra) if not h and not e})
print(f"training prompts: {n_base} in ROWS, {len(order) - n_base} more from --extra; held out: {len(set(pids[held].tolist()))}")
common = np.argsort(-np.bincount(tokens, minlength=tokens.max() + 1))[:2000]
tok_col = {t: i for i, t in enumerate(common)}


def token_onehot(idx):
    cols = np.array([tok_col.get(int(t), -1) for t in tokens[idx]])
    keep = cols >= 0
    return sparse.csr_matrix((np.ones(keep.sum()), (np.nonzero(keep)[0], cols[keep])), shape=(len(idx), len(common)))


def inputs(head, idx):
    base = np.hstack([stats[idx], ctx[idx]])
    if head in ("lr-hidden", "mlp-hidden"):
        return np.hstack([base, hidden[idx]])
    return base


def inner_split(idx):
    """A fifth of the training prompts for choosing the L2 strength / early stopping."""
    ps = np.array([held_out(int(p), seed=11) for p in pids[idx]])
    return idx[~ps], idx[ps]


def fit_predict(head, tr, te, y):
    sc = StandardScaler().fit(inputs(head, tr))
    X = lambda i: sc.transform(inputs(head, i))
    if head == "lr-tokens":
        Xt = lambda i: sparse.hstack([sparse.csr_matrix(X(i)), token_onehot(i)]).tocsr()
        m = LogisticRegression(C=0.1, max_iter=2000).fit(Xt(tr), y[tr])
        return m.predict_proba(Xt(te))[:, 1]
    if head == "lr-stats":
        m = LogisticRegression(C=1.0, max_iter=2000).fit(X(tr), y[tr])
        return m.predict_proba(X(te))[:, 1]
    if head == "lr-hidden":
        a, b = inner_split(tr)
        best = max(
            (roc_auc_score(y[b], LogisticRegression(C=c, max_iter=2000).fit(X(a), y[a]).predict_proba(X(b))[:, 1]), c)
            for c in (0.0003, 0.001, 0.003, 0.01, 0.1)
        )[1]
        m = LogisticRegression(C=best, max_iter=2000).fit(X(tr), y[tr])
        return m.predict_proba(X(te))[:, 1]
    if head == "mlp-hidden":
        m = MLPClassifier(hidden_layer_sizes=(64,), alpha=1e-2, early_stopping=True, validation_fraction=0.2,
                          max_iter=200, random_state=7).fit(X(tr), y[tr])
        return m.predict_proba(X(te))[:, 1]
    raise ValueError(head)


shares = [float(s) for s in args.shares.split(",")]
source = {"all": np.ones_like(live), "live": live, "teacher-forced": ~live}[args.eval]
heads = args.heads.split(",")
for rule in args.rules.split(","):
    y = label(rule)
    usable = has_target | (rule == "identical")
    print(f"\n## {rule}")
    print("| training prompts | train rows | kind | held-out rows | positives | confidence | " + " | ".join(heads) + " |")
    print("|---|---|---|---|---|---|" + "---|" * len(heads))
    te = np.nonzero(usable & held & source)[0]
    for share in shares:
        count = int(share) if share > 1 else max(1, int(round(share * len(order))))
        chosen = set(order[:count].tolist())
        tr = np.nonzero(usable & ~held & np.isin(pids, list(chosen)))[0]
        preds = {h: fit_predict(h, tr, te, y) for h in heads}
        for k, name in ((0, "code"), (1, "chat")):
            sel = kinds[te] == k
            yt = y[te][sel]
            if len(set(yt)) < 2:
                continue
            cells = [f"{roc_auc_score(yt, stats[te][sel][:, 0]):.4f}"]
            cells += [f"{roc_auc_score(yt, preds[h][sel]):.4f}" for h in heads]
            print(f"| {count} | {len(tr)} | {name} | {sel.sum()} | {yt.mean():.3f} | " + " | ".join(cells) + " |")
