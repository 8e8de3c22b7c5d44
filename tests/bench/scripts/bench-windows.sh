#!/usr/bin/env bash
# Windows as they run in production (tests/README.md, "Windows from vLLM's prefix cache"): vLLM
# serving the 1.5B target dequantised to float32 (the draft's real pair), started with its
# token-in endpoint so that every window reads the prefix cache; cores pinned (vLLM on core 0,
# draft and gateway on core 1); one configuration after the other against the same server, its
# prefix cache emptied before each: target only (passthrough), exact windows (every token,
# lossless), relaxed windows (every token, a draft token kept where the rule accepts it on the
# target's probabilities: ratio:0.5 on code, ratio:0.8 on chat, the oracle study's choices), and
# windows where the draft's confidence rejects (no cost guard). HumanEval scores pass@1, the chat
# prompts agreement with target-only, the instruction prompts IFEval's checkers. The reports
# carry vLLM's busy time by its own counters, prompt tokens computed per window, and the same
# calls projected on the H200 table (tests/bench/gpu/window_cost.json). Each run is resumable (saved
# runs are reused; pass --fresh to start over).
# VLLM_MODEL=draft serves the draft's own float32 checkpoint instead (three times faster here,
# one model at two precisions: it measures the calls, not the pair's quality).
# Usage: [VLLM_MODEL=target|draft] [SAMPLES="humaneval chat instructions"] [PROBLEMS=8] [CHAT=8]
#        [INSTRUCTIONS=8] [MAX_TOKENS=192] [CONFIGS=...] ./tests/bench/scripts/bench-windows.sh [--fresh]
export APPROXY_SETUP_ARGS="${APPROXY_SETUP_ARGS:---vllm}"
source "$(dirname "${BASH_SOURCE[0]}")/../../../deploy/bootstrap.sh"
VLLM_MODEL="${VLLM_MODEL:-target}"
case "$VLLM_MODEL" in target) SIZE=1.5b ;; draft) SIZE=0.5b ;; *) echo "VLLM_MODEL is target or draft" >&2; exit 2 ;; esac
SAMPLES="${SAMPLES:-humaneval chat instructions}"
PROBLEMS="${PROBLEMS:-8}"
CHAT="${CHAT:-8}"
INSTRUCTIONS="${INSTRUCTIONS:-8}"
MAX_TOKENS="${MAX_TOKENS:-192}"
CONFIGS="${CONFIGS:-vllm-target-only,vllm-exact,vllm-relaxed,vllm-approximate}"
START=$(date +%s)
OUT="$REPO/tests/bench/results/windows"
run() { "$APPROXY" bench calls --layouts pinned --target-delay 0 --vllm-model "$VLLM_MODEL" --only "$CONFIGS" "$@"; }
for sample in $SAMPLES; do
  case "$sample" in
    humaneval) run --sample humaneval --prompts "$PROBLEMS" --max-tokens "$MAX_TOKENS" --relaxed-rule ratio:0.5 \
      --out "$OUT/humaneval-$SIZE" "${@}" ;;
    chat) run --sample chat --prompts "$CHAT" --max-tokens 128 --relaxed-rule ratio:0.8 --out "$OUT/chat-$SIZE" "${@}" ;;
    instructions) run --sample instructions --prompts "$INSTRUCTIONS" --max-tokens 160 --relaxed-rule ratio:0.8 \
      --out "$OUT/instructions-$SIZE" "${@}" ;;
    *) echo "unknown sample $sample" >&2; exit 2 ;;
  esac
done
"$APPROXY" bench report
echo "==> done in $(( $(date +%s) - START ))s (set-up excluded) on $(nproc) cores, $(date -u +%Y-%m-%d)"
