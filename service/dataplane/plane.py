"""One app's data plane: its engines and their cost model, admission, memory budget (and the request bodies' share
of it), scheduler, the operations' context, the inference statistics, and the door every request that does work
enters through (:mod:`service.dataplane.door`). Everything a plane holds is its own: two apps in one process
(each with its plane) keep their own limits, budgets and calibration.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from service.dataplane.admission import Admission
from service.dataplane.auth import ApiKeys
from service.dataplane.context import Context, EngineObserver
from service.dataplane.door import Door
from service.dataplane.heap import HeapTrimmer, release_free_heap
from service.dataplane.memory import MemoryBudget
from service.dataplane.runtime import Runtime
from service.dataplane.scheduling import Scheduler, SchedulerObserver
from service.dataplane.sessions.store import SessionObserver, SessionStore
from service.dataplane.statistics import InferenceStatistics, StatisticsStore
from service.engines.base import Engine
from service.engines.cost import CostModel
from service.engines.dispatch import EngineDispatcher
from service.settings import Settings


class Observer(SchedulerObserver, EngineObserver, StatisticsStore, SessionObserver, Protocol):
    """Everything the data plane reports (the service's metrics implement it), and the statistics it reads back."""

    def admission_changed(self, computing: int, queued: int) -> None: ...


class DataPlane:
    """The data plane of one process, shared by every front end (REST and gRPC): a request that one front end
    admitted counts against the other's capacity, and both read the same engines and budgets.
    """

    def __init__(
        self,
        settings: Settings,
        engines: Mapping[str, Engine],
        *,
        observer: Observer | None = None,
        costs: CostModel | None = None,
    ) -> None:
        s = self.settings = settings
        self.costs = costs if costs is not None else CostModel(s.cost_factors())
        """The cost model of this plane's operations (``ATTN_COST_CALIBRATION``); its engines price with it too when
        they were built with it (:func:`service.app.default_engines`)."""
        self.runtime = Runtime(settings=settings, engines=dict(engines))
        self.dispatcher = EngineDispatcher(
            self.runtime.engines,
            small_task_scores=s.auto_numpy_max_scores,
            large_task_scores=s.auto_numpy_large_scores,
        )
        self.memory = MemoryBudget(s.memory_budget_bytes, s.queue_timeout_s, s.retry_after_s)
        self.sessions = (
            SessionStore(
                self.memory.share(s.session_cache_limit(), "session caches"),
                idle_s=s.session_idle_s,
                max_positions=s.session_max_positions,
                max_per_key=s.session_max_per_key,
                observer=observer,
            )
            if s.sessions_served()
            else None
        )
        """The attention sessions' caches (:mod:`.sessions`), on their share of the memory budget; None where they
        are not served (several workers, ``ATTN_SESSIONS=false``)."""
        self.context = Context.from_settings(
            settings, self.dispatcher, observer, costs=self.costs, sessions=self.sessions
        )
        self.body_share = self.memory.share(s.body_memory_limit(), "request bodies")
        """The share of the budget that admitted request bodies (REST) and messages (gRPC) hold together, until
        their request ends (``ATTN_BODY_MEMORY_BYTES``): one share for both front ends.
        """
        self.admission = Admission(
            slots=s.max_concurrent_requests,
            max_queue=s.max_queued_requests,
            target_wait_s=min(s.queue_target_s, s.queue_timeout_s),
            queue_timeout_s=s.queue_timeout_s,
            min_retry_after_s=s.retry_after_s,
            on_change=None if observer is None else observer.admission_changed,
        )
        self.scheduler = Scheduler(
            self.admission,
            self.memory,
            inline_max_body_bytes=s.inline_max_body_bytes,
            inline_max_work_flops=s.inline_max_work_flops,
            observer=observer,
        )
        self.trimmer = HeapTrimmer(release_free_heap)
        """Gives the C heap's free memory back after this plane's requests (its thread ends when the app stops)."""
        self.statistics = InferenceStatistics(observer)
        """The statistics extension: the inference requests of both front ends, counted in the observer's metrics."""
        self.door = Door(
            admission=self.admission,
            body_share=self.body_share,
            scheduler=self.scheduler,
            context=self.context,
            runtime=self.runtime,
            statistics=self.statistics,
            trimmer=self.trimmer,
            debug_delay_s=s.debug_delay_s,
            observer=observer,
        )
        """The door every request that does work enters, from either front end (:mod:`.door`)."""
        self.api_keys = ApiKeys([key.get_secret_value() for key in s.api_keys]) if s.api_keys else None
        self.auth_exempt = frozenset(s.auth_exempt_paths)
        """REST paths and gRPC methods (``/package.Service/Method``) served without a key (probes, scrapes)."""

    def close(self) -> None:
        """Stop this plane's threads (the heap trimmer's, the sessions' sweeper) and free the sessions' caches."""
        self.trimmer.close()
        if self.sessions is not None:
            self.sessions.close()

    def needs_key(self, path: str) -> bool:
        """Whether a request for ``path`` (a REST path or a gRPC method's full name) must present an API key:
        keys are configured and the path is not exempt (``ATTN_AUTH_EXEMPT_PATHS``). One rule for both front
        ends, applied before any of a request's body or message is read.
        """
        return self.api_keys is not None and path not in self.auth_exempt
