#!/usr/bin/env bash
# How many users one target serves through approxy (tests/README.md, "Many streams at once"):
# C = 1, 2, 4, 8 and 16 concurrent clients send the 16-problem HumanEval sample (pass@1) and the
# instruction-following chat prompts (IFEval's checks) through the shipped policy and through
# passthrough, to one llama-server with 16 slots, cores pinned (target on core 0, gateway and
# draft on core 1) and shared. Then the draft alone: batched decode at 1 to 16 streams on one
# core at 128, 512 and 1,024 tokens of context (`approxy bench streams`). Every run is saved as it ends and reused (--fresh starts over),
# so an interrupted sweep resumes.
# Usage: [PROMPTS=16] [LAYOUTS=pinned,shared] [SAMPLES="humaneval instructions"] ./tests/bench/scripts/bench-concurrency.sh [--fresh]
source "$(dirname "${BASH_SOURCE[0]}")/../../../deploy/bootstrap.sh"
PROMPTS="${PROMPTS:-16}"
LAYOUTS="${LAYOUTS:-pinned,shared}"
SAMPLES="${SAMPLES:-humaneval instructions}"
START=$(date +%s)
OUT="$REPO/tests/bench/results/concurrency"
mkdir -p "$OUT"
for sample in $SAMPLES; do
  "$APPROXY" bench concurrency --sample "$sample" --prompts "$PROMPTS" --layouts "$LAYOUTS" --out "$OUT" "$@"
done
if [ ! -f "$OUT/streams.json" ] || [[ " $* " == *" --fresh "* ]]; then
  taskset -c 1 "$APPROXY" bench streams --streams 1,2,4,8,16 --tokens 48 --context 128,512,1024 --threads 1 --out "$OUT/streams.json" >/dev/null
fi
echo "==> done in $(( $(date +%s) - START ))s (set-up excluded) on $(nproc) cores, $(date -u +%Y-%m-%d)"
