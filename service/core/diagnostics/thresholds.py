"""The thresholds of the per-head flags and of saturation (settings ``ATTN_DIAG_*``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DiagnosticThresholds:
    """Thresholds of the per-head flags and of saturation (settings ``ATTN_DIAG_*``).

    * ``collapsed_max_weight`` (0.9): an informative row *collapses* when its max
      weight is ``>=`` this, i.e. at least 90 % of its mass sits on one key.
    * ``collapsed_row_fraction`` (0.5): a head is ``collapsed`` when strictly
      more than this fraction of its informative rows collapse ("most rows").
    * ``uniform_normalized_entropy`` (0.95): a head is ``uniform`` when the mean
      normalized entropy of its informative rows is ``>=`` this (1 is exactly
      uniform; 0.95 still means the head barely discriminates between keys).
    * ``saturation_margin`` (1e-6, docs/concepts/diagnostics.md): an informative row is
      *saturated* when its max weight is ``> 1 - margin``: softmax gradients
      through it are then below ~1e-6 and vanish.
    """

    collapsed_max_weight: float = 0.9
    collapsed_row_fraction: float = 0.5
    uniform_normalized_entropy: float = 0.95
    saturation_margin: float = 1e-6

    def __post_init__(self) -> None:
        """Reject values outside the ranges where the flags make sense."""
        checks = (
            ("collapsed_max_weight", self.collapsed_max_weight, 0.0, 1.0, False),
            ("collapsed_row_fraction", self.collapsed_row_fraction, 0.0, 1.0, True),
            ("uniform_normalized_entropy", self.uniform_normalized_entropy, 0.0, 1.0, False),
            ("saturation_margin", self.saturation_margin, 0.0, 1.0, False),
        )
        for name, value, low, high, low_closed in checks:
            v = float(value)
            ok = (low <= v if low_closed else low < v) and v <= high
            if not ok:
                left = "[" if low_closed else "("
                raise ValueError(f"{name} must be in {left}{low}, {high}], got {value!r}")
