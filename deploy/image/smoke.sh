#!/usr/bin/env bash
# Runs the images build.sh made against the real llama-server target and sends each a real
# request with the openai client: localhost/approxy (draft baked in) and localhost/approxy-slim
# (draft mounted read-only). Checks the health check, the non-root user, and that SIGTERM
# drains and exits 0. Host networking: the target listens on the host's loopback.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$REPO/deploy/bootstrap.sh"
# shellcheck source=deploy/image/podman-args.sh
source "$REPO/deploy/image/podman-args.sh"
VERSION="$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"]=="approxy"))')"
podman_args_for "localhost/approxy-slim:$VERSION"
WORK="$(mktemp -d)"
TARGET_PORT="$(free_port)"
start_target "$TARGET_PORT" "$WORK/target.log"
CID=""
cleanup() {
  # errexit holds in traps: a failed `podman rm` must not skip stopping the target.
  if [ -n "$CID" ]; then podman rm -f "$CID" >/dev/null 2>&1 || true; fi
  stop_processes "$TARGET_PID"
  rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$WORK/policy"
sed -e "s#^base_url = .*#base_url = \"http://127.0.0.1:$TARGET_PORT\"#" \
  "$REPO/deploy/compose/llama-server/approxy.toml" > "$WORK/policy/approxy.toml"
chmod -R a+rX "$WORK"
PY="$APPROXY_HOME/venv/e2e/bin/python"
[ -x "$PY" ] || PY=python3

smoke() { # IMAGE [extra podman run args...]
  local image="$1"; shift
  local port; port="$(free_port)"
  echo "==> $image on 127.0.0.1:$port"
  CID="$(podman run -d "${PODMAN_ARGS[@]}" --network host -e APPROXY_API_KEYS=smoke-key \
    -e APPROXY_LISTEN="127.0.0.1:$port" -v "$WORK/policy:/etc/approxy:ro" "$@" "$image")"
  for _ in $(seq 1 120); do
    curl -fsS "http://127.0.0.1:$port/ready" >/dev/null 2>&1 && break
    [ "$(podman inspect -f '{{.State.Running}}' "$CID")" = true ] || { podman logs "$CID" | tail -20; return 1; }
    sleep 1
  done
  echo "user in the container: $(podman exec "$CID" id -u)"
  [ "$(podman exec "$CID" id -u)" = 10001 ]
  # Run by hand: podman schedules health checks with systemd timers, and this machine has no systemd.
  if ! podman healthcheck run "$CID"; then echo "the image's health check failed"; return 1; fi
  echo "health check: healthy"
  curl -fsS "http://127.0.0.1:$port/ready"; echo
  OPENAI_BASE_URL="http://127.0.0.1:$port/v1" OPENAI_API_KEY=smoke-key "$PY" -c '
from openai import OpenAI
import openai
r = OpenAI(max_retries=0).chat.completions.create(model="qwen2.5-coder-1.5b-instruct", max_tokens=48,
    messages=[{"role": "user", "content": "Write a Python function that reverses a string."}])
a = r.usage.model_extra["approxy"]
assert a["mode"] == "approximate" and r.usage.completion_tokens > 0, r
print(repr(r.choices[0].message.content[:120]))
print({k: a[k] for k in ("mode", "draft_tokens", "target_tokens", "target_calls")})
try:
    OpenAI(max_retries=0, api_key="wrong").models.list()
    raise SystemExit("a wrong key was let in")
except openai.AuthenticationError:
    print("a wrong key: 401")
'
  podman stop -t 30 "$CID" >/dev/null
  local code; code="$(podman inspect -f '{{.State.ExitCode}}' "$CID")"
  echo "exit code after SIGTERM: $code"
  podman rm "$CID" >/dev/null; CID=""
  [ "$code" = 0 ]
}
smoke "localhost/approxy:$VERSION"
smoke "localhost/approxy-slim:$VERSION" -v "$APPROXY_HOME/models/draft-onnx:/opt/approxy/models/draft-onnx:ro"
echo "==> both images served real requests"
