"""Attention normalizers and their vector-Jacobian products (docs/concepts/normalizers.md).

Every forward map turns a score vector ``z`` into weights on the probability
simplex ``Delta = {p : p >= 0, sum(p) = 1}``, along ``axis`` of an array of any
rank. Shared contract:

- masked positions arrive as ``-inf`` and come out as exactly 0;
- a fully masked row (all ``-inf``) comes out as all zeros, never NaN, and no
  floating-point warning is raised (no ``inf - inf``, ``0/0`` or ``log 0`` is
  ever evaluated);
- the row max (over the finite entries) is subtracted first, so very large
  scores (``1e4`` in float32) are safe; ``relu`` is the exception because it is
  not shift invariant;
- floating dtypes are preserved (non-floating input is computed as float64).
  Sort-based and bisection normalizers compute in float64 internally, in row
  chunks of bounded size, and cast back.

``+inf`` and NaN scores are outside the contract (NaN propagates).

Layout:

- ``rows``: shared pieces (dtypes, row maxima, safe denominators, rows in bounded chunks, sorted candidates).
- ``softmax``: :func:`softmax` and :func:`log_softmax`.
- ``sparse``: the exact sort-based :func:`sparsemax` and :func:`entmax15`.
- ``bisection``: :func:`entmax_bisect`, alpha-entmax for any alpha > 1.
- ``relu``: :func:`relu_normalize` and :func:`relu_row_sums`.
- ``gradients``: the vector-Jacobian products (``*_backward``).
- ``dispatch``: the normalizers by name, :func:`normalize` and :func:`normalize_backward`.

References:
    A. F. T. Martins and R. F. Astudillo, "From Softmax to Sparsemax: A Sparse
    Model of Attention and Multi-Label Classification", ICML 2016.
    B. Peters, V. Niculae and A. F. T. Martins, "Sparse Sequence-to-Sequence
    Models", ACL 2019.
    M. Blondel, A. F. T. Martins and V. Niculae, "Learning with Fenchel-Young
    Losses", JMLR 21, 2020.

"""

from __future__ import annotations

from service.core.normalizers.bisection import NEAR_ONE, entmax_bisect
from service.core.normalizers.dispatch import NORMALIZER_NAMES, normalize, normalize_backward
from service.core.normalizers.gradients import entmax_backward, relu_backward, softmax_backward, sparsemax_backward
from service.core.normalizers.relu import relu_normalize, relu_row_sums
from service.core.normalizers.rows import ROW_CHUNK_ELEMENTS
from service.core.normalizers.softmax import log_softmax, softmax
from service.core.normalizers.sparse import entmax15, sparsemax

__all__ = [
    "NEAR_ONE",
    "NORMALIZER_NAMES",
    "ROW_CHUNK_ELEMENTS",
    "entmax15",
    "entmax_backward",
    "entmax_bisect",
    "log_softmax",
    "normalize",
    "normalize_backward",
    "relu_backward",
    "relu_normalize",
    "relu_row_sums",
    "softmax",
    "softmax_backward",
    "sparsemax",
    "sparsemax_backward",
]
