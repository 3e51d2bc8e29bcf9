"""The playground in a real headless Chromium (Debian's chromium driven by Playwright).

Loads ``/``, moves the temperature (with the mouse-free ``fill`` and with the keyboard), checks the bars
against semantics.md's numbers, toggles the causal and padding masks and checks the heatmap's masked
cells are empty, runs the gradient, sampling and calibration panels, and saves screenshots (into
``$PLAYGROUND_SCREENSHOTS_DIR`` when set: ``make screenshots`` refreshes the ones the README shows).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.e2e.conftest import LiveServer

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


def cells(page: Any) -> list[tuple[int, int, int, float, bool]]:
    """(head, query, key, weight, drawn empty) of every heatmap cell; empty means nothing is painted."""
    got = page.eval_on_selector_all(
        "#heatmaps svg.heatmap rect.cell",
        "rs => rs.map(r => [+r.closest('svg').dataset.head, +r.dataset.i, +r.dataset.j, +r.dataset.w,"
        " getComputedStyle(r).fill === 'none'])",
    )
    return [tuple(c) for c in got]


def test_heatmap_masks(page: Any, shots: Path) -> None:
    page.wait_for_selector('#heatmaps[data-key="false|false|softmax|1.0"]', timeout=20_000)
    before = cells(page)
    assert len(before) == 2 * 8 * 8 and all(w > 0 and not empty for *_, w, empty in before)
    assert page.locator("#head-diagnostics tbody tr").count() == 2

    page.check("#causal")
    page.wait_for_selector('#heatmaps[data-key="true|false|softmax|1.0"]', timeout=20_000)
    # the cells are redrawn once per event the checkbox fires (input, change): wait until the last
    # drawing has its style (a cell of weight 0 is painted with nothing)
    wait_until(
        page,
        "() => [...document.querySelectorAll('#heatmaps rect.cell')].every("
        "r => (+r.dataset.w > 0) === (getComputedStyle(r).fill !== 'none'))",
    )
    after = cells(page)
    upper = [c for c in after if c[2] > c[1]]
    lower = [c for c in after if c[2] <= c[1]]
    assert len(upper) == 2 * 28 and all(w == 0 and empty for *_, w, empty in upper)  # the upper triangle is empty
    assert all(w > 0 and not empty for *_, w, empty in lower)
    for head in (0, 1):  # each row still sums to 1
        rows = np.zeros(8)
        for h, i, _j, w, _e in after:
            rows[i] += w if h == head else 0
        np.testing.assert_allclose(rows, 1.0, atol=1e-12)
    page.locator("#panel-heatmap").screenshot(path=str(shots / "playground-heatmap.png"))

    page.fill("#valid-keys", "5")
    page.check("#padding")
    page.wait_for_selector('#heatmaps[data-key="true|true|softmax|1.0"]', timeout=20_000)
    padded = cells(page)
    assert all(w == 0 and empty for _h, i, j, w, empty in padded if j >= 5 or j > i)
    assert all(w > 0 for _h, i, j, w, _e in padded if j < 5 and j <= i)
    assert "collapsed" in page.text_content("#head-diagnostics") or "–" in page.text_content("#head-diagnostics")
    assert page.errors == [] and page.outside == []


def _routes(server: LiveServer) -> set[str]:
    return set(httpx.get(server.url + "/openapi.json").json()["paths"])


def test_gradient_sampling_and_calibration_panels(page: Any, page_server: LiveServer, shots: Path) -> None:
    routes = _routes(page_server)
    page.click("#grad-run")
    page.wait_for_selector("#grad-chart[data-source]", timeout=60_000)
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


def test_page_headers_and_keyboard_reach(page_server: LiveServer, page: Any) -> None:
    r = httpx.get(page_server.url + "/")
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "connect-src 'self'" in csp and "unsafe-inline" not in csp
    assert 'href="docs"' in r.text
    reached = set()
    for _ in range(40):  # Tab through the page: every control is reachable from the keyboard
        page.keyboard.press("Tab")
        reached.add(page.evaluate("document.activeElement.id"))
    assert {
        "preset",
        "scores",
        "temperature",
        "normalizer",
        "causal",
        "padding",
        "grad-run",
        "top-k",
        "calib-run",
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
