#!/usr/bin/env bash
# Judged windows (`verification = "judged"`) on the held-out code problems, with the target's
# own answers as the oracle (`approxy bench oracle --judged`): sets up whatever is missing, then
# answers the 41 held-out HumanEval problems (every fourth, the importance labels' held-out
# set) target-only, draft-only, with the draft's confidence at the default's code threshold
# (approximate mode), in exact windows, and in judged windows of at most 16 (the default) and
# 64 draft tokens at that threshold, then at 0.5, 0.3 and 0.2 (up to 64). Reports pass@1, the target's share and
# tokens per target call in tests/bench/results/importance/judged/. Target answers are kept under
# $APPROXY_HOME/work/bench-oracle-asked, so a rerun asks the target only where it was not
# asked; a fresh configuration costs about 0.15 s per token on 2 cores.
# Usage: [THRESHOLD=0.85] ./tests/bench/scripts/study-judged.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../../deploy/bootstrap.sh"
T="${THRESHOLD:-0.85}"
START=$(date +%s)
"$APPROXY" bench oracle --problems 41 --chat 0 --instructions 0 --max-tokens 256 \
  --rules identical --verifiers "confidence:$T" --judged "exact,exact@64,$T,$T@64,0.5@64,0.3@64,0.2@64" \
  --out "$REPO/tests/bench/results/importance/judged"
echo "==> done in $(( $(date +%s) - START ))s (set-up excluded) on $(nproc) cores, $(date -u +%Y-%m-%d)"
