"""Offline study: can a router on the draft's side tell the positions where the draft's token
changes the answer (importance labels, `approxy train importance`) better than the draft's own
confidence does?

Rows come from `approxy train importance-rows --out ROWS`: ROWS/train (the HumanEval problems
training may use) and ROWS/held-out (the 41 it never sees). Chat rows (`importance-rows --chat`)
are read the same way, a prompt standing for a problem (held out: the instruction-following
set's first 20 prompts; important: an instruction flips or the likelihood falls past the
margin). A row is positive when it is an important disagreement: the draft's token differs from
the target's there and, the target finishing either way, the tests' verdict changes. Every head is fitted on the training problems
only and judged on the held-out ones.

For each feature set it prints, on the held-out rows (all; along the target's answers; along
approxy's live answers):
  AUC                 ROC AUC for "important"
  flag@95             the share of positions a router must send to the target to catch 95 % of
                      the important ones (its threshold set on the held-out rows themselves: the
                      best this ranking can do)
  precision@95        the share of those flagged positions that are important
  deployed            the threshold set on the training problems' out-of-fold scores for 95 %
                      recall, applied to the held-out rows: the recall and the flagged share it
                      gives there (what shipping it would give)
and the oracles: flagging every disagreement (what identity needs) and flagging exactly the
important positions. Then how sure each set's flag@95 gain over the confidence is (the held-out
problems resampled, both judged on each resample), and a learning curve of the best sets against
the number of training problems.

Feature sets (all standardised, logistic regression, balanced class weights, L2 strength
chosen by grouped cross-validation over training problems):
  confidence        the draft's top-1 probability alone (no fit: the shipped verifier's ranking)
  stats             the four logit statistics
  +context          and the answer's context (verifier/src/verify/context.rs)
  +syntax           and where in code the token falls (verifier/src/verify/syntax.rs)
  +hidden           and the draft's 896-wide last hidden state
  +tokens           +syntax and a one-hot of the draft's token (the 500 commonest)
  trees SET         SET's features (+tokens excepted; the hidden state as its first 32 principal
                    components) in gradient-boosted trees instead of a logistic head (balanced
                    class weights, rounds chosen by the same grouped cross-validation): whether
                    a head that is not linear finds more

Usage (numpy, safetensors and scikit-learn from PyPI):
  python3 -m venv /tmp/probe && /tmp/probe/bin/pip install numpy safetensors scikit-learn
  OMP_NUM_THREADS=1 /tmp/probe/bin/python training/scripts/importance_study.py ROWS [--shares 0.25,0.5,1] [--json OUT]
(One OpenMP thread: the trees' threads wait on each other at every split, and beside a busy
llama-server a fit of a minute took more than fifteen.)
"""
import argparse
import json
import pathlib

import numpy as np
from scipy import sparse
from sklearn.decomposition import PCA
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import GroupKFold
from sklearn.preprocessing import StandardScaler

from rows import load_shards

UNKNOWN, AGREES, HARMLESS, IMPORTANT = 255, 0, 1, 2
RECALL = 0.95

ap = argparse.ArgumentParser()
ap.add_argument("rows")
ap.add_argument("--shares", default="0.25,0.5,1")
ap.add_argument("--sets", default="confidence,stats,+context,+syntax,+hidden,+tokens,trees +syntax,trees +hidden")
ap.add_argument("--json", help="write the figures here too")
ap.add_argument("--curve-sets", default="+syntax,+hidden,+tokens",
                help="the sets of the learning curve (trees take minutes a fit on 2 cores)")
ap.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples of the held-out problems")
args = ap.parse_args()


def load(d):
    parts = load_shards(pathlib.Path(args.rows) / d)
    cols = {k: np.concatenate([p[k] for p in parts]) for k in
            ("stats", "context", "syntax", "hidden", "tokens", "prompt_ids", "importance", "live")}
    keep = cols["importance"] != UNKNOWN
    return {k: v[keep] for k, v in cols.items()}, int((~keep).sum())


train, train_unknown = load("train")
held, held_unknown = load("held-out")
common = np.argsort(-np.bincount(train["tokens"], minlength=int(train["tokens"].max()) + 1))[:500]
tok_col = {int(t): i for i, t in enumerate(common)}


def base(fs):
    """The feature set a head reads: `trees +hidden` reads `+hidden`'s."""
    return fs.removeprefix("trees ")


_hidden_pca = []


def hidden_pca(hidden):
    """The hidden state's first 32 principal components, fitted on the training rows once (no
    labels read): trees split on one input at a time, and with 896 inputs and about 200 important
    rows a fit took minutes on 2 cores."""
    if not _hidden_pca:
        _hidden_pca.append(PCA(n_components=32, random_state=7).fit(train["hidden"]))
    return _hidden_pca[0].transform(hidden)


def dense(rows, fs):
    trees_head = fs.startswith("trees ")
    fs = base(fs)
    parts = [rows["stats"]]
    if fs in ("+context", "+syntax", "+hidden", "+tokens"):
        parts.append(rows["context"])
    if fs in ("+syntax", "+hidden", "+tokens"):
        parts.append(rows["syntax"])
    if fs == "+hidden":
        parts.append(hidden_pca(rows["hidden"]) if trees_head else rows["hidden"])
    return np.hstack(parts)


def onehot(rows):
    cols = np.array([tok_col.get(int(t), -1) for t in rows["tokens"]])
    keep = cols >= 0
    return sparse.csr_matrix((np.ones(keep.sum()), (np.nonzero(keep)[0], cols[keep])),
                             shape=(len(cols), len(common)))


def design(rows, fs, scaler):
    x = scaler.transform(dense(rows, fs))
    if fs == "+tokens":
        return sparse.hstack([sparse.csr_matrix(x), onehot(rows)]).tocsr()
    return x


def subset(rows, idx):
    return {k: v[idx] for k, v in rows.items()}


def fit(rows, fs, folds=4):
    """A head on `rows` and its out-of-fold scores there (for a deployable threshold)."""
    y = rows["importance"] == IMPORTANT
    if fs == "confidence":
        s = -rows["stats"][:, 0]
        return (lambda r: -r["stats"][:, 0]), s
    groups = rows["prompt_ids"]
    n_folds = min(folds, len(set(groups.tolist())))
    if fs.startswith("trees "):
        return fit_trees(rows, fs, y, groups, n_folds)
    cs = (0.001, 0.01, 0.1, 1.0) if fs != "+hidden" else (0.0003, 0.001, 0.01)

    def oof(c):
        out = np.zeros(len(y))
        for a, b in GroupKFold(n_splits=n_folds).split(y, y, groups):
            ra, rb = subset(rows, a), subset(rows, b)
            sc = StandardScaler().fit(dense(ra, fs))
            m = LogisticRegression(C=c, class_weight="balanced", max_iter=3000).fit(design(ra, fs, sc), y[a])
            out[b] = m.decision_function(design(rb, fs, sc))
        return out

    best = max(((roc_auc_score(y, o), c, o) for c in cs for o in [oof(c)]), key=lambda t: t[0])
    sc = StandardScaler().fit(dense(rows, fs))
    m = LogisticRegression(C=best[1], class_weight="balanced", max_iter=3000).fit(design(rows, fs, sc), y)
    return (lambda r: m.decision_function(design(r, fs, sc))), best[2]


def trees(rounds):
    return HistGradientBoostingClassifier(learning_rate=0.05, max_iter=rounds, max_leaf_nodes=15,
                                          min_samples_leaf=40, l2_regularization=1.0,
                                          class_weight="balanced", early_stopping=False, random_state=7)


def fit_trees(rows, fs, y, groups, n_folds):
    """Gradient-boosted trees on `fs`'s features (no scaling: trees split on raw values)."""
    def oof(rounds):
        out = np.zeros(len(y))
        for a, b in GroupKFold(n_splits=n_folds).split(y, y, groups):
            m = trees(rounds).fit(dense(subset(rows, a), fs), y[a])
            out[b] = m.decision_function(dense(subset(rows, b), fs))
        return out

    best = max(((roc_auc_score(y, o), r, o) for r in (100, 300) for o in [oof(r)]), key=lambda t: t[0])
    m = trees(best[1]).fit(dense(rows, fs), y)
    return (lambda r: m.decision_function(dense(r, fs))), best[2]


def threshold_for(scores, y, recall=RECALL):
    """The highest threshold flagging at least `recall` of the positives (flag: score >= t)."""
    pos = np.sort(scores[y])[::-1]
    if len(pos) == 0:
        return np.inf
    k = int(np.ceil(recall * len(pos)))
    return pos[k - 1]


def judge(scores, rows, t_deployed):
    y = rows["importance"] == IMPORTANT
    n, p = len(y), int(y.sum())
    out = {"rows": n, "important": p, "disagreements": int((rows["importance"] != AGREES).sum())}
    if p == 0 or p == n:
        return out
    t = threshold_for(scores, y)
    flagged = scores >= t
    dep = scores >= t_deployed
    out.update({
        "auc": roc_auc_score(y, scores),
        "flag95": flagged.mean(),
        "precision95": (flagged & y).sum() / max(flagged.sum(), 1),
        "deployed_recall": (dep & y).sum() / p,
        "deployed_flag": dep.mean(),
    })
    return out


def row(name, r):
    if "auc" not in r:
        return f"| {name} | {r['rows']} | {r['important']} | – | – | – | – |"
    return (f"| {name} | {r['rows']} | {r['important']} | {r['auc']:.3f} | {100 * r['flag95']:.1f} % | "
            f"{100 * r['precision95']:.1f} % | {100 * r['deployed_recall']:.0f} % at {100 * r['deployed_flag']:.1f} % |")


print(f"training rows {len(train['importance'])} ({int((train['importance'] == IMPORTANT).sum())} important, "
      f"{int((train['importance'] == HARMLESS).sum())} harmless disagreements; {train_unknown} unjudged) "
      f"from {len(set(train['prompt_ids'].tolist()))} problems")
print(f"held-out rows {len(held['importance'])} ({int((held['importance'] == IMPORTANT).sum())} important, "
      f"{int((held['importance'] == HARMLESS).sum())} harmless; {held_unknown} unjudged) "
      f"from {len(set(held['prompt_ids'].tolist()))} problems")

results = {}
held_scores = {}
views = {"all": np.ones(len(held["live"]), bool), "target path": ~held["live"], "live path": held["live"]}
print("\n| feature set | view | rows | important | AUC | flag@95 | precision@95 | deployed: recall at flagged |")
print("|---|---|---|---|---|---|---|---|")
for fs in args.sets.split(","):
    score, oof = fit(train, fs)
    t_dep = threshold_for(oof, train["importance"] == IMPORTANT)
    s = score(held)
    held_scores[fs] = s
    results[fs] = {}
    for v, sel in views.items():
        if sel.sum() == 0:
            continue
        r = judge(s[sel], subset(held, sel), t_dep)
        results[fs][v] = r
        print(row(f"{fs} | {v}", r))
for v, sel in views.items():
    if sel.sum() == 0:
        continue
    h = subset(held, sel)
    n = len(h["importance"])
    print(f"| oracle: every disagreement | {v} | {n} | | | {100 * (h['importance'] != AGREES).mean():.1f} % | | |")
    print(f"| oracle: importance | {v} | {n} | | | {100 * (h['importance'] == IMPORTANT).mean():.2f} % | | |")
conf = held["stats"][:, 0]
for t in (0.7, 0.85, 0.95):
    flagged = conf < t
    y = held["importance"] == IMPORTANT
    print(f"\nconfidence verifier at threshold {t}: flags {100 * flagged.mean():.1f} % of held-out positions, "
          f"catching {int((flagged & y).sum())} of {int(y.sum())} important")

# How sure each set's flag@95 gain over the confidence is: held-out problems resampled with
# replacement, both rankings judged on the same resample (52 important positions make flag@95
# turn on the last two or three of them).
boot = {}
if "confidence" in held_scores and len(held_scores) > 1:
    rng = np.random.default_rng(11)
    problems_held = sorted(set(held["prompt_ids"].tolist()))
    rows_of = {p: np.nonzero(held["prompt_ids"] == p)[0] for p in problems_held}
    y_held = held["importance"] == IMPORTANT

    def flag95(scores, y):
        return (scores >= threshold_for(scores, y)).mean() if y.any() else np.nan

    draws = [np.concatenate([rows_of[p] for p in rng.choice(problems_held, len(problems_held))])
             for _ in range(args.resamples)]
    base_flags = np.array([flag95(held_scores["confidence"][i], y_held[i]) for i in draws])
    print(f"\nflag@95 against the confidence's, all held-out rows, {args.resamples} resamples of the "
          f"{len(problems_held)} held-out problems (a negative difference flags fewer positions):\n")
    print("| feature set | difference, median | 90 % interval | resamples where it flags fewer |")
    print("|---|---|---|---|")
    for fs, sc in held_scores.items():
        if fs == "confidence":
            continue
        d = np.array([flag95(sc[i], y_held[i]) for i in draws]) - base_flags
        d = d[~np.isnan(d)]
        lo, mid, hi = np.percentile(d, [5, 50, 95])
        boot[fs] = {"median": mid, "p5": lo, "p95": hi, "fewer": float((d < 0).mean())}
        print(f"| {fs} | {100 * mid:+.1f} points | {100 * lo:+.1f} to {100 * hi:+.1f} | {100 * (d < 0).mean():.0f} % |")

shares = [float(x) for x in args.shares.split(",")]
problems = np.random.default_rng(7).permutation(sorted(set(train["prompt_ids"].tolist())))
curve = []
best_sets = [fs for fs in args.curve_sets.split(",") if fs in args.sets.split(",")]
if len(shares) > 1 and best_sets:
    print("\n| training problems | rows | important | " + " | ".join(f"{fs} AUC / flag@95" for fs in best_sets) + " |")
    print("|---|---|---|" + "---|" * len(best_sets))
    for sh in shares:
        k = max(2, int(round(sh * len(problems))))
        sel = np.isin(train["prompt_ids"], problems[:k])
        tr = subset(train, sel)
        cells = []
        for fs in best_sets:
            score, _ = fit(tr, fs)
            r = judge(score(held), held, np.inf)
            cells.append(f"{r.get('auc', float('nan')):.3f} / {100 * r.get('flag95', float('nan')):.1f} %")
            curve.append({"problems": k, "set": fs, **r})
        print(f"| {k} | {sel.sum()} | {int((tr['importance'] == IMPORTANT).sum())} | " + " | ".join(cells) + " |")

if args.json:
    pathlib.Path(args.json).write_text(json.dumps({"results": results, "curve": curve, "against_confidence": boot}, indent=1, default=float))
