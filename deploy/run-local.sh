#!/usr/bin/env bash
# Sets up whatever is missing, starts llama-server with the 1.5B target on 127.0.0.1:8081 and
# approxy on 127.0.0.1:8080 with policies/default.toml. Ctrl-C stops both: each gets SIGTERM
# and APPROXY_STOP_GRACE seconds (10 unless set) before SIGKILL; a second Ctrl-C skips the wait.
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
mkdir -p "$APPROXY_HOME/logs"
APPROXY_PID="" TARGET_PID=""
cleanup() {
  stop_processes "$APPROXY_PID" "$TARGET_PID"
  echo "stopped"
}
# Before the target starts: a Ctrl-C while it loads, or a start that fails, stops it too.
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
echo "==> starting llama-server (target) on 127.0.0.1:8081 (log: $APPROXY_HOME/logs/target-server.log)"
start_target 8081 "$APPROXY_HOME/logs/target-server.log"
echo "==> starting approxy on 127.0.0.1:8080; use OPENAI_BASE_URL=http://127.0.0.1:8080/v1 (model: $TARGET_ALIAS)"
"$APPROXY" serve --policy "${APPROXY_POLICY:-$REPO/policies/default.toml}" --listen "${APPROXY_LISTEN:-127.0.0.1:8080}" &
APPROXY_PID=$!
wait "$APPROXY_PID"
