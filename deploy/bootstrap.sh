# Sourced by run-local.sh and test-all.sh: builds approxy and provides every asset
# (`approxy setup`: models, llama-server, ONNX Runtime, ONNX draft) under $APPROXY_HOME.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# As the binary does: XDG_CACHE_HOME when it is an absolute path, else ~/.cache.
case "${XDG_CACHE_HOME:-}" in /*) _cache="$XDG_CACHE_HOME" ;; *) _cache="$HOME/.cache" ;; esac
export APPROXY_HOME="${APPROXY_HOME:-$_cache/approxy}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
cd "$REPO"
echo "==> building approxy (cargo build --release)"
cargo build --release --locked -p approxy
APPROXY="$REPO/target/release/approxy"
echo "==> approxy setup ${APPROXY_SETUP_ARGS:+$APPROXY_SETUP_ARGS }(cache: $APPROXY_HOME)"
# shellcheck disable=SC2086  # the arguments are words on purpose
"$APPROXY" setup ${APPROXY_SETUP_ARGS:-}
LLAMA_SERVER="$APPROXY_HOME/bin/llama-server"
TARGET_GGUF="$APPROXY_HOME/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
TARGET_ALIAS="qwen2.5-coder-1.5b-instruct"

# wait_healthy NAME PID URL LOGFILE SECONDS: waits until URL answers 2xx, failing with the
# log's tail when the process exits or time runs out.
wait_healthy() {
  local name="$1" pid="$2" url="$3" log="$4" seconds="$5"
  for _ in $(seq 1 "$seconds"); do
    # --max-time: a server that accepts and never answers must not hold the wait forever.
    if curl -fsS --max-time 5 "$url" >/dev/null 2>&1; then return 0; fi
    if ! kill -0 "$pid" 2>/dev/null; then echo "$name exited; log:"; tail -30 "$log"; return 1; fi
    sleep 1
  done
  echo "$name did not become healthy in $seconds s; log:"; tail -30 "$log"; return 1
}

# start_target PORT LOGFILE: starts llama-server with the target model, waits until healthy,
# sets TARGET_PID.
start_target() {
  local port="$1" log="$2"
  "$LLAMA_SERVER" -m "$TARGET_GGUF" --alias "$TARGET_ALIAS" --host 127.0.0.1 --port "$port" \
    -c 8192 -np 2 -t "${APPROXY_TARGET_THREADS:-2}" --cache-ram 0 --metrics >"$log" 2>&1 &
  TARGET_PID=$!
  wait_healthy llama-server "$TARGET_PID" "http://127.0.0.1:$port/health" "$log" 120
}

# start_other_target PORT LOGFILE: starts llama-server with SmolLM2-135M (a tokenizer unlike the
# draft's; from `approxy setup --vllm`, the test set-up), waits until healthy, sets OTHER_PID.
OTHER_ALIAS="smollm2-135m-instruct"
start_other_target() {
  local port="$1" log="$2"
  "$LLAMA_SERVER" -m "$APPROXY_HOME/models/smollm2-135m-instruct-q4_1.gguf" --alias "$OTHER_ALIAS" --host 127.0.0.1 \
    --port "$port" -c 4096 -np 2 -t 1 >"$log" 2>&1 &
  OTHER_PID=$!
  wait_healthy llama-server "$OTHER_PID" "http://127.0.0.1:$port/health" "$log" 120
}

# start_vllm PORT LOGFILE: starts vLLM (CPU build, from `approxy setup --vllm`) serving the
# draft model as float32 under the name $VLLM_ALIAS, waits until healthy (start-up takes a
# minute or two), sets VLLM_PID. Its token-in endpoint (--enable-scale-out) with the cached
# prompt tokens in its usage (--enable-prompt-tokens-details) is how approxy scores a window
# from its prefix cache; without them windows recompute their prefix. The cache serves whole
# blocks: 32 tokens, the smallest vLLM's CPU kernels take (its CPU default, 128, would leave
# up to 127 tokens of every window's prefix to compute again; a GPU's default is 16).
VLLM_ALIAS="qwen2.5-coder-0.5b-instruct-f32"
VLLM_WINDOW_FLAGS=(--enable-scale-out --enable-prefix-caching --enable-prompt-tokens-details --block-size 32)
start_vllm() {
  local port="$1" log="$2"
  VLLM_CPU_KVCACHE_SPACE=2 "$APPROXY_HOME/venv/vllm/bin/python" -m vllm.entrypoints.openai.api_server \
    --model "$APPROXY_HOME/models/draft-hf" --served-model-name "$VLLM_ALIAS" --host 127.0.0.1 --port "$port" \
    --max-model-len 4096 --dtype float32 --enforce-eager "${VLLM_WINDOW_FLAGS[@]}" >"$log" 2>&1 &
  VLLM_PID=$!
  wait_healthy vLLM "$VLLM_PID" "http://127.0.0.1:$port/health" "$log" 600
}

# stop_process PID [GRACE_SECONDS]: stops a server as process supervisors do: SIGTERM, up to
# GRACE_SECONDS (whole seconds; default $APPROXY_STOP_GRACE, else 10) for it to exit, then
# SIGKILL. A bare `kill; wait` waited forever on a llama-server hung in its shutdown after a
# long run. An empty PID or a process already gone is no error, and nothing here fails under
# errexit (this runs in EXIT traps). STOP_NOW set (stop_processes's trap: a second Ctrl-C)
# ends the grace early.
stop_process() {
  local pid="${1:-}" grace="${2:-${APPROXY_STOP_GRACE:-10}}" tenths
  [ -n "$pid" ] || return 0
  case "$grace" in '' | *[!0-9]*) grace=10 ;; esac
  kill -TERM "$pid" 2>/dev/null || return 0
  tenths=$((grace * 10))
  while [ "$tenths" -gt 0 ] && [ -z "${STOP_NOW:-}" ] && process_runs "$pid"; do
    # A Ctrl-C reaches this sleep too.
    sleep 0.1 || true
    tenths=$((tenths - 1))
  done
  if process_runs "$pid"; then
    echo "process $pid still runs ${grace}s after SIGTERM; sending SIGKILL" >&2
    kill -KILL "$pid" 2>/dev/null || true
    # Dead before the caller goes on (and so a zombie below if nothing reaped it yet).
    tenths=50
    while [ "$tenths" -gt 0 ] && process_runs "$pid"; do sleep 0.1 || true; tenths=$((tenths - 1)); done
  fi
  # bash reaps its children as they exit, so only one still a zombie is waited for: a `wait` on
  # one bash has reaped can block until another child exits, never if that is the hung target.
  # It did in run-local.sh, about one Ctrl-C in five: the Ctrl-C reached approxy and the
  # script's `wait` on it at once, and the clean-up's `wait` on approxy, gone, never returned.
  if [ "$(process_state "$pid")" = Z ]; then wait "$pid" 2>/dev/null || true; fi
}

# stop_processes PID...: stop_process for each in turn, for EXIT traps. From then on INT and
# TERM end the grace early: left as they were, a second Ctrl-C (or a TERM after it) ended the
# shell in the middle of its clean-up with the server still running.
stop_processes() {
  trap 'STOP_NOW=1' INT TERM
  local pid
  for pid in "$@"; do stop_process "$pid"; done
}

# process_state PID: the process's state letter from /proc (Z: exited, not yet reaped); "?"
# without /proc; nothing once it is gone.
process_state() {
  local stat
  kill -0 "$1" 2>/dev/null || return 0
  if read -r stat 2>/dev/null </proc/"$1"/stat; then
    stat="${stat##*) }"
    echo "${stat%% *}"
  else
    echo "?"
  fi
}

# process_runs PID: whether PID exists and has not exited (kill -0 alone counts a zombie).
process_runs() {
  local state
  state="$(process_state "$1")"
  [ -n "$state" ] && [ "$state" != Z ]
}

# free_port: an unused loopback TCP port.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}
