"""Estimates of a request's work, memory and response size, checked before anything large is allocated.

Work is counted in float32 GEMM-equivalent operations (:attr:`service.engines.cost.Cost.work_flops`):
the request's estimated single-core time on the reference machine times its GEMM rate, so an
``exp`` or a bisection step counts for what it costs, not as one flop. Memory is the request's
inputs, the engine's intermediates and results, and its response; :func:`enforce` refuses a
request over any limit (``TOO_LARGE``). The scheduler then reserves the memory estimate on the
request's lease of the process-wide budget (:mod:`service.dataplane.memory`).

The work is priced by the data plane's cost model (:class:`~service.engines.cost.CostModel`, with this machine's
calibration factors), given as ``costs``: every operation passes its context's (its data plane's); an estimate
given none prices with the reference machine's model.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

from service.core.attention import Dims
from service.dataplane.errors import too_large
from service.dataplane.memory import over_budget_message
from service.engines import cost
from service.engines.cost import CostModel

# Bytes one number takes in a JSON array (digits, sign, exponent, comma): float32
# needs at most 9 significant digits, float64 17 (IEEE 754 shortest round trip).
JSON_BYTES_PER_NUMBER = {"float32": 16, "float64": 25}


def operations_costs(costs: CostModel | None = None) -> CostModel:
    """``costs`` (an operation passes its context's), or the reference machine's model for an estimate given none."""
    return costs if costs is not None else cost.REFERENCE


DIAGNOSTICS_NS_PER_SCORE = 8.0
"""The diagnostics' passes over the weights (entropy with a log, max, sums, distance), per score."""


@dataclass(frozen=True, slots=True)
class Budget:
    """Limits from settings: estimated work, response bytes and memory of one request."""

    max_work_flops: float
    max_response_bytes: int
    max_memory_bytes: int | None = None


def normalizer_flops_per_score(
    normalizer: str, S: int, precision: str = "float32", alpha: float | None = None, *, costs: CostModel | None = None
) -> float:
    """Work of the normalizer on one score, in GEMM-equivalent flops (sort, bisection steps and all).

    ``S`` is kept for callers: the measured sort-based costs hardly move from 256 to 8192 keys.
    """
    model = operations_costs(costs)
    ns = model.normalizer_ns_per_score(normalizer, alpha if normalizer == "entmax" else None, precision)
    return ns_as_flops(ns)


def bytes_per_number(precision: str, encoding: str) -> float:
    """Response bytes per returned number in the given encoding (``binary``: raw bytes, the Open Inference
    Protocol's binary tensor data extension and gRPC's raw contents).
    """
    itemsize = 4 if precision == "float32" else 8
    if encoding == "binary":
        return itemsize
    if encoding == "base64":
        return itemsize * 4 / 3
    return JSON_BYTES_PER_NUMBER[precision]


def softmax_estimate(
    shape: tuple[int, ...],
    axis: int,
    normalizer: str,
    with_log: bool,
    precision: str,
    encoding: str,
    alpha: float | None = None,
    *,
    costs: CostModel | None = None,
) -> tuple[float, int]:
    """(flops, response bytes) of one softmax request."""
    elements = math.prod(shape)
    n = shape[axis] if -len(shape) <= axis < len(shape) else 1
    flops = elements * (
        normalizer_flops_per_score(normalizer, n, precision, alpha, costs=costs) + ns_as_flops(DIAGNOSTICS_NS_PER_SCORE)
    )
    response = int(elements * bytes_per_number(precision, encoding) * (2 if with_log else 1) + 4096)
    return flops, response


def softmax_memory(shape: tuple[int, ...], with_log: bool, precision: str, response_bytes: int) -> int:
    """Peak bytes of one softmax request: the logits in the compute dtype, the float64 working copies
    ((logits + mask) / T and the log-probabilities are formed in float64), the results, row-chunk
    scratch of the sort-based and bisection kernels, and the response body.
    """
    elements = math.prod(shape)
    itemsize = 4 if precision == "float32" else 8
    arrays = elements * itemsize * (3 + int(with_log)) + elements * 8 * (1 + int(with_log))
    return arrays + cost.numpy_scratch_bytes(elements, "entmax") + response_bytes


ESTIMATED_FROM_WEIGHTS = frozenset({"weights", "diagnostics", "inspection", "norm_weights"})
"""The results whose estimate prices the weights (gradient health is priced on its own below)."""
INSPECTION_NS_PER_SCORE = 6.0
"""The inspection's passes over each weight (float64 copies, the norm weights and their summary, patterns)."""
INSPECTION_BYTES_PER_HEAD = 400
"""One ``inspection.heads`` entry in JSON (eleven named numbers)."""


def attention_estimate(
    dims: Dims,
    normalizer: str,
    returned: Collection[str],
    precision: str,
    encoding: str,
    alpha: float | None = None,
    *,
    costs: CostModel | None = None,
) -> tuple[float, int]:
    """(flops, response bytes) of one attention request on the numpy engine (the engine every request can use)."""
    need_weights = not ESTIMATED_FROM_WEIGHTS.isdisjoint(returned)
    need_scores = "scores" in returned or "diagnostics" in returned
    c = operations_costs(costs).numpy_cost(
        dims, normalizer=normalizer, alpha=alpha, dtype=precision, need_weights=need_weights, need_scores=need_scores
    )
    flops = c.work_flops
    if "diagnostics" in returned:
        flops += cost.scores(dims) * ns_as_flops(DIAGNOSTICS_NS_PER_SCORE)
    if "gradient_health" in returned:
        flops += cost.scores(dims) * ns_as_flops(GRADIENT_HEALTH_NS_PER_SCORE)
    if "inspection" in returned or "norm_weights" in returned:
        # norm weights and their summary, the sink mass and three patterns: a few passes over the weights; the
        # spectral norms: the Gram matrices of every head's queries and keys, ~2 (L + S) E^2 each (the power
        # iteration's squarings of E x E matrices are small beside them for L, S >= E)
        flops += cost.scores(dims) * ns_as_flops(INSPECTION_NS_PER_SCORE)
        flops += 2.0 * dims.B * (dims.Hq * dims.L + dims.Hkv * dims.S) * dims.E * dims.E
    return flops, attention_response_bytes(dims, returned, precision, encoding)


def attention_response_bytes(dims: Dims, returned: Collection[str], precision: str, encoding: str) -> int:
    """Estimated size of the response body."""
    per_number = bytes_per_number(precision, encoding)
    numbers = 0
    if "output" in returned:
        numbers += dims.B * dims.Hq * dims.L * dims.Ev
    numbers += cost.scores(dims) * (("weights" in returned) + ("scores" in returned) + ("norm_weights" in returned))
    rows = dims.B * dims.Hq * dims.L
    heads = dims.B * dims.Hq
    return int(
        numbers * per_number
        + ("diagnostics" in returned) * rows * 8 * 25
        + ("gradient_health" in returned) * heads * HEALTH_BYTES_PER_HEAD
        + ("inspection" in returned) * heads * INSPECTION_BYTES_PER_HEAD
        + 4096
    )


GRADIENT_HEALTH_NS_PER_SCORE = 8.0
"""Jacobian norms: a power for entmax, three row sums, a square root per row."""
HEALTH_BYTES_PER_HEAD = 120
"""One {"batch", "head", "mean_jacobian_norm", "vanishing_fraction", "rows"} object."""


def ns_as_flops(ns: float) -> float:
    """Nanoseconds of one core of the reference machine as GEMM-equivalent flops."""
    return ns * 1e-9 * cost.REFERENCE_GEMM_FLOPS_PER_S


def backward_estimate(
    dims: Dims,
    normalizer: str,
    returned: Collection[str],
    precision: str,
    encoding: str,
    alpha: float | None = None,
    *,
    costs: CostModel | None = None,
) -> tuple[float, int]:
    """(flops, response bytes) of one backward request.

    The backward pass recomputes the scores and weights (``Q K^T``), then runs
    four more products of the same size: ``dV = A^T dO``, ``dA = dO V^T``,
    ``dQ = dS K``, ``dK = dS^T Q`` (and ``A V`` when the output is asked for),
    plus the normalizer's forward and backward (each about the forward's cost
    per score). A float mask's gradient is counted at its largest possible
    size, one number per score.
    """
    n = cost.scores(dims)
    products = 3 * dims.E + 2 * dims.Ev + ("output" in returned) * dims.Ev
    # relu's backward forms its scores and dZ products in float64 whatever the precision (core.backward)
    in_float32 = precision == "float32" and normalizer != "relu"
    rate = cost.REFERENCE_GEMM_FLOPS_PER_S if in_float32 else cost.REFERENCE_GEMM_FLOPS_PER_S / 2
    gemm = 2.0 * n * products * cost.REFERENCE_GEMM_FLOPS_PER_S / rate
    model = operations_costs(costs)
    ns = model.normalizer_ns_per_score(normalizer, alpha if normalizer == "entmax" else None, precision)
    per_score = 2 * ns + 6
    flops = gemm + n * ns_as_flops(per_score)
    if "gradient_health" in returned:
        flops += n * ns_as_flops(GRADIENT_HEALTH_NS_PER_SCORE)
    sizes = {
        "grad_query": dims.B * dims.Hq * dims.L * dims.E,
        "grad_key": dims.B * dims.Hkv * dims.S * dims.E,
        "grad_value": dims.B * dims.Hkv * dims.S * dims.Ev,
        "grad_mask": n,
        "output": dims.B * dims.Hq * dims.L * dims.Ev,
        "weights": n,
    }
    numbers = sum(count for name, count in sizes.items() if name in returned)
    heads = dims.B * dims.Hq
    response = int(
        numbers * bytes_per_number(precision, encoding)
        + ("gradient_health" in returned) * heads * HEALTH_BYTES_PER_HEAD
        + 4096
    )
    return flops, response


def backward_memory(dims: Dims, returned: Collection[str], precision: str, response_bytes: int) -> int:
    """Peak bytes of one backward request on numpy: the inputs and their gradients, one (G*L, S) block of
    scores, weights and their gradients per kv head at a time, the returned full-size arrays, the response.
    """
    itemsize = 4 if precision == "float32" else 8
    inputs = (
        dims.B * dims.Hq * dims.L * (dims.E + dims.Ev) + dims.B * dims.Hkv * dims.S * (dims.E + dims.Ev)
    ) * itemsize
    block = dims.group * dims.L * dims.S * 8 * 6
    full = cost.scores(dims) * itemsize * (("grad_mask" in returned) + ("weights" in returned))
    return 3 * inputs + block + full + cost.numpy_scratch_bytes(cost.scores(dims), "entmax") + response_bytes


def backward_graph_memory(graph: str, dims: Dims, precision: str, response_bytes: int) -> int:
    """Peak bytes of one backward request on an ONNX backward graph, which materialises its (B, Hq, L, S)
    intermediates (numpy works on row chunks instead: :func:`backward_memory`); per score as measured
    (:data:`service.engines.cost.ONNX_BYTES_PER_SCORE`).
    """
    itemsize = 4 if precision == "float32" else 8
    inputs = (
        dims.B * dims.Hq * dims.L * (dims.E + dims.Ev) + dims.B * dims.Hkv * dims.S * (dims.E + dims.Ev)
    ) * itemsize
    per_score = cost.ONNX_BYTES_PER_SCORE.get(graph, cost.ONNX_DEFAULT_BYTES_PER_SCORE)
    return 3 * inputs + int(cost.scores(dims) * per_score) + response_bytes


def attention_memory(
    engine_cost: cost.Cost, dims: Dims, precision: str, response_bytes: int, *, cached_keys: bool = False
) -> int:
    """Peak bytes of one attention request on an engine: the inputs in the compute dtype (the engine may
    copy them once more), the engine's own peak, per-row diagnostics and the response body. ``cached_keys``: the
    keys and values are a session's cache, held on the caches' own share: only an engine's copy of them counts.
    """
    itemsize = 4 if precision == "float32" else 8
    queries = dims.B * dims.Hq * dims.L * dims.E * itemsize
    keys = dims.B * dims.Hkv * dims.S * (dims.E + dims.Ev) * itemsize
    inputs = 2 * queries + (1 if cached_keys else 2) * keys
    return inputs + engine_cost.peak_bytes + dims.B * dims.Hq * dims.L * 8 * 8 + response_bytes


SAMPLE_NS_PER_LOGIT = 25.0
"""/v1/sample's passes over each logit: copy, mask, shift, exp, partial selection, counts, raw statistics."""
SAMPLE_SORT_NS_PER_LOGIT = 150.0
"""A full sort of every row (``top_p`` alone may grow its candidates to the whole vocabulary)."""
CALIBRATE_NS_PER_LOGIT = 400.0
"""/v1/calibrate: about 20 passes (Newton steps, NLL and ECE before and after) of exp and two dot products."""


def sample_estimate(
    rows: int,
    vocab: int,
    draws: int,
    top_logprobs: int,
    returned: Collection[str],
    sorts_all: bool,
    precision: str,
    encoding: str,
) -> tuple[float, int, int]:
    """(flops, response bytes, memory bytes) of one /v1/sample request.

    Memory: the logits and about six same-sized temporaries in the compute dtype, the int64 indices of
    a partition and a float64 CDF, per logit; the draws; the response.
    """
    elements = rows * vocab
    log_v = math.log2(max(vocab, 2))
    ns = elements * (SAMPLE_NS_PER_LOGIT + sorts_all * SAMPLE_SORT_NS_PER_LOGIT) + rows * draws * 20.0 * log_v
    per_number = bytes_per_number(precision, encoding)
    numbers = rows * draws * (("tokens" in returned) + ("logprobs" in returned) + ("raw_logprobs" in returned))
    numbers += elements * ("probabilities" in returned)
    response = numbers * per_number + rows * top_logprobs * 48 * ("top_logprobs" in returned)
    response += rows * 4 * 25 * ("diagnostics" in returned) + 4096
    itemsize = 4 if precision == "float32" else 8
    memory = elements * (7 * itemsize + 16) + rows * draws * 40 + response
    return ns_as_flops(ns), int(response), int(memory)


def calibrate_estimate(rows: int, classes: int, bins: int) -> tuple[float, int, int]:
    """(flops, response bytes, memory bytes) of one /v1/calibrate request (float64, ~6 temporaries per logit)."""
    elements = rows * classes
    response = 2 * bins * 120 + 4096
    return ns_as_flops(elements * CALIBRATE_NS_PER_LOGIT), response, elements * 8 * 7 + response


def check(budget: Budget, flops: float, response_bytes: int, memory_bytes: int | None = None) -> str | None:
    """Why a request over a limit is refused (the ``TOO_LARGE`` message), or None when it fits."""
    if flops > budget.max_work_flops:
        return (
            f"estimated work {flops:.3g} GEMM-equivalent floating-point operations (about "
            f"{flops / cost.REFERENCE_GEMM_FLOPS_PER_S:.2g} core-seconds) exceeds the limit of "
            f"{budget.max_work_flops:.3g}; split the request (fewer batches or heads, shorter sequences)"
        )
    if response_bytes > budget.max_response_bytes:
        return (
            f"estimated response size {response_bytes} bytes exceeds the limit of {budget.max_response_bytes}; "
            "ask for fewer outputs (return), use encoding 'base64', or split the request"
        )
    if memory_bytes is not None and budget.max_memory_bytes is not None and memory_bytes > budget.max_memory_bytes:
        return over_budget_message(memory_bytes, budget.max_memory_bytes)
    return None


def enforce(budget: Budget, flops: float, response_bytes: int, memory_bytes: int | None = None) -> None:
    """Raise ``TOO_LARGE`` when a request exceeds the budget."""
    reason = check(budget, flops, response_bytes, memory_bytes)
    if reason is not None:
        raise too_large(reason)


SWEEP_ROW_BYTES = 400
"""One sweep row of /v1/attention/analyze as JSON: eleven named numbers."""
ANALYSIS_NS_PER_SCORE = 30.0
"""The analysis' passes over each score beyond the normalizer: entropy (a log), Jacobian norm, row min/max/sums."""
DRAW_NS_PER_NUMBER = 10.0
"""Drawing one standard normal float64 (numpy's ziggurat)."""


def analyze_estimate(
    dims: Dims,
    head_dims: Collection[int],
    points_per_head_dim: int,
    normalizer: str,
    alpha: float | None,
    drawn: bool,
    *,
    costs: CostModel | None = None,
) -> tuple[float, int]:
    """(flops, response bytes) of one analysis, computed in float64.

    Per sweep point and head dimension E: ``Q K^T`` (float64 GEMMs run at about half the float32
    rate), the normalizer and the row statistics of every score; when Q and K are drawn, each E
    also draws ``B*(Hq*L + Hkv*S)*E`` normal numbers.
    """
    n = cost.scores(dims)
    per_score_ns = operations_costs(costs).normalizer_ns_per_score(
        normalizer, alpha if normalizer == "entmax" else None, "float64"
    )
    flops = 0.0
    for e in head_dims:
        flops += points_per_head_dim * n * (2.0 * e * 2 + ns_as_flops(per_score_ns + ANALYSIS_NS_PER_SCORE))
        if drawn:
            flops += ns_as_flops(DRAW_NS_PER_NUMBER) * dims.B * (dims.Hq * dims.L + dims.Hkv * dims.S) * e
    return flops, len(head_dims) * points_per_head_dim * SWEEP_ROW_BYTES + 4096


def analyze_memory(dims: Dims, head_dims: Collection[int], response_bytes: int) -> int:
    """Peak bytes of one analysis: Q and K in float64 (twice: as sent or drawn, and as computed) for the
    largest E, a mask as large as the scores at most, and one chunk of scores with its temporaries.
    """
    e = max(head_dims)
    inputs = dims.B * (dims.Hq * dims.L + dims.Hkv * dims.S) * e * 8
    return 2 * inputs + cost.numpy_scratch_bytes(cost.scores(dims), "entmax") * 2 + response_bytes
