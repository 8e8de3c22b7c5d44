#!/usr/bin/env bash
# Brings deploy/compose.yaml up with podman-compose (PyPI, pinned) in the cpu profile, using the
# images build.sh --compose made: llama-server, approxy and Prometheus on a compose network.
# Sends a real chat request through approxy with the openai client, waits until Prometheus has
# scraped approxy_tokens_total, then takes it all down.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# As the binary does: XDG_CACHE_HOME when it is an absolute path, else ~/.cache.
case "${XDG_CACHE_HOME:-}" in /*) _cache="$XDG_CACHE_HOME" ;; *) _cache="$HOME/.cache" ;; esac
export APPROXY_HOME="${APPROXY_HOME:-$_cache/approxy}"
# shellcheck source=deploy/image/podman-args.sh
source "$REPO/deploy/image/podman-args.sh"
podman_args_for localhost/approxy-slim:0.1.0
VENV="$APPROXY_HOME/venv/compose"
if [ ! -x "$VENV/bin/podman-compose" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --no-cache-dir podman-compose==1.6.0 openai==3.54.0
fi
export APPROXY_API_KEYS=compose-smoke-key APPROXY_PORT="${APPROXY_PORT:-18080}" PROMETHEUS_PORT="${PROMETHEUS_PORT:-19090}"
# The runtime is a global podman flag; the limits are per container.
compose() {
  "$VENV/bin/podman-compose" -f "$REPO/deploy/compose.yaml" --profile cpu \
    --podman-args="${PODMAN_ARGS[*]:0:2}" --podman-run-args="${PODMAN_ARGS[*]:2}" "$@"
}
trap 'compose down -t 30 >/dev/null 2>&1 || true' EXIT
# approxy waits for llama-server to be healthy. podman runs health checks on systemd timers; a
# machine without systemd (this one) never runs them, so they are run here by hand.
compose up -d llama-server
echo "==> waiting for llama-server's health check"
for _ in $(seq 1 120); do
  podman healthcheck run approxy_llama-server_1 >/dev/null 2>&1 && break
  sleep 2
done
compose up -d
echo "==> waiting for approxy"
for _ in $(seq 1 180); do
  curl -fsS "http://127.0.0.1:$APPROXY_PORT/ready" >/dev/null 2>&1 && break
  sleep 2
done
curl -fsS "http://127.0.0.1:$APPROXY_PORT/ready"; echo
OPENAI_BASE_URL="http://127.0.0.1:$APPROXY_PORT/v1" OPENAI_API_KEY="$APPROXY_API_KEYS" "$VENV/bin/python" -c '
from openai import OpenAI
r = OpenAI(max_retries=0).chat.completions.create(model="qwen2.5-coder-1.5b-instruct", max_tokens=32,
    messages=[{"role": "user", "content": "Write a Python function that reverses a string."}])
a = r.usage.model_extra["approxy"]
assert a["mode"] == "approximate" and r.usage.completion_tokens > 0, r
print({k: a[k] for k in ("mode", "draft_tokens", "target_tokens", "target_calls")})
'
echo "==> waiting for Prometheus to scrape approxy"
for _ in $(seq 1 60); do
  if curl -fsS "http://127.0.0.1:$PROMETHEUS_PORT/api/v1/query?query=approxy_tokens_total" | grep -q '"source"'; then
    curl -fsS "http://127.0.0.1:$PROMETHEUS_PORT/api/v1/query?query=sum(approxy_tokens_total)"; echo
    curl -fsS "http://127.0.0.1:$PROMETHEUS_PORT/api/v1/rules" | grep -o '"name":"Approxy[A-Za-z]*"' | sort -u
    echo "==> compose served a real request and Prometheus scraped approxy"
    exit 0
  fi
  sleep 2
done
echo "Prometheus never saw approxy_tokens_total"; exit 1
