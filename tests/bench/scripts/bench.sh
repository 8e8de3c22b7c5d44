#!/usr/bin/env bash
# The benchmarks behind the results in tests/README.md: sets up what is missing, measures the
# gateway's passthrough overhead, runs HumanEval through every configuration on shared and
# pinned cores, then rewrites that section from the JSON they wrote (tests/bench/results/).
#
#   PROBLEMS=164 ./tests/bench/scripts/bench.sh     # all of HumanEval (the default)
#   PROBLEMS=41 ./tests/bench/scripts/bench.sh      # every 4th problem, for a quicker look
#
# Extra arguments go to `approxy bench quality` (e.g. --layouts shared, --only target-only).
# Results of an interrupted run are kept per configuration and reused by the next run with
# the same problems.
source "$(dirname "${BASH_SOURCE[0]}")/../../../deploy/bootstrap.sh"
OUT="${BENCH_OUT:-tests/bench/results}"
"$APPROXY" bench overhead --out "$OUT"
"$APPROXY" bench quality --problems "${PROBLEMS:-164}" --out "$OUT" "$@"
"$APPROXY" bench report --out "$OUT" --readme tests/README.md
echo "==> results: $OUT/quality.md, $OUT/overhead.md, $OUT/quality.png; tests/README.md results updated"
