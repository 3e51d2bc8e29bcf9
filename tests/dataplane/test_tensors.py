"""The quick check of tiny tensors in ``finite_as`` agrees with numpy's, value for value and message for message."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from service.core.errors import InvalidInput
from service.dataplane import tensors
from service.dataplane.tensors import finite_as

SPECIALS = [0.0, -0.0, 1.5, np.nan, np.inf, -np.inf, 3.4028235e38, -3.4028235e38, 3.4028236e38, 1e39, -1e39, 1e308]


def outcome(arr: np.ndarray, dtype: np.dtype) -> tuple[str, bytes] | str:
    try:
        out = finite_as(arr, dtype, "query")
    except InvalidInput as exc:
        return f"{exc} {exc.loc}"
    return out.dtype.str, out.tobytes()


@pytest.mark.parametrize("source", ["float16", "float32", "float64"])
@pytest.mark.parametrize("target", ["float32", "float64"])
def test_quick_check_matches_numpy(monkeypatch: pytest.MonkeyPatch, source: str, target: str) -> None:
    rng = np.random.default_rng(7)
    cases = []
    with np.errstate(over="ignore"):
        for special, where in itertools.product(SPECIALS, [0, 5, 15]):
            arr = rng.standard_normal((1, 1, 4, 4)).astype(source)
            arr.reshape(-1)[where] = special
            cases.append(arr)
        big = np.full((2, 3), 1e308)  # a sum that overflows float64 although every value is finite
        cases.append(big.astype(source))
    dtype = np.dtype(target)
    quick = [outcome(a, dtype) for a in cases]
    monkeypatch.setattr(tensors, "PYTHON_CHECK_MAX", 0)
    assert [outcome(a, dtype) for a in cases] == quick
    assert sum(isinstance(o, str) for o in quick) > 0  # the specials were refused on both paths


def test_quick_check_returns_the_input_when_no_cast_is_needed() -> None:
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert finite_as(arr, np.dtype(np.float32), "query") is arr
    widened = finite_as(arr, np.dtype(np.float64), "query")
    assert widened.dtype == np.float64 and widened.tolist() == arr.tolist()
