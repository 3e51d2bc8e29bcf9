"""Choosing the engine for a request.

``engine: "auto"`` walks the preferred order (ONNX first, numpy last) and takes
the first engine that is ready and supports the task; the reason says why, e.g.
``auto: onnx graph softmax_fused_f32 supports this request`` or
``auto: onnx cannot run this request (<the ONNX engine's reason>); using numpy``.
A named engine either runs the task or says why not:
:class:`EngineUnavailable` (invalid input: the engine cannot serve this request,
or is not enabled) or :class:`EngineNotReady` (not ready: try again later).

The backward pass (:class:`~service.core.backward.BackwardTask`) is dispatched
the same way, in the same order, among the engines that implement the optional
:class:`~service.engines.base.BackwardEngine` capability; the others are
skipped with the reason "no backward pass".
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import cast

from service.core.attention import ScoreOverflow, explain_score_overflow
from service.core.backward import BackwardResult, BackwardTask
from service.core.errors import InvalidInput, NumericalError
from service.core.types import AttentionResult, AttentionTask
from service.engines.base import Engine, EngineChoice, fallible, runs_graphs, with_backward

logger = logging.getLogger("service.engines.dispatch")

# Up to this many attention scores (B*Hq*L*S), ``auto`` tries numpy first: on the
# benchmark machine numpy answered a (1, 4, 32, 32) request with weights and
# scores in 98 us against ONNX Runtime's 119 us (session.run has a fixed cost of
# ~45-90 us), while from (1, 8, 64, 64) on ONNX is about twice as fast.
SMALL_TASK_SCORES = 4096

# Above this many scores, a task that returns its weights tries numpy first when ONNX Runtime runs on
# the CPU without its memory arena (the default, ATTN_ONNX_MEMORY_ARENA): every run then allocates
# its full-size intermediates afresh, and numpy's chunked pass is faster. Measured in one run
# (2026-11-23, 2 cores, float32 softmax, numpy ms / ONNX ms): (1, 8, 512, 64), 2.1M scores, with
# weights 9.8 / 5.8, with weights and scores 13.0 / 13.7; (4, 12, 512, 64), 12.6M scores, 42 / 52
# and 40 / 89; output only ONNX stays ahead (35 / 28). With the arena ONNX keeps the lead
# ((4, 12, 512, 64) with weights: 33 ms) but holds its peak memory.
LARGE_TASK_SCORES = 1 << 22

# sparsemax and entmax15 try numpy first when ONNX Runtime runs on the CPU: numpy's sort-based pass
# beat the ONNX graphs (TopK and cumulative sums over full-size tensors) at every size measured, with
# and without weights, with and without the arena (same run, numpy ms / ONNX ms, with weights):
# (1, 8, 64, 64) sparsemax 0.7 / 1.8, entmax15 0.9 / 1.7; (1, 8, 128, 64) 2.5 / 7.0 and 3.7 / 7.5
# (arena on: 3.2 / 6.4 and 4.6 / 7.3); (1, 8, 512, 64) 20.5 / 84.7 and 33.1 / 95.7. alpha-entmax
# (bisection) was mixed (0.58x to 1.17x) and keeps the default order.
NUMPY_FIRST_NORMALIZERS = frozenset({"sparsemax", "entmax15"})


# The backward pass tries numpy first: its chunked, multi-threaded backward measured 1.6x to 2.9x
# faster than the ONNX backward graph, which materialises every (B, Hq, L, S) intermediate
# (bench/bench_backward.py; one thread each, (2, 12, 256, 64): 40 against 64 ms, (4, 12, 512, 64):
# 243 against 696 ms), while the forward passes ran about as fast.
BACKWARD_AUTO_ORDER = ("numpy", "onnx")
BACKWARD_ORDER_REASON = "numpy's chunked backward pass is faster than the ONNX backward graph"


class EngineUnavailable(Exception):
    """The requested engine cannot run this request; the message says why (invalid input)."""


class EngineNotReady(Exception):
    """The requested engine is not ready yet, or failed to start; the message says why (not ready).

    ``failed``: its start-up failed, so it stays unavailable until the process restarts and retrying the
    same request cannot help; else it is starting, and a retry later may succeed.
    """

    def __init__(self, message: str, *, failed: bool = False) -> None:
        super().__init__(message)
        self.failed = failed


class EngineOverBudget(Exception):
    """The request is over a limit on the engine that would run it (or on every engine, under ``auto``): too large."""


Admit = Callable[[Engine, AttentionTask | BackwardTask], str | None]
"""Called with each engine that could run a task: None admits it (and may reserve what it needs),
a sentence says why the task is over a limit there (the engine is then skipped under ``auto``)."""


@lru_cache(maxsize=1024)
def _small_reason(scores: int) -> str:
    """Why ``auto`` tries numpy first for a request of ``scores`` scores (built once per size, not per request)."""
    return f"small request ({scores} scores): numpy has the lower per-call overhead"


@lru_cache(maxsize=1024)
def _large_reason(scores: int) -> str:
    """Why ``auto`` tries numpy first for a large request that returns weights (once per size)."""
    return (
        f"large request returning weights ({scores} scores): numpy's chunked pass is faster than ONNX Runtime "
        "on the CPU without its memory arena or huge pages"
    )


# A short query (fewer than this many rows: a decoding step) tries numpy first when ONNX Runtime runs on the CPU:
# numpy's pass is a few matrix-vector products that read the keys and values once, in place, while ONNX Runtime's
# Attention kernel (the graph such queries get: FlashAttention splits its work by blocks of query rows, and the
# flash graph takes at least this many) varied fivefold. Measured in four runs (2026-11-27, `python -m bench
# kernels`, float32, output only): (1, 32, 1, 128) over 8,192 keys, numpy 40, 39, 38 and 33 ms; ONNX 122, 118, 24 and
# 65 ms.
SHORT_QUERY_ROWS = 16


@lru_cache(maxsize=64)
def _short_reason(rows: int) -> str:
    """Why ``auto`` tries numpy first for a query of ``rows`` rows (once per length)."""
    return (
        f"short query ({rows} rows, a decoding step): numpy reads the keys and values once, in place, steadier "
        "than ONNX Runtime's Attention kernel"
    )


VIEW_REASON = (
    "keys and values that are a view of a larger buffer (an attention session's cache): numpy reads them in place, "
    "ONNX Runtime would copy them first"
)


@lru_cache(maxsize=8)
def _sorting_reason(normalizer: str) -> str:
    return f"{normalizer}: numpy's sort-based pass is faster than the ONNX graph on the CPU"


def _on_cpu(engine: Engine | None) -> bool:
    """An engine on ONNX Runtime's CPU execution provider (numpy's provider is "CPU/numpy")."""
    return engine is not None and engine.provider == "CPUExecutionProvider"


@lru_cache(maxsize=1024)
def _auto_choice(name: str, provider: str, why_order: str) -> EngineChoice:
    """The (immutable) choice of ``auto`` for an order reason such as :func:`_small_reason`, built once."""
    return EngineChoice(name, provider, f"auto: {why_order}")


def _not_ready_reason(engine: Engine) -> str:
    reason = engine.not_ready_reason if fallible(engine) else None
    return reason or f"engine {engine.name!r} is not ready"


def _what_runs(engine: Engine, task: AttentionTask | BackwardTask) -> str:
    """``onnx graph softmax_fused_f32`` for engines that name their graphs, else the engine name."""
    graph = None
    if runs_graphs(engine):
        graph = engine.backward_graph_for(task) if isinstance(task, BackwardTask) else engine.graph_for(task)
    return f"{engine.name} graph {graph}" if graph else engine.name


def _unsupported(engine: Engine, task: AttentionTask | BackwardTask) -> str | None:
    """Why ``engine`` cannot run ``task`` (forward or backward), or None."""
    if isinstance(task, BackwardTask):
        if not with_backward(engine):
            return "it has no backward pass"
        return engine.backward_unsupported_reason(task)
    return engine.unsupported_reason(task)


def _runner(engine: Engine, task: AttentionTask | BackwardTask) -> Callable[[], AttentionResult | BackwardResult]:
    if isinstance(task, BackwardTask):
        assert with_backward(engine)
        return lambda: engine.run_backward(task)
    return lambda: engine.run(task)


class EngineDispatcher:
    """Picks the engine for each request among ``engines`` (name -> engine).

    ``preferred_auto_order`` is the order ``auto`` tries; engines not in it are
    only used when named.
    """

    def __init__(
        self,
        engines: Mapping[str, Engine],
        preferred_auto_order: Sequence[str] = ("onnx", "numpy"),
        *,
        small_task_scores: int = SMALL_TASK_SCORES,
        large_task_scores: int = LARGE_TASK_SCORES,
        backward_order: Sequence[str] = BACKWARD_AUTO_ORDER,
    ) -> None:
        self.engines = dict(engines)
        self.order = [name for name in preferred_auto_order if name in self.engines]
        self.backward_order = [name for name in backward_order if name in self.engines]
        self.small_task_scores = small_task_scores
        self.large_task_scores = large_task_scores
        self._numpy_first = ["numpy"] + [n for n in self.order if n != "numpy"]

    def _auto_order(self, task: AttentionTask | BackwardTask) -> tuple[list[str], str]:
        """The order ``auto`` tries for this task, and why, when it differs from the default."""
        if isinstance(task, BackwardTask):
            order = [n for n in self.backward_order if n in self.engines]
            order += [n for n in self.order if n not in order]
            return order, (BACKWARD_ORDER_REASON if order[:1] == ["numpy"] and self.order[:1] != ["numpy"] else "")
        forward = task
        q, k = forward.inputs.query.shape, forward.inputs.key.shape
        scores = math.prod(q[:-1]) * (k[-2] if len(k) >= 2 else 1)
        if "numpy" not in self.order or self.order[0] == "numpy":
            return self.order, ""
        if scores <= self.small_task_scores:
            return self._numpy_first, _small_reason(scores)
        first = self.engines.get(self.order[0])
        if not _on_cpu(first):
            return self.order, ""
        if not (forward.inputs.key.flags.c_contiguous and forward.inputs.value.flags.c_contiguous):
            return self._numpy_first, VIEW_REASON
        rows = q[-2] if len(q) >= 2 else 1
        if rows < SHORT_QUERY_ROWS:
            return self._numpy_first, _short_reason(rows)
        normalizer = forward.params.normalizer
        if normalizer in NUMPY_FIRST_NORMALIZERS:
            return self._numpy_first, _sorting_reason(normalizer)
        # Without its arena or huge pages ONNX Runtime faults every large intermediate in afresh, 4 KiB at a time.
        fresh_pages = runs_graphs(first) and not (first.memory_arena or first.malloc_huge_pages)
        if 0 < self.large_task_scores < scores and forward.need_weights and fresh_pages:
            return self._numpy_first, _large_reason(scores)
        return self.order, ""

    def select(
        self, task: AttentionTask | BackwardTask, requested: str, admit: Admit | None = None
    ) -> tuple[Engine, EngineChoice]:
        """The engine to run ``task`` and the :class:`EngineChoice` to report.

        Raises :class:`EngineUnavailable` or :class:`EngineNotReady` as described
        in the module docstring, and :class:`EngineOverBudget` when ``admit``
        refuses the named engine, or every engine that could run the task.
        """
        if requested != "auto":
            return self._select_named(task, requested, admit)
        skipped: list[str] = []
        over: list[str] = []
        order, why_order = self._auto_order(task)
        for name in order:
            engine = self.engines[name]
            if not engine.ready:
                skipped.append(f"{name} is not ready ({_not_ready_reason(engine)})")
                continue
            reason = _unsupported(engine, task)
            if reason:
                skipped.append(f"{name} cannot run this request ({reason})")
                continue
            too_costly = admit(engine, task) if admit is not None else None
            if too_costly:
                skipped.append(f"{name} is over a limit ({too_costly})")
                over.append(f"on {name}: {too_costly}")
                continue
            if skipped:
                why = f"auto: {'; '.join(skipped)}; using {name}"
            elif why_order:
                return engine, _auto_choice(engine.name, engine.provider, why_order)
            else:
                why = f"auto: {_what_runs(engine, task)} supports this request"
            return engine, EngineChoice(engine.name, engine.provider, why)
        if over:
            raise EngineOverBudget("; ".join(over))
        raise EngineUnavailable(
            "no engine can run this request: " + "; ".join(skipped or ["no engines are configured"])
        )

    def _select_named(
        self, task: AttentionTask | BackwardTask, requested: str, admit: Admit | None = None
    ) -> tuple[Engine, EngineChoice]:
        engine = self.engines.get(requested)
        if engine is None:
            enabled = ", ".join(sorted(self.engines)) or "none"
            raise EngineUnavailable(f"engine {requested!r} is not enabled on this server (enabled: {enabled})")
        if not engine.ready:
            why = _not_ready_reason(engine)
            if fallible(engine) and engine.failed:  # for good: say what serves instead
                others = " or ".join(repr(n) for n in ("auto", *self.engines) if n != requested)
                raise EngineNotReady(f"{why}; use engine {others}", failed=True)
            raise EngineNotReady(why)
        reason = _unsupported(engine, task)
        if reason:
            raise EngineUnavailable(f"engine {requested!r} cannot run this request: {reason}")
        too_costly = admit(engine, task) if admit is not None else None
        if too_costly:
            raise EngineOverBudget(too_costly)
        return engine, EngineChoice(engine.name, engine.provider, f"requested: {_what_runs(engine, task)}")

    def run(
        self, task: AttentionTask, requested: str, admit: Admit | None = None
    ) -> tuple[AttentionResult, EngineChoice]:
        """Select an engine and run the forward ``task`` on it (see :meth:`_run`)."""
        result, choice = self._run(task, requested, admit)
        return cast(AttentionResult, result), choice

    def run_backward(
        self, task: BackwardTask, requested: str, admit: Admit | None = None
    ) -> tuple[BackwardResult, EngineChoice]:
        """Select an engine with a backward pass and run ``task`` on it (see :meth:`_run`)."""
        result, choice = self._run(task, requested, admit)
        return cast(BackwardResult, result), choice

    def _run(
        self, task: AttentionTask | BackwardTask, requested: str, admit: Admit | None = None
    ) -> tuple[AttentionResult | BackwardResult, EngineChoice]:
        """Select an engine and run ``task`` on it.

        Contract errors (:class:`InvalidInput`, :class:`NumericalError`) propagate
        from any engine. Any other failure of an engine under ``auto`` falls back
        to the next engine in order (logged with the traceback; the reason names
        the exception type only, no internals). A named engine's failure is a
        server fault and propagates (the front ends answer an internal error and log
        it with the request id): blaming the client would be wrong.
        """
        engine, choice = self.select(task, requested, admit)
        try:
            return _runner(engine, task)(), choice
        except ScoreOverflow as exc:  # the engines' cheap check found it; name the score and the cause
            forward = task.task if isinstance(task, BackwardTask) else task
            raise explain_score_overflow(exc, forward.inputs, forward.params, forward.dtype) from None
        except (InvalidInput, NumericalError):
            raise
        except Exception as exc:
            if requested != "auto":
                raise
            logger.exception("engine %s failed on a request; falling back", engine.name)
            failure = f"{engine.name} failed ({type(exc).__name__}, logged)"
            position = next(i for i, name in enumerate(self.order) if self.engines[name] is engine)
            for name in self.order[position + 1 :]:
                fallback = self.engines[name]
                if fallback.ready and not _unsupported(fallback, task) and (admit is None or not admit(fallback, task)):
                    return _runner(fallback, task)(), EngineChoice(
                        fallback.name, fallback.provider, f"{choice.reason}; but {failure}; using {name}"
                    )
            raise
