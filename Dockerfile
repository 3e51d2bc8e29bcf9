# Attention inference service image (CPU by default).
#
#   docker build -t attention-service .
#   docker run --rm -p 8000:8000 attention-service
#
# BASE_IMAGE must be a Debian-family image with python3 (>= 3.11) and the
# venv module; both stages use it, so the virtualenv built in the first stage
# finds the same interpreter in the second. The default is pinned by exact
# version and digest, so that a rebuild gets the same base (bumping it: see
# docs/operations/image.md). Machines without a registry build on a local base instead
# (deploy/podman/build-and-smoke.sh makes one with debootstrap).
#
# Dependencies come from requirements.lock (pip-compile --generate-hashes,
# `make lock`): exact versions, every file checked against its sha256.
#
# GPU variant: --build-arg EXTRAS=gpu installs requirements-gpu.lock, which has
# onnxruntime-gpu in place of onnxruntime. onnxruntime-gpu 1.31.1 (locked) loads CUDA 13
# (libcudart.so.13, libcublas.so.13) and cuDNN 9, which the image must then hold, either
#   - from a CUDA base image: BASE_IMAGE=an nvidia/cuda:<13.x>-cudnn-runtime
#     image with python3 >= 3.11 and python3-venv, or
#   - from PyPI, on the default base: onnxruntime-gpu[cuda,cudnn]
#     (nvidia-cuda-runtime, nvidia-cublas, nvidia-cudnn-cu13, ...; the ONNX
#     engine preloads them), several GB larger (not in the lock).
# Either way the host provides the NVIDIA driver (new enough for CUDA 13) and
# passes the GPU in (`docker run --gpus all`, `podman run --device
# nvidia.com/gpu=all` with CDI, or an nvidia.com/gpu limit on Kubernetes); set
# ATTN_ONNX_PROVIDERS='["cuda","cpu"]' (TensorRT is not installed). Without
# the libraries the CUDA provider fails to load, ONNX Runtime logs the error
# and the service runs on CPU (GET /v1/engines shows the active providers).

ARG BASE_IMAGE=python:3.11.13-slim-bookworm@sha256:86adf8dbadc3d6e82ee5dd2c74bec2e1c2467cdad47886280501df722372d2e1

# --- build: a virtualenv with the service and its dependencies ---------------
FROM ${BASE_IMAGE} AS build

# "" (CPU, requirements.lock) or "gpu" (requirements-gpu.lock).
ARG EXTRAS=""

# No PYTHONDONTWRITEBYTECODE here: pip compiles the bytecode now, so that the
# read-only runtime never needs to.
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Debian's python refuses system-wide installs (PEP 668): everything goes into
# /opt/venv, which the runtime stage copies as a whole. The venv's pip is the
# one the base bundles (no upgrade: nothing unpinned enters the image).
RUN python3 -m venv /opt/venv

WORKDIR /src

# Dependencies first, from the lock alone, so that code changes do not
# reinstall them: exact versions, hashes required, nothing resolved here.
COPY requirements.lock requirements-gpu.lock ./
RUN lock=requirements.lock; if [ "$EXTRAS" = gpu ]; then lock=requirements-gpu.lock; fi \
 && /opt/venv/bin/pip install --no-cache-dir --require-hashes --no-deps -r "$lock"

COPY pyproject.toml README.md setup.py MANIFEST.in ./
COPY service/ service/
# The ONNX graphs become package data (service/models inside the installed package; see setup.py).
COPY models/ models/
# --no-deps: the dependencies are in already, exactly as locked (and with
# EXTRAS=gpu, the CPU onnxruntime of the base dependencies must stay out).
RUN /opt/venv/bin/pip install --no-cache-dir --no-deps . \
 && /opt/venv/bin/python -c "import service.app, onnxruntime; print('onnxruntime', onnxruntime.__version__, onnxruntime.get_available_providers())"

# --- runtime ----------------------------------------------------------------
FROM ${BASE_IMAGE} AS runtime

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# tini as PID 1: forwards SIGTERM to the server and reaps the worker processes
# uvicorn forks with ATTN_WORKERS > 1. (Without it, run with `docker run --init`.)
# DL3008 (pin apt versions) is ignored on purpose: tini comes from the base's
# own Debian release, whose exact version strings change with every point
# release and security update; a pin would break the build, not make it safer.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 10001 app \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin app

COPY --from=build /opt/venv /opt/venv

# The graphs ship inside the installed package (ATTN_MODELS_DIR may point elsewhere).
# PYTHONDONTWRITEBYTECODE: the root file system may be read-only (pip compiled
# the bytecode at install time).
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    ATTN_HOST=0.0.0.0 \
    ATTN_PORT=8000 \
    ATTN_GRPC_PORT=8001

WORKDIR /app
USER 10001:10001
# REST (/v1, /v2, /metrics, the pages) and the Open Inference Protocol over gRPC.
EXPOSE 8000 8001

# Liveness only: the process answers. Readiness (/readyz, 503 until the ONNX
# sessions are warm) belongs to the orchestrator (compose, Kubernetes).
# Python, not curl: slim images have no curl.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('ATTN_PORT', '8000'), timeout=4)"]

# On SIGTERM the server stops accepting, lets requests in flight finish (up to
# ATTN_SHUTDOWN_GRACE_S) and exits 0; `tini -e 143` also maps an exit "by
# SIGTERM" (uvicorn re-raises the signal it caught) to 0, not to a crash.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/tini", "-e", "143", "--", "python", "-m", "service"]
CMD ["serve"]
