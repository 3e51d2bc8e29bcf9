"""The ONNX engine: the graphs of models/ run by ONNX Runtime on the best available provider.

At :meth:`OnnxEngine.start` (called once from application start-up, in a worker
thread) the engine reads ``models/manifest.json``, checks the sha256 of every
model file, creates one :class:`onnxruntime.InferenceSession` per graph and
warms each up; ``ready`` turns True only when all of that succeeded. A missing
or corrupted file, or a session that fails to load, leaves the engine not ready
with the reason in :meth:`describe` and a log line on ``service.engines.onnx``;
the numpy engine keeps serving.

Per request the engine builds the graph inputs from the task exactly as the
numpy reference does (same validation, same keep mask from
:func:`service.core.masks.keep_mask`), runs the one graph that serves the
normalizer, dtype and requested outputs, and checks the contract on the way
out: fully masked rows are zero in output and weights whatever the runtime did.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import json
import logging
import math
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from service.core.attention import (
    Dims,
    check_dims,
    check_live_rows,
    check_params,
    check_scores_finite,
    overflow_error,
    promote_to_4d,
    resolved_scale,
    scaled_bias,
    score_factor,
    widened_factor,
)
from service.core.backward import (
    BACKWARD_RETURNS,
    BackwardResult,
    BackwardTask,
    checked_gradient,
    gradient_health,
    jacobian_norms,
    sum_to_shape,
)
from service.core.errors import InvalidInput, NumericalError
from service.core.masks import as_4d_mask, keep_mask, valid_key_counts
from service.core.types import AttentionResult, AttentionTask
from service.engines.base import public_reason
from service.engines.cost import Cost, onnx_cost

logger = logging.getLogger("service.engines.onnx")

MANIFEST_NAME = "manifest.json"

# Execution providers in order of preference when none are configured.
PREFERRED_PROVIDERS: tuple[str, ...] = (
    "TensorrtExecutionProvider",
    "CUDAExecutionProvider",
    "ROCMExecutionProvider",
    "DmlExecutionProvider",
    "CoreMLExecutionProvider",
    "OpenVINOExecutionProvider",
    "CPUExecutionProvider",
)
# Short names accepted in configuration (case-insensitive), e.g. ATTN_ONNX_PROVIDERS='["cuda","cpu"]'.
PROVIDER_ALIASES: dict[str, str] = {
    "tensorrt": "TensorrtExecutionProvider",
    "trt": "TensorrtExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "rocm": "ROCMExecutionProvider",
    "dml": "DmlExecutionProvider",
    "directml": "DmlExecutionProvider",
    "coreml": "CoreMLExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
    "cpu": "CPUExecutionProvider",
}
OPTIMIZATION_LEVELS = ("disable", "basic", "extended", "all")
SUPPORTED_DTYPES = ("float32", "float64")
TRIM_AFTER_BYTES = 64 << 20
"""After a run estimated to peak above this, the C heap's free memory is given back to the OS."""


def _malloc_trim() -> Any:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc
        return None


_MALLOC_TRIM = _malloc_trim()


def release_free_heap() -> None:
    """Return free C-heap memory to the OS (glibc ``malloc_trim(0)``; a no-op without glibc).

    With ONNX Runtime's arena off, intermediates above glibc's mmap threshold go back to the OS when
    freed, but smaller ones (up to 32 MiB once the threshold has adapted) stay in the heap, so a
    large request would leave the process at its peak: after such a run the free heap is trimmed.
    """
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def choose_providers(available: list[str], configured: list[str] | None) -> tuple[list[str], list[str]]:
    """(providers to request, warnings).

    Without a configuration: the available providers in :data:`PREFERRED_PROVIDERS`
    order. With one: the configured providers (full names or short aliases) in the
    given order, dropping those this onnxruntime build lacks (with a warning). The
    CPU provider always closes the list, so nodes other providers lack still run.
    """
    warnings: list[str] = []
    if not configured:
        chosen = [p for p in PREFERRED_PROVIDERS if p in available]
    else:
        chosen = []
        for name in configured:
            full = PROVIDER_ALIASES.get(name.strip().lower(), name.strip())
            if full not in available:
                warnings.append(
                    f"configured execution provider {name!r} is not available in this onnxruntime "
                    f"build (available: {', '.join(available)}); skipped"
                )
            elif full not in chosen:
                chosen.append(full)
    if "CPUExecutionProvider" not in chosen:
        chosen.append("CPUExecutionProvider")
    return chosen, warnings


class ModelCheckError(RuntimeError):
    """The models directory does not match its manifest (missing file, wrong hash, bad manifest).

    ``str(exc)`` is fit for clients (file names relative to the models directory, no hash);
    ``detail`` adds what only the server's log should show (the hashes).
    """

    def __init__(self, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.detail = detail or message


def verify_models(models_dir: Path) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Read the manifest and every model file, checking each file's sha256.

    Returns (manifest, {graph name: file bytes}); raises :class:`ModelCheckError`
    naming the first file that is missing or whose hash differs. The messages
    name files relative to the models directory: they reach HTTP bodies (503),
    which must not show the server's file system (the log line names the folder).
    """
    manifest_path = models_dir / MANIFEST_NAME
    try:
        manifest = json.loads(manifest_path.read_text())
        graphs = manifest["graphs"]
    except FileNotFoundError:
        raise ModelCheckError(
            f"model manifest {MANIFEST_NAME} is missing from the models directory "
            "(set ATTN_MODELS_DIR, or run `python -m service export-models --out DIR`)"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelCheckError(f"model manifest {MANIFEST_NAME} is unreadable: {type(exc).__name__}") from None
    blobs: dict[str, bytes] = {}
    for g in graphs:
        path = models_dir / g["file"]
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ModelCheckError(
                f"model file {g['file']} listed in the manifest cannot be read: {exc.strerror or type(exc).__name__}"
            ) from None
        digest = hashlib.sha256(data).hexdigest()
        if digest != g["sha256"]:
            raise ModelCheckError(
                f"model file {g['file']} is corrupted: its sha256 does not match the manifest's",
                f"model file {g['file']} is corrupted: sha256 {digest} does not match the manifest's {g['sha256']}",
            )
        blobs[g["name"]] = data
    return manifest, blobs


class OnnxEngine:
    """Attention on ONNX Runtime over the graphs of ``models_dir``.

    ``providers``: execution providers in order of preference (full names or
    aliases such as ``"cuda"``); None picks the best available
    (:data:`PREFERRED_PROVIDERS`). ``intra_op_threads``: 0 lets ONNX Runtime
    choose (one per physical core). ``graph_optimization_level``: one of
    ``disable``, ``basic``, ``extended``, ``all``. ``warmup``: run each graph once
    at start so the first request does not pay for lazy initialisation.
    ``memory_arena``: keep ONNX Runtime's CPU memory arena (off by default: see ``_start``).
    """

    name = "onnx"

    def __init__(
        self,
        models_dir: str | Path,
        *,
        providers: list[str] | None = None,
        intra_op_threads: int = 0,
        graph_optimization_level: str = "all",
        warmup: bool = True,
        memory_arena: bool = False,
    ) -> None:
        if graph_optimization_level not in OPTIMIZATION_LEVELS:
            raise ValueError(
                f"graph_optimization_level must be one of {OPTIMIZATION_LEVELS}, got {graph_optimization_level!r}"
            )
        if intra_op_threads < 0:
            raise ValueError(f"intra_op_threads must be >= 0, got {intra_op_threads}")
        self.models_dir = Path(models_dir)
        self.configured_providers = list(providers) if providers else None
        self.intra_op_threads = intra_op_threads
        self.graph_optimization_level = graph_optimization_level
        self.warmup = warmup
        self.memory_arena = memory_arena
        self._lock = threading.Lock()
        self._state = "new"  # new -> starting -> ready | failed
        self._error: str | None = None  # why start-up failed, fit for clients (no path, no hash)
        self._failure_detail: str | None = None  # the same for the server's log (folder, hashes)
        self._warnings: list[str] = []
        self._manifest: dict[str, Any] | None = None
        self._sessions: dict[str, Any] = {}
        self._input_names: dict[str, frozenset[str]] = {}
        self._output_names: dict[str, frozenset[str]] = {}
        self._input_dtypes: dict[str, dict[str, np.dtype]] = {}
        self._fused: dict[str, bool] = {}
        self._timings: dict[str, dict[str, float]] = {}
        self._requested_providers: list[str] = []
        self._active_providers: list[str] = []
        self._available_providers: list[str] = []
        self._ort_version: str | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Verify the models, create and warm up one session per graph. Idempotent; never raises."""
        with self._lock:
            if self._state != "new":
                return
            self._state = "starting"
            try:
                self._start()
            except Exception as exc:  # any failure leaves the engine not ready, numpy keeps serving
                self._sessions = {}
                if isinstance(exc, ModelCheckError):
                    self._error, detail = public_reason(str(exc)), exc.detail
                else:
                    self._error, detail = public_reason(f"{type(exc).__name__}: {exc}"), f"{type(exc).__name__}: {exc}"
                self._failure_detail = f"{detail} (models directory {self.models_dir})"
                self._state = "failed"
                # No log line here: the runtime writes the one line, saying whether the service
                # degrades to the other engines or is not ready (ATTN_ONNX_REQUIRED).
                return
            self._state = "ready"
            logger.info(
                "ONNX engine ready: %d graphs on %s (onnxruntime %s)",
                len(self._sessions),
                self.provider,
                self._ort_version,
            )

    def _start(self) -> None:
        import onnxruntime as ort  # imported here so that importing the engine stays cheap

        self._ort_version = ort.__version__
        self._available_providers = list(ort.get_available_providers())
        self._requested_providers, self._warnings = choose_providers(
            self._available_providers, self.configured_providers
        )
        if {"CUDAExecutionProvider", "TensorrtExecutionProvider"} & set(self._requested_providers):
            # onnxruntime-gpu finds CUDA and cuDNN installed from PyPI (onnxruntime-gpu[cuda,cudnn])
            # only once they are preloaded; system-wide libraries work either way.
            try:
                ort.preload_dlls()
            except Exception as exc:  # pragma: no cover - GPU machines only
                self._warnings.append(f"onnxruntime.preload_dlls() failed: {type(exc).__name__}: {exc}")
        for w in self._warnings:
            logger.warning("%s", w)
        manifest, blobs = verify_models(self.models_dir)
        levels = {
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }

        def session_options(log_severity_level: int) -> Any:
            options = ort.SessionOptions()
            options.intra_op_num_threads = self.intra_op_threads
            options.graph_optimization_level = levels[self.graph_optimization_level]
            options.log_severity_level = log_severity_level
            # Without the arena, ONNX Runtime returns each run's buffers to the allocator: an 8192-key
            # entmax request no longer leaves RSS at its 3.9 GB peak, and peaks are lower (the arena
            # rounds its extensions up). Repeated large requests pay for fresh pages instead.
            options.enable_cpu_mem_arena = self.memory_arena
            return options

        # onnx's shape inference gives the Attention operator's qk_matmul_output a last dim of 0
        # when kv_len is symbolic, and ONNX Runtime then logs a shape warning on every run of the
        # fused weights graph: run that one at log level error (see service/export/graphs.py).
        normal, quiet = session_options(2), session_options(3)
        sessions: dict[str, Any] = {}
        timings: dict[str, dict[str, float]] = {}
        for g in manifest["graphs"]:
            supports = g["supports"]
            opts = quiet if supports["fused_attention_op"] and supports["weights"] else normal
            t0 = time.perf_counter()
            session = ort.InferenceSession(blobs[g["name"]], sess_options=opts, providers=self._requested_providers)
            t1 = time.perf_counter()
            if self.warmup:
                session.run(None, _warmup_feeds(g))
            t2 = time.perf_counter()
            sessions[g["name"]] = session
            timings[g["name"]] = {"load_ms": round((t1 - t0) * 1e3, 3), "warmup_ms": round((t2 - t1) * 1e3, 3)}
        first = next(iter(sessions.values()), None)
        self._active_providers = list(first.get_providers()) if first is not None else []
        if self._active_providers[:1] != self._requested_providers[:1]:
            # e.g. onnxruntime-gpu installed but CUDA libraries missing: ORT falls back to CPU
            msg = (
                f"requested execution provider {self._requested_providers[0]} but the sessions run on "
                f"{', '.join(self._active_providers) or 'nothing'}"
            )
            self._warnings.append(msg)
            logger.warning("%s", msg)
        self._manifest = manifest
        self._sessions = sessions
        self._input_names = {name: frozenset(i.name for i in s.get_inputs()) for name, s in sessions.items()}
        self._output_names = {name: frozenset(o.name for o in s.get_outputs()) for name, s in sessions.items()}
        self._input_dtypes = {
            g["name"]: {i["name"]: np.dtype(i["dtype"]) for i in g["inputs"]} for g in manifest["graphs"]
        }
        self._fused = {g["name"]: bool(g["supports"]["fused_attention_op"]) for g in manifest["graphs"]}
        self._timings = timings

    # ------------------------------------------------------------------ protocol
    @property
    def _graphs(self) -> list[dict[str, Any]]:
        """Manifest entries of the loaded graphs, in order of preference."""
        return self._manifest["graphs"] if self._manifest is not None else []

    @property
    def provider(self) -> str:
        """The execution provider the sessions run on (``session.get_providers()[0]``)."""
        if self._active_providers:
            return self._active_providers[0]
        return f"none ({self._state})"

    @property
    def ready(self) -> bool:
        return self._state == "ready"

    @property
    def failed(self) -> bool:
        """Start-up failed: the engine stays unavailable until the process restarts."""
        return self._state == "failed"

    @property
    def failure(self) -> str | None:
        """Why start-up failed, fit for clients (no server path, no hash); None unless it failed."""
        return self._error if self._state == "failed" else None

    @property
    def failure_detail(self) -> str | None:
        """Why start-up failed, for the server's log only (it names the models folder and the hashes)."""
        return self._failure_detail

    @property
    def not_ready_reason(self) -> str | None:
        """Why the engine is not ready (None when it is)."""
        if self._state == "ready":
            return None
        if self._state == "failed":
            return (
                f"the ONNX engine failed to start ({self._error}); it stays unavailable until the service "
                "restarts with intact graphs"
            )
        if self._state == "starting":
            return "the ONNX engine is still starting (verifying, loading and warming up its graphs)"
        return "the ONNX engine is not started yet (it loads and warms up its graphs at start-up)"

    def graph_for(self, task: AttentionTask) -> str | None:
        """Name of the graph that would run ``task`` (None when no graph serves it)."""
        key = self._request_key(task)
        if isinstance(key, str):
            return None
        normalizer, dtype, outputs, masked = key
        for g in self._graphs:
            s = g["supports"]
            if (
                s.get("pass", "forward") == "forward"
                and s["normalizer"] == normalizer
                and s["dtype"] == dtype
                and outputs <= set(s["outputs"])
                and (s["masking"] or not masked)
            ):
                name: str = g["name"]
                return name
        return None

    def cost(self, task: AttentionTask) -> Cost | None:
        """Estimated time and peak memory of ``task`` on its graph (None when no graph serves it)."""
        graph = self.graph_for(task)
        if graph is None:
            return None
        inputs = task.inputs
        return onnx_cost(
            graph,
            check_dims(inputs.query.shape, inputs.key.shape, inputs.value.shape),
            dtype=np.dtype(task.dtype).name,
            need_weights=task.need_weights,
            need_scores=task.need_scores,
        )

    def unsupported_reason(self, task: AttentionTask) -> str | None:
        if not self.ready:
            return self.not_ready_reason
        key = self._request_key(task)
        if isinstance(key, str):
            return key
        if self.graph_for(task) is None:
            normalizer, dtype, outputs, _ = key
            return f"no ONNX graph serves normalizer {normalizer} in {dtype} with outputs {', '.join(sorted(outputs))}"
        return None

    def _request_key(self, task: AttentionTask) -> tuple[str, str, set[str], bool] | str:
        """(normalizer of the graph, dtype name, outputs needed, whether anything masks),
        or the reason no graph can serve the task.
        """
        dtype = np.dtype(task.dtype).name
        if dtype not in SUPPORTED_DTYPES:
            return f"precision {dtype} has no ONNX graph (float32 and float64 only)"
        normalizer = task.params.normalizer
        if normalizer == "entmax":
            alpha = task.params.alpha
            if alpha is None or not math.isfinite(alpha) or alpha <= 1:
                return f"entmax needs a finite alpha > 1, got {alpha}"
            # the exact sort-based graphs, as the numpy reference does for these two alphas
            normalizer = {2.0: "sparsemax", 1.5: "entmax15"}.get(float(alpha), "entmax")
        outputs = {"output"}
        if task.need_weights:
            outputs.add("weights")
        if task.need_scores:
            outputs.add("scores")
        inputs = task.inputs
        masked = inputs.mask is not None or task.params.causal is not None or inputs.key_lengths is not None
        return normalizer, dtype, outputs, masked

    def _feeds(
        self, task: AttentionTask, name: str
    ) -> tuple[dict[str, np.ndarray], Dims, np.ndarray | None, np.ndarray]:
        """The inputs of graph ``name`` for ``task`` (validated as the numpy reference does).

        Also the sizes, the combined keep mask (None when nothing masks) and ``valid_keys`` (B, Hq, L).
        """
        params = task.params
        check_params(params)
        inputs = task.inputs
        dims = check_dims(inputs.query.shape, inputs.key.shape, inputs.value.shape)
        dtype = np.dtype(task.dtype)
        B, Hq, L, S = dims.weights_shape
        target = (B, Hq, L, S)

        keep = keep_mask(B, Hq, L, S, mask=inputs.mask, causal=params.causal, key_lengths=inputs.key_lengths)
        valid_keys = valid_key_counts(keep, target)
        scale = resolved_scale(params, dims.E)
        relu = params.normalizer == "relu"
        mask = inputs.mask
        float_mask = None if mask is None or np.asarray(mask).dtype == bool else as_4d_mask(np.asarray(mask), target)
        types = self._input_dtypes[name]
        factor: float | np.floating
        if relu:
            # The relu graphs take scale and temperature in float64 and leave the temperature out of the
            # weights (relu is invariant to it), as the numpy engine does.
            factor, temperature, bias = scale, params.temperature, float_mask
        else:
            # scale / T and bias / T divided in float64 and rounded once, exactly as the numpy engine
            # does (a temperature beyond float32's range must not reach the graph as inf).
            factor, temperature = score_factor(scale, params.temperature, dtype), 1.0
            bias = None if float_mask is None else scaled_bias(float_mask, params.temperature, dtype)
        query = promote_to_4d(inputs.query)
        if not relu and widened_factor(factor, dtype):
            # scale / T underflows the graph's float32 scale: the query is scaled in float64 and rounded
            # once instead, as the numpy engine forms Q * factor
            query, factor = np.asarray(query, dtype=np.float64) * factor, 1.0
        feeds = {
            "query": np.ascontiguousarray(query, dtype=dtype),
            "key": np.ascontiguousarray(promote_to_4d(inputs.key), dtype=dtype),
            "value": np.ascontiguousarray(promote_to_4d(inputs.value), dtype=dtype),
            "scale": np.array(factor, dtype=types.get("scale", dtype)),
            "temperature": np.array(temperature, dtype=types.get("temperature", dtype)),
        }
        graph_inputs = self._input_names[name]
        if "keep_mask" in graph_inputs:
            # the Attention operator needs the mask's last two dims to be exactly (L, S)
            keep4 = np.ones((1, 1, 1, 1), dtype=bool) if keep is None else keep
            feeds["keep_mask"] = np.ascontiguousarray(np.broadcast_to(keep4, keep4.shape[:2] + (L, S)))
            if bias is not None:
                feeds["bias"] = np.ascontiguousarray(bias, dtype=dtype)
            else:
                feeds["bias"] = np.zeros((1, 1, 1, 1), dtype=dtype)
        if "alpha" in graph_inputs:
            feeds["alpha"] = np.array(params.alpha, dtype=dtype)
        return feeds, dims, keep, valid_keys

    def run(self, task: AttentionTask) -> AttentionResult:
        if not self.ready:
            raise RuntimeError(self.not_ready_reason)
        name = self.graph_for(task)
        if name is None:
            raise RuntimeError(self.unsupported_reason(task) or "no ONNX graph serves this request")
        feeds, dims, keep, valid_keys = self._feeds(task, name)
        dtype = np.dtype(task.dtype)
        S = dims.S
        inputs = task.inputs
        relu = task.params.normalizer == "relu"
        # The weights are fetched whenever the graph computes them anyway (the primitive graphs run
        # every node whatever is fetched): they show rows whose scores all overflowed to -inf.
        has_weights = "weights" in self._output_names[name]
        fetch_weights = task.need_weights or (has_weights and not self._fused[name])
        wanted = ["output"] + (["weights"] if fetch_weights else []) + (["scores"] if task.need_scores else [])
        fetched = dict(zip(wanted, self._sessions[name].run(wanted, feeds), strict=True))
        # The graph and dims are known here: no second graph lookup and shape check through self.cost.
        peak = onnx_cost(
            name, dims, dtype=dtype.name, need_weights=task.need_weights, need_scores=task.need_scores
        ).peak_bytes
        if peak > TRIM_AFTER_BYTES:
            release_free_heap()
        output = fetched["output"]
        weights = fetched.get("weights")
        scores = fetched.get("scores")

        # Overflow is a 422 on both engines alike, never a silent dead row or a null score.
        if scores is not None:
            check_scores_finite(scores, keep, dtype)
        if weights is not None and not relu:  # a live row's weights sum to 1; relu rows may be all 0
            check_live_rows(weights.sum(axis=-1) == 0, valid_keys, dtype)
        # The contract, whatever the runtime did: fully masked rows are all zeros.
        empty = valid_keys == 0
        if empty.any():
            output[empty] = 0
            if weights is not None:
                weights[empty] = 0
        if not np.isfinite(output).all():
            raise overflow_error(dtype, "the attention output is not finite: the scores")
        if not task.need_weights:
            weights = None
        lead = inputs.query.shape[:-1]
        rank = inputs.query.ndim
        return AttentionResult(
            output=output.reshape(lead + (dims.Ev,)) if rank < 4 else output,
            weights=None if weights is None else weights.reshape(lead + (S,)),
            scores=None if scores is None else scores.reshape(lead + (S,)),
            valid_keys=valid_keys,
        )

    # ------------------------------------------------------------------ backward (optional capability)
    def backward_graph_for(self, task: BackwardTask) -> str | None:
        """Name of the backward graph that would run ``task`` (None when no graph serves it)."""
        key = self._request_key(task.task)
        if isinstance(key, str):
            return None
        normalizer, dtype, _, _ = key
        for g in self._graphs:
            s = g["supports"]
            if s.get("pass") == "backward" and s["normalizer"] == normalizer and s["dtype"] == dtype:
                return str(g["name"])
        return None

    def backward_unsupported_reason(self, task: BackwardTask) -> str | None:
        if not self.ready:
            return self.not_ready_reason
        key = self._request_key(task.task)
        if isinstance(key, str):
            return key
        if self.backward_graph_for(task) is None:
            normalizer, dtype, _, _ = key
            return f"no ONNX backward graph serves normalizer {normalizer} in {dtype}"
        params, compute = task.task.params, task.task.dtype
        factor = score_factor(resolved_scale(params, task.task.inputs.query.shape[-1]), params.temperature, compute)
        if widened_factor(factor, compute):
            # the graph would take scale / T as float32, where it underflows (the forward pass scales the
            # query in float64 instead; dQ = (scale / T) dZ K would need the same outside the graph)
            return f"scale / temperature = {float(factor):.3g} underflows {np.dtype(compute).name} in the graph"
        return None

    def run_backward(self, task: BackwardTask) -> BackwardResult:
        """The backward graph's gradients of Q, K and V, and what is derived from its other outputs.

        The mask, scale and temperature gradients and the gradient health come from
        the graph's ``grad_scores``, ``scores`` and ``weights`` by the formulas of
        :func:`service.core.backward.run_backward`.
        """
        if not self.ready:
            raise RuntimeError(self.not_ready_reason)
        name = self.backward_graph_for(task)
        if name is None:
            raise RuntimeError(self.backward_unsupported_reason(task) or "no ONNX backward graph serves this request")
        unknown = set(task.want) - set(BACKWARD_RETURNS)
        if unknown:
            raise InvalidInput(f"unknown return values {sorted(unknown)}", ("return",))
        fwd = task.task
        feeds, dims, keep, valid_keys = self._feeds(fwd, name)
        dtype = np.dtype(fwd.dtype)
        lead = fwd.inputs.query.shape[:-1]
        feeds["grad_output"] = checked_gradient(task.grad_output, lead + (dims.Ev,), "grad_output", "output", dtype)
        feeds["grad_weights"] = (
            np.zeros((1, 1, 1, 1), dtype=dtype)
            if task.grad_weights is None
            else checked_gradient(task.grad_weights, lead + (dims.S,), "grad_weights", "weights", dtype)
        )
        mask = fwd.inputs.mask
        want = task.want
        if "grad_mask" in want and (mask is None or np.asarray(mask).dtype == bool):
            raise InvalidInput("grad_mask needs a float (additive) mask; this request has none", ("mask",))
        needed = {
            "grad_query": bool({"grad_query", "grad_scale"} & want),
            "grad_key": "grad_key" in want,
            "grad_value": "grad_value" in want,
            "output": "output" in want,
            # always: they show scores that overflowed (as the forward checks them)
            "weights": True,
            "scores": True,
            "grad_scores": bool({"grad_mask", "grad_temperature"} & want),
        }
        fetch = [n for n, needed_ in needed.items() if needed_]
        got = dict(zip(fetch, self._sessions[name].run(fetch, feeds), strict=True)) if fetch else {}
        # Overflow is a 422 on both engines alike, never a silent dead row.
        check_scores_finite(got["scores"], keep, dtype)
        check_live_rows(got["weights"].sum(axis=-1) == 0, valid_keys, dtype)
        empty = valid_keys == 0
        if empty.any():  # the contract, whatever the runtime did
            for n in ("output", "weights", "grad_query", "grad_scores"):
                if n in got:
                    got[n][empty] = 0
        for n in ("grad_query", "grad_key", "grad_value", "output"):
            if n in got and not np.isfinite(got[n]).all():
                raise NumericalError(
                    f"{n} is not finite in {dtype.name}: the scores or gradients overflowed; "
                    "retry with precision float64 or smaller inputs"
                )
        params = fwd.params
        T = params.temperature
        result = BackwardResult(valid_keys=valid_keys)
        if "grad_query" in want:
            result.grad_query = got["grad_query"].reshape(fwd.inputs.query.shape)
        if "grad_key" in want:
            result.grad_key = got["grad_key"].reshape(fwd.inputs.key.shape)
        if "grad_value" in want:
            result.grad_value = got["grad_value"].reshape(fwd.inputs.value.shape)
        if "output" in want:
            result.output = got["output"].reshape(lead + (dims.Ev,))
        if "weights" in want:
            result.weights = got["weights"].reshape(lead + (dims.S,))
        if "grad_scale" in want:
            scale = resolved_scale(params, dims.E)
            dq = got["grad_query"].astype(np.float64)
            result.grad_scale = float(np.sum(feeds["query"].astype(np.float64) * dq) / scale)
        if "grad_temperature" in want:
            z, dz = got["scores"], got["grad_scores"]
            result.grad_temperature = -float(np.sum(dz * np.where(np.isneginf(z), 0, z), dtype=np.float64)) / T
        if "grad_mask" in want and mask is not None:
            m4_shape = as_4d_mask(np.asarray(mask), dims.weights_shape).shape
            gm = sum_to_shape(got["grad_scores"].astype(np.float64), m4_shape) / T
            result.grad_mask = gm.astype(dtype).reshape(np.asarray(mask).shape)
        if "gradient_health" in want:
            norms = jacobian_norms(params.normalizer, got["weights"], alpha=params.alpha)
            result.gradient_health = gradient_health(norms, valid_keys, task.vanishing_threshold)
        for n in ("grad_scale", "grad_temperature"):
            value = getattr(result, n)
            if value is not None and not math.isfinite(value):
                raise NumericalError(f"{n} is not finite; retry with precision float64 or smaller inputs")
        return result

    # ------------------------------------------------------------------ reporting
    def describe(self) -> dict[str, Any]:
        """JSON-ready state for /v1/engines."""
        return {
            "name": self.name,
            "provider": self.provider,
            "ready": self.ready,
            "error": self._error,
            "status": self._state,
            "not_ready_reason": self.not_ready_reason,
            "onnxruntime_version": self._ort_version or _ort_version(),
            "available_providers": self._available_providers or _available_providers(),
            "requested_providers": self._requested_providers,
            "active_providers": self._active_providers,
            "configured_providers": self.configured_providers,
            "provider_warnings": [public_reason(w) for w in self._warnings],
            "intra_op_threads": self.intra_op_threads,
            "graph_optimization_level": self.graph_optimization_level,
            "memory_arena": self.memory_arena,
            "models_source": models_source(self.models_dir),
            "graphs": {name: dict(t) for name, t in self._timings.items()},
        }

    def models(self) -> dict[str, Any]:
        """JSON-ready manifest for /v1/models, with the result of the start-up hash check."""
        if self._manifest is not None:
            manifest = self._manifest
            verified = True
        else:
            try:
                manifest = json.loads((self.models_dir / MANIFEST_NAME).read_text())
            except (OSError, ValueError):
                manifest = {"graphs": []}
            verified = False
        return {
            "models_source": models_source(self.models_dir),
            "verified": verified,
            "error": self._error,
            "opset": manifest.get("opset"),
            "ir_version": manifest.get("ir_version"),
            "models": [
                {
                    # the hash stays on the server: "verified" says it matched at start-up
                    **{k: v for k, v in g.items() if k != "sha256"},
                    "verified": verified,
                    **({"timing": self._timings[g["name"]]} if g.get("name") in self._timings else {}),
                }
                for g in manifest.get("graphs", [])
            ],
        }


def models_source(models_dir: Path) -> str:
    """Where the graphs come from, in words (answers to clients name no server path)."""
    from service.models_location import checkout_models_dir, packaged_models_dir

    resolved = models_dir.resolve()
    for source, candidate in (("package", packaged_models_dir()), ("checkout", checkout_models_dir())):
        if candidate is not None and candidate.resolve() == resolved:
            return source
    return "ATTN_MODELS_DIR"


def _warmup_feeds(entry: dict[str, Any]) -> dict[str, np.ndarray]:
    """Small inputs for one warm-up run: GQA (4 query heads on 2 kv heads), a causal mask."""
    dtype = np.dtype(entry["supports"]["dtype"])
    types = {i["name"]: np.dtype(i["dtype"]) for i in entry["inputs"]}
    rng = np.random.default_rng(0)
    B, Hq, Hkv, L, S, E, Ev = 1, 4, 2, 3, 5, 8, 8
    feeds = {
        "query": rng.standard_normal((B, Hq, L, E)).astype(dtype),
        "key": rng.standard_normal((B, Hkv, S, E)).astype(dtype),
        "value": rng.standard_normal((B, Hkv, S, Ev)).astype(dtype),
        "keep_mask": np.tri(L, S, k=S - L, dtype=bool).reshape(1, 1, L, S),
        "bias": np.zeros((1, 1, 1, 1), dtype=dtype),
        "scale": np.array(1 / math.sqrt(E), dtype=types.get("scale", dtype)),
        "temperature": np.array(1.0, dtype=types.get("temperature", dtype)),
        "alpha": np.array(1.7, dtype=dtype),
        "grad_output": rng.standard_normal((B, Hq, L, Ev)).astype(dtype),
        "grad_weights": np.zeros((1, 1, 1, 1), dtype=dtype),
    }
    names = {i["name"] for i in entry["inputs"]}
    return {k: v for k, v in feeds.items() if k in names}


def _ort_version() -> str | None:
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    version: str = ort.__version__
    return version


def _available_providers() -> list[str]:
    try:
        import onnxruntime as ort
    except ImportError:
        return []
    return list(ort.get_available_providers())
