"""The playground in a real headless Chromium (Debian's chromium driven by Playwright).

Loads ``/``, moves the temperature (with the mouse-free ``fill`` and with the keyboard), checks the bars
against the contract's reference numbers (docs/concepts/contract.md), toggles the causal and padding masks and
checks the heatmap's masked cells are empty, runs the gradient, sampling and calibration panels, steps a session
and checks what it shows against stateless attention over the same Q, K and V, and saves
screenshots (into ``$PLAYGROUND_SCREENSHOTS_DIR`` when set: ``make screenshots`` refreshes the ones
docs/guides/playground.md shows).
"""

from __future__ import annotations

import os
import re
import shutil
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.e2e.conftest import LiveServer
from tests.live import API_KEY

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# The flags a headless Chromium needs on these machines (no sandbox as root, no network beyond loopback).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

if CHROMIUM is None:
    pytest.skip("chromium is not installed (Debian package 'chromium'; .ci/run installs it)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is a test dependency")
expect = sync_api.expect


def wait_until(page: Any, predicate: str, timeout_s: float = 20.0) -> None:
    """Poll a JavaScript predicate with ``page.evaluate`` until it holds.

    Not ``page.wait_for_function``: Playwright polls a string predicate with ``globalThis.eval`` inside
    the page, which the playground's Content-Security-Policy (``script-src 'self'``, no
    ``'unsafe-eval'``) refuses whenever the first check fails. ``page.evaluate`` goes through the
    DevTools protocol, which the policy does not cover, so the page is still tested under its own CSP.
    """
    deadline = time.monotonic() + timeout_s
    while not page.evaluate(predicate):
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {timeout_s} s: {predicate}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any, page_server: LiveServer) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900}, device_scale_factor=1)
    pg = context.new_page()
    pg.errors = []  # type: ignore[attr-defined]
    pg.outside = []  # type: ignore[attr-defined]
    pg.on("pageerror", lambda exc: pg.errors.append(str(exc)))
    pg.on("console", lambda msg: pg.errors.append(msg.text) if msg.type == "error" else None)
    pg.on("request", lambda req: None if req.url.startswith(page_server.url) else pg.outside.append(req.url))
    pg.goto(page_server.url + "/")
    yield pg
    context.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = os.environ.get("PLAYGROUND_SCREENSHOTS_DIR")
    path = Path(target) if target else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def weights(page: Any, key: str) -> list[float]:
    page.wait_for_selector(f'#bars[data-key="{key}"]', timeout=20_000)
    return [float(v) for v in page.eval_on_selector_all("#bars rect.bar", "rs => rs.map(r => r.dataset.weight)")]


def test_weights_follow_the_temperature(page: Any, shots: Path) -> None:
    np.testing.assert_allclose(weights(page, "softmax|1.0|1,0.5,2.5,-0.1"), [0.1557, 0.0945, 0.6980, 0.0518], atol=5e-5)
    assert page.text_content("#entropy") == "0.9169" and page.text_content("#support") == "4 of 4"

    page.select_option("#preset", "2.1,0.5,-1.2,3.0")
    page.fill("#temperature", "2")
    np.testing.assert_allclose(weights(page, "softmax|2.0|2.1,0.5,-1.2,3"), [0.3116, 0.1400, 0.0598, 0.4886], atol=5e-5)
    assert page.text_content("#temperature-value") == "2.0"

    page.focus("#temperature")  # the keyboard: ten steps of 0.1 down, back to 1
    for _ in range(10):
        page.keyboard.press("ArrowLeft")
    np.testing.assert_allclose(weights(page, "softmax|1.0|2.1,0.5,-1.2,3"), [0.2704, 0.0546, 0.0100, 0.6650], atol=5e-5)
    assert page.text_content("#entropy") == "0.8296"

    page.select_option("#normalizer", "entmax15")
    np.testing.assert_allclose(weights(page, "entmax15|1.0|2.1,0.5,-1.2,3"), [0.1983, 0, 0, 0.8017], atol=5e-5)
    assert page.text_content("#support") == "2 of 4"
    page.select_option("#normalizer", "sparsemax")
    page.select_option("#preset", "1.8,-0.3,2.5,0.1")
    np.testing.assert_allclose(weights(page, "sparsemax|1.0|1.8,-0.3,2.5,0.1"), [0.15, 0, 0.85, 0], atol=1e-9)

    page.fill("#scores", "1.0, 0.5, 2.5, -0.1")  # typed scores
    page.select_option("#normalizer", "softmax")
    np.testing.assert_allclose(weights(page, "softmax|1.0|1,0.5,2.5,-0.1"), [0.1557, 0.0945, 0.6980, 0.0518], atol=5e-5)
    page.locator("#panel-softmax").screenshot(path=str(shots / "playground-weights.png"))
    assert page.errors == [] and page.outside == []


def png_pixels(data: bytes) -> list[list[tuple[int, ...]]]:
    """The pixels of an 8-bit RGB or RGBA PNG (what Chromium's screenshots are), as rows of tuples."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, channels = 8, b"", 0, 0, 0
    while pos < len(data):
        length = int.from_bytes(data[pos : pos + 4], "big")
        kind, chunk = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height = int.from_bytes(chunk[:4], "big"), int.from_bytes(chunk[4:8], "big")
            assert chunk[8] == 8 and chunk[12] == 0, "8-bit, not interlaced"
            channels = {2: 3, 6: 4}[chunk[9]]
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw, stride, rows, prev = zlib.decompress(idat), width * channels, [], bytearray(width * channels)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - channels] if x >= channels else 0
            b, c = prev[x], prev[x - channels] if x >= channels else 0
            if kind == 1:
                line[x] = (line[x] + a) & 255
            elif kind == 2:
                line[x] = (line[x] + b) & 255
            elif kind == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[x : x + 3]) for x in range(0, stride, channels)])
        prev = line
    return rows


def cell_pixels(page: Any, head: int, i: int, j: int) -> set[tuple[int, ...]]:
    """The colours painted inside one heatmap cell (2 px in from its edges, clear of the grid lines)."""
    box = page.locator(f'#heatmaps svg[data-head="{head}"] rect.cell[data-i="{i}"][data-j="{j}"]').bounding_box()
    clip = {"x": box["x"] + 2, "y": box["y"] + 2, "width": box["width"] - 4, "height": box["height"] - 4}
    return {px for row in png_pixels(page.screenshot(clip=clip)) for px in row}


def cells(page: Any) -> list[tuple[int, int, int, float, bool]]:
    """(head, query, key, weight, masked) of every heatmap cell, as the page marks it."""
    got = page.eval_on_selector_all(
        "#heatmaps svg.heatmap rect.cell",
        "rs => rs.map(r => [+r.closest('svg').dataset.head, +r.dataset.i, +r.dataset.j, +r.dataset.w,"
        " r.dataset.masked === 'true' && r.classList.contains('masked')])",
    )
    return [tuple(c) for c in got]


def heatmap_drawn(page: Any, key: str, mask: str = "", scale: str = "") -> None:
    """Wait for the heatmaps of these settings: causal|padding|normalizer|temperature, explicit mask, colour scale."""
    extra = (f'[data-mask="{mask}"]' if mask else "") + (f'[data-scale="{scale}"]' if scale else "")
    page.wait_for_selector(f'#heatmaps[data-key="{key}"]{extra}', timeout=20_000)


def test_heatmap_masks(page: Any, shots: Path) -> None:
    heatmap_drawn(page, "false|false|softmax|1.0")
    before = cells(page)
    assert len(before) == 2 * 8 * 8 and all(w > 0 and not masked for *_, w, masked in before)
    assert page.locator("#head-diagnostics tbody tr").count() == 2

    page.check("#causal")
    heatmap_drawn(page, "true|false|softmax|1.0")
    after = cells(page)
    upper = [c for c in after if c[2] > c[1]]
    lower = [c for c in after if c[2] <= c[1]]
    assert len(upper) == 2 * 28 and all(w == 0 and masked for *_, w, masked in upper)  # the upper triangle: masked
    assert all(w > 0 and not masked for *_, w, masked in lower)
    for head in (0, 1):  # each row still sums to 1
        rows = np.zeros(8)
        for h, i, _j, w, _m in after:
            rows[i] += w if h == head else 0
        np.testing.assert_allclose(rows, 1.0, atol=1e-12)

    page.fill("#valid-keys", "5")
    page.check("#padding")
    heatmap_drawn(page, "true|true|softmax|1.0")
    padded = cells(page)
    assert all(w == 0 and masked for _h, i, j, w, masked in padded if j >= 5 or j > i)  # key padding: masked too
    assert all(w > 0 and not masked for _h, i, j, w, masked in padded if j < 5 and j <= i)
    assert "collapsed" in page.text_content("#head-diagnostics") or "–" in page.text_content("#head-diagnostics")
    page.locator("#panel-heatmap").screenshot(path=str(shots / "playground-heatmap.png"))
    assert page.errors == [] and page.outside == []


def test_heatmap_colour_bar(page: Any) -> None:
    """Every heatmap has a colour bar with its tick values, on the weights' 0..1 scale or the data's range."""
    heatmap_drawn(page, "false|false|softmax|1.0")
    bars = page.eval_on_selector_all(
        "#heatmaps svg.heatmap",
        "ss => ss.map(s => { const bar = s.querySelector('g.colorbar');"
        " return bar && [+bar.dataset.min, +bar.dataset.max,"
        " [...bar.querySelectorAll('text.tick')].map(t => t.textContent),"
        " [...bar.querySelectorAll('.range-mark')].map(m => +m.dataset.value), s.getAttribute('aria-label')]; })",
    )
    assert len(bars) == 2
    for bar in bars:
        assert bar is not None, "a heatmap without a colour bar"
        low, high, ticks, marks, label = bar
        assert (low, high) == (0, 1) and ticks == ["0", "0.25", "0.5", "0.75", "1"]
        assert len(marks) == 2 and 0 < marks[0] < marks[1] < 1  # this head's smallest and largest weight
        assert "0 to 1" in label
    assert "fixed 0 to 1 scale" in page.text_content("#heat-summary")

    page.select_option("#heat-scale", "data")  # the data's range: 0 to the largest weight of all heads
    heatmap_drawn(page, "false|false|softmax|1.0", scale="data")
    top = max(w for *_, w, _m in cells(page))
    high = page.eval_on_selector_all("#heatmaps g.colorbar", "bs => bs.map(b => +b.dataset.max)")
    assert high == [top, top] and top < 1
    ticks = page.eval_on_selector(
        "#heatmaps g.colorbar", "b => [...b.querySelectorAll('text.tick')].map(t => +t.dataset.value)"
    )
    assert ticks[0] == 0 and ticks[-1] == pytest.approx(top) and len(ticks) == 5
    assert "largest weight shown" in page.text_content("#heat-summary")
    assert page.errors == [] and page.outside == []


def test_masked_cells_differ_from_zero_weights(page: Any, shots: Path) -> None:
    """Masked (the request's causal mask, padding or explicit mask) is hatched; an exact 0 of sparsemax is white."""
    heatmap_drawn(page, "false|false|softmax|1.0")
    page.select_option("#heat-normalizer", "sparsemax")
    page.check("#causal")
    heatmap_drawn(page, "true|false|sparsemax|1.0")
    got = cells(page)
    masked = [c for c in got if c[4]]
    zeros = [c for c in got if c[3] == 0 and not c[4]]
    upper = {(h, i, j) for h in (0, 1) for i in range(8) for j in range(8) if j > i}
    assert {(h, i, j) for h, i, j, _w, _m in masked} == upper
    assert len(zeros) > 5, "sparsemax gives exact zeros inside the causal triangle"
    fills = page.eval_on_selector_all(
        "#heatmaps svg[data-head='0'] rect.cell", "rs => rs.map(r => [r.dataset.masked, getComputedStyle(r).fill])"
    )
    assert all(fill.startswith("url(") for m, fill in fills if m == "true")
    assert {fill for m, fill in fills if m == "false"} >= {"rgb(255, 255, 255)"}
    assert not any(fill.startswith("url(") for m, fill in fills if m == "false")
    # and on screen: a masked cell shows the hatching (light and dark grey), a zero weight plain white
    h, i, j = next((h, i, j) for h, i, j, *_ in zeros if h == 0)
    assert cell_pixels(page, h, i, j) == {(255, 255, 255)}
    hatched = cell_pixels(page, 0, 0, 7)
    assert len(hatched) >= 2 and (255, 255, 255) not in hatched and min(sum(px) for px in hatched) < 3 * 180
    for svg in range(2):  # each heatmap's legend says what the hatching and the white mean
        legend = page.locator(f'#heatmaps svg[data-head="{svg}"] g.legend-entry')
        assert legend.all_text_contents() == ["masked", "weight 0 (not masked)"]
    page.locator("#panel-heatmap").screenshot(path=str(shots / "playground-heatmap-sparsemax.png"))

    page.uncheck("#causal")  # an explicit mask: a local window |i - j| <= 2, from the page
    page.select_option("#mask-kind", "window")
    heatmap_drawn(page, "false|false|sparsemax|1.0", mask="window")
    assert all(m == (abs(i - j) > 2) for _h, i, j, _w, m in cells(page))
    page.select_option("#qk-source", "pasted")  # and a pasted one
    page.select_option("#mask-kind", "pasted")
    heatmap_drawn(page, "false|false|sparsemax|1.0", mask="pasted")
    assert [(i, j) for _h, i, j, _w, m in cells(page) if m] == [(0, 2), (2, 0)]  # the example mask
    page.fill("#pasted-mask", "[[true, false, true], [true, true, true], [false, false, true]]")
    wait_until(
        page,
        "[...document.querySelectorAll('#heatmaps rect.cell.masked')].map(r => r.dataset.i + r.dataset.j).join()"
        " === '01,20,21'",
    )
    assert page.errors == [] and page.outside == []


def run_sweep(page: Any) -> None:
    """Click the gradient panel's run button and wait for the sweep that click asked for (the one started at
    page load may still be running: it leaves its source on the chart).
    """
    page.click("#grad-run")
    page.wait_for_selector("#grad-chart[data-source]:not([aria-busy])", timeout=60_000)


def _routes(server: LiveServer) -> set[str]:
    return set(httpx.get(server.url + "/openapi.json").json()["paths"])


def test_gradient_sampling_and_calibration_panels(page: Any, page_server: LiveServer, shots: Path) -> None:
    routes = _routes(page_server)
    run_sweep(page)
    source = page.get_attribute("#grad-chart", "data-source")
    assert source == ("analyze" if "/v1/attention/analyze" in routes else "backward")
    first = page.eval_on_selector("#grad-chart path", "p => JSON.parse(p.dataset.values)")
    assert len(first) == 12 and all(np.isfinite(first)) and max(first) > 0
    assert first[-1] < 0.1 * max(first)  # scale 50 saturates the softmax: the gradient vanishes

    if "/v1/sample" in routes:
        # Answers held back 0.3 s: every wait below must poll (as on a busy CI machine), not pass at once.
        page.route("**/v1/sample", lambda route: (time.sleep(0.3), route.continue_()))
        page.fill("#logits", "2.1,0.5,-1.2,3.0")
        page.fill("#top-k", "2")
        expect(page.locator("#sample-bars rect.bar")).to_have_count(4, timeout=20_000)
        expect(page.locator("#top-k-value")).to_have_text("2")
        # the label changes at once, the bars when the top-k answer is back (they were 4 before it, too)
        expect(page.locator("#sample-summary")).to_have_text(re.compile(r"^kept 2 of 4 tokens"), timeout=20_000)
        sampled = page.eval_on_selector_all(
            "#sample-bars rect.bar", "rs => rs.map(r => [+r.dataset.weight, r.dataset.removed])"
        )
        np.testing.assert_allclose([w for w, _ in sampled], [0.2891, 0, 0, 0.7109], atol=5e-5)
        assert [r for _, r in sampled] == ["false", "true", "true", "false"]
    else:
        expect(page.locator("#sample-summary")).to_contain_text("/v1/sample")
    if "/v1/calibrate" in routes:
        page.click("#calib-run")
        expect(page.locator("#calib-summary")).to_contain_text("fitted T", timeout=20_000)
        assert page.locator("#reliability rect").count() > 0
    else:
        page.click("#calib-run")
        expect(page.locator("#calib-summary")).to_contain_text("/v1/calibrate")
    page.screenshot(path=str(shots / "playground.png"), full_page=True)
    assert page.errors == [] and page.outside == []


def check_sweep_chart(page: Any) -> None:
    """The scale sweep has its y axes with tick values and titles, the x axis, and a legend entry per line."""
    run_sweep(page)
    two_axes = page.get_attribute("#grad-chart", "data-source") == "analyze"  # Jacobian norm and entropy
    lines = page.eval_on_selector_all(
        "#grad-chart path.line", "ps => ps.map(p => [p.dataset.series, p.dataset.axis, JSON.parse(p.dataset.values)])"
    )
    assert len(lines) == 2 and {axis for _, axis, _ in lines} == ({"left", "right"} if two_axes else {"left"})
    for side in ("left", "right") if two_axes else ("left",):
        ticks = page.eval_on_selector_all(
            f"#grad-chart text.y-tick.{side}", "ts => ts.map(t => [t.textContent, +t.dataset.value])"
        )
        values = [v for _, v in ticks]
        assert len(ticks) >= 3 and values[0] == 0 and values == sorted(values)
        assert all(float(label) == pytest.approx(v, rel=0.05) for label, v in ticks)  # the labels are the values
        shown = [x for _, axis, xs in lines if axis == side for x in xs]
        assert max(shown) <= values[-1] < 2.5 * max(shown)  # the scale covers the data, not much more
        title = page.text_content(f"#grad-chart text.y-title.{side}")
        named = next(name for name, axis, _ in lines if axis == side)
        assert title == (named if two_axes else "gradient norm (Frobenius)")
    if not two_axes:  # one quantity, one axis
        assert page.locator("#grad-chart text.y-tick.right").count() == 0
    x_ticks = page.eval_on_selector_all("#grad-chart text.x-tick", "ts => ts.map(t => +t.dataset.value)")
    assert x_ticks == [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50]
    assert "scale" in page.text_content("#grad-chart text.x-title")
    legend = page.eval_on_selector_all(
        "#grad-chart g.legend-entry",
        "es => es.map(e => [e.dataset.series, e.textContent, getComputedStyle(e.querySelector('line')).stroke])",
    )
    assert [series for series, *_ in legend] == [name for name, *_ in lines]  # one entry per line, in order
    assert all(label.startswith(series) for series, label, _ in legend)
    strokes = page.eval_on_selector_all("#grad-chart path.line", "ps => ps.map(p => getComputedStyle(p).stroke)")
    assert [stroke for *_, stroke in legend] == strokes and len(set(strokes)) == 2  # the key matches each line


def test_sweep_chart_axes_and_legend(page: Any, shots: Path) -> None:
    check_sweep_chart(page)
    page.evaluate("document.getElementById('panel-gradients').scrollIntoView()")  # (the clip is in the viewport)
    panel, summary = page.locator("#panel-gradients").bounding_box(), page.locator("#grad-summary").bounding_box()
    clip = {**panel, "height": summary["y"] + summary["height"] + 12 - panel["y"]}  # not the panel's empty foot
    page.screenshot(path=str(shots / "playground-sweep.png"), clip=clip)
    assert page.errors == [] and page.outside == []


def test_sweep_chart_from_backward(page: Any, page_server: LiveServer) -> None:
    """On a server without /v1/attention/analyze: gradient norms from /v1/attention/backward, on one axis."""

    def without_analyze(route: Any) -> None:
        schema = httpx.get(page_server.url + "/openapi.json").json()
        del schema["paths"]["/v1/attention/analyze"]
        route.fulfill(json=schema)

    page.route("**/openapi.json", without_analyze)
    page.reload()
    page.fill("#grad-length", "8")
    page.fill("#grad-dim", "8")
    check_sweep_chart(page)
    assert page.get_attribute("#grad-chart", "data-source") == "backward"
    assert page.errors == [] and page.outside == []


def refused(errors: list[str]) -> list[str]:
    """Console errors other than the browser's own note that a request was answered 4xx."""
    return [e for e in errors if "the server responded with a status of 4" not in e]


def test_bad_input_clears_the_results(page: Any, shots: Path) -> None:
    """A failed request takes down the bars, heatmaps and chart it would have replaced and says why."""
    weights(page, "softmax|1.0|1,0.5,2.5,-0.1")
    page.fill("#scores", "1, x")  # refused by the page
    expect(page.locator("#bars rect.bar")).to_have_count(0)
    expect(page.locator("#softmax-error")).to_contain_text("not a comma-separated list of numbers")
    assert page.text_content("#entropy") == "–" and page.text_content("#support") == "–"
    assert page.get_attribute("#scores", "aria-invalid") == "true"
    page.fill("#scores", "1, 2")
    np.testing.assert_allclose(weights(page, "softmax|1.0|1,2"), [0.2689, 0.7311], atol=5e-5)
    expect(page.locator("#softmax-error")).to_have_text("")
    page.select_option("#normalizer", "entmax")
    page.fill("#alpha", "0.5")  # refused by the server (alpha > 1)
    expect(page.locator("#softmax-error")).to_contain_text("422")
    expect(page.locator("#bars rect.bar")).to_have_count(0)
    page.fill("#alpha", "1.5")
    weights(page, "entmax|1.0|1,2")

    heatmap_drawn(page, "false|false|softmax|1.0")
    page.select_option("#qk-source", "pasted")
    expect(page.locator("#heatmaps svg.heatmap")).to_have_count(1, timeout=20_000)  # the example Q and K
    page.fill("#pasted-query", "[[1, 0], [0")  # not JSON
    expect(page.locator("#heat-error")).to_contain_text("query: ")
    assert page.get_attribute("#pasted-query", "aria-invalid") == "true"
    expect(page.locator("#heatmaps svg")).to_have_count(0)
    page.fill("#pasted-query", "[[1, 0, 0]]")  # JSON, but E = 3 against the key's 2: the server says 422
    expect(page.locator("#heat-error")).to_contain_text("422")
    expect(page.locator("#heatmaps svg")).to_have_count(0)
    expect(page.locator("#head-diagnostics tbody tr")).to_have_count(0)
    expect(page.locator("#heat-summary")).to_have_text("")
    page.locator("#pasted-query").blur()  # (no focus ring over the picture)
    page.locator("#panel-heatmap").screenshot(path=str(shots / "playground-error.png"))
    page.fill("#pasted-query", "[[1, 0], [0, 1]]")
    expect(page.locator("#heatmaps rect.cell")).to_have_count(2 * 3, timeout=20_000)
    expect(page.locator("#heat-error")).to_have_text("")

    run_sweep(page)
    page.fill("#grad-dim", "0")  # E = 0: refused
    page.click("#grad-run")
    expect(page.locator("#grad-error")).to_contain_text("422", timeout=20_000)
    expect(page.locator("#grad-chart path, #grad-chart text, #grad-chart g")).to_have_count(0)
    assert page.get_attribute("#grad-chart", "data-source") is None and page.text_content("#grad-summary") == ""
    page.fill("#grad-dim", "16")
    run_sweep(page)
    expect(page.locator("#grad-chart path.line")).to_have_count(2)
    expect(page.locator("#grad-error")).to_have_text("")
    assert refused(page.errors) == [] and page.outside == []


def test_page_headers_and_keyboard_reach(page_server: LiveServer, page: Any) -> None:
    r = httpx.get(page_server.url + "/")
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "connect-src 'self'" in csp and "unsafe-inline" not in csp
    assert 'href="docs"' in r.text
    reached = set()
    for _ in range(60):  # Tab through the page: every control is reachable from the keyboard
        page.keyboard.press("Tab")
        reached.add(page.evaluate("document.activeElement.id"))
    assert {
        "preset",
        "scores",
        "temperature",
        "normalizer",
        "causal",
        "padding",
        "mask-kind",
        "heat-scale",
        "token-ids",
        "sink-positions",
        "exclude-bos",
        "norm-toggle",
        "grad-run",
        "top-k",
        "calib-run",
        "dec-heads",
        "dec-windowed",
        "dec-normalizer",
        "dec-head",
        "dec-start",
        "dec-step",
        "dec-run",
        "dec-end",
    } <= reached


def test_docs_and_redoc_render_offline(browser: Any, page_server: LiveServer, shots: Path) -> None:
    """Swagger UI and ReDoc draw the schema from this server's assets alone, under their CSP."""
    for path, ready in (("/docs", '[data-path="/v1/attention"]'), ("/redoc", "text=Compute attention")):
        pg = browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        outside: list[str] = []
        pg.on("pageerror", lambda exc, errors=errors: errors.append(str(exc)))
        pg.on("console", lambda msg, errors=errors: errors.append(msg.text) if msg.type == "error" else None)
        pg.on(
            "request",
            lambda req, outside=outside: (
                None if req.url.startswith((page_server.url, "data:", "blob:")) else outside.append(req.url)
            ),
        )
        pg.goto(page_server.url + path)
        pg.wait_for_selector(ready, state="attached", timeout=30_000)
        assert pg.locator("a[href='/']").count() >= 1  # the description links the playground
        if path == "/docs":
            pg.screenshot(path=str(shots / "docs.png"))
        # ReDoc's footer asks for Redocly's logo from its CDN; the page's policy refuses it (nothing leaves).
        refused = [e for e in errors if "violates the following Content Security Policy" in e]
        assert [e for e in errors if e not in refused] == [], errors
        assert all("cdn.redoc.ly" in url for url in outside) and len(refused) == len(outside), (outside, refused)
        pg.close()


def test_a_keyed_server_s_page_loads_and_sends_the_typed_key(browser: Any, keyed_server: LiveServer) -> None:
    """With API keys set the page loads without one (it holds no data), the API refuses it until the key is typed
    into the page's field, and then every panel runs with it.
    """
    pg = browser.new_page(viewport={"width": 1280, "height": 900})
    failed: list[str] = []  # without the key
    failed_with_key: list[str] = []  # the panels' first requests may still be answered after the key is typed

    def on_response(r: Any) -> None:
        if r.status >= 400:
            (failed_with_key if "x-api-key" in r.request.headers else failed).append(f"{r.status} {r.url}")

    pg.on("response", on_response)
    pg.goto(keyed_server.url + "/")
    expect(pg.locator("#softmax-error")).to_contain_text("401", timeout=20_000)
    assert failed and all(entry.startswith("401 ") and "/v1/" in entry for entry in failed), failed
    pg.fill("#api-key", API_KEY)
    pg.press("#api-key", "Tab")  # the field's change event: the panels run again with the key
    np.testing.assert_allclose(weights(pg, "softmax|1.0|1,0.5,2.5,-0.1"), [0.1557, 0.0945, 0.6980, 0.0518], atol=5e-5)
    expect(pg.locator("#softmax-error")).to_have_text("")
    pg.wait_for_selector("#sample-bars rect.bar", timeout=20_000)  # the sampling panel ran too
    expect(pg.locator("#sample-error")).to_have_text("")
    assert failed_with_key == []
    assert all(entry.startswith("401 ") and "/v1/" in entry for entry in failed), failed
    pg.close()


STEPS = "/v1/sessions/{sequence_id}/steps"


def decoded(page: Any, seen: int) -> dict[str, str]:
    """Wait for the decode panel to show the step after which ``seen`` positions were appended; its data-*."""
    page.wait_for_selector(f'#dec-bars[data-positions-seen="{seen}"]', timeout=20_000)
    wait_until(page, "!document.getElementById('panel-decode').hasAttribute('aria-busy')")
    return page.eval_on_selector("#dec-bars", "s => ({...s.dataset})")


def shown_row(page: Any) -> list[tuple[int, float, bool]]:
    """(position, weight, sink) of every bar of the decode panel's cache."""
    got = page.eval_on_selector_all(
        "#dec-bars rect.bar",
        "rs => rs.map(r => [+r.dataset.position, +r.dataset.weight, r.classList.contains('sink')])",
    )
    return [tuple(b) for b in got]


def step_bodies(page: Any) -> list[dict[str, Any]]:
    """The bodies the page sends to POST /v1/sessions/{id}/steps, recorded as it sends them."""
    bodies: list[dict[str, Any]] = []
    page.on("request", lambda r: bodies.append(r.post_data_json) if r.method == "POST" and "/steps" in r.url else None)
    return bodies


def stateless(server: LiveServer, bodies: list[dict[str, Any]], kept: list[int]) -> dict[str, Any]:
    """The last step recomputed by /v1/attention over the kept positions of every key and value the page sent."""
    keys = np.concatenate([np.array(b["key"]) for b in bodies], axis=1)  # (heads, positions, E)
    values = np.concatenate([np.array(b["value"]) for b in bodies], axis=1)
    last = bodies[-1]
    request = {
        "query": last["query"],
        "key": keys[:, kept].tolist(),
        "value": values[:, kept].tolist(),
        "causal": "bottom_right",
        "normalizer": last["normalizer"],
        "temperature": last["temperature"],
        "precision": "float64",
        "return": ["weights", "diagnostics"],
    }
    answer = httpx.post(server.url + "/v1/attention", json=request, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()


def check_against_stateless(page: Any, server: LiveServer, bodies: list[dict[str, Any]], head: int) -> None:
    """The bars, entropy and sink mass shown for ``head``: the stateless recompute of the newest row."""
    data = page.eval_on_selector("#dec-bars", "s => ({...s.dataset})")
    assert int(data["head"]) == head
    bars = shown_row(page)
    kept = [p for p, _w, _s in bars]
    answer = stateless(server, bodies, kept)
    row = np.array(answer["weights"])[head, -1]
    np.testing.assert_allclose([w for _p, w, _s in bars], row, rtol=0, atol=1e-12)
    assert float(data["entropy"]) == pytest.approx(answer["diagnostics"]["entropy"][head][-1], abs=1e-12)
    sink_positions = bodies[-1]["sink_positions"]
    assert [s for p, _w, s in bars] == [p < sink_positions for p in kept]
    assert float(data["sinkMass"]) == pytest.approx(
        sum(w for p, w in zip(kept, row, strict=True) if p < sink_positions)
    )
    assert page.text_content("#dec-entropy") == f"{float(data['entropy']):.4f}"


def test_decode_session_steps(page: Any, page_server: LiveServer) -> None:
    """Start, then Step three times: the bars are the kept positions, positions_seen counts each token, the chart
    has a point per step, and the numbers shown are the stateless recompute of the same Q, K and V.
    """
    assert STEPS in _routes(page_server)
    bodies = step_bodies(page)
    page.fill("#dec-heads", "9")  # refused by the page
    page.click("#dec-start")
    expect(page.locator("#dec-error")).to_contain_text("heads: a whole number from 1 to 4")
    assert page.get_attribute("#dec-heads", "aria-invalid") == "true" and bodies == []
    page.fill("#dec-heads", "3")
    page.click("#dec-start")
    first = decoded(page, 4)
    assert page.get_attribute("#dec-heads", "aria-invalid") is None
    assert first["sequence"].startswith("playground-") and first["steps"] == "1"
    assert page.locator("#dec-head option").count() == 3
    for step in range(1, 4):
        page.click("#dec-step")
        data = decoded(page, 4 + step)
        assert page.text_content("#dec-positions-seen") == str(4 + step) and data["steps"] == str(1 + step)
        cache_length = int(page.text_content("#dec-cache-length"))
        assert cache_length == 4 + step and len(shown_row(page)) == cache_length
        assert [p for p, *_ in shown_row(page)] == list(range(4 + step))  # no window: every position kept
        for series in ("entropy (nats)", "sink mass"):  # a point per step (the start is step 0)
            values = page.eval_on_selector(
                f'#dec-chart path[data-series="{series}"]', "p => JSON.parse(p.dataset.values)"
            )
            assert len(values) == 1 + step
        assert page.locator("#dec-chart > circle.point").count() == 1 + step
    assert data["sequence"] == first["sequence"]  # one sequence
    assert [b.get("start", False) for b in bodies] == [True, False, False, False]
    assert [len(b["key"][0]) for b in bodies] == [4, 1, 1, 1]  # a prompt of 4, then a token per step
    entropies = page.eval_on_selector(
        '#dec-chart path[data-series="entropy (nats)"]', "p => JSON.parse(p.dataset.values)"
    )
    assert entropies[-1] == float(data["entropy"])
    assert (
        page.locator("#dec-chart text.y-tick.left").count() >= 3
        and page.locator("#dec-chart text.y-tick.right").count() >= 3
    )
    assert page.eval_on_selector_all("#dec-chart text.x-tick", "ts => ts.map(t => +t.dataset.value)") == [0, 1, 2, 3]
    assert page.locator("#dec-chart g.legend-entry").count() == 2
    check_against_stateless(page, page_server, bodies, head=0)

    page.select_option("#dec-head", "2")  # another head: drawn again from the same answer, no request
    page.wait_for_selector('#dec-bars[data-head="2"]')
    check_against_stateless(page, page_server, bodies, head=2)
    assert len(bodies) == 4
    assert page.errors == [] and page.outside == []


def test_decode_window_end_and_refusal(page: Any, page_server: LiveServer, shots: Path) -> None:
    """A window evicts positions (the bars skip them, a hatched band marks them); End frees the cache, and the
    next step's refusal shows in the panel; Start begins again.
    """
    bodies = step_bodies(page)
    page.check("#dec-windowed")
    page.fill("#dec-window", "6")
    page.fill("#dec-sinks", "2")
    page.select_option("#dec-normalizer", "entmax15")
    page.click("#dec-start")
    decoded(page, 4)
    page.click("#dec-run")
    data = decoded(page, 20)
    assert data["steps"] == "17" and data["cacheLength"] == "8" and page.text_content("#dec-cache-length") == "8"
    bars = shown_row(page)
    assert [p for p, *_ in bars] == [0, 1, *range(14, 20)]  # the 2 sinks and the last 6
    evicted = page.eval_on_selector_all("#dec-bars rect.evicted", "rs => rs.map(r => [+r.dataset.from, +r.dataset.to])")
    assert evicted == [[2, 13]]
    assert bodies[0]["window"] == 6 and bodies[0]["sinks"] == 2 and all("window" not in b for b in bodies[1:])
    check_against_stateless(page, page_server, bodies, head=0)
    assert page.locator("#dec-chart > rect.point").count() == 17
    page.locator("#dec-run").blur()
    page.evaluate("document.getElementById('panel-decode').scrollIntoView()")
    page.locator("#panel-decode").screenshot(path=str(shots / "playground-decode.png"))

    page.click("#dec-end")
    expect(page.locator("#dec-summary")).to_contain_text("ended", timeout=20_000)
    assert page.text_content("#dec-cache-length") == "0" and page.locator("#dec-bars rect.bar").count() == 0
    page.click("#dec-step")  # the server refuses a step of an ended sequence: 422, its detail in the panel
    expect(page.locator("#dec-error")).to_contain_text("422", timeout=20_000)
    expect(page.locator("#dec-error")).to_contain_text("has ended")
    assert page.get_attribute("#dec-chart", "hidden") is not None and page.text_content("#dec-positions-seen") == "–"
    page.click("#dec-start")
    data = decoded(page, 4)
    expect(page.locator("#dec-error")).to_have_text("")
    assert data["steps"] == "1" and page.locator("#dec-bars rect.bar").count() == 4
    assert refused(page.errors) == [] and page.outside == []


def test_decode_without_sessions(page: Any, page_server: LiveServer) -> None:
    """On a server whose /openapi.json has no sessions, the panel says so and sends nothing."""

    def without_sessions(route: Any) -> None:
        schema = httpx.get(page_server.url + "/openapi.json").json()
        del schema["paths"][STEPS]
        route.fulfill(json=schema)

    page.route("**/openapi.json", without_sessions)
    page.reload()
    expect(page.locator("#dec-summary")).to_contain_text("does not serve sessions", timeout=20_000)
    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.url) if "/v1/sessions" in r.url else None)
    page.click("#dec-start")
    page.click("#dec-step")
    wait_until(page, "!document.getElementById('panel-decode').hasAttribute('aria-busy')")
    expect(page.locator("#dec-summary")).to_contain_text("does not serve sessions")
    assert sent == [] and page.locator("#dec-bars rect").count() == 0
    assert page.errors == [] and page.outside == []


# ------------------------------------------------------------------ panel 2: per-head inspection (issue 31)

INSPECTED = ("sink_mass", "spectral_norm", "previous_token_score", "duplicate_token_score", "induction_score")
SHOWN = (*INSPECTED, "norm_max_share")
SCORES = ("previous_token_score", "duplicate_token_score", "induction_score")


def attention_bodies(page: Any) -> list[dict[str, Any]]:
    """The bodies the page sends to POST /v1/attention from now on, recorded as it sends them."""
    bodies: list[dict[str, Any]] = []
    page.on(
        "request",
        lambda r: bodies.append(r.post_data_json) if r.method == "POST" and r.url.endswith("/v1/attention") else None,
    )
    return bodies


def answer_to(server: LiveServer, body: dict[str, Any]) -> dict[str, Any]:
    """The service's answer to a body the page sent, asked again outside the page."""
    answer = httpx.post(server.url + "/v1/attention", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    got: dict[str, Any] = answer.json()
    return got


def inspection_rows(page: Any, key: str) -> list[dict[str, str]]:
    """Wait for the inspection table of these settings (token ids|sink positions|exclude_bos|exclude_current_token);
    each row's data-*.
    """
    page.wait_for_selector(f'#head-inspection[data-key="{key}"]:not([hidden])', timeout=20_000)
    rows: list[dict[str, str]] = page.eval_on_selector_all(
        "#head-inspection tbody tr", "rs => rs.map(r => ({...r.dataset}))"
    )
    return rows


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def check_inspection(rows: list[dict[str, str]], answer: dict[str, Any], scores: bool) -> None:
    heads = answer["inspection"]["heads"]
    assert [int(r["head"]) for r in rows] == [h["head"] for h in heads] and len(rows) > 0
    for row, head in zip(rows, heads, strict=True):
        for name in SHOWN:
            if name in SCORES and not scores:
                assert camel(name) not in row and name not in head
                continue
            assert float(row[camel(name)]) == pytest.approx(head[name], rel=1e-12, abs=1e-15), name


def test_inspection_table_equals_the_answer(page: Any, page_server: LiveServer, shots: Path) -> None:
    """Sink mass, spectral norm and the pattern scores per head, as the server answers the request the page sent;
    the token ids follow L until edited, then go as typed; an empty field sends none (no pattern scores).
    """
    heatmap_drawn(page, "false|false|softmax|1.0")
    bodies = attention_bodies(page)
    page.fill("#length", "6")  # the default token ids follow: 1 2 3 1 2 3
    rows = inspection_rows(page, "1 2 3 1 2 3|4|false|false")
    assert page.input_value("#token-ids") == "1 2 3 1 2 3"
    body = bodies[-1]
    assert body["token_ids"] == [[1, 2, 3, 1, 2, 3]] and body["sink_positions"] == 4 and "inspection" in body["return"]
    assert "norm_weights" not in body["return"] and "exclude_bos" not in body
    check_inspection(rows, answer_to(page_server, body), scores=True)
    assert page.locator("#head-inspection tbody tr").count() == 2 == page.locator("#head-diagnostics tbody tr").count()
    shown = page.eval_on_selector_all("#head-inspection tbody tr:first-child td", "ts => ts.map(t => t.textContent)")
    assert shown[1] == f"{float(rows[0]['sinkMass']):.3f}" and shown[2] == f"{float(rows[0]['spectralNorm']):.2f}"
    assert page.locator("#head-inspection tbody tr:first-child meter").count() == 5  # the shares and scores in [0, 1]

    page.check("#causal")  # and every option the panel sends
    page.fill("#sink-positions", "2")
    page.check("#exclude-bos")
    page.check("#exclude-current")
    page.fill("#token-ids", "7, 7, 9, 7, 9, 7")
    rows = inspection_rows(page, "7 7 9 7 9 7|2|true|true")
    heatmap_drawn(page, "true|false|softmax|1.0")
    body = bodies[-1]
    assert body["token_ids"] == [[7, 7, 9, 7, 9, 7]] and body["sink_positions"] == 2
    assert body["exclude_bos"] is True and body["exclude_current_token"] is True and body["causal"] is True
    answer = answer_to(page_server, body)
    check_inspection(rows, answer, scores=True)
    assert answer["inspection"]["sink_positions"] == 2
    page.fill("#length", "8")  # edited: the field no longer follows L (and now does not match S)
    expect(page.locator("#heat-error")).to_contain_text("422", timeout=20_000)

    page.fill("#token-ids", "")  # empty: no token ids, no pattern scores
    rows = inspection_rows(page, "none|2|true|true")
    assert "token_ids" not in bodies[-1]
    check_inspection(rows, answer_to(page_server, bodies[-1]), scores=False)
    assert page.eval_on_selector_all("#head-inspection tbody tr:first-child td.none", "ts => ts.length") == 3
    assert refused(page.errors) == [] and page.outside == []


def test_norm_heatmaps_equal_norm_weights(page: Any, page_server: LiveServer, shots: Path) -> None:
    """The toggle draws ||A_ij v_j|| beside the weights, one heatmap per head on its own 0-to-max colour bar; its
    cells are the answer's norm_weights.
    """
    heatmap_drawn(page, "false|false|softmax|1.0")
    assert page.get_attribute("#norm-heatmaps", "hidden") is not None
    bodies = attention_bodies(page)
    page.check("#causal")
    page.check("#norm-toggle")
    page.wait_for_selector('#norm-heatmaps[data-key="true|false|softmax|1.0"]:not([hidden])', timeout=20_000)
    body = bodies[-1]
    assert body["return"][-1] == "norm_weights"
    answer = answer_to(page_server, body)
    norms = np.asarray(answer["norm_weights"])[0]  # (H, L, S) of the one batch entry
    got = page.eval_on_selector_all(
        "#norm-heatmaps svg.heatmap rect.cell",
        "rs => rs.map(r => [+r.closest('svg').dataset.head, +r.dataset.i, +r.dataset.j, +r.dataset.w,"
        " r.dataset.masked === 'true'])",
    )
    assert len(got) == norms.size == 2 * 8 * 8
    np.testing.assert_allclose([w for *_, w, _m in got], [norms[h, i, j] for h, i, j, *_ in got], rtol=1e-12, atol=0)
    assert all(m == (j > i) for _h, i, j, _w, m in got)  # the causal mask, hatched as in the weights
    assert page.eval_on_selector_all("#norm-heatmaps svg", "ss => ss.map(s => s.dataset.kind)") == ["norm", "norm"]
    assert page.locator("#heatmaps svg.heatmap").count() == 2  # beside the weights, not instead of them
    # its own colour bar: 0 to the largest norm shown (of either head), with ticks
    top = float(norms[:, np.tril(np.ones((8, 8), bool))].max())
    bars = page.eval_on_selector_all(
        "#norm-heatmaps g.colorbar",
        "bs => bs.map(b => [+b.dataset.min, +b.dataset.max,"
        " [...b.querySelectorAll('text.tick')].map(t => +t.dataset.value)])",
    )
    assert len(bars) == 2
    for low, high, ticks in bars:
        assert low == 0 and high == pytest.approx(top, rel=1e-12) and ticks[0] == 0 and ticks[-1] == pytest.approx(top)
    assert float(page.get_attribute("#norm-heatmaps", "data-max")) == pytest.approx(top, rel=1e-12)
    assert top > 1  # ||v_j|| of random keys in E = 8 is near sqrt(8): not the weights' 0..1 scale
    legend = page.locator('#norm-heatmaps svg[data-head="0"] g.legend-entry').all_text_contents()
    assert legend == ["masked", "norm 0 (not masked)"]
    inspection_rows(page, "1 2 3 1 2 3 1 2|4|false|false")
    page.locator("#norm-toggle").blur()
    page.locator("#panel-heatmap").screenshot(path=str(shots / "playground-inspection.png"))

    page.uncheck("#norm-toggle")
    wait_until(page, "document.getElementById('norm-heatmaps').hidden")
    expect(page.locator("#norm-heatmaps svg")).to_have_count(0)
    wait_until(page, "document.querySelectorAll('#heatmaps svg.heatmap').length === 2")
    assert "norm_weights" not in bodies[-1]["return"]
    assert page.errors == [] and page.outside == []


def test_token_ids_that_do_not_match_s_are_the_servers_422(page: Any) -> None:
    """Token ids of another length than S: the server's 422, naming token_ids, in the panel's live region; the
    heatmaps, tables and norm heatmaps go; ids that are not integers are the page's own error.
    """
    page.check("#norm-toggle")
    page.wait_for_selector('#norm-heatmaps[data-key="false|false|softmax|1.0"]:not([hidden])', timeout=20_000)
    page.fill("#token-ids", "1 2 3")
    expect(page.locator("#heat-error")).to_contain_text("422", timeout=20_000)
    expect(page.locator("#heat-error")).to_contain_text("token_ids")
    assert page.get_attribute("#heat-error", "aria-live") == "polite"
    expect(page.locator("#heatmaps svg")).to_have_count(0)
    expect(page.locator("#norm-heatmaps svg")).to_have_count(0)
    expect(page.locator("#head-inspection tbody tr")).to_have_count(0)
    assert page.get_attribute("#head-inspection", "hidden") is not None
    page.fill("#token-ids", "1 2 x")  # refused by the page
    expect(page.locator("#heat-error")).to_contain_text('token ids: "x" is not a whole number')
    assert page.get_attribute("#token-ids", "aria-invalid") == "true"
    page.fill("#token-ids", "1 2 1 2 1 2 1 2")
    inspection_rows(page, "1 2 1 2 1 2 1 2|4|false|false")
    expect(page.locator("#heat-error")).to_have_text("")
    assert page.get_attribute("#token-ids", "aria-invalid") is None
    expect(page.locator("#norm-heatmaps svg")).to_have_count(2)
    assert refused(page.errors) == [] and page.outside == []
