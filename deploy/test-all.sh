#!/usr/bin/env bash
# Sets up whatever is missing and runs every test: Rust unit and integration tests and the
# end-to-end tests (real llama-server target, real ONNX draft, the official openai client),
# then the same client suite and the target-client contract against a real vLLM.
APPROXY_SETUP_ARGS="--vllm"
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
mkdir -p "$APPROXY_HOME/logs"
PORT="$(free_port)"
echo "==> starting llama-server (target) for the tests on 127.0.0.1:$PORT"
start_target "$PORT" "$APPROXY_HOME/logs/test-target-server.log"
VLLM_PID="" OTHER_PID=""
# A server stopped on the way has its pid cleared (a reused pid must not be signalled), so each
# of these is one word or none.
# shellcheck disable=SC2086
stop_servers() {
  # errexit holds in traps too: a server that is already gone must not fail the run.
  # Children first (vLLM's multiprocessing helpers outlive their parent otherwise), named
  # while their parents live: once a parent is gone they are init's and no longer found.
  local children="" pid
  for pid in $TARGET_PID $VLLM_PID $OTHER_PID; do
    children="$children $(pgrep -P "$pid" 2>/dev/null || true)"
  done
  for pid in $children; do kill -TERM "$pid" 2>/dev/null || true; done
  # The children too get the grace and then SIGKILL.
  stop_processes $TARGET_PID $VLLM_PID $OTHER_PID $children
}
trap stop_servers EXIT
OTHER_PORT="$(free_port)"
echo "==> starting llama-server with $OTHER_ALIAS (a target with another tokenizer) on 127.0.0.1:$OTHER_PORT"
start_other_target "$OTHER_PORT" "$APPROXY_HOME/logs/test-other-target-server.log"
export APPROXY_TEST_TARGET_URL="http://127.0.0.1:$PORT"
export APPROXY_TEST_OTHER_TARGET_URL="http://127.0.0.1:$OTHER_PORT" APPROXY_TEST_OTHER_TARGET_MODEL="$OTHER_ALIAS"
export APPROXY_BIN="$APPROXY"
export APPROXY_PROMETHEUS_BIN="$APPROXY_HOME/bin/prometheus" APPROXY_PROMTOOL_BIN="$APPROXY_HOME/bin/promtool"
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

for kind in openai_text chat_prefix; do
  echo "==> end-to-end tests (openai Python client) through approxy with llama-server as an $kind target"
  APPROXY_E2E_TARGET_KIND=$kind "$VENV/bin/python" -m pytest -q "$REPO/tests/e2e/test_openai_client.py" -p no:cacheprovider
done
stop_process "$OTHER_PID"; OTHER_PID=""

# vLLM runs only now: with llama-server and the draft busy too, two cores would starve it.
stop_process "$TARGET_PID"; TARGET_PID=""
VLLM_PORT="$(free_port)"
echo "==> starting vLLM (target, $VLLM_ALIAS) for the tests on 127.0.0.1:$VLLM_PORT"
start_vllm "$VLLM_PORT" "$APPROXY_HOME/logs/test-vllm-server.log"
export APPROXY_TEST_VLLM_URL="http://127.0.0.1:$VLLM_PORT" APPROXY_TEST_VLLM_MODEL="$VLLM_ALIAS"

echo "==> Rust tests against vLLM (the vllm target kind)"
cargo test --release --locked -p approxy-verifier --test target_vllm --no-fail-fast -- --ignored --test-threads=1

echo "==> end-to-end tests (openai Python client) through approxy with vLLM as the target"
APPROXY_E2E_TARGET_KIND=vllm APPROXY_TEST_TARGET_URL="$APPROXY_TEST_VLLM_URL" APPROXY_TARGET_ALIAS="$VLLM_ALIAS" \
  "$VENV/bin/python" -m pytest -q "$REPO/tests/e2e/test_openai_client.py" -p no:cacheprovider

echo "==> end-to-end tests (openai Python client) through approxy with vLLM as a chat_prefix target (continue_final_message)"
APPROXY_E2E_TARGET_KIND=chat_prefix APPROXY_E2E_PREFIX_STYLE=continue_final_message APPROXY_TEST_TARGET_URL="$APPROXY_TEST_VLLM_URL" \
  APPROXY_TARGET_ALIAS="$VLLM_ALIAS" "$VENV/bin/python" -m pytest -q "$REPO/tests/e2e/test_openai_client.py" -p no:cacheprovider
