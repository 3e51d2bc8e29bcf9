"""A 60-digit reference for alpha-entmax, in the standard library's ``decimal`` (no float rounding anywhere).

``p_i = (1 + a (y_i - lam))_+^(1/a)`` with ``a = alpha - 1``, ``y = z - max z`` and ``lam`` found by bisection
so that the weights sum to 1 (docs/concepts/normalizers.md's ``[(alpha-1) z - tau]_+^(1/(alpha-1))`` with
``tau = a lam - 1``).
The float64 ``alpha`` and scores are taken exactly as the binary numbers they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal, localcontext

DIGITS = 60


def entmax_reference(z: Sequence[float], alpha: float) -> list[float]:
    """alpha-entmax of one row (``-inf`` = masked) to 60 significant digits, rounded to float64 at the end."""
    with localcontext() as ctx:
        ctx.prec = DIGITS
        a = Decimal(alpha) - 1
        inv = 1 / a
        finite = [Decimal(v) for v in z if v != float("-inf")]
        top = max(finite)
        y = [None if v == float("-inf") else Decimal(v) - top for v in z]

        def weights(lam: Decimal) -> list[Decimal]:
            out = []
            for v in y:
                base = Decimal(0) if v is None else 1 + a * (v - lam)
                out.append(base**inv if base > 0 else Decimal(0))
            return out

        lo, hi = Decimal(0), Decimal(len(finite)).ln()  # sum p >= 1 at 0, <= 1 at ln n (>= (1 - n^-a) / a)
        for _ in range(210):  # ln n * 2^-210 < 1e-60
            mid = (lo + hi) / 2
            if sum(weights(mid)) >= 1:
                lo = mid
            else:
                hi = mid
        p = weights(lo)
        total = sum(p)
        return [float(v / total) for v in p]
