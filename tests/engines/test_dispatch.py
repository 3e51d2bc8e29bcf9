"""Engine dispatch: auto picks ONNX when it is ready and supports the request, else numpy, and says why."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from service.core.backward import BackwardTask
from service.core.errors import InvalidInput
from service.core.types import AttentionInputs, AttentionParams, AttentionResult, AttentionTask
from service.engines.dispatch import EngineDispatcher, EngineNotReady, EngineUnavailable
from service.engines.numpy_engine import NumpyEngine
from service.engines.onnx_engine import OnnxEngine
from service.export import DEFAULT_MODELS_DIR


class FakeEngine:
    """An engine whose readiness, support and failures the test controls."""

    def __init__(
        self, name: str, *, ready: bool = True, unsupported: str | None = None, fail: Exception | None = None
    ) -> None:
        self.name = name
        self._ready = ready
        self.unsupported = unsupported
        self.fail = fail
        self.calls = 0

    @property
    def provider(self) -> str:
        return f"{self.name}-provider"

    @property
    def ready(self) -> bool:
        return self._ready

    # Fallible, declared in full (service/engines/base.py): the dispatcher reads not_ready_reason only through it
    failed = False
    failure: str | None = None
    failure_detail: str | None = None

    @property
    def not_ready_reason(self) -> str | None:
        return None if self._ready else f"{self.name} is warming up"

    def unsupported_reason(self, task: AttentionTask) -> str | None:
        return self.unsupported

    def run(self, task: AttentionTask) -> AttentionResult:
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        return AttentionResult(output=np.zeros(1), weights=None, scores=None, valid_keys=np.zeros(1, dtype=np.int64))

    def describe(self) -> dict[str, Any]:
        return {"name": self.name}


def a_task(
    normalizer: str = "softmax", alpha: float | None = None, dtype: str = "float32", need_weights: bool = False
) -> AttentionTask:
    rng = np.random.default_rng(0)
    return AttentionTask(
        # 2*48*48 scores: above SMALL_TASK_SCORES, so auto keeps its default order
        inputs=AttentionInputs(
            rng.standard_normal((2, 48, 8)), rng.standard_normal((2, 48, 8)), rng.standard_normal((2, 48, 8))
        ),
        params=AttentionParams(normalizer=normalizer, alpha=alpha),
        dtype=np.dtype(dtype),
        need_weights=need_weights,
    )


# ------------------------------------------------------------------------------ with fakes


def test_auto_prefers_the_first_ready_engine_that_supports_the_task() -> None:
    onnx, numpy = FakeEngine("onnx"), FakeEngine("numpy")
    engine, choice = EngineDispatcher({"numpy": numpy, "onnx": onnx}).select(a_task(), "auto")
    assert engine is onnx
    assert choice.name == "onnx" and choice.provider == "onnx-provider"
    assert choice.reason == "auto: onnx supports this request"


def test_auto_tries_numpy_first_on_small_requests() -> None:
    onnx, numpy = FakeEngine("onnx"), FakeEngine("numpy")
    d = EngineDispatcher({"onnx": onnx, "numpy": numpy})
    rng = np.random.default_rng(0)
    small = AttentionTask(
        AttentionInputs(
            rng.standard_normal((1, 4, 16, 8)), rng.standard_normal((1, 4, 64, 8)), rng.standard_normal((1, 4, 64, 8))
        )
    )
    engine, choice = d.select(small, "auto")  # 1*4*16*64 = 4096 scores
    assert (
        engine is numpy and choice.reason == "auto: small request (4096 scores): numpy has the lower per-call overhead"
    )
    bigger = AttentionTask(AttentionInputs(rng.standard_normal((1, 4, 17, 8)), small.inputs.key, small.inputs.value))
    assert d.select(bigger, "auto")[0] is onnx
    assert d.select(small, "onnx")[0] is onnx  # a named engine is always honoured


def test_auto_falls_back_when_not_ready_or_unsupported() -> None:
    numpy = FakeEngine("numpy")
    d = EngineDispatcher({"onnx": FakeEngine("onnx", ready=False), "numpy": numpy})
    engine, choice = d.select(a_task(), "auto")
    assert engine is numpy and choice.reason == "auto: onnx is not ready (onnx is warming up); using numpy"

    d = EngineDispatcher(
        {"onnx": FakeEngine("onnx", unsupported="entmax with alpha=1.7 has no ONNX graph"), "numpy": numpy}
    )
    engine, choice = d.select(a_task(), "auto")
    assert engine is numpy
    assert choice.reason == "auto: onnx cannot run this request (entmax with alpha=1.7 has no ONNX graph); using numpy"


def test_auto_with_no_capable_engine() -> None:
    d = EngineDispatcher({"onnx": FakeEngine("onnx", unsupported="no"), "numpy": FakeEngine("numpy", ready=False)})
    with pytest.raises(EngineUnavailable, match="no engine can run this request: onnx cannot"):
        d.select(a_task(), "auto")


def test_named_engine() -> None:
    onnx, numpy = FakeEngine("onnx"), FakeEngine("numpy")
    d = EngineDispatcher({"onnx": onnx, "numpy": numpy})
    engine, choice = d.select(a_task(), "numpy")
    assert engine is numpy and choice.reason == "requested: numpy"
    with pytest.raises(EngineUnavailable, match="'tpu' is not enabled on this server"):
        d.select(a_task(), "tpu")
    onnx.unsupported = "precision float16 has no ONNX graph"
    with pytest.raises(EngineUnavailable, match="'onnx' cannot run this request: precision float16 has no ONNX graph"):
        d.select(a_task(), "onnx")
    onnx._ready = False
    with pytest.raises(EngineNotReady, match="onnx is warming up"):
        d.select(a_task(), "onnx")


def test_onnx_disabled() -> None:
    d = EngineDispatcher({"numpy": FakeEngine("numpy")})
    assert d.order == ["numpy"]
    with pytest.raises(EngineUnavailable, match="'onnx' is not enabled"):
        d.select(a_task(), "onnx")
    assert d.select(a_task(), "auto")[1].name == "numpy"


def test_run_falls_back_on_an_engine_failure_under_auto_only() -> None:
    onnx, numpy = FakeEngine("onnx", fail=RuntimeError("kernel exploded")), FakeEngine("numpy")
    d = EngineDispatcher({"onnx": onnx, "numpy": numpy})
    _, choice = d.run(a_task(), "auto")
    assert choice.name == "numpy" and "onnx failed (RuntimeError, logged); using numpy" in choice.reason
    assert "kernel exploded" not in choice.reason  # no internals in what the client sees
    with pytest.raises(RuntimeError, match="kernel exploded"):  # a server fault: the HTTP layer answers 500
        d.run(a_task(), "onnx")


def test_contract_errors_propagate() -> None:
    onnx, numpy = FakeEngine("onnx", fail=InvalidInput("bad shape")), FakeEngine("numpy")
    with pytest.raises(InvalidInput):
        EngineDispatcher({"onnx": onnx, "numpy": numpy}).run(a_task(), "auto")
    assert numpy.calls == 0


# ------------------------------------------------------------------------------ with the real engines


@pytest.fixture(scope="module")
def dispatcher() -> EngineDispatcher:
    onnx = OnnxEngine(DEFAULT_MODELS_DIR)
    onnx.start()
    assert onnx.ready
    return EngineDispatcher({"numpy": NumpyEngine(), "onnx": onnx})


def test_real_auto_names_the_graph(dispatcher: EngineDispatcher) -> None:
    result, choice = dispatcher.run(a_task(), "auto")
    assert choice.name == "onnx" and choice.provider == "CPUExecutionProvider"
    assert choice.reason == "auto: onnx graph softmax_flash_f32 supports this request"
    want = NumpyEngine().run(a_task())
    np.testing.assert_allclose(result.output, want.output, atol=1e-5)

    _, choice = dispatcher.select(a_task("entmax", alpha=1.7, dtype="float64", need_weights=True), "auto")
    assert choice.reason == "auto: onnx graph entmax_f64 supports this request"
    _, choice = dispatcher.select(a_task(), "onnx")
    assert choice.reason == "requested: onnx graph softmax_flash_f32"


def test_real_auto_uses_numpy_for_float16(dispatcher: EngineDispatcher) -> None:
    t = a_task(dtype="float16")
    engine, choice = dispatcher.select(t, "auto")
    assert choice.name == "numpy" and choice.provider == "CPU/numpy"
    assert (
        choice.reason
        == "auto: onnx cannot run this request (precision float16 has no ONNX graph (float32 and float64 only)); "
        "using numpy"
    )
    with pytest.raises(EngineUnavailable, match="float16"):
        dispatcher.select(t, "onnx")


# ------------------------------------------------------------------------------ numpy first by measured speed


class CpuOnnx(FakeEngine):
    """A fake ONNX engine on ONNX Runtime's CPU provider, with or without its memory arena and huge pages."""

    def __init__(
        self, *, memory_arena: bool = False, provider: str = "CPUExecutionProvider", malloc_huge_pages: bool = False
    ) -> None:
        super().__init__("onnx")
        self.memory_arena = memory_arena
        self.malloc_huge_pages = malloc_huge_pages
        self._provider = provider

    @property
    def provider(self) -> str:
        return self._provider

    # the rest of GraphEngine, which the dispatcher reads memory_arena and malloc_huge_pages through
    def graph_for(self, task: AttentionTask) -> str | None:
        return None

    def backward_graph_for(self, task: BackwardTask) -> str | None:
        return None

    def models(self) -> dict[str, Any]:
        return {}


@pytest.mark.parametrize("normalizer", ["sparsemax", "entmax15"])
def test_sort_based_normalizers_try_numpy_first_on_a_cpu_onnx(normalizer: str) -> None:
    numpy = FakeEngine("numpy")
    for arena in (False, True):  # faster with and without the arena
        engine, choice = EngineDispatcher({"numpy": numpy, "onnx": CpuOnnx(memory_arena=arena)}).select(
            a_task(normalizer), "auto"
        )
        assert engine is numpy
        assert choice.reason == f"auto: {normalizer}: numpy's sort-based pass is faster than the ONNX graph on the CPU"


@pytest.mark.parametrize(
    ("onnx", "normalizer", "alpha"),
    [
        (CpuOnnx(provider="CUDAExecutionProvider"), "sparsemax", None),  # a GPU keeps ONNX first
        (CpuOnnx(), "softmax", None),
        (CpuOnnx(), "relu", None),
        (CpuOnnx(), "entmax", 1.3),  # bisection: measured mixed, default order
    ],
)
def test_other_tasks_keep_onnx_first(onnx: CpuOnnx, normalizer: str, alpha: float | None) -> None:
    engine, _ = EngineDispatcher({"numpy": FakeEngine("numpy"), "onnx": onnx}).select(a_task(normalizer, alpha), "auto")
    assert engine is onnx


def test_large_tasks_with_weights_try_numpy_first_on_a_cpu_onnx_without_arena_or_huge_pages() -> None:
    numpy = FakeEngine("numpy")
    scores = 2 * 48 * 48  # a_task's

    def pick(onnx: CpuOnnx, need_weights: bool, large: int = scores - 1) -> str:
        dispatcher = EngineDispatcher({"numpy": numpy, "onnx": onnx}, large_task_scores=large)
        engine, choice = dispatcher.select(a_task(need_weights=need_weights), "auto")
        if engine is numpy:
            assert f"large request returning weights ({scores} scores)" in choice.reason
        return engine.name

    assert pick(CpuOnnx(), need_weights=True) == "numpy"
    assert pick(CpuOnnx(), need_weights=False) == "onnx"  # output only: the fused graph stays ahead
    assert pick(CpuOnnx(memory_arena=True), need_weights=True) == "onnx"  # with its arena ONNX is faster
    assert pick(CpuOnnx(malloc_huge_pages=True), need_weights=True) == "onnx"  # and with huge pages
    assert pick(CpuOnnx(), need_weights=True, large=scores) == "onnx"  # at the threshold, not above
    assert pick(CpuOnnx(), need_weights=True, large=0) == "onnx"  # 0 turns it off


def test_keys_and_values_that_are_a_view_try_numpy_first_on_a_cpu_onnx() -> None:
    """A session's cache is a view of a larger buffer: numpy reads it in place, ONNX Runtime would copy it."""
    numpy = FakeEngine("numpy")
    task = a_task()
    buffer = np.zeros((2, 96, 8))
    buffer[:, :48] = task.inputs.key
    view = AttentionTask(
        inputs=AttentionInputs(task.inputs.query, buffer[:, :48], buffer[:, :48]),
        params=task.params,
        dtype=task.dtype,
    )
    dispatcher = EngineDispatcher({"numpy": numpy, "onnx": CpuOnnx()})
    engine, choice = dispatcher.select(view, "auto")
    assert engine is numpy and "a view of a larger buffer" in choice.reason
    assert dispatcher.select(task, "auto")[0].name == "onnx"  # the same task with contiguous keys: ONNX first


@pytest.mark.parametrize(("rows", "first"), [(1, "numpy"), (15, "numpy"), (16, "onnx")])
def test_short_queries_try_numpy_first_on_a_cpu_onnx(rows: int, first: str) -> None:
    """A decoding step (fewer than SHORT_QUERY_ROWS query rows) over many keys: numpy reads the keys and values once,
    in place; from 16 rows on ONNX keeps its place (the flash graph serves them).
    """
    rng = np.random.default_rng(1)
    task = AttentionTask(
        inputs=AttentionInputs(
            rng.standard_normal((1, 4, rows, 8)),
            rng.standard_normal((1, 4, 2048, 8)),
            rng.standard_normal((1, 4, 2048, 8)),
        ),
        params=AttentionParams(),
        dtype=np.dtype(np.float32),
    )
    dispatcher = EngineDispatcher({"numpy": FakeEngine("numpy"), "onnx": CpuOnnx()})
    engine, choice = dispatcher.select(task, "auto")
    assert engine.name == first
    if first == "numpy":
        assert (
            choice.reason == f"auto: short query ({rows} rows, a decoding step): numpy reads the keys and values "
            "once, in place, steadier than ONNX Runtime's Attention kernel"
        )
