"""The sampling operation: logits post-processing (mask, penalties, temperature, top-k, top-p, min-p, in that
order) and seeded draws from the final distribution (:mod:`service.core.sampling`).
"""

from __future__ import annotations

import secrets
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.core import sampling
from service.core.errors import NumericalError, wider_remedies
from service.dataplane import budget
from service.dataplane.context import Context
from service.dataplane.errors import invalid
from service.dataplane.memory import MemoryLease
from service.dataplane.options import SERVER_SEED_BITS, SampleOptionsLike
from service.dataplane.scheduling import Job
from service.dataplane.tensors import finite_as, float_mask_as
from service.dataplane.timing import Timing

TIMING_ORDER = ("decode", "compute", "encode")


@dataclass(slots=True)
class SampleOutcome:
    """The draws and what was asked about them; per-row values are scalars for (V,) logits, lists for (N, V)."""

    tokens: np.ndarray
    """(n,) or (N, n) int64."""
    logprobs: np.ndarray | None
    raw_logprobs: np.ndarray | None
    top_logprobs: Any
    """Per row, ``[{"token", "logprob"}, ...]`` (a list of them for (N, V) logits)."""
    probabilities: np.ndarray | None
    diagnostics: dict[str, Any] | None
    seed: int
    timing: Timing


def params_of(options: SampleOptionsLike) -> sampling.SamplingParams:
    return sampling.SamplingParams(
        temperature=options.temperature,
        top_k=options.top_k,
        top_p=options.top_p,
        min_p=options.min_p,
        repetition_penalty=options.repetition_penalty,
        presence_penalty=options.presence_penalty,
        frequency_penalty=options.frequency_penalty,
    )


def _per_row(arr: np.ndarray, rank: int) -> Any:
    """A per-row array as the answer carries it: a scalar for (V,) logits, a list for (N, V)."""
    return arr[0].item() if rank == 1 else arr


def sample(
    ctx: Context,
    logits: np.ndarray,
    mask: np.ndarray | None,
    previous_tokens: sampling.TokenLists | None,
    options: SampleOptionsLike,
    *,
    precision: str,
    returned: Collection[str],
    encoding: str,
    timing: Timing,
) -> Job[SampleOutcome]:
    """``options.n`` draws per row of ``logits`` ((V,) or (N, V)); ``returned`` is a subset of tokens, logprobs,
    raw_logprobs, top_logprobs, probabilities, diagnostics. Without a seed the server draws one (< 2**53).
    """
    if logits.ndim == 2 and logits.shape[0] > ctx.max_rows:
        raise invalid(f"logits has {logits.shape[0]} rows, above the limit of {ctx.max_rows}", "logits", "shape", 0)
    dtype = np.dtype(precision)
    logits = finite_as(logits, dtype, "logits")
    mask = float_mask_as(mask, dtype)
    rows, vocab = (1, logits.shape[0]) if logits.ndim == 1 else logits.shape
    returned = frozenset(returned)
    sorts_all = options.top_p < 1 and not 0 < options.top_k < vocab and options.temperature > 0
    flops, size, memory = budget.sample_estimate(
        rows, vocab, options.n, options.top_logprobs, returned, sorts_all, precision, encoding
    )
    budget.enforce(ctx.budget, flops, size, memory)
    timing.phase("decode")

    def run(lease: MemoryLease) -> SampleOutcome:
        timing.skip()
        rank = logits.ndim
        raw: sampling.RawStats | None = None
        if "raw_logprobs" in returned or "diagnostics" in returned:
            raw = sampling.raw_stats(np.atleast_2d(logits))
        filtered, _ = sampling.process(
            logits,
            params_of(options),
            mask=mask,
            previous_tokens=previous_tokens,
            dtype=dtype,
            removed_mass="diagnostics" in returned,
            raw=raw,
        )
        seed = options.seed if options.seed is not None else secrets.randbits(SERVER_SEED_BITS)
        tokens, logprobs = sampling.draw(filtered, sampling.uniforms(seed, (rows, options.n)))
        timing.phase("compute")
        shape = (options.n,) if rank == 1 else (rows, options.n)
        raw_lp = None
        if "raw_logprobs" in returned:
            assert raw is not None
            picked = np.take_along_axis(np.atleast_2d(logits), tokens, axis=-1).astype(np.float64)
            raw_lp = representable(picked - raw.max[:, None] - raw.lse[:, None], dtype, "raw_logprobs").reshape(shape)
        diagnostics = None
        if "diagnostics" in returned:
            assert raw is not None
            diagnostics = {
                "entropy_raw": _per_row(raw.entropy, rank),
                "entropy": _per_row(filtered.entropy, rank),
                "kept": _per_row(filtered.kept.astype(np.int64), rank),
                "removed_mass": _per_row(filtered.removed_mass + 0.0, rank),
            }
        return SampleOutcome(
            tokens=tokens.reshape(shape),
            logprobs=logprobs.astype(dtype).reshape(shape) if "logprobs" in returned else None,
            raw_logprobs=raw_lp,
            top_logprobs=_top_logprobs(filtered, options.top_logprobs, rank) if "top_logprobs" in returned else None,
            probabilities=filtered.dense(dtype).reshape(logits.shape) if "probabilities" in returned else None,
            diagnostics=diagnostics,
            seed=seed,
            timing=timing,
        )

    return Job(flops, size, memory, run)


def representable(values: np.ndarray, dtype: np.dtype, name: str) -> np.ndarray:
    """float64 ``values`` in the answer's ``dtype``; one beyond it (a raw log-probability of -6e38 from float32
    logits 3e38 apart) is refused by element, never answered as -inf (null in JSON).
    """
    with np.errstate(over="ignore"):
        out = values.astype(dtype)
    if dtype == values.dtype or np.isfinite(out).all():
        return out
    i = int(np.argmax(~np.isfinite(out).reshape(-1)))
    raise NumericalError(
        f"{name}[{i}] = {values.reshape(-1)[i]:g} is beyond {dtype.name} (largest {float(np.finfo(dtype).max):g}): "
        f"the drawn token's log-probability under the logits as given; use precision float64, or leave {name} out",
        remedies=wider_remedies(dtype.name),
    )


def _top_logprobs(filtered: sampling.Filtered, m: int, rank: int) -> Any:
    """Per row, the m most probable tokens of the final distribution as ``[{"token", "logprob"}, ...]``."""
    if m == 0:
        lists: list[list[dict[str, Any]]] = [[] for _ in range(filtered.ids.shape[0])]
    else:
        ids, logp, valid = sampling.top_logprobs(filtered, m)
        # Log-probabilities stay numpy scalars: orjson writes a float32 with its own shortest digits.
        lists = [
            [{"token": t, "logprob": lp} for t, lp, ok in zip(ti, li, vi, strict=True) if ok]
            for ti, li, vi in zip(ids.tolist(), logp, valid.tolist(), strict=True)
        ]
    return lists[0] if rank == 1 else lists
