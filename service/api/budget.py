"""Estimates of a request's work and response size, checked before anything large is allocated."""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

from service.api.errors import ProblemError
from service.core.attention import Dims

# Bytes one number takes in a JSON array (digits, sign, exponent, comma): float32
# needs at most 9 significant digits, float64 17 (IEEE 754 shortest round trip).
JSON_BYTES_PER_NUMBER = {"float32": 16, "float64": 25}


@dataclass(frozen=True, slots=True)
class Budget:
    """Limits from settings: estimated floating-point operations and response bytes."""

    max_work_flops: float
    max_response_bytes: int


def normalizer_flops_per_score(normalizer: str, S: int) -> float:
    """Rough operations per score: exp for softmax, a sort for sparse maps, ~60 passes for bisection."""
    if normalizer in ("sparsemax", "entmax15"):
        return 10.0 + 4.0 * math.log2(max(S, 2))
    if normalizer == "entmax":
        return 4.0 * 60
    return 10.0


def bytes_per_number(precision: str, encoding: str) -> float:
    """Response bytes per returned number in the given encoding."""
    if encoding == "base64":
        return (4 if precision == "float32" else 8) * 4 / 3
    return JSON_BYTES_PER_NUMBER[precision]


def softmax_estimate(
    shape: tuple[int, ...], axis: int, normalizer: str, with_log: bool, precision: str, encoding: str
) -> tuple[float, int]:
    """(flops, response bytes) of one softmax request."""
    elements = math.prod(shape)
    n = shape[axis] if -len(shape) <= axis < len(shape) else 1
    flops = elements * normalizer_flops_per_score(normalizer, n)
    response = int(elements * bytes_per_number(precision, encoding) * (2 if with_log else 1) + 4096)
    return flops, response


def attention_estimate(
    dims: Dims, normalizer: str, returned: Collection[str], precision: str, encoding: str
) -> tuple[float, int]:
    """(flops, response bytes) of one attention request."""
    scores = dims.B * dims.Hq * dims.L * dims.S
    flops = 2.0 * scores * (dims.E + dims.Ev) + scores * normalizer_flops_per_score(normalizer, dims.S)
    if "diagnostics" in returned:
        flops += 12.0 * scores
    if "gradient_health" in returned:
        flops += GRADIENT_HEALTH_FLOPS_PER_SCORE * scores
    per_number = bytes_per_number(precision, encoding)
    numbers = 0
    if "output" in returned:
        numbers += dims.B * dims.Hq * dims.L * dims.Ev
    numbers += scores * (("weights" in returned) + ("scores" in returned))
    rows = dims.B * dims.Hq * dims.L
    heads = dims.B * dims.Hq
    response = int(
        numbers * per_number
        + ("diagnostics" in returned) * rows * 8 * 25
        + ("gradient_health" in returned) * heads * HEALTH_BYTES_PER_HEAD
        + 4096
    )
    return flops, response


# Jacobian norms: a power for entmax, three row sums, a square root per row.
GRADIENT_HEALTH_FLOPS_PER_SCORE = 8.0
# One {"batch", "head", "mean_jacobian_norm", "vanishing_fraction", "rows"} object.
HEALTH_BYTES_PER_HEAD = 120


def backward_estimate(
    dims: Dims, normalizer: str, returned: Collection[str], precision: str, encoding: str
) -> tuple[float, int]:
    """(flops, response bytes) of one backward request.

    The backward pass recomputes the scores and weights (``Q K^T``), then runs
    four more products of the same size: ``dV = A^T dO``, ``dA = dO V^T``,
    ``dQ = dS K``, ``dK = dS^T Q`` (and ``A V`` when the output is asked for),
    plus the normalizer's forward and backward: about three times the forward's
    products. A float mask's gradient is counted at its largest possible size,
    one number per score.
    """
    scores = dims.B * dims.Hq * dims.L * dims.S
    products = 3 * dims.E + 2 * dims.Ev + ("output" in returned) * dims.Ev
    flops = 2.0 * scores * products + scores * (2 * normalizer_flops_per_score(normalizer, dims.S) + 6)
    if "gradient_health" in returned:
        flops += GRADIENT_HEALTH_FLOPS_PER_SCORE * scores
    sizes = {
        "grad_query": dims.B * dims.Hq * dims.L * dims.E,
        "grad_key": dims.B * dims.Hkv * dims.S * dims.E,
        "grad_value": dims.B * dims.Hkv * dims.S * dims.Ev,
        "grad_mask": scores,
        "output": dims.B * dims.Hq * dims.L * dims.Ev,
        "weights": scores,
    }
    numbers = sum(n for name, n in sizes.items() if name in returned)
    heads = dims.B * dims.Hq
    response = int(
        numbers * bytes_per_number(precision, encoding)
        + ("gradient_health" in returned) * heads * HEALTH_BYTES_PER_HEAD
        + 4096
    )
    return flops, response


def enforce(budget: Budget, flops: float, response_bytes: int) -> None:
    """Raise a 413 problem when a request exceeds the budget."""
    if flops > budget.max_work_flops:
        raise ProblemError(
            413,
            f"estimated work {flops:.3g} floating-point operations exceeds the limit of {budget.max_work_flops:.3g}; "
            "split the request (fewer batches or heads, shorter sequences)",
        )
    if response_bytes > budget.max_response_bytes:
        raise ProblemError(
            413,
            f"estimated response size {response_bytes} bytes exceeds the limit of {budget.max_response_bytes}; "
            "ask for fewer outputs (return), use encoding 'base64', or split the request",
        )
