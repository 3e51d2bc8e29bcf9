"""Steps 1-3: the masks, the repetition penalty and the frequency and presence penalties."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

from service.core.errors import InvalidInput, wider_remedies
from service.core.sampling.params import SamplingParams, TokenLists


def previous_token_pairs(previous_tokens: TokenLists, rows: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, token) index pairs of ``previous_tokens``: one list for every row, or one list per row.

    An integer array of rank 2 (the /v2 form) is one list per row, where ``-1`` entries are padding.
    Ids outside ``[0, vocab)`` are an :class:`InvalidInput` naming the element.
    """
    position: np.ndarray  # (T, k): each token's index in the request, for error messages
    if isinstance(previous_tokens, np.ndarray):
        arr = previous_tokens
        if arr.dtype.kind not in "iu" or arr.ndim not in (1, 2):
            raise InvalidInput("previous_tokens must be integers, one list or one list per row", ("previous_tokens",))
        per_row = arr.ndim == 2
        if per_row:
            if arr.shape[0] != rows:
                raise InvalidInput(
                    f"previous_tokens has {arr.shape[0]} rows but the logits have {rows}", ("previous_tokens",)
                )
            r, c = np.nonzero(arr != -1)
            toks = arr[r, c].astype(np.int64)
            row_ids = r.astype(np.int64)
            position = np.stack([r, c], axis=1)
        else:
            toks = arr.astype(np.int64)
            row_ids = np.zeros(0, np.int64)
            position = np.arange(toks.size)[:, None]
    else:
        items = list(previous_tokens)
        per_row = bool(items) and isinstance(items[0], list | tuple | np.ndarray)
        if per_row:
            for i, x in enumerate(items):
                if not isinstance(x, list | tuple | np.ndarray):
                    raise InvalidInput(
                        f"previous_tokens[{i}] must be a list of token ids: give one list per row, or one flat list",
                        ("previous_tokens", i),
                    )
                _check_ids(x, vocab, (i,))
            if len(items) != rows:
                raise InvalidInput(
                    f"previous_tokens has {len(items)} lists but the logits have {rows} rows", ("previous_tokens",)
                )
            lists = cast(list[Sequence[int]], items)
            lengths = np.array([len(x) for x in lists], dtype=np.int64)
            toks = np.fromiter((t for x in lists for t in x), dtype=np.int64, count=int(lengths.sum()))
            row_ids = np.repeat(np.arange(rows, dtype=np.int64), lengths)
        else:
            _check_ids(items, vocab, ())
            toks = np.asarray(items, dtype=np.int64).reshape(-1)
            row_ids = np.zeros(0, np.int64)
        position = np.zeros((0, 1), dtype=np.int64)  # every id was checked above
    bad = np.nonzero((toks < 0) | (toks >= vocab))[0]
    if bad.size:
        i = int(bad[0])
        where = [int(v) for v in position[i]]
        raise InvalidInput(
            f"previous_tokens{where} = {int(toks[i])} is not a token id in [0, {vocab})",
            ("previous_tokens", *where),
        )
    if not per_row:  # one list for every row
        row_ids = np.repeat(np.arange(rows, dtype=np.int64), toks.size)
        toks = np.tile(toks, rows)
    return row_ids, toks


def _check_ids(ids: Sequence[object] | np.ndarray, vocab: int, where: tuple[int, ...]) -> None:
    """Each element an integer token id in [0, vocab), or an :class:`InvalidInput` naming the first that is not."""
    for j, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, int | np.integer) or not 0 <= t < vocab:
            loc = (*where, j)
            what = "an integer" if isinstance(t, bool) or not isinstance(t, int | np.integer) else "a token id"
            raise InvalidInput(
                f"previous_tokens{list(loc)} = {t!r} is not {what} in [0, {vocab})", ("previous_tokens", *loc)
            )


def apply_penalties(z: np.ndarray, row_ids: np.ndarray, tokens: np.ndarray, params: SamplingParams) -> bool:
    """Steps 2 and 3, in place on ``z`` (N, V): the repetition penalty once per distinct token, then
    the frequency and presence penalties (OpenAI's rule: ``- f * count - p * [count > 0]``).
    Returns whether any logit changed.
    """
    if tokens.size == 0:
        return False
    if params.repetition_penalty == 1 and params.frequency_penalty == 0 and params.presence_penalty == 0:
        return False
    vocab = z.shape[1]
    keys, counts = np.unique(row_ids * vocab + tokens, return_counts=True)
    r, c = np.divmod(keys, vocab)
    vals = z[r, c].astype(np.float64)
    rep = params.repetition_penalty
    if rep != 1:
        with np.errstate(over="ignore"):
            vals = np.where(vals > 0, vals / rep, vals * rep)
    with np.errstate(over="ignore", invalid="ignore"):  # huge penalties: checked just below
        vals = vals - params.frequency_penalty * counts - params.presence_penalty
        out = vals.astype(z.dtype)
    if np.isposinf(out).any() or np.isnan(out).any():
        raise InvalidInput(
            f"the penalties make a logit overflow {z.dtype.name}",
            ("frequency_penalty",),
            remedies=wider_remedies(z.dtype.name, "smaller_penalties"),
        )
    z[r, c] = out
    return True


def apply_mask(z: np.ndarray, mask: np.ndarray | None) -> None:
    """Step 1 in place: a boolean mask (True = keep) sets removed tokens to -inf, a float mask is added."""
    if mask is None:
        return
    try:
        if np.broadcast_shapes(mask.shape, z.shape) != z.shape:
            raise ValueError
    except ValueError:
        raise InvalidInput(
            f"mask shape {tuple(mask.shape)} does not broadcast to the logits shape {tuple(z.shape)}",
            ("mask", "shape"),
        ) from None
    if mask.dtype == bool:
        np.copyto(z, -np.inf, where=~mask)
    else:
        if np.isnan(mask).any() or np.isposinf(mask).any():
            raise InvalidInput("a float mask may hold finite numbers or -inf, not NaN or +inf", ("mask",))
        with np.errstate(over="ignore"):
            z += mask.astype(z.dtype, copy=False)
        if np.isposinf(z).any():
            raise InvalidInput(f"logits + mask overflow {z.dtype.name}", ("mask",))
