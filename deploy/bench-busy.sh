#!/usr/bin/env bash
# How the default policy was chosen under busy pricing (policies/README.md, "Busy pricing";
# tests/README.md, "Priced by the target's time"): cores pinned (llama-server on core 0, draft
# and gateway on core 1), target-only against the shipped policy at threshold 0.70 on the
# 24-problem HumanEval sample (pass@1), the 40 held-out chat prompts (agreement with the target)
# and the 40 instruction-following prompts (IFEval's checkers), then a stricter code threshold
# (0.85) on HumanEval. Each run is resumable (saved runs are reused; pass --fresh to start over).
# The reports carry the target's busy time by its own counters, approxy's account of it, and the
# same calls projected on the H200 table (deploy/gpu/window_cost.json).
# Usage: [PROBLEMS=24] [CHAT=40] [INSTRUCTIONS=40] ./deploy/bench-busy.sh [--fresh]
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
PROBLEMS="${PROBLEMS:-24}"
CHAT="${CHAT:-40}"
INSTRUCTIONS="${INSTRUCTIONS:-40}"
START=$(date +%s)
OUT="$REPO/deploy/results/calls-busy"
"$APPROXY" bench calls --sample humaneval --prompts "$PROBLEMS" --layouts pinned --target-delay 0 \
  --only target-only,default --out "$OUT" "$@"
"$APPROXY" bench calls --sample chat --prompts "$CHAT" --max-tokens 128 --layouts pinned --target-delay 0 \
  --only target-only,default --out "$OUT" "$@"
"$APPROXY" bench calls --sample instructions --prompts "$INSTRUCTIONS" --max-tokens 160 --layouts pinned \
  --target-delay 0 --only target-only,default --out "$OUT" "$@"
STRICT="$REPO/deploy/results/calls-busy-code-0.85"
mkdir -p "$STRICT"
sed 's/^threshold = 0.7$/threshold = { code = 0.85, chat = 0.7 }/' "$REPO/policies/default.toml" > "$STRICT/policy.toml"
"$APPROXY" bench calls --sample humaneval --prompts "$PROBLEMS" --layouts pinned --target-delay 0 \
  --only target-only,default --base-policy "$STRICT/policy.toml" --out "$STRICT" "$@"
echo "==> done in $(( $(date +%s) - START ))s (set-up excluded) on $(nproc) cores, $(date -u +%Y-%m-%d)"
