#!/usr/bin/env bash
# Builds approxy's container images with podman, on a machine with no container registry:
#   localhost/approxy:<version>        the gateway with the draft baked in (target `approxy`)
#   localhost/approxy-slim:<version>   the gateway without the draft (mount it; `approxy-slim`)
# and, with --compose, the two images deploy/compose.yaml also runs:
#   localhost/approxy-llama-server:<version>  llama-server and the 1.5B target from the cache
#   localhost/approxy-prometheus:<version>    Debian's Prometheus
# It runs `approxy setup` first (for ONNX Runtime and the draft), installs podman, runc and
# mmdebstrap from Debian if they are missing, makes the base images (bases.sh), assembles the
# build context deploy/Dockerfile describes, and builds. The committed tree (git HEAD) is built.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
COMPOSE=0
for a in "$@"; do
  case "$a" in
    --compose) COMPOSE=1 ;;
    *) echo "usage: $0 [--compose]" >&2; exit 2 ;;
  esac
done
source "$REPO/deploy/bootstrap.sh"
VERSION="$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"]=="approxy"))')"

missing=()
for tool in podman:podman runc:runc mmdebstrap:mmdebstrap; do
  command -v "${tool%%:*}" >/dev/null || missing+=("${tool##*:}")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "==> apt-get install ${missing[*]}"
  apt-get install -y -q "${missing[@]}" >/dev/null
fi

eval "$("$REPO/deploy/image/bases.sh")"
# shellcheck source=deploy/image/podman-args.sh
source "$REPO/deploy/image/podman-args.sh"
podman_args_for "$RUNTIME_IMAGE"

CTX="$APPROXY_HOME/image/context"
echo "==> assembling the build context in $CTX"
rm -rf "$CTX"
mkdir -p "$CTX/src" "$CTX/assets/lib" "$CTX/assets/models" "$CTX/policies/examples"
git -C "$REPO" archive --format=tar HEAD | tar -C "$CTX/src" -x
# Every crate the lock file names, so that the build stage needs no network.
(cd "$CTX/src" && cargo vendor --locked --quiet "$CTX/vendor" >/dev/null)
cat > "$CTX/cargo-config.toml" <<'TOML'
[source.crates-io]
replace-with = "vendored-sources"

[source.vendored-sources]
directory = "vendor"
TOML
cp "$APPROXY_HOME/lib/libonnxruntime.so."* "$CTX/assets/lib/"
cp -r "$APPROXY_HOME/models/draft-onnx" "$CTX/assets/models/"
cp "$REPO/deploy/compose/llama-server/approxy.toml" "$CTX/policies/approxy.toml"
cp -r "$REPO/policies/"*.toml "$REPO/policies/providers" "$CTX/policies/examples/"

build() { # TARGET TAG [DOCKERFILE]
  echo "==> podman build --target $1 -t $2"
  podman build "${PODMAN_ARGS[@]}" --format docker --file "${3:-$REPO/deploy/Dockerfile}" --target "$1" \
    --build-arg BUILD_IMAGE="$BUILD_IMAGE" --build-arg RUNTIME_IMAGE="$RUNTIME_IMAGE" \
    --label org.opencontainers.image.revision="$(git -C "$REPO" rev-parse HEAD)" \
    --tag "$2" "$CTX"
}
build approxy "localhost/approxy:$VERSION"
build approxy-slim "localhost/approxy-slim:$VERSION"

if [ "$COMPOSE" = 1 ]; then
  mkdir -p "$CTX/llama/bin" "$CTX/llama/models" "$CTX/prometheus"
  # llama-server as `approxy setup` built it for this machine's CPU (see deploy/README.md, "Which CPUs"),
  # with the libraries it links that a minimal Debian lacks (libgomp) beside it.
  cp "$LLAMA_SERVER" "$CTX/llama/bin/"
  ldd "$LLAMA_SERVER" | awk '/=> \// {print $3}' \
    | grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' \
    | xargs -r cp -L -t "$CTX/llama/bin/"
  cp "$TARGET_GGUF" "$CTX/llama/models/target.gguf"
  if [ -x "$APPROXY_HOME/bin/prometheus" ]; then
    cp "$APPROXY_HOME/bin/prometheus" "$CTX/prometheus/"
  else # the test set-up extracts it; without that, straight from Debian's package
    (cd "$CTX/prometheus" && apt-get download -q prometheus >/dev/null && dpkg -x prometheus_*.deb root \
      && mv root/usr/bin/prometheus . && rm -rf root prometheus_*.deb)
  fi
  build llama-server "localhost/approxy-llama-server:$VERSION" "$REPO/deploy/image/targets.Dockerfile"
  build prometheus "localhost/approxy-prometheus:$VERSION" "$REPO/deploy/image/targets.Dockerfile"
fi
podman images --filter reference='localhost/approxy*' --format '{{.Repository}}:{{.Tag}} {{.Size}}'
