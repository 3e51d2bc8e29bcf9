"""What the operations need of their data plane: the engine dispatcher, the cost model, the limits and the
diagnostics' settings.

Built once per data plane from its settings (:meth:`Context.from_settings`), shared by its requests.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from service.core.backward import BackwardResult, BackwardTask
from service.core.diagnostics import DiagnosticThresholds
from service.core.types import NORMALIZERS, AttentionResult, AttentionTask
from service.dataplane.budget import Budget
from service.dataplane.errors import invalid, too_large, unavailable
from service.dataplane.sessions.store import SessionStore
from service.dataplane.tensors import TensorLimits
from service.engines.base import EngineChoice
from service.engines.cost import CostModel
from service.engines.dispatch import Admit, EngineDispatcher, EngineNotReady, EngineOverBudget, EngineUnavailable
from service.observability.spans import span
from service.settings import Settings

NOT_READY_RETRY_AFTER_S = 5
"""Retry hint while an engine is starting (none once its start-up failed: retrying cannot help)."""


class EngineObserver(Protocol):
    """Told how long each engine run took (the metrics implement it)."""

    def engine_ran(self, engine: str, provider: str, model: str, normalizer: str, seconds: float) -> None: ...


@dataclass(frozen=True, slots=True)
class Context:
    """The parts of a data plane that every operation reads."""

    dispatcher: EngineDispatcher
    budget: Budget
    costs: CostModel
    """The cost model that prices a request's work (the plane's, with this machine's calibration factors)."""
    limits: TensorLimits
    """Limits of attention and softmax tensors."""
    logits_limits: TensorLimits
    """Limits of sample and calibrate logits: rank 1 or 2, any axis up to ``max_vocab`` (a 256k vocabulary)."""
    thresholds: DiagnosticThresholds
    vanishing_threshold: float
    saturation_margin: float
    max_rows: int
    """Most rows of (N, V) logits (``ATTN_MAX_DIM``)."""
    observer: EngineObserver | None = None
    sessions: SessionStore | None = None
    """The plane's attention sessions (None where they are not served: several workers, ``ATTN_SESSIONS=false``)."""

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        dispatcher: EngineDispatcher,
        observer: EngineObserver | None = None,
        *,
        costs: CostModel | None = None,
        sessions: SessionStore | None = None,
    ) -> Context:
        """The context of ``settings``; ``costs``: its plane's cost model (default: the settings' calibration)."""
        s = settings
        return cls(
            dispatcher=dispatcher,
            budget=Budget(
                max_work_flops=s.max_work_flops,
                max_response_bytes=s.max_response_bytes,
                max_memory_bytes=s.memory_budget_bytes,
            ),
            costs=costs if costs is not None else CostModel(s.cost_factors()),
            limits=TensorLimits(max_rank=s.max_rank, max_dim=s.max_dim, max_elements=s.max_tensor_elements),
            logits_limits=TensorLimits(
                max_rank=2, max_dim=max(s.max_dim, s.max_vocab), max_elements=s.max_tensor_elements
            ),
            thresholds=s.diagnostic_thresholds(),
            vanishing_threshold=s.diag_vanishing_threshold,
            saturation_margin=s.diag_saturation_margin,
            max_rows=s.max_dim,
            observer=observer,
            sessions=sessions,
        )

    def run_engine(
        self, model: str, task: AttentionTask | BackwardTask, requested: str, admit: Admit
    ) -> tuple[AttentionResult | BackwardResult, EngineChoice]:
        """Run ``task`` on the engine the dispatcher picks; timed (metrics, the ``engine`` span), its refusals
        as service errors: over a limit ``TOO_LARGE``, an engine that cannot serve it ``INVALID`` (naming
        ``engine``), one not ready ``UNAVAILABLE``.
        """
        params = task.task.params if isinstance(task, BackwardTask) else task.params
        normalizer = params.normalizer if params.normalizer in NORMALIZERS else "other"
        run: Callable[..., tuple[AttentionResult | BackwardResult, EngineChoice]] = (
            self.dispatcher.run_backward if isinstance(task, BackwardTask) else self.dispatcher.run
        )
        t0 = time.perf_counter()
        try:
            with span("engine", {"attn.model": model, "attn.normalizer": normalizer}):
                result, choice = run(task, requested, admit)
        except EngineOverBudget as exc:
            raise too_large(str(exc)) from None
        except EngineUnavailable as exc:
            raise invalid(str(exc), "engine") from None
        except EngineNotReady as exc:
            raise unavailable(str(exc), None if exc.failed else NOT_READY_RETRY_AFTER_S) from None
        if self.observer is not None:
            self.observer.engine_ran(choice.name, choice.provider, model, normalizer, time.perf_counter() - t0)
        return result, choice
