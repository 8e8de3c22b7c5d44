#!/usr/bin/env bash
# Where a decode step of the draft goes, by ONNX operator (tests/bench/scripts/draft-step-ops.py), on the draft
# `approxy setup` made, pinned to one core: ONNX Runtime's own profiler, from the PyPI wheel the
# set-up's runtime library comes from, in a venv of its own. Writes
# tests/bench/results/concurrency/draft-step-ops.{md,json}. Run it alone: it times.
source "$(dirname "${BASH_SOURCE[0]}")/../../../deploy/bootstrap.sh"
VENV="$APPROXY_HOME/venv/draft-step-ops"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet onnxruntime==1.31.1 numpy
fi
OUT="$REPO/tests/bench/results/concurrency"
mkdir -p "$OUT"
taskset -c 1 "$VENV/bin/python" "$REPO/tests/bench/scripts/draft-step-ops.py" "$APPROXY_HOME/models/draft-onnx" \
  --json "$OUT/draft-step-ops.json" "$@" > "$OUT/draft-step-ops.md"
cat "$OUT/draft-step-ops.md"
