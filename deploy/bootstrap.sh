# Sourced by run-local.sh and test-all.sh: builds approxy and provides every asset
# (`approxy setup`: models, llama-server, ONNX Runtime, ONNX draft) under $APPROXY_HOME.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export APPROXY_HOME="${APPROXY_HOME:-$HOME/.cache/approxy}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
cd "$REPO"
echo "==> building approxy (cargo build --release)"
cargo build --release --locked -p approxy-gateway
APPROXY="$REPO/target/release/approxy"
echo "==> approxy setup (cache: $APPROXY_HOME)"
"$APPROXY" setup
LLAMA_SERVER="$APPROXY_HOME/bin/llama-server"
TARGET_GGUF="$APPROXY_HOME/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
TARGET_ALIAS="qwen2.5-coder-1.5b-instruct"

# start_target PORT LOGFILE: starts llama-server with the target model, waits until healthy,
# sets TARGET_PID.
start_target() {
  local port="$1" log="$2"
  "$LLAMA_SERVER" -m "$TARGET_GGUF" --alias "$TARGET_ALIAS" --host 127.0.0.1 --port "$port" \
    -c 8192 -np 2 -t "${APPROXY_TARGET_THREADS:-2}" >"$log" 2>&1 &
  TARGET_PID=$!
  for _ in $(seq 1 240); do
    if curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1; then return 0; fi
    if ! kill -0 "$TARGET_PID" 2>/dev/null; then echo "llama-server exited; log:"; tail -20 "$log"; return 1; fi
    sleep 0.5
  done
  echo "llama-server did not become healthy; log:"; tail -20 "$log"; return 1
}

# free_port: an unused loopback TCP port.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}
