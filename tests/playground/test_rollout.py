"""The playground's panel 6, rollout across layers (issue 31 item 6), in a real headless Chromium.

A stack of attention weights written by numpy (``np.save``, ``np.savez``, ``np.savez_compressed``) is chosen in the
panel's file input; the page reads the file itself (static/npy.js), sends the stack's bytes as the base64 tensor form
to ``POST /v1/attention/rollout`` and draws one batch entry's rollout. The heatmap's cells (their ``data-w``) and the
rows' sums equal ``service.core.rollout`` computed here for the same stack and options; the files the page cannot
take and the server's 422 show in the panel's live region. Saves ``playground-rollout.png``.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.core.rollout import RolloutParams, row_sum_tolerance
from service.core.rollout import rollout as core_rollout
from tests.playground import test_page as base

pytestmark = pytest.mark.slow

# the browser, a fresh page of the page server per test, and the screenshots' folder: test_page.py's fixtures
browser = base.browser
page = base.page
shots = base.shots
expect = base.expect

ROLLOUT = "/v1/attention/rollout"


def causal_stack(seed: int, shape: tuple[int, ...], dtype: Any = np.float32, sharpness: float = 1.0) -> np.ndarray:
    """Softmax weights under the causal mask, ``shape`` ending in (L, L): each row sums to 1 over keys 0..i."""
    rng = np.random.default_rng(seed)
    scores = sharpness * rng.standard_normal(shape)
    length = shape[-1]
    scores[..., np.triu(np.ones((length, length), bool), 1)] = -np.inf
    w = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (w / w.sum(axis=-1, keepdims=True)).astype(dtype)


def expected(stack: np.ndarray, **options: Any) -> np.ndarray:
    """``service.core.rollout`` of a [layers, B, H, L, L] stack as the page asks for it (float64 answers)."""
    params = RolloutParams(tolerance=row_sum_tolerance(stack.dtype, np.dtype(np.float64)), **options)
    return core_rollout(stack, None, params)


def rollout_bodies(page: Any) -> list[dict[str, Any]]:
    """The bodies the page sends to POST /v1/attention/rollout from now on."""
    bodies: list[dict[str, Any]] = []
    page.on(
        "request", lambda r: bodies.append(r.post_data_json) if r.method == "POST" and r.url.endswith(ROLLOUT) else None
    )
    return bodies


def drawn(page: Any, key: str) -> list[tuple[int, int, float]]:
    """Wait for the rollout heatmap of ``key`` (file|array|fusion|residual|discard|renormalize|batch); its cells."""
    page.wait_for_selector(f'#ro-heatmap[data-key="{key}"]', timeout=20_000)
    got = page.eval_on_selector_all(
        "#ro-heatmap svg.heatmap rect.cell", "rs => rs.map(r => [+r.dataset.i, +r.dataset.j, +r.dataset.w])"
    )
    return [tuple(c) for c in got]


def check_cells(cells: list[tuple[int, int, float]], want: np.ndarray) -> None:
    """The heatmap's cells are ``want`` [L, L], every one of them."""
    assert len(cells) == want.size
    np.testing.assert_allclose([w for *_, w in cells], [want[i, j] for i, j, _ in cells], rtol=1e-12, atol=1e-15)


def row_sums(page: Any) -> list[tuple[int, float]]:
    got = page.eval_on_selector_all("#ro-sums tbody tr", "rs => rs.map(r => [+r.dataset.row, +r.dataset.sum])")
    return [tuple(r) for r in got]


def test_rollout_heatmap_equals_the_core_for_an_npy_stack(page: Any, tmp_path: Path, shots: Path) -> None:
    """np.save's float32 [layers, B, H, L, L]: sent as its bytes in base64, the heatmap and the row sums are the
    core's rollout of the chosen batch entry; another batch entry is drawn from the same answer; every option goes.
    """
    stack = causal_stack(0, (4, 2, 3, 12, 12), sharpness=2.0)
    path = tmp_path / "vit-stack.npy"
    np.save(path, stack)
    bodies = rollout_bodies(page)
    assert page.get_attribute("#ro-sums-box", "hidden") is not None  # nothing drawn before a file is chosen
    page.set_input_files("#ro-file", str(path))
    cells = drawn(page, "vit-stack.npy|vit-stack|mean|0.5|0|false|0")
    body = bodies[-1]
    weights = body["weights"]
    assert weights["shape"] == [4, 2, 3, 12, 12] and weights["dtype"] == "float32"
    assert base64.b64decode(weights["b64"]) == stack.tobytes()  # the file's bytes, as they are
    assert {k: v for k, v in body.items() if k != "weights"} == {
        "head_fusion": "mean",
        "residual": 0.5,
        "discard_ratio": 0,
        "renormalize": False,
        "precision": "float64",
    }
    want = expected(stack)
    check_cells(cells, want[0])
    sums = row_sums(page)
    assert [i for i, _ in sums] == list(range(12))
    np.testing.assert_allclose([s for _, s in sums], want[0].sum(axis=-1), rtol=1e-12)
    np.testing.assert_allclose([s for _, s in sums], 1.0, rtol=1e-12)  # residual > 0: each row a distribution
    # the colour bar: 0 to the entry's largest value, with its ticks; no "masked" in the legend (nothing is)
    bar = page.eval_on_selector(
        "#ro-heatmap g.colorbar",
        "b => [+b.dataset.min, +b.dataset.max, [...b.querySelectorAll('text.tick')].map(t => +t.dataset.value)]",
    )
    assert bar[0] == 0 and bar[1] == pytest.approx(want[0].max(), rel=1e-12) and len(bar[2]) == 5
    assert page.locator("#ro-heatmap g.legend-entry").all_text_contents() == ["share 0"]
    assert page.get_attribute("#ro-heatmap", "data-shape") == "4,2,3,12,12"
    assert page.get_attribute("#ro-batch", "max") == "1"
    expect(page.locator("#ro-summary")).to_contain_text("4 layers, B = 2, 3 heads, L = 12, float32")
    page.evaluate("document.getElementById('panel-rollout').scrollIntoView()")
    page.locator("#panel-rollout").screenshot(path=str(shots / "playground-rollout.png"))

    page.fill("#ro-batch", "1")  # the other batch entry: drawn from the same answer, no request
    check_cells(drawn(page, "vit-stack.npy|vit-stack|mean|0.5|0|false|1"), want[1])
    assert len(bodies) == 1
    page.select_option("#ro-fusion", "max")
    page.fill("#ro-residual", "0.3")
    page.fill("#ro-discard", "0.2")
    page.check("#ro-renormalize")
    cells = drawn(page, "vit-stack.npy|vit-stack|max|0.3|0.2|true|1")
    assert bodies[-1]["head_fusion"] == "max" and bodies[-1]["residual"] == 0.3
    assert bodies[-1]["discard_ratio"] == 0.2 and bodies[-1]["renormalize"] is True
    check_cells(cells, expected(stack, head_fusion="max", residual=0.3, discard_ratio=0.2, renormalize=True)[1])
    page.select_option("#ro-fusion", "min")
    page.fill("#ro-residual", "0.5")
    page.fill("#ro-discard", "0")
    page.uncheck("#ro-renormalize")
    page.fill("#ro-batch", "0")
    check_cells(drawn(page, "vit-stack.npy|vit-stack|min|0.5|0|false|0"), expected(stack, head_fusion="min")[0])
    expect(page.locator("#ro-error")).to_have_text("")
    assert page.errors == [] and page.outside == []


def test_a_4d_float16_stack_is_one_batch_entry(page: Any, tmp_path: Path) -> None:
    """[layers, H, L, L] goes as [layers, 1, H, L, L] (the same bytes); float16 keeps its dtype on the wire."""
    stack = causal_stack(1, (3, 2, 5, 5), np.float16)
    path = tmp_path / "heads.npy"
    np.save(path, stack)
    bodies = rollout_bodies(page)
    page.set_input_files("#ro-file", str(path))
    cells = drawn(page, "heads.npy|heads|mean|0.5|0|false|0")
    weights = bodies[-1]["weights"]
    assert weights["shape"] == [3, 1, 2, 5, 5] and weights["dtype"] == "float16"
    assert base64.b64decode(weights["b64"]) == stack.tobytes()
    check_cells(cells, expected(stack[:, None])[0])
    assert page.get_attribute("#ro-batch", "max") == "0" and page.get_attribute("#ro-array-label", "hidden") is not None
    page.fill("#ro-batch", "1")  # there is no batch entry 1: the page says so
    expect(page.locator("#ro-error")).to_contain_text("batch entry: a whole number from 0 to 0")
    assert page.get_attribute("#ro-batch", "aria-invalid") == "true"
    expect(page.locator("#ro-heatmap svg")).to_have_count(0)
    page.fill("#ro-batch", "0")
    drawn(page, "heads.npy|heads|mean|0.5|0|false|0")
    assert page.get_attribute("#ro-batch", "aria-invalid") is None and len(bodies) == 1
    assert page.errors == [] and page.outside == []


@pytest.mark.parametrize("compressed", [False, True], ids=["savez", "savez_compressed"])
def test_an_npz_with_two_stacks_and_the_menu(page: Any, tmp_path: Path, compressed: bool) -> None:
    """np.savez (stored entries) and np.savez_compressed (deflated, inflated by the browser): a menu of the
    arrays, each drawn as the core's rollout; an array that is not a stack says why.
    """
    first = causal_stack(2, (2, 2, 2, 6, 6), np.float64)
    second = causal_stack(3, (3, 1, 4, 4, 4), np.float32)
    path = tmp_path / "two.npz"
    (np.savez_compressed if compressed else np.savez)(path, first=first, second=second, ids=np.arange(6))
    page.set_input_files("#ro-file", str(path))
    check_cells(drawn(page, "two.npz|first|mean|0.5|0|false|0"), expected(first)[0])
    assert page.get_attribute("#ro-array-label", "hidden") is None
    options = page.eval_on_selector_all("#ro-array option", "os => os.map(o => o.textContent)")
    assert options == [
        "first (2 × 2 × 2 × 6 × 6, float64)",
        "second (3 × 1 × 4 × 4 × 4, float32)",
        "ids (not readable)",
    ]
    page.select_option("#ro-array", label=options[1])
    check_cells(drawn(page, "two.npz|second|mean|0.5|0|false|0"), expected(second)[0])
    assert page.get_attribute("#ro-heatmap", "data-shape") == "3,1,4,4,4"
    page.select_option("#ro-array", label=options[2])  # not a stack: the page says why, sends nothing
    expect(page.locator("#ro-error")).to_contain_text("two.npz[ids]: dtype int64 ('<i8'): the stack must be float16")
    expect(page.locator("#ro-heatmap svg")).to_have_count(0)
    page.select_option("#ro-array", label=options[0])
    page.fill("#ro-batch", "1")
    check_cells(drawn(page, "two.npz|first|mean|0.5|0|false|1"), expected(first)[1])
    expect(page.locator("#ro-error")).to_have_text("")
    assert page.errors == [] and page.outside == []


def test_files_the_page_refuses_and_the_servers_422(page: Any, tmp_path: Path) -> None:
    """Fortran order, other dtypes, big-endian floats, another rank and a file that is not numpy's: the page's own
    message; a negative weight: the server's 422 naming layer, batch, head and row. Each takes the heatmap down, in
    the panel's polite live region; a good file brings it back.
    """
    assert (
        page.get_attribute("#ro-error", "aria-live") == "polite" and page.get_attribute("#ro-error", "role") == "status"
    )
    stack = causal_stack(4, (2, 1, 2, 4, 4), np.float64)
    good = tmp_path / "good.npy"
    np.save(good, stack)
    cases: list[tuple[str, Any, str]] = [
        ("fortran.npy", np.asfortranarray(stack), "fortran.npy: Fortran order (column-major) is not read here"),
        ("ints.npy", np.ones((2, 1, 2, 4, 4), np.int64), "ints.npy: dtype int64 ('<i8'): the stack must be float16"),
        ("big.npy", stack.astype(">f4"), "big.npy: dtype big-endian float32 ('>f4')"),
        ("flat.npy", stack[0, 0], "flat.npy: shape (2, 4, 4) has 3 axes; a stack is [layers, B, H, L, L]"),
    ]
    for name, array, _message in cases:
        np.save(tmp_path / name, array)
    (tmp_path / "notes.npy").write_text("not numpy")
    cases.append(("notes.npy", None, "notes.npy is neither a .npy file"))

    page.set_input_files("#ro-file", str(good))
    drawn(page, "good.npy|good|mean|0.5|0|false|0")
    for name, _array, message in cases:
        page.set_input_files("#ro-file", str(tmp_path / name))
        expect(page.locator("#ro-error")).to_contain_text(message)
        expect(page.locator("#ro-heatmap svg")).to_have_count(0)
        assert page.get_attribute("#ro-sums-box", "hidden") is not None
    assert page.get_attribute("#ro-file", "aria-invalid") == "true"  # the last: not a numpy file at all

    bad = stack.copy()
    bad[1, 0, 1, 2, 0] = -0.25  # layer 1, batch 0, head 1, row 2
    np.save(tmp_path / "negative.npy", bad)
    page.set_input_files("#ro-file", str(tmp_path / "negative.npy"))
    expect(page.locator("#ro-error")).to_contain_text("422", timeout=20_000)
    expect(page.locator("#ro-error")).to_contain_text("(layer 1, batch 0, head 1, row 2) = -0.25 is negative")
    expect(page.locator("#ro-heatmap svg")).to_have_count(0)
    assert page.get_attribute("#ro-file", "aria-invalid") is None  # the file was read: the server refused it
    page.check("#ro-renormalize")  # renormalize does not make a negative weight one: still refused
    expect(page.locator("#ro-error")).to_contain_text("is negative")

    page.set_input_files("#ro-file", str(good))
    check_cells(drawn(page, "good.npy|good|mean|0.5|0|true|0"), expected(stack, renormalize=True)[0])
    expect(page.locator("#ro-error")).to_have_text("")
    page.fill("#ro-residual", "1.5")  # out of [0, 1]: the page's message
    expect(page.locator("#ro-error")).to_contain_text("residual: a number from 0 to 1")
    assert page.get_attribute("#ro-residual", "aria-invalid") == "true"
    assert base.refused(page.errors) == [] and page.outside == []
