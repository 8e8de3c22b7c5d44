#!/usr/bin/env bash
# Sets up whatever is missing, starts llama-server with the 1.5B target on 127.0.0.1:8081 and
# approxy on 127.0.0.1:8080 with policies/default.toml. Ctrl-C stops both.
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
mkdir -p "$APPROXY_HOME/logs"
echo "==> starting llama-server (target) on 127.0.0.1:8081 (log: $APPROXY_HOME/logs/target-server.log)"
start_target 8081 "$APPROXY_HOME/logs/target-server.log"
APPROXY_PID=""
cleanup() {
  [ -n "$APPROXY_PID" ] && kill -TERM "$APPROXY_PID" 2>/dev/null && wait "$APPROXY_PID" 2>/dev/null
  kill -TERM "$TARGET_PID" 2>/dev/null && wait "$TARGET_PID" 2>/dev/null
  echo "stopped"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
echo "==> starting approxy on 127.0.0.1:8080; use OPENAI_BASE_URL=http://127.0.0.1:8080/v1 (model: $TARGET_ALIAS)"
"$APPROXY" serve --policy "${APPROXY_POLICY:-$REPO/policies/default.toml}" --listen "${APPROXY_LISTEN:-127.0.0.1:8080}" &
APPROXY_PID=$!
wait "$APPROXY_PID"
