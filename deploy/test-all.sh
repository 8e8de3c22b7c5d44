#!/usr/bin/env bash
# Sets up whatever is missing and runs every test: Rust unit and integration tests and the
# end-to-end tests (real llama-server target, real ONNX draft, the official openai client).
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
mkdir -p "$APPROXY_HOME/logs"
PORT="$(free_port)"
echo "==> starting llama-server (target) for the tests on 127.0.0.1:$PORT"
start_target "$PORT" "$APPROXY_HOME/logs/test-target-server.log"
trap 'kill -TERM "$TARGET_PID" 2>/dev/null; wait "$TARGET_PID" 2>/dev/null || true' EXIT
export APPROXY_TEST_TARGET_URL="http://127.0.0.1:$PORT"
export APPROXY_BIN="$APPROXY"
export APPROXY_TARGET_ALIAS="$TARGET_ALIAS"

echo "==> Rust unit and integration tests"
# One test thread: the draft and the target share this machine's cores.
cargo test --release --locked --workspace --no-fail-fast -- --test-threads=1

echo "==> end-to-end tests (openai Python client)"
VENV="$APPROXY_HOME/venv/e2e"
REQ="$REPO/tests/e2e/requirements.txt"
if ! cmp -s "$REQ" "$VENV/.requirements" 2>/dev/null; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --no-cache-dir -r "$REQ"
  cp "$REQ" "$VENV/.requirements"
fi
"$VENV/bin/python" -m pytest -q "$REPO/tests/e2e" -p no:cacheprovider
