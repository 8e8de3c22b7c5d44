#!/usr/bin/env bash
# How the default correction was chosen: the 24-problem HumanEval sample through approxy (the
# confidence verifier at the default level, cores shared) with each correction setting, the
# cost guard off (max_cost_ratio = 1000) so the corrections themselves are compared, then with
# the guard at 1.5. Results per setting under tests/bench/results/corrections/<name>/, and a table:
#
#   ./tests/bench/scripts/bench-corrections.sh            # PROBLEMS=24 unless set
source "$(dirname "${BASH_SOURCE[0]}")/../../../deploy/bootstrap.sh"
OUT="${BENCH_OUT:-tests/bench/results/corrections}"
variants=(
  'fixed1|correction = { mode = "fixed", tokens = 1 }|max_cost_ratio = 1000.0'
  'span16r2|correction = { mode = "span", max_span = 16, resync = 2 }|max_cost_ratio = 1000.0'
  'span32r2|correction = { mode = "span", max_span = 32, resync = 2 }|max_cost_ratio = 1000.0'
  'span32r3|correction = { mode = "span", max_span = 32, resync = 3 }|max_cost_ratio = 1000.0'
  'span64r4|correction = { mode = "span", max_span = 64, resync = 4 }|max_cost_ratio = 1000.0'
  'fixed1-guard1.0|correction = { mode = "fixed", tokens = 1 }|max_cost_ratio = 1.0'
  'span32r3-guard1.0|correction = { mode = "span", max_span = 32, resync = 3 }|max_cost_ratio = 1.0'
  'span32r3-guard1.5|correction = { mode = "span", max_span = 32, resync = 3 }|max_cost_ratio = 1.5'
)
# The reference: the target alone (through approxy in passthrough).
"$APPROXY" bench quality --problems "${PROBLEMS:-24}" --layouts shared --only target-only --out "$OUT/target-only"
for v in "${variants[@]}"; do
  IFS='|' read -r name corr guard <<<"$v"
  mkdir -p "$OUT/$name"
  # The shipped default policy with only these two settings replaced.
  sed -e "s/^correction = .*$/$corr/" -e "s/^max_cost_ratio = .*$/$guard/" policies/default.toml >"$OUT/$name/policy.toml"
  echo "==> $name"
  "$APPROXY" bench quality --problems "${PROBLEMS:-24}" --layouts shared --only confidence-default \
    --base-policy "$OUT/$name/policy.toml" --out "$OUT/$name"
done
python3 "$REPO/tests/bench/scripts/summarize-corrections.py" "$OUT"
