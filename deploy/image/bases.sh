#!/usr/bin/env bash
# Makes the two base images deploy/Dockerfile builds on, from Debian packages, for machines
# that cannot pull from a container registry (such as this project's):
#   localhost/approxy-base/debian:bookworm-slim   minbase Debian 12 (what debian:bookworm-slim is)
#   localhost/approxy-base/rust:<ver>-bookworm    that plus gcc, g++, make and this machine's Rust
#                                                 toolchain (rustup's; docs left out), as rust:<ver>-slim
# With a registry, skip this: the Dockerfile's defaults are the official images of the same names.
set -euo pipefail
MIRROR="${APPROXY_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
RUNTIME_TAG=localhost/approxy-base/debian:bookworm-slim
RUST_VERSION="$(rustc --version | awk '{print $2}')"
BUILD_TAG="localhost/approxy-base/rust:${RUST_VERSION}-bookworm"
TOOLCHAIN="$(rustc --print sysroot)"
echo "RUNTIME_IMAGE=$RUNTIME_TAG"
echo "BUILD_IMAGE=$BUILD_TAG"

if ! podman image exists "$RUNTIME_TAG"; then
  echo "==> $RUNTIME_TAG (mmdebstrap --variant=minbase bookworm)" >&2
  mmdebstrap --quiet --variant=minbase --mode=root --aptopt='APT::Install-Recommends "false"' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
    bookworm - "$MIRROR" \
    | podman import --change 'CMD ["/bin/bash"]' - "$RUNTIME_TAG" >/dev/null
fi

if ! podman image exists "$BUILD_TAG"; then
  echo "==> $BUILD_TAG (minbase + gcc, g++, make, pkg-config + the Rust toolchain at $TOOLCHAIN)" >&2
  mmdebstrap --quiet --variant=minbase --mode=root --aptopt='APT::Install-Recommends "false"' \
    --include=gcc,g++,libc6-dev,make,pkg-config \
    --customize-hook="tar -C '$TOOLCHAIN' -c bin lib libexec etc | tar -C \"\$1/usr/local\" -x" \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
    bookworm - "$MIRROR" \
    | podman import --change 'ENV CARGO_HOME=/usr/local/cargo' \
        --change 'ENV PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["/bin/bash"]' - "$BUILD_TAG" >/dev/null
fi
