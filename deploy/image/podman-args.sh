# Sourced by build.sh and the image tests. podman_args_for IMAGE sets PODMAN_ARGS to what this
# machine's podman needs to run a container, found by trying: nothing on an ordinary host.
# In this project's sandbox (Firecracker VMs with hybrid cgroups v1/v2 and a hard open-files
# limit of 20000) podman's defaults fail twice over: Debian 12's crun 1.8 refuses hybrid
# cgroups ("cgroups in hybrid mode not supported"), and podman asks for 1048576 open files
# and unlimited processes, above the hard limits ("setrlimit ... Operation not permitted").
# runc with limits within the hard ones works.
podman_args_for() {
  local image="$1" err
  PODMAN_ARGS=()
  if err="$(podman run --rm --entrypoint /bin/true "$image" 2>&1)"; then return 0; fi
  echo "podman's defaults cannot run a container here: ${err##*$'\n'}" >&2
  local nofile
  nofile="$(ulimit -Hn)"
  PODMAN_ARGS=(--runtime runc --ulimit "nofile=$nofile:$nofile" --ulimit nproc=4096:4096)
  if ! err="$(podman run --rm "${PODMAN_ARGS[@]}" --entrypoint /bin/true "$image" 2>&1)"; then
    echo "nor with ${PODMAN_ARGS[*]}: $err" >&2
    return 1
  fi
  echo "using: podman ${PODMAN_ARGS[*]}" >&2
}
