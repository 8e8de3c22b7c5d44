#!/usr/bin/env bash
# How the default policy was chosen under busy pricing (policies/README.md, "Busy pricing";
# tests/README.md, "Priced by the target's time"). Cores pinned (llama-server on core 0, draft
# and gateway on core 1); target-only against the shipped policy on the 24-problem HumanEval
# sample (pass@1), the 40 held-out chat prompts (agreement with the target) and the 40
# instruction-following prompts (IFEval's checkers); then the shipped policy with the code
# threshold at 0.70 (the earlier default) on HumanEval; then the chat threshold at 0.70 (the
# earlier default) on the instruction-following and chat prompts; then vLLM (the draft's float32
# checkpoint as the target, 6 HumanEval problems of at most 128 tokens): the default, and windows
# where the verifier rejects without the guard, which the report also projects as SGLang's radix
# cache would serve them. Each run is resumable (saved
# runs are reused; pass --fresh to start over). The reports carry the target's busy time by its
# own counters, approxy's account of it, and the same calls projected on the H200 table
# (tests/bench/gpu/window_cost.json).
# Usage: [PROBLEMS=24] [CHAT=40] [INSTRUCTIONS=40] [VLLM_PROBLEMS=6] ./tests/bench/scripts/bench-busy.sh [--fresh]
export APPROXY_SETUP_ARGS="${APPROXY_SETUP_ARGS:---vllm}"
source "$(dirname "${BASH_SOURCE[0]}")/../../../deploy/bootstrap.sh"
PROBLEMS="${PROBLEMS:-24}"
CHAT="${CHAT:-40}"
INSTRUCTIONS="${INSTRUCTIONS:-40}"
VLLM_PROBLEMS="${VLLM_PROBLEMS:-6}"
START=$(date +%s)
OUT="$REPO/tests/bench/results/calls-busy"
run() { "$APPROXY" bench calls --layouts pinned --target-delay 0 "$@"; }
run --sample humaneval --prompts "$PROBLEMS" --only target-only,default --out "$OUT" "$@"
run --sample chat --prompts "$CHAT" --max-tokens 128 --only target-only,default --out "$OUT" "$@"
run --sample instructions --prompts "$INSTRUCTIONS" --max-tokens 160 --only target-only,default --out "$OUT" "$@"
LOOSE="$REPO/tests/bench/results/calls-busy-code-0.70"
mkdir -p "$LOOSE"
sed 's/^threshold = { code = 0.85, chat = 0.9 }$/threshold = 0.7/' "$REPO/policies/default.toml" > "$LOOSE/policy.toml"
run --sample humaneval --prompts "$PROBLEMS" --only target-only,default --base-policy "$LOOSE/policy.toml" \
  --out "$LOOSE" "$@"
LOOSE_CHAT="$REPO/tests/bench/results/calls-busy-chat-0.70"
mkdir -p "$LOOSE_CHAT"
sed 's/^threshold = { code = 0.85, chat = 0.9 }$/threshold = { code = 0.85, chat = 0.7 }/' "$REPO/policies/default.toml" \
  > "$LOOSE_CHAT/policy.toml"
for sample in "instructions --prompts $INSTRUCTIONS --max-tokens 160" "chat --prompts $CHAT --max-tokens 128"; do
  # shellcheck disable=SC2086
  run --sample $sample --only target-only,default --base-policy "$LOOSE_CHAT/policy.toml" --out "$LOOSE_CHAT" "$@"
done
run --sample humaneval --prompts "$VLLM_PROBLEMS" --max-tokens 128 --only vllm-target-only,vllm-default,vllm-approximate \
  --out "$REPO/tests/bench/results/calls-busy-vllm" "$@"
"$APPROXY" bench report
echo "==> done in $(( $(date +%s) - START ))s (set-up excluded) on $(nproc) cores, $(date -u +%Y-%m-%d)"
