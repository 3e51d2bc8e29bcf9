"""Estimated time and peak memory of one attention call on each engine: the model behind the budgets.

The estimates are worst cases per score (``B * Hq * L * S``): every key a candidate of the support for
the sparse normalizers, the bisection run to convergence (about 60 halvings in float64, measured;
numpy) or its fixed 64 steps (ONNX graph). They were measured by ``bench/bench_costs.py`` on the
reference machine (2-core x86 VM, float32 GEMM ~50 GFLOP/s per core) and rounded up; the benchmark
prints each measurement beside the model, which must stay above it.

Time is in single-core seconds of the reference machine; :attr:`Cost.work_flops` expresses it as
float32 GEMM-equivalent operations (time x the reference core's GEMM rate), the unit of the
``max_work_flops`` setting. A normalizer pass over one score is not one flop: ``exp`` costs about
as much as 250 GEMM flops, a bisection step with a fractional power about 700, so counting GEMM
flops alone lets a sparse request run a thousand times longer than its budget says.

Peak memory counts what the engine allocates while it runs, results included (not the inputs it
is given). ONNX Runtime materialises every intermediate of the primitive graphs over the full
``(B, Hq, L, S)`` scores (measured bytes per score below, arena off); the numpy engine works in
chunks of bounded size per worker thread, so beyond its results it needs a few MiB per thread.

**Calibration.** The constants are the reference machine's (:data:`REFERENCE`); :mod:`service.engines.cost_calibration`
measures this machine and gives the factors by which it is slower, per kernel. A :class:`CostModel` holds one set of
factors: each data plane builds its own (``ATTN_COST_CALIBRATION``) and hands it to its engines and operations, so
two planes in one process price requests each by its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType

from service.core.attention import Dims
from service.core.attention.chunks import CHUNK_ELEMENTS
from service.core.normalizers import NEAR_ONE, ROW_CHUNK_ELEMENTS

REFERENCE_GEMM_FLOPS_PER_S = 50e9
"""float32 GEMM rate of one core of the reference machine (1024^3, one BLAS thread)."""

# numpy engine, ns per score on one core, worst case, by (normalizer, dtype).
NUMPY_NS_PER_SCORE: dict[tuple[str, str], float] = {
    ("softmax", "float32"): 6.0,
    ("softmax", "float64"): 12.0,
    ("relu", "float32"): 7.0,
    ("relu", "float64"): 12.0,
    ("sparsemax", "float32"): 16.0,
    ("sparsemax", "float64"): 22.0,
    ("entmax15", "float32"): 24.0,
    ("entmax15", "float64"): 30.0,
}
NUMPY_BISECT_STEPS = 64
"""Halvings until tau stops moving in float64 (53 to 62 measured on varied inputs; the loop's cap is 200)."""
NUMPY_NS_PER_BISECT_STEP = 15.0
NUMPY_NS_PER_NEAR_ONE_STEP = 30.0
"""The same step below ``alpha - 1 = NEAR_ONE``, where the power is ``exp(log1p(.) / (alpha - 1))``: about twice the
cost of the fractional power (measured with the kernel's operations alone)."""
"""One bisection step over one candidate: subtract, clamp, fractional power (slow on subnormals), sum."""

# ONNX graphs, ns per score (whole request, intra-op threads as configured) and peak bytes per score.
ONNX_NS_PER_SCORE: dict[str, float] = {
    "softmax_flash_f32": 4.0,
    "softmax_fused_nomask_f32": 6.0,
    "softmax_fused_f32": 6.0,
    "softmax_fused_weights_f32": 8.0,
    "softmax_fused_nomask_f64": 35.0,
    "softmax_fused_f64": 35.0,
    "softmax_fused_weights_f64": 60.0,
    "softmax_f32": 25.0,
    "softmax_f64": 45.0,
    "relu_f32": 45.0,
    "relu_f64": 65.0,
    "sparsemax_f32": 115.0,
    "sparsemax_f64": 120.0,
    "entmax15_f32": 145.0,
    "entmax15_f64": 280.0,
    "entmax_f32": 1400.0,
    "entmax_f64": 1400.0,
    # the backward graphs (four more GEMMs and the softmax VJP): measured on (1, 8, 512, 512, 64) causal,
    # one intra-op thread, on the shared development VM (load 11): 113 and 246 ns per score
    "softmax_backward_f32": 120.0,
    "softmax_backward_f64": 260.0,
}
ONNX_BYTES_PER_SCORE: dict[str, float] = {
    # FlashAttention holds no (L, S) scores: a few tiles a thread (within FIXED_BYTES) beside the results
    "softmax_flash_f32": 0.0,
    "softmax_fused_nomask_f32": 8.0,
    "softmax_fused_f32": 8.0,
    "softmax_fused_weights_f32": 12.0,
    "softmax_fused_nomask_f64": 34.0,
    "softmax_fused_f64": 34.0,
    "softmax_fused_weights_f64": 34.0,
    "softmax_f32": 24.0,
    "softmax_f64": 48.0,
    "relu_f32": 30.0,
    "relu_f64": 34.0,
    "sparsemax_f32": 52.0,
    "sparsemax_f64": 66.0,
    "entmax15_f32": 72.0,
    "entmax15_f64": 72.0,
    "entmax_f32": 44.0,
    "entmax_f64": 48.0,
    # measured peaks 38 and 67 bytes per score (about ten (B, Hq, L, S) tensors)
    "softmax_backward_f32": 40.0,
    "softmax_backward_f64": 80.0,
}
ONNX_DEFAULT_NS_PER_SCORE = 1400.0
ONNX_NEAR_ONE_FACTOR = 1.6
"""The entmax graphs' near-one branch (``alpha - 1 < NEAR_ONE``: Kahan's log1p, then exp) against their power branch:
1.4-1.5 times measured on a (1, 4, 32, 512) float32 request, rounded up."""
ONNX_DEFAULT_BYTES_PER_SCORE = 80.0
"""For a graph the tables do not name (a newly exported one): the largest of the measured graphs."""

SORT_BLOCK_ELEMENTS = ROW_CHUNK_ELEMENTS
"""Row blocks of the sort-based and bisection kernels (the normalizers' own chunk size)."""


def numpy_scratch_bytes(n_scores: int, normalizer: str) -> int:
    """One worker thread's temporaries for a task of ``n_scores``: a chunk of scores and two temporaries
    in float64, plus, for the sort-based and bisection normalizers, their float64 row blocks (x, sorted
    candidates, prefix sums, ...). Never more than the task itself needs, so a tiny request does not
    hold tens of MiB of the memory budget.
    """
    chunk = min(n_scores, CHUNK_ELEMENTS) * 8 * 3
    blocks = 0 if normalizer in ("softmax", "relu") else min(n_scores, SORT_BLOCK_ELEMENTS) * 8 * 12
    return chunk + blocks


FIXED_BYTES = 1 << 20

KERNELS = ("softmax", "relu", "sparsemax", "entmax15", "entmax")
"""The normalizers' kernels, each with a calibration factor (``entmax``: the bisection, any other alpha)."""


def kernel_of(normalizer: str, alpha: float | None) -> str:
    """The kernel that runs ``normalizer``: ``entmax`` at alpha 1.5 and 2 is entmax15 and sparsemax."""
    if normalizer == "entmax":
        return {1.5: "entmax15", 2.0: "sparsemax"}.get(float(alpha) if alpha is not None else 0.0, "entmax")
    return normalizer if normalizer in KERNELS else "entmax15"


def graph_kernel(graph: str) -> str:
    """The normalizer kernel of an ONNX graph, from its name (``sparsemax_f32``, ``softmax_fused_f32``, ...)."""
    for kernel in ("entmax15", "entmax_", "sparsemax", "relu", "softmax"):
        if graph.startswith(kernel):
            return kernel.rstrip("_")
    return "entmax"


@dataclass(frozen=True, slots=True)
class Cost:
    """Estimated single-core seconds on the reference machine and peak bytes allocated while running."""

    seconds: float
    peak_bytes: int

    @property
    def work_flops(self) -> float:
        """The time as float32 GEMM-equivalent operations (the unit of ``max_work_flops``)."""
        return self.seconds * REFERENCE_GEMM_FLOPS_PER_S


def scores(dims: Dims) -> int:
    """Number of attention scores ``B * Hq * L * S``."""
    return dims.B * dims.Hq * dims.L * dims.S


def near_one(alpha: float | None) -> bool:
    """Whether alpha-entmax runs its near-one form (``alpha - 1 < NEAR_ONE``: log1p and exp instead of a power)."""
    return alpha is not None and float(alpha) - 1.0 < NEAR_ONE


def reference_ns_per_score(normalizer: str, alpha: float | None, dtype: str) -> float:
    """:meth:`CostModel.normalizer_ns_per_score` on the reference machine (uncalibrated)."""
    if normalizer == "entmax":
        exact = {1.5: "entmax15", 2.0: "sparsemax"}.get(float(alpha) if alpha is not None else 0.0)
        if exact is None:
            step = NUMPY_NS_PER_NEAR_ONE_STEP if near_one(alpha) else NUMPY_NS_PER_BISECT_STEP
            return NUMPY_NS_PER_SCORE[("sparsemax", dtype)] + NUMPY_BISECT_STEPS * step
        normalizer = exact
    return NUMPY_NS_PER_SCORE.get((normalizer, dtype), NUMPY_NS_PER_SCORE[("entmax15", "float64")])


def _itemsize(dtype: str) -> int:
    return 4 if dtype == "float32" else 8


def result_bytes(dims: Dims, dtype: str, need_weights: bool, need_scores: bool) -> int:
    """The arrays an engine hands back: output, and weights and scores when asked for."""
    n = dims.B * dims.Hq * dims.L * dims.Ev + scores(dims) * (int(need_weights) + int(need_scores))
    return n * _itemsize(dtype)


class CostModel:
    """The model with one machine's calibration factors: each kernel's time (``"gemm"`` and the normalizers'
    :data:`KERNELS`) multiplied by its factor, 1 where none is given. Immutable: the engines and operations of one
    data plane share it, and price every request alike.
    """

    def __init__(self, factors: Mapping[str, float] | None = None) -> None:
        given = dict(factors or {})
        unknown = set(given) - {"gemm", *KERNELS}
        if unknown or any(not value > 0 for value in given.values()):
            raise ValueError(f"calibration factors are 'gemm' and {', '.join(KERNELS)}, each > 0; got {given}")
        self.factors: Mapping[str, float] = MappingProxyType(given)
        """This machine's time over the model's, per kernel and for ``"gemm"``."""
        self._numpy_cost = lru_cache(maxsize=512)(self._numpy_cost_uncached)
        """:meth:`numpy_cost`, cached: a pure function of the shapes and options, asked for by the budget check and
        again by the dispatcher's admission of the engine, on every request."""

    def __repr__(self) -> str:
        return f"CostModel({dict(self.factors)})"

    def factor(self, kernel: str) -> float:
        """The calibration factor of ``kernel`` (a normalizer's kernel or ``"gemm"``): 1 unless given."""
        return self.factors.get(kernel, 1.0)

    def gemm_seconds(self, dims: Dims, dtype: str) -> float:
        """Q K^T and A V: ``2 * scores * (E + Ev)`` flops at the reference rate (float64 at half of it)."""
        flops = 2.0 * scores(dims) * (dims.E + dims.Ev)
        rate = REFERENCE_GEMM_FLOPS_PER_S if dtype == "float32" else REFERENCE_GEMM_FLOPS_PER_S / 2
        return flops / rate * self.factor("gemm")

    def normalizer_ns_per_score(self, normalizer: str, alpha: float | None, dtype: str) -> float:
        """The numpy normalizers' worst-case cost of one score, in ns on one core.

        ``entmax`` with alpha 1.5 or 2 runs the exact sort-based kernels (as the engines do), any other
        alpha the bisection, whose cost is its steps times one step's pass over the candidates. Scaled by the
        kernel's calibration factor.
        """
        return reference_ns_per_score(normalizer, alpha, dtype) * self.factor(kernel_of(normalizer, alpha))

    def numpy_cost(
        self,
        dims: Dims,
        *,
        normalizer: str,
        alpha: float | None,
        dtype: str,
        need_weights: bool,
        need_scores: bool,
        workers: int = 1,
    ) -> Cost:
        """The numpy engine: GEMMs plus the normalizer's passes; results plus a scratch per worker thread."""
        threads = max(1, min(workers, -(-scores(dims) // SORT_BLOCK_ELEMENTS)))  # small tasks run on one thread
        return self._numpy_cost(dims, normalizer, alpha, dtype, need_weights, need_scores, threads)

    def _numpy_cost_uncached(
        self,
        dims: Dims,
        normalizer: str,
        alpha: float | None,
        dtype: str,
        need_weights: bool,
        need_scores: bool,
        threads: int,
    ) -> Cost:
        n = scores(dims)
        seconds = self.gemm_seconds(dims, dtype) + n * self.normalizer_ns_per_score(normalizer, alpha, dtype) * 1e-9
        scratch = threads * numpy_scratch_bytes(n, normalizer)
        return Cost(seconds, result_bytes(dims, dtype, need_weights, need_scores) + scratch + FIXED_BYTES)

    def onnx_cost(
        self,
        graph: str,
        dims: Dims,
        *,
        dtype: str,
        need_weights: bool,
        need_scores: bool,
        alpha: float | None = None,
    ) -> Cost:
        """One ONNX graph: its measured time and peak per score, results included (copied out of the run).

        ``alpha`` (entmax graphs): below ``alpha - 1 = NEAR_ONE`` the graph's near-one branch runs, which costs
        :data:`ONNX_NEAR_ONE_FACTOR` times its other branch.
        """
        n = scores(dims)
        ns = ONNX_NS_PER_SCORE.get(graph, ONNX_DEFAULT_NS_PER_SCORE) * self.factor(graph_kernel(graph))
        if graph.startswith("entmax_f") and near_one(alpha):
            ns *= ONNX_NEAR_ONE_FACTOR
        per_score = ONNX_BYTES_PER_SCORE.get(graph, ONNX_DEFAULT_BYTES_PER_SCORE)
        seconds = self.gemm_seconds(dims, dtype) + n * ns * 1e-9
        peak = int(n * per_score) + result_bytes(dims, dtype, need_weights, need_scores)
        return Cost(seconds, peak + FIXED_BYTES)

    def estimate(
        self,
        engine: str,
        dims: Dims,
        *,
        normalizer: str,
        alpha: float | None,
        dtype: str,
        need_weights: bool,
        need_scores: bool,
        graph: str | None = None,
        workers: int = 1,
    ) -> Cost:
        """The cost of one call on ``engine`` (``"numpy"``, or ``"onnx"`` running ``graph``)."""
        if engine == "onnx":
            if graph is None:
                raise ValueError("the ONNX estimate needs the graph that runs the request")
            return self.onnx_cost(
                graph, dims, dtype=dtype, need_weights=need_weights, need_scores=need_scores, alpha=alpha
            )
        return self.numpy_cost(
            dims,
            normalizer=normalizer,
            alpha=alpha,
            dtype=dtype,
            need_weights=need_weights,
            need_scores=need_scores,
            workers=workers,
        )


REFERENCE = CostModel()
"""The reference machine's model (no calibration): what an engine built without a model of its own prices with."""
estimate = REFERENCE.estimate
"""The reference machine's estimate of one call (bench/bench_costs.py sets its measurements beside it)."""
