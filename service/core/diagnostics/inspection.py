"""Per-head inspection of one layer's attention: what the tools researchers use compute from the same tensors
(docs/concepts/diagnostics.md, "Inspection").

With ``A`` the weights ``(B, Hq, L, S)``, ``Q`` the queries, ``K`` and ``V`` the keys and values (``Hkv`` heads,
each shared by ``Hq / Hkv`` query heads), per (batch ``b``, query head ``h``):

- **sink mass** (StreamingLLM, Xiao et al. 2023): the mean, over the head's *live* rows (at least one valid key),
  of the weight on key positions ``0 .. P-1`` (``P`` = ``sink_positions``), counted from position 0 whatever the
  padding. 0 for a head without a live row.
- **spectral norm** (Zhai et al. 2023, "Stabilizing Transformer Training by Preventing Attention Entropy
  Collapse"): the largest singular value of the logits ``M = Q_h K_h^T * scale / T`` before any mask, over the
  keys that ``key_lengths`` keeps (service.core.diagnostics.spectral). Without forming ``M``: ``||M||_2^2`` is the
  largest eigenvalue of ``M^T M = K (Q^T Q) K^T``, whose non-zero eigenvalues are those of ``C = G_q G_k`` (the
  ``E x E`` Gram matrices). Computed by power iteration on ``C`` with its Rayleigh quotient (Golub & Van Loan,
  section 8.2), the steps accelerated by repeated squaring, from a fixed seeded start, to a stated tolerance: it
  stops when the residual of the Rayleigh pair is at most ``tol`` times the Rayleigh quotient (``tol`` = 1e-6 for
  float32 requests, 1e-10 for float64), which puts the norm within ``tol / 2`` (relative) of a singular value of
  ``M``, the largest; heads that miss it fall back to the exact route (Cholesky and ``eigvalsh``, or QR and SVD
  where ``G_q`` is singular). Heads with ``min(L, S, E) <= 32`` are exact: through ``M`` itself where ``L`` or ``S``
  is that small, the exact route where ``E`` is.
- **head pattern scores** (TransformerLens ``head_detector.py``, its ``"mul"`` error measure), when the token ids
  are given (``L == S``): ``sum(A' * P) / sum(A')`` with ``P`` the 0/1 detection pattern (previous token:
  ``j == i - 1``; duplicate token: ``j < i`` and ``t_j == t_i``; induction: ``1 <= j <= i`` and
  ``t_{j-1} == t_i``, TransformerLens' duplicate pattern shifted one key to the right) and ``A'`` the weights with,
  on request, the first key's column (``exclude_bos``) and the diagonal (``exclude_current_token``) set to 0.
  TransformerLens divides by ``sum(A')`` as it is; where that sum is 0 (every weight excluded) the score is 0
  here, not NaN.
- **norm-based weights** (Kobayashi et al. 2020, "Attention is not only a weight"): ``N_ij = ||A_ij v_j|| =
  A_ij ||v_j||`` (the weights are non-negative for every normalizer), and per head ``norm_max_share``, the mean
  over live rows of ``max_j N_ij / sum_j N_ij`` (rows whose norm mass is 0 left out), and
  ``norm_argmax_agreement``, the share of those rows whose largest ``N_ij`` is at the largest ``A_ij`` (ties: the
  first index, as ``argmax``).

Every sum runs in float64; the results are float64.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from service.core.diagnostics.spectral import spectral_norms

DEFAULT_SINK_POSITIONS = 4
"""StreamingLLM's four attention sinks."""
PATTERNS = ("previous_token_score", "duplicate_token_score", "induction_score")


def row_sink_mass(weights: np.ndarray, positions: int) -> np.ndarray:
    """Each row's weight on keys ``0 .. positions-1`` (float64, the weights' shape without its last axis): the
    session model's per-row ``sink_mass`` (its first kept positions), whose mean over live rows is a head's.
    """
    rows: np.ndarray = weights[..., : max(0, positions)].sum(axis=-1, dtype=np.float64)
    return rows


def sink_mass(weights: np.ndarray, valid_keys: np.ndarray, positions: int) -> np.ndarray:
    """``(B, Hq)``: the mean over live rows (``valid_keys > 0``) of each row's weight on keys ``0 .. positions-1``."""
    rows = row_sink_mass(weights, positions)
    live = valid_keys > 0
    count = live.sum(axis=-1)
    total = np.where(live, rows, 0.0).sum(axis=-1)
    mean: np.ndarray = np.divide(total, count, out=np.zeros(total.shape), where=count > 0)
    return mean


def detection_patterns(tokens: np.ndarray) -> dict[str, np.ndarray]:
    """TransformerLens' three 0/1 detection patterns ``(S, S)`` of one sequence of token ids (module docstring)."""
    S = tokens.shape[0]
    previous = np.eye(S, k=-1)
    same = tokens[:, None] == tokens[None, :]
    duplicate = np.tril(same, k=-1).astype(np.float64)
    shifted = np.zeros((S, S))
    shifted[:, 1:] = duplicate[:, :-1]
    induction = np.tril(shifted)
    return {"previous_token_score": previous, "duplicate_token_score": duplicate, "induction_score": induction}


def pattern_scores(
    weights: np.ndarray, tokens: np.ndarray, *, exclude_bos: bool = False, exclude_current_token: bool = False
) -> dict[str, np.ndarray]:
    """Each pattern's ``(B, Hq)`` score in TransformerLens' ``"mul"`` measure; ``weights`` ``(B, Hq, S, S)``,
    ``tokens`` ``(B, S)``.
    """
    B, Hq = weights.shape[:2]
    scores = {name: np.zeros((B, Hq)) for name in PATTERNS}
    for b in range(B):
        a = weights[b].astype(np.float64)  # (Hq, S, S), a copy: the exclusions do not touch the answer's weights
        if exclude_bos:
            a[:, :, 0] = 0.0
        if exclude_current_token:
            idx = np.arange(a.shape[-1])
            a[:, idx, idx] = 0.0
        denominators = a.sum(axis=(1, 2))
        for name, pattern in detection_patterns(tokens[b]).items():
            numerators = np.einsum("hij,ij->h", a, pattern)
            scores[name][b] = np.divide(numerators, denominators, out=np.zeros(Hq), where=denominators != 0)
    return scores


def norm_weights(weights: np.ndarray, value: np.ndarray) -> np.ndarray:
    """``||A_ij v_j||`` ``(B, Hq, L, S)`` in the weights' dtype; ``value`` ``(B, Hkv, S, Ev)``."""
    B, Hq, L, S = weights.shape
    Hkv = value.shape[1]
    v = value.astype(weights.dtype, copy=False)
    norms = np.sqrt(np.einsum("bksd,bksd->bks", v, v))  # (B, Hkv, S), in the weights' precision
    if Hq != Hkv:  # each key head's norms for each of its query heads: a 4-D product (numpy's 5-D broadcast of
        norms = np.repeat(norms, Hq // Hkv, axis=1)  # the same product ran 14x slower at (1, 8, 128, 128))
    normed: np.ndarray = np.multiply(weights, norms[:, :, None, :])
    np.abs(normed, out=normed)
    return normed


def norm_summary(weights: np.ndarray, normed: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per head: (``norm_max_share``, ``norm_argmax_agreement``, rows counted) over the rows with norm mass."""
    mass = normed.sum(axis=-1, dtype=np.float64)
    counted = mass > 0
    rows = counted.sum(axis=-1)
    top = normed.argmax(axis=-1)  # the row's largest N_ij read at its argmax: one pass fewer than max()
    largest = np.take_along_axis(normed, top[..., None], axis=-1)[..., 0]
    share = np.divide(largest, mass, out=np.zeros(mass.shape), where=counted)
    agree = (top == weights.argmax(axis=-1)) & counted
    mean_share = np.divide(np.where(counted, share, 0.0).sum(axis=-1), rows, out=np.zeros(rows.shape), where=rows > 0)
    agreement = np.divide(agree.sum(axis=-1), rows, out=np.zeros(rows.shape), where=rows > 0)
    return mean_share, agreement, rows


@dataclass(frozen=True, slots=True)
class Inspection:
    """The per-head inspection of one layer (module docstring), ``(B, Hq)`` arrays."""

    sink_positions: int
    sink_mass: np.ndarray
    spectral_norm: np.ndarray
    live_rows: np.ndarray
    patterns: dict[str, np.ndarray] | None = None
    norm_max_share: np.ndarray | None = None
    norm_argmax_agreement: np.ndarray | None = None

    def heads(self) -> list[dict[str, Any]]:
        """JSON-ready, one entry per (batch, query head) in that order."""
        B, H = self.sink_mass.shape
        entries = []
        for b in range(B):
            for h in range(H):
                entry: dict[str, Any] = {
                    "batch": b,
                    "head": h,
                    "sink_mass": float(self.sink_mass[b, h]),
                    "spectral_norm": float(self.spectral_norm[b, h]),
                    "live_rows": int(self.live_rows[b, h]),
                }
                if self.patterns is not None:
                    entry.update({name: float(score[b, h]) for name, score in self.patterns.items()})
                if self.norm_max_share is not None and self.norm_argmax_agreement is not None:
                    entry["norm_max_share"] = float(self.norm_max_share[b, h])
                    entry["norm_argmax_agreement"] = float(self.norm_argmax_agreement[b, h])
                entries.append(entry)
        return entries


def inspect(
    weights: np.ndarray,
    valid_keys: np.ndarray,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    *,
    factor: float,
    key_lengths: np.ndarray | None = None,
    sink_positions: int = DEFAULT_SINK_POSITIONS,
    tokens: np.ndarray | None = None,
    exclude_bos: bool = False,
    exclude_current_token: bool = False,
    normed: np.ndarray | None = None,
) -> Inspection:
    """The inspection of one layer, every array in rank 4 (module docstring); ``normed``: the norm-based weights
    when they were computed (their summary is added).
    """
    patterns = None
    if tokens is not None:
        patterns = pattern_scores(weights, tokens, exclude_bos=exclude_bos, exclude_current_token=exclude_current_token)
    share = agreement = None
    if normed is not None:
        share, agreement, _ = norm_summary(weights, normed)
    return Inspection(
        sink_positions=sink_positions,
        sink_mass=sink_mass(weights, valid_keys, sink_positions),
        spectral_norm=spectral_norms(query, key, factor, key_lengths),
        live_rows=(valid_keys > 0).sum(axis=-1),
        patterns=patterns,
        norm_max_share=share,
        norm_argmax_agreement=agreement,
    )
