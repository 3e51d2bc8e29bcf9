#!/usr/bin/env bash
# CI's container smoke test (.ci/run): build the image with podman, run it, /readyz, /v1 and /v2
# and gRPC answers equal to the in-process engine, SIGTERM exits 0 within the grace period.
#
# Where podman cannot run (no podman packages and no apt-get, not root, podman info fails), it says
# so and exits 0: the rest of CI goes on. A smoke test that ran and failed exits non-zero.
# CONTAINER_SMOKE=0 skips it on purpose. The podman state (base image, layers) lives in
# $PODMAN_SCRATCH (default /tmp/podman-attn) and is reused by later runs on the same machine.
set -uo pipefail
cd "$(dirname "$0")/../.."

if [[ ${CONTAINER_SMOKE:-1} == 0 ]]; then
    echo "container smoke test: skipped (CONTAINER_SMOKE=0)"
    exit 0
fi
missing=()
for tool in podman runc debootstrap catatonit curl; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
if ((${#missing[@]})); then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "container smoke test: installing ${missing[*]} (Debian packages podman runc debootstrap catatonit curl)"
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            podman runc debootstrap catatonit curl; } >/tmp/ci-smoke-apt.log 2>&1 \
            || echo "container smoke test: apt-get failed (see /tmp/ci-smoke-apt.log)"
    fi
fi
for tool in podman runc debootstrap curl; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "container smoke test: SKIPPED, podman cannot run on this machine ($tool is missing and could not be installed)"
        exit 0
    fi
done

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
grpc_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# A tag of its own: another build on this machine cannot swap the image under this run.
image=localhost/attention-service:ci-$$
start=$SECONDS
SMOKE_PORT=$port SMOKE_GRPC_PORT=$grpc_port IMAGE=$image timeout 1200 deploy/podman/build-and-smoke.sh
status=$?
if [[ $status != 3 ]]; then  # the layers stay cached for the next run; only this run's tag goes
    CONTAINERS_CONF=${PODMAN_SCRATCH:-/tmp/podman-attn}/conf/containers.conf \
        CONTAINERS_STORAGE_CONF=${PODMAN_SCRATCH:-/tmp/podman-attn}/conf/storage.conf \
        podman rmi "$image" >/dev/null 2>&1 || true
fi
case $status in
    0) echo "container smoke test: passed in $((SECONDS - start)) s" ;;
    3) echo "container smoke test: SKIPPED, podman cannot run on this machine (see the SKIP line above)"; status=0 ;;
    124) echo "container smoke test: FAILED, still running after 1200 s" ;;
    *) echo "container smoke test: FAILED (exit $status) after $((SECONDS - start)) s" ;;
esac
exit $status
