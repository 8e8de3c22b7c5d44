#!/usr/bin/env bash
# Draft decode speed, calibrated against this machine's llama-server speed: sets up what is
# missing, starts an idle target, runs `approxy bench draft --target-url ...` and prints JSON.
source "$(dirname "${BASH_SOURCE[0]}")/../../../deploy/bootstrap.sh"
mkdir -p "$APPROXY_HOME/logs"
PORT="$(free_port)"
start_target "$PORT" "$APPROXY_HOME/logs/bench-target-server.log"
trap 'stop_processes "$TARGET_PID"' EXIT
"$APPROXY" bench draft --tokens 128 --runs 3 --target-url "http://127.0.0.1:$PORT" "$@"
