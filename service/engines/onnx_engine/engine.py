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

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np

from service.core.attention import (
    Dims,
    check_dims,
    resolved_scale,
    score_factor,
    widened_factor,
)
from service.core.backward import BACKWARD_RETURNS, BackwardResult, BackwardTask, checked_gradient
from service.core.errors import InvalidInput
from service.core.types import AttentionResult, AttentionTask
from service.engines.base import public_reason
from service.engines.cost import REFERENCE, Cost, CostModel
from service.engines.onnx_engine.backward import backward_result
from service.engines.onnx_engine.feeds import graph_feeds
from service.engines.onnx_engine.forward import forward_result
from service.engines.onnx_engine.heap import TRIM_AFTER_BYTES, malloc_huge_pages, release_free_heap
from service.engines.onnx_engine.manifest import ModelCheckError, models_listing, models_source, verify_models
from service.engines.onnx_engine.providers import available_providers, choose_providers, ort_version
from service.engines.onnx_engine.routing import backward_graph, forward_graph, request_key
from service.engines.onnx_engine.sessions import OPTIMIZATION_LEVELS, open_sessions

logger = logging.getLogger("service.engines.onnx")


class OnnxEngine:
    """Attention on ONNX Runtime over the graphs of ``models_dir``.

    ``providers``: execution providers in order of preference (full names or
    aliases such as ``"cuda"``); None picks the best available
    (:data:`PREFERRED_PROVIDERS`). ``intra_op_threads``: 0 lets ONNX Runtime
    choose (one per physical core). ``graph_optimization_level``: one of
    ``disable``, ``basic``, ``extended``, ``all``. ``warmup``: run each graph once
    at start so the first request does not pay for lazy initialisation.
    ``memory_arena``: keep ONNX Runtime's CPU memory arena (off by default: see :func:`.sessions.open_sessions`).
    ``cost_model``: prices its tasks (the data plane's; the reference machine's by default).
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
        cost_model: CostModel = REFERENCE,
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
        self.malloc_huge_pages = malloc_huge_pages()  # fresh buffers fault in 2 MiB at a time (.heap)
        self.cost_model = cost_model
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
        sessions, timings = open_sessions(
            ort,
            manifest,
            blobs,
            providers=self._requested_providers,
            intra_op_threads=self.intra_op_threads,
            graph_optimization_level=self.graph_optimization_level,
            memory_arena=self.memory_arena,
            warmup=self.warmup,
        )
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
        key = request_key(task)
        if isinstance(key, str):
            return None
        return forward_graph(self._graphs, key)

    def cost(self, task: AttentionTask) -> Cost | None:
        """Estimated time and peak memory of ``task`` on its graph (None when no graph serves it)."""
        graph = self.graph_for(task)
        if graph is None:
            return None
        inputs = task.inputs
        return self.cost_model.onnx_cost(
            graph,
            check_dims(inputs.query.shape, inputs.key.shape, inputs.value.shape),
            dtype=np.dtype(task.dtype).name,
            need_weights=task.need_weights,
            need_scores=task.need_scores,
            alpha=task.params.alpha,
        )

    def unsupported_reason(self, task: AttentionTask) -> str | None:
        if not self.ready:
            return self.not_ready_reason
        key = request_key(task)
        if isinstance(key, str):
            return key
        if self.graph_for(task) is None:
            return (
                f"no ONNX graph serves normalizer {key.normalizer} in {key.dtype} with outputs "
                f"{', '.join(sorted(key.outputs))}"
            )
        return None

    def _feeds(
        self, task: AttentionTask, name: str
    ) -> tuple[dict[str, np.ndarray], Dims, np.ndarray | None, np.ndarray]:
        """The inputs of graph ``name`` for ``task`` (:func:`.feeds.graph_feeds`)."""
        return graph_feeds(task, self._input_names[name], self._input_dtypes[name])

    def run(self, task: AttentionTask) -> AttentionResult:
        if not self.ready:
            raise RuntimeError(self.not_ready_reason)
        name = self.graph_for(task)
        if name is None:
            raise RuntimeError(self.unsupported_reason(task) or "no ONNX graph serves this request")
        feeds, dims, keep, valid_keys = self._feeds(task, name)
        dtype = np.dtype(task.dtype)
        # The weights are fetched whenever the graph computes them anyway (the primitive graphs run
        # every node whatever is fetched): they show rows whose scores all overflowed to -inf.
        has_weights = "weights" in self._output_names[name]
        fetch_weights = task.need_weights or (has_weights and not self._fused[name])
        wanted = ["output"] + (["weights"] if fetch_weights else []) + (["scores"] if task.need_scores else [])
        fetched = dict(zip(wanted, self._sessions[name].run(wanted, feeds), strict=True))
        # The graph and dims are known here: no second graph lookup and shape check through self.cost.
        peak = self.cost_model.onnx_cost(
            name,
            dims,
            dtype=dtype.name,
            need_weights=task.need_weights,
            need_scores=task.need_scores,
            alpha=task.params.alpha,
        ).peak_bytes
        if peak > TRIM_AFTER_BYTES:
            release_free_heap()
        return forward_result(task, fetched, dims, keep, valid_keys)

    # ------------------------------------------------------------------ backward (optional capability)
    def backward_graph_for(self, task: BackwardTask) -> str | None:
        """Name of the backward graph that would run ``task`` (None when no graph serves it)."""
        key = request_key(task.task)
        if isinstance(key, str):
            return None
        return backward_graph(self._graphs, key)

    def backward_unsupported_reason(self, task: BackwardTask) -> str | None:
        if not self.ready:
            return self.not_ready_reason
        key = request_key(task.task)
        if isinstance(key, str):
            return key
        if self.backward_graph_for(task) is None:
            return f"no ONNX backward graph serves normalizer {key.normalizer} in {key.dtype}"
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
        return backward_result(task, got, feeds, dims, keep, valid_keys)

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
            "onnxruntime_version": self._ort_version or ort_version(),
            "available_providers": self._available_providers or available_providers(),
            "requested_providers": self._requested_providers,
            "active_providers": self._active_providers,
            "configured_providers": self.configured_providers,
            "provider_warnings": [public_reason(w) for w in self._warnings],
            "intra_op_threads": self.intra_op_threads,
            "graph_optimization_level": self.graph_optimization_level,
            "memory_arena": self.memory_arena,
            "malloc_huge_pages": self.malloc_huge_pages,
            "models_source": models_source(self.models_dir),
            "graphs": {name: dict(t) for name, t in self._timings.items()},
        }

    def models(self) -> dict[str, Any]:
        """JSON-ready manifest for /v1/models, with the result of the start-up hash check."""
        return models_listing(self.models_dir, self._manifest, self._error, self._timings)
