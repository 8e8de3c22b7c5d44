#!/usr/bin/env bash
# Reproduces the "engine's call structure" tables in tests/README.md (`approxy bench calls`): sets up
# whatever is missing (vLLM included), then runs, most telling first, each resumable (saved runs
# are reused; pass --fresh to start over):
#   1. HumanEval, cores shared, with 0 and 200 ms injected before every target call:
#      target-only, the shipped policy, spans without the cost guard, spans with overlap;
#   2. the same with the cores pinned (target on core 0, draft on core 1), no delay;
#   3. 40 held-out chat prompts (128-token answers), shared, no delay: target-only, the shipped
#      policy, spans (overlap changes no answer, only speed, which 1 and 2 measure);
#   4. HumanEval, shared, 50 ms per call;
#   5. vLLM (the draft's float32 checkpoint, about 6 tokens/s here): target-only and exact
#      windows without and with overlap, on a smaller HumanEval sample;
# and rewrites the results section of tests/README.md (`approxy bench report`).
# Usage: [PROBLEMS=24] [CHAT=40] [VLLM_PROBLEMS=6] ./tests/bench/scripts/bench-calls.sh [--fresh]
export APPROXY_SETUP_ARGS="${APPROXY_SETUP_ARGS:---vllm}"
source "$(dirname "${BASH_SOURCE[0]}")/../../../deploy/bootstrap.sh"
PROBLEMS="${PROBLEMS:-24}"
CHAT="${CHAT:-40}"
VLLM_PROBLEMS="${VLLM_PROBLEMS:-6}"
START=$(date +%s)
"$APPROXY" bench calls --sample humaneval --prompts "$PROBLEMS" --layouts shared --target-delay 0,200 "$@"
"$APPROXY" bench calls --sample humaneval --prompts "$PROBLEMS" --layouts pinned --target-delay 0 "$@"
"$APPROXY" bench calls --sample chat --prompts "$CHAT" --max-tokens 128 --layouts shared --target-delay 0 \
  --only target-only,default,span "$@"
"$APPROXY" bench calls --sample humaneval --prompts "$PROBLEMS" --layouts shared --target-delay 50 "$@"
"$APPROXY" bench calls --sample humaneval --prompts "$VLLM_PROBLEMS" --max-tokens 128 --layouts shared \
  --target-delay 0 --only vllm-target-only,vllm-exact,vllm-exact-overlap "$@"
"$APPROXY" bench report
echo "==> done in $(( $(date +%s) - START ))s (set-up excluded) on $(nproc) cores, $(date -u +%Y-%m-%d)"
