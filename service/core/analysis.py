"""Training-health analysis: what scale and temperature do to the scores, the weights and their gradients.

For each point of a sweep over scales, temperatures and (for drawn inputs)
head dimensions, :func:`analyze` runs the scores ``Z = (scale Q K^T + bias)/T``
through the normalizer, on the forward pass's row chunks, and summarises:

* ``score_std``: the standard deviation of ``Z`` over unmasked positions (for
  standard normal Q and K and scale 1 it is ``sqrt(E)``: Vaswani et al. 2017,
  section 3.2.1, the reason for the ``1/sqrt(d_k)`` scale);
* ``score_range``: the mean over rows of the largest minus the smallest unmasked score;
* ``mean_entropy`` and ``mean_normalized_entropy`` of the weights (nats;
  ``H / ln n_valid``);
* ``saturated_fraction``: rows whose largest weight exceeds ``1 - margin``
  (the saturation of docs/concepts/diagnostics.md, the diagnostics' margin);
* ``mean_jacobian_norm``: the mean Frobenius norm of the normalizer's Jacobian
  (:func:`service.core.backward.jacobian_norms`), and ``vanishing_fraction``,
  the rows whose norm is below the threshold: how much gradient gets through.

Row statistics are over *informative* rows, those with at least two valid keys
(with one key or none, every normalizer's Jacobian is 0 whatever the scores).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from service.core import normalizers
from service.core.attention import check_dims
from service.core.attention.chunks import CHUNK_ELEMENTS, chunk_scores, plan_chunks
from service.core.attention.prepared import prepare
from service.core.backward import jacobian_norms
from service.core.errors import InvalidInput, NumericalError
from service.core.types import AttentionInputs, AttentionParams, Causal

__all__ = ["SweepPoint", "SweepRow", "analyze", "draw_normal", "sweep_points"]


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """One point of a sweep."""

    scale: float
    temperature: float
    head_dim: int


@dataclass(frozen=True, slots=True)
class SweepRow:
    """The statistics of one sweep point (module docstring)."""

    scale: float
    temperature: float
    head_dim: int
    score_std: float
    score_range: float
    mean_entropy: float
    mean_normalized_entropy: float
    saturated_fraction: float
    mean_jacobian_norm: float
    vanishing_fraction: float
    rows: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def sweep_points(
    head_dims: Sequence[int], scales: Sequence[float] | None, temperatures: Sequence[float]
) -> list[SweepPoint]:
    """Head dimension outermost, then scale, then temperature; scales default to ``[1, 1/sqrt(E)]`` per E."""
    points = []
    for e in head_dims:
        for s in scales if scales is not None else (1.0, 1.0 / math.sqrt(e)):
            for t in temperatures:
                points.append(SweepPoint(float(s), float(t), int(e)))
    return points


def draw_normal(shape: Sequence[int], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Query and key with standard normal entries, shape ``[B, H, L, E]`` each (so S = L), float64."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(tuple(shape))
    k = rng.standard_normal(tuple(shape))
    return q, k


@dataclass(slots=True)
class _Sums:
    """Running sums of one sweep point over chunks (Chan et al.'s pairwise update for the variance)."""

    count: int = 0
    exponent: int = 0  # mean and m2 are in units of 2**exponent and 4**exponent: no square overflows or underflows
    mean: float = 0.0
    m2: float = 0.0
    rows: int = 0
    half_range_sum: float = 0.0  # half of each row's range: a range up to float64's largest number adds no overflow
    entropy_sum: float = 0.0
    normalized_entropy_sum: float = 0.0
    saturated: int = 0
    jacobian_sum: float = 0.0
    vanishing: int = 0

    def add_scores(self, values: np.ndarray) -> None:
        n = int(values.size)
        if n == 0:
            return
        top = float(np.max(np.abs(values)))
        exponent = math.frexp(top)[1] if top > _UNSCALED or 0 < top < 1 / _UNSCALED else 0
        if self.count == 0:
            self.exponent = exponent
        elif exponent > self.exponent:  # into the larger units (what the smaller ones held may underflow: negligible)
            self.mean = math.ldexp(self.mean, self.exponent - exponent)
            self.m2 = math.ldexp(self.m2, 2 * (self.exponent - exponent))
            self.exponent = exponent
        if self.exponent:
            values = np.ldexp(values, -self.exponent)
        mean = float(values.mean())
        m2 = float(np.square(values - mean).sum())
        total = self.count + n
        delta = mean - self.mean
        self.mean += delta * n / total
        self.m2 += m2 + delta * delta * self.count * n / total
        self.count = total

    def std(self) -> float:
        """The population standard deviation of the scores added, 0 for none."""
        return math.ldexp(math.sqrt(self.m2 / self.count), self.exponent) if self.count else 0.0


# Scores of at most this magnitude (and at least its reciprocal) are squared as they are; beyond, they are scaled
# by a power of two first (exactly), so that a representable standard deviation is computed (1e300 squared is inf).
_UNSCALED = 2.0**480


def analyze(
    query: np.ndarray,
    key: np.ndarray,
    *,
    points: Sequence[SweepPoint],
    normalizer: str = "softmax",
    alpha: float | None = None,
    mask: np.ndarray | None = None,
    causal: Causal | None = None,
    key_lengths: np.ndarray | None = None,
    vanishing_threshold: float = 1e-3,
    saturation_margin: float = 1e-6,
) -> list[SweepRow]:
    """The sweep's statistics, one row per point (all of whose ``head_dim`` must equal E of query and key).

    Computes in float64. Raises :class:`InvalidInput` for inputs the contract rejects, and
    :class:`NumericalError` naming the sweep point where a score overflows float64 at a position no mask removes
    (as /v1/attention refuses such scores), or where a statistic does not fit it.
    """
    q = np.asarray(query, dtype=np.float64)
    k = np.asarray(key, dtype=np.float64)
    dims = check_dims(q.shape, k.shape, k.shape)
    rows_out = []
    for point in points:
        if point.head_dim != dims.E:
            raise InvalidInput(f"sweep point head_dim {point.head_dim} differs from E = {dims.E}", ("head_dims",))
        params = AttentionParams(
            normalizer=normalizer, alpha=alpha, scale=point.scale, temperature=point.temperature, causal=causal
        )
        try:
            # value = key: its shape passes the checks and the pass never reads it
            p = prepare(AttentionInputs(q, k, k, mask, key_lengths), params, np.dtype(np.float64))
            sums = _Sums()
            for c in plan_chunks(p.dims, CHUNK_ELEMENTS):
                nkv = c.kv.stop - c.kv.start
                z = np.empty((nkv, (c.g.stop - c.g.start) * (c.l.stop - c.l.start), dims.S))
                with np.errstate(over="ignore", invalid="ignore", under="ignore"):
                    chunk_scores(p, c, z, check=True)  # an overflowed score is refused, never read as masked
                    _add_chunk(sums, z, normalizer, alpha, vanishing_threshold, saturation_margin)
            rows_out.append(_row(point, sums))
        except NumericalError as exc:
            where = f"scale = {point.scale:.3g}, temperature = {point.temperature:.3g}, head_dim = {point.head_dim}"
            raise NumericalError(f"at the sweep point {where}: {exc}", remedies=exc.remedies) from None
    return rows_out


def _add_chunk(
    sums: _Sums, z: np.ndarray, normalizer: str, alpha: float | None, threshold: float, margin: float
) -> None:
    z2 = z.reshape(-1, z.shape[-1])
    valid = ~np.isneginf(z2)
    n_valid = valid.sum(axis=-1)
    sums.add_scores(z2[valid])
    informative = n_valid >= 2
    if not informative.any():
        return
    zi, vi, ni = z2[informative], valid[informative], n_valid[informative]
    a = normalizers.normalize(zi, normalizer, alpha=alpha)
    sums.rows += int(zi.shape[0])
    sums.half_range_sum += float((zi.max(axis=-1) / 2 - np.where(vi, zi, np.inf).min(axis=-1) / 2).sum())
    positive = a > 0
    h = -np.where(positive, a * np.log(np.where(positive, a, 1.0)), 0.0).sum(axis=-1)
    h = np.maximum(h, 0.0)
    sums.entropy_sum += float(h.sum())
    sums.normalized_entropy_sum += float((h / np.log(ni)).sum())
    sums.saturated += int((a.max(axis=-1) > 1.0 - margin).sum())
    norms = jacobian_norms(normalizer, a, z=zi, alpha=alpha)
    sums.jacobian_sum += float(norms.sum())
    sums.vanishing += int((norms < threshold).sum())


def _row(point: SweepPoint, s: _Sums) -> SweepRow:
    rows = max(s.rows, 1)
    row = SweepRow(
        scale=point.scale,
        temperature=point.temperature,
        head_dim=point.head_dim,
        score_std=s.std(),
        score_range=s.half_range_sum / rows * 2,
        mean_entropy=s.entropy_sum / rows,
        mean_normalized_entropy=s.normalized_entropy_sum / rows,
        saturated_fraction=s.saturated / rows,
        mean_jacobian_norm=s.jacobian_sum / rows,
        vanishing_fraction=s.vanishing / rows,
        rows=s.rows,
    )
    for name, value in row.as_dict().items():
        if isinstance(value, float) and not math.isfinite(value):
            raise NumericalError(
                f"{name} is beyond float64's range ({_F64_MAX:.3g}); use a smaller scale or a larger temperature",
                remedies=("smaller_inputs", "larger_temperature"),
            )
    return row


_F64_MAX = float(np.finfo(np.float64).max)
