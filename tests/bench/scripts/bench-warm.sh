#!/usr/bin/env bash
# The warm of an answer's prompt (`target.cache.warm`) with and without (tests/README.md,
# "Warming the slot"): 16 HumanEval problems at 1 and 4 concurrent clients, through the shipped
# policy and through the same with `cache = { slots = true, warm = true }`, against one
# passthrough run per layout (made first and copied, as the benchmark reuses a saved run). The
# pinned pair runs twice, in opposite orders, since runs drift by about 10 %. Saved runs are
# reused, so an interrupted comparison resumes; remove tests/bench/results/concurrency/warm/ to start over.
# Usage: [PROMPTS=16] [CLIENTS=1,4] ./tests/bench/scripts/bench-warm.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../../deploy/bootstrap.sh"
PROMPTS="${PROMPTS:-16}"
CLIENTS="${CLIENTS:-1,4}"
START=$(date +%s)
OUT="$REPO/tests/bench/results/concurrency/warm"
mkdir -p "$OUT" "$APPROXY_HOME/work/bench"
WARM_POLICY="$APPROXY_HOME/work/bench/warm-policy.toml"
sed 's/^cache = { slots = true }/cache = { slots = true, warm = true }/' "$REPO/policies/default.toml" >"$WARM_POLICY"
grep -q '^cache = { slots = true, warm = true }' "$WARM_POLICY" || { echo "policies/default.toml has no 'cache = { slots = true }' line to turn the warm on in" >&2; exit 1; }
run() { # run DIR LAYOUT POLICY
  local dir="$OUT/$1"
  mkdir -p "$dir/raw"
  # Every run of a layout is set against one passthrough run.
  cp -n "$OUT/$2-warm/raw/"*passthrough* "$dir/raw/" 2>/dev/null || true
  "$APPROXY" bench concurrency --sample humaneval --prompts "$PROMPTS" --clients "$CLIENTS" --layouts "$2" --base-policy "$3" --out "$dir"
}
run pinned-warm pinned "$WARM_POLICY"
run pinned-off pinned "$REPO/policies/default.toml"
run pinned-off-2 pinned "$REPO/policies/default.toml"
run pinned-warm-2 pinned "$WARM_POLICY"
run shared-warm shared "$WARM_POLICY"
run shared-off shared "$REPO/policies/default.toml"
echo "==> done in $(( $(date +%s) - START ))s (set-up excluded) on $(nproc) cores, $(date -u +%Y-%m-%d)"
