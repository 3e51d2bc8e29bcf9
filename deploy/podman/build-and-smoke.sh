#!/usr/bin/env bash
# Build the image with podman and smoke-test it: the check of the Dockerfile
# on machines without a Docker engine (see docs/operations/image.md); .ci/run runs
# it when podman can run (deploy/podman/ci-smoke.sh).
#
#   deploy/podman/build-and-smoke.sh            # base (once), build, run, probe, stop
#   SMOKE_STEPS=base deploy/podman/build-and-smoke.sh   # only the parts named
#
# Exit status: 0 passed, 1 failed, 3 podman cannot run on this machine (not
# root, or `podman info` fails): nothing was tested.
#
# Idempotent: podman's configuration and storage, the debootstrap root file
# system and the logs all live under $PODMAN_SCRATCH (default /tmp/podman-attn),
# never in the repository. The base image is made once and reused; remove it
# with `podman rmi localhost/debian-bookworm-py:base` (same env) to remake it.
#
# Needs root and: apt-get install --no-install-recommends podman runc debootstrap catatonit curl
# Environment knobs:
#   PODMAN_SCRATCH  scratch folder (default /tmp/podman-attn)
#   BASE_IMAGE      base to build on (default localhost/debian-bookworm-py:base,
#                   made here with debootstrap because no registry is reachable)
#   IMAGE           tag to build (default localhost/attention-service:dev)
#   SMOKE_NAME      container name (default attn-smoke-PID, unique per run)
#   SMOKE_PORT      host port for the smoke run (default: a free one; --network host)
#   SMOKE_GRPC_PORT host port of its gRPC front end (default: a free one)
#   DEBIAN_MIRROR   debootstrap mirror (default: the first URIs: of the apt sources)
#   STOP_LIMIT_S    the longest `podman stop` may take to pass (default 10)
#   BUILD_CA_BUNDLE host CA bundle mounted over the build's
#                   /etc/ssl/certs/ca-certificates.crt for the RUN steps only
#                   (default: /etc/ssl/certs/ca-certificates.crt when present;
#                   empty: none). Needed where an egress proxy re-signs TLS with a
#                   CA only the host trusts; it is never written into a layer.
#   SMOKE_STEPS     any of: base build run (default: all three)
#   SMOKE_WORKERS   ATTN_WORKERS of the smoke run (default 1; > 1 also sets
#                   ATTN_METRICS_DIR=/tmp/metrics, on the tmpfs)
#   SMOKE_API_KEY   ATTN_API_KEYS of the smoke run, sent as a Bearer token
#                   (default: a random key; empty: no authentication)
#   SMOKE_PYTHON    interpreter with this repository's dependencies, for the
#                   comparison with the in-process engine (default: .venv/bin/python)
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
SCRATCH=${PODMAN_SCRATCH:-/tmp/podman-attn}
BASE_IMAGE=${BASE_IMAGE:-localhost/debian-bookworm-py:base}
IMAGE=${IMAGE:-localhost/attention-service:dev}
# Free ports unless given: a fixed one may be another server's (`make serve`, another run of this script).
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
PORT=${SMOKE_PORT:-$(free_port)}
GRPC_PORT=${SMOKE_GRPC_PORT:-$(free_port)}
STOP_LIMIT_S=${STOP_LIMIT_S:-10}
STEPS=${SMOKE_STEPS:-base build run}
WORKERS=${SMOKE_WORKERS:-1}
API_KEY=${SMOKE_API_KEY-smoke-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}
# Unique per run: several developers (and CI) may smoke-test on one machine at once.
NAME=${SMOKE_NAME:-attn-smoke-$$}
URL="http://127.0.0.1:${PORT}"
PYTHON=${SMOKE_PYTHON:-$REPO/.venv/bin/python}

log() { printf '[%(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
want() { [[ " $STEPS " == *" $1 "* ]]; }
# podman 4.3 logs an error for each healthcheck timer it cannot set up without
# systemd; those lines are noise here.
pm() { podman "$@" 2> >(grep -v 'unable to get systemd connection' >&2); }

cannot() { log "SKIP: podman cannot run here: $*"; exit 3; }
for tool in podman runc curl; do
    command -v "$tool" >/dev/null || cannot "$tool is missing: apt-get install --no-install-recommends podman runc debootstrap catatonit curl"
done
[[ $(id -u) == 0 ]] || cannot "not root (this script runs rootful podman and debootstrap)"

# --- podman configuration (see /work/shared/notes/containers.md) -------------
# crun refuses the hybrid cgroup v1/v2 layout: runc. No systemd: cgroupfs and
# file events. Containers may not raise rlimits past the host's: default ulimits
# at or below them.
mkdir -p "$SCRATCH/conf" "$SCRATCH/storage" "$SCRATCH/run" "$SCRATCH/tmp"
nofile=$(ulimit -n); nproc=$(ulimit -u)
[[ $nofile == unlimited || $nofile -gt 20000 ]] && nofile=20000
[[ $nproc == unlimited || $nproc -gt 32768 ]] && nproc=32768
cat >"$SCRATCH/conf/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=${nofile}:${nofile}", "nproc=${nproc}:${nproc}"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$SCRATCH/run/events.log"
tmp_dir = "$SCRATCH/tmp"
EOF
cat >"$SCRATCH/conf/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$SCRATCH/storage"
runroot = "$SCRATCH/run"
EOF
export CONTAINERS_CONF="$SCRATCH/conf/containers.conf"
export CONTAINERS_STORAGE_CONF="$SCRATCH/conf/storage.conf"
export TMPDIR="$SCRATCH/tmp"
podman info >"$SCRATCH/info.log" 2>&1 || cannot "podman info failed: $(tail -n 3 "$SCRATCH/info.log" | tr '\n' ' ')"

# --- base image: Debian bookworm + python3 + venv, by debootstrap ------------
if want base; then
    if podman image exists "$BASE_IMAGE"; then
        log "base image $BASE_IMAGE exists; reusing it"
    else
        command -v debootstrap >/dev/null || die "debootstrap is missing: apt-get install --no-install-recommends debootstrap"
        mirror=${DEBIAN_MIRROR:-$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)}
        mirror=${mirror:-http://deb.debian.org/debian}
        rootfs="$SCRATCH/rootfs"
        rm -rf "$rootfs"
        t0=$(now)
        log "debootstrap bookworm from $mirror into $rootfs"
        debootstrap --variant=minbase --include=python3,python3-venv,python3-pip \
            bookworm "$rootfs" "$mirror" >"$SCRATCH/debootstrap.log" 2>&1 \
            || die "debootstrap failed; see $SCRATCH/debootstrap.log"
        # Leave apt usable inside builds (the Dockerfile installs tini) and the
        # image small.
        rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/lib/apt/lists/*
        tar -C "$rootfs" -c . | podman import --quiet - "$BASE_IMAGE" >/dev/null
        rm -rf "$rootfs"
        log "base image $BASE_IMAGE made in $(since "$t0") s"
    fi
fi

# --- build ------------------------------------------------------------------
if want build; then
    t0=$(now)
    log "building $IMAGE on $BASE_IMAGE"
    # --format docker keeps HEALTHCHECK (the OCI format drops it);
    # --network host lets apt-get and pip reach the package registries.
    ca=${BUILD_CA_BUNDLE-/etc/ssl/certs/ca-certificates.crt}
    ca_args=()
    if [[ -n $ca && -f $ca ]]; then ca_args=(--volume "$ca:/etc/ssl/certs/ca-certificates.crt:ro"); fi
    podman build --isolation chroot --network host --format docker "${ca_args[@]}" \
        --build-arg BASE_IMAGE="$BASE_IMAGE" -t "$IMAGE" "$REPO" \
        >"$SCRATCH/build.log" 2>&1 || { tail -n 40 "$SCRATCH/build.log" >&2; die "build failed; see $SCRATCH/build.log"; }
    log "built $IMAGE in $(since "$t0") s ($(podman image inspect --format '{{.Size}}' "$IMAGE" | awk '{ printf "%.0f MB", $1 / 1e6 }'))"
fi

# --- smoke run ----------------------------------------------------------------
if want run; then
    trap 'podman rm -f --ignore "$NAME" >/dev/null 2>&1 || true' EXIT
    pm rm -f --ignore "$NAME" >/dev/null
    # The image's own entrypoint (tini) is PID 1; the same hardening as the
    # Kubernetes manifests: read-only root, a tmpfs /tmp, no capabilities.
    env_args=(-e ATTN_PORT="$PORT" -e ATTN_GRPC_PORT="$GRPC_PORT" -e ATTN_WORKERS="$WORKERS")
    if ((WORKERS > 1)); then env_args+=(-e ATTN_METRICS_DIR=/tmp/metrics); fi
    auth=()
    if [[ -n $API_KEY ]]; then
        env_args+=(-e ATTN_API_KEYS="$API_KEY")
        auth=(-H "Authorization: Bearer $API_KEY")
    fi
    t0=$(now)
    # --health-interval=disable: podman schedules healthchecks with systemd
    # timers, and there is no systemd here; `podman healthcheck run` below
    # still runs the image's HEALTHCHECK once.
    pm run -d --name "$NAME" --network host --health-interval=disable \
        --read-only --tmpfs /tmp:rw,nosuid,nodev,size=64m \
        --cap-drop ALL --security-opt no-new-privileges \
        "${env_args[@]}" "$IMAGE" >/dev/null

    wait_for() {  # wait_for PATH EXPECTED_STATUS TIMEOUT_S
        local deadline=$((SECONDS + $3)) code
        while ((SECONDS < deadline)); do
            code=$(curl -s -o /dev/null -w '%{http_code}' "$URL$1" || true)
            [[ $code == "$2" ]] && return 0
            [[ $(podman inspect --format '{{.State.Running}}' "$NAME") == true ]] \
                || { podman logs "$NAME" >&2; die "container exited while waiting for $1"; }
            sleep 0.2
        done
        podman logs "$NAME" >&2
        die "$1 did not answer $2 within $3 s (last: $code)"
    }
    # The probes carry no key (as the kubelet's): they must be exempt.
    wait_for /healthz 200 60;  log "GET /healthz 200 after $(since "$t0") s (workers=$WORKERS)"
    wait_for /readyz 200 120;  log "GET /readyz 200 after $(since "$t0") s"

    if [[ -n $API_KEY ]]; then
        code=$(curl -s -o /dev/null -w '%{http_code}' "$URL/v1/engines")
        [[ $code == 401 ]] || die "GET /v1/engines without the API key gave $code, not 401: ATTN_API_KEYS is not enforced"
        log "GET /v1/engines without the API key: 401, as it should"
    fi
    curl -sf "${auth[@]}" "$URL/v1/engines" >"$SCRATCH/engines.json" || die "GET /v1/engines failed"
    log "engines: $(tr -d '\n' <"$SCRATCH/engines.json" | cut -c1-300)"

    # /v1 (numpy and onnx engines), /v2 and gRPC answers equal to the in-process engine's.
    t1=$(now)
    compared=0
    SMOKE_API_KEY="$API_KEY" SMOKE_GRPC_TARGET="127.0.0.1:$GRPC_PORT" \
        "$PYTHON" "$REPO/deploy/podman/compare_with_engine.py" "$URL" >&2 || compared=$?
    case $compared in
        0) ;;
        1) die "the container's answers differ from the in-process engine, or it did not answer (see above)" ;;
        *) die "the comparison with the in-process engine did not run (exit $compared; see above)" ;;
    esac
    log "/v1, /v2 and gRPC answers match the in-process engine ($(since "$t1") s)"

    code=$(curl -s -o "$SCRATCH/metrics.txt" -w '%{http_code}' "$URL/metrics")
    log "GET /metrics (no key): $code, $(grep -c '^attn_' "$SCRATCH/metrics.txt" || true) attn_* samples"

    if pm healthcheck run "$NAME" >/dev/null 2>&1; then
        log "image HEALTHCHECK passes"
    else
        log "WARN: podman healthcheck run did not pass (is the image in docker format?)"
    fi

    t0=$(now)
    pm stop -t 30 "$NAME" >/dev/null
    took=$(since "$t0")
    code=$(podman inspect --format '{{.State.ExitCode}}' "$NAME")
    podman logs "$NAME" >"$SCRATCH/container.log" 2>&1
    log "podman stop took $took s; exit code $code; last log lines:"
    tail -n 4 "$SCRATCH/container.log" >&2
    awk -v t="$took" -v l="$STOP_LIMIT_S" 'BEGIN { exit !(t < l) }' \
        || die "stop took $took s (>= $STOP_LIMIT_S s): SIGTERM was not handled, the runtime waited and killed"
    [[ $code == 0 ]] || die "the service exited with $code after SIGTERM"
    log "smoke test passed"
fi
