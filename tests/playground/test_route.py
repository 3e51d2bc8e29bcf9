"""The playground's page and assets as the server sends them (the browser tests are in test_page.py)."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings

STATIC = Path(__file__).resolve().parents[2] / "service" / "playground" / "static"
MODULES = (
    *("playground.js", "common.js", "charts.js"),
    *("attention.js", "gradients.js", "sampling.js", "decode.js", "rollout.js"),
)
"""The page's ES modules: the entry point, its shared helpers and charts, and one module per panel."""
MODULE_IMPORT = re.compile(r'^import \{[^}]*\} from "\./([\w-]+\.js)";$', re.M)
"""A module's imports of its siblings (the file names); tests/hardening/test_security.py follows them too."""


def imported(http: TestClient, entry: str = "playground.js") -> set[str]:
    """The modules ``entry`` reaches through its imports (itself included), as the server sends them."""
    seen, todo = set(), [entry]
    while todo:
        module = todo.pop()
        if module not in seen:
            got = http.get(f"/playground/{module}")
            assert got.status_code == 200, module
            seen.add(module)
            todo.extend(MODULE_IMPORT.findall(got.text))
    return seen


def test_the_modules_are_every_script_shipped_and_import_no_circle() -> None:
    """Each module imports only from the shared ones (common.js, charts.js: the panels never import each other), so
    the import graph has no circle and a panel reads from its own file and the two shared ones.
    """
    shipped = {p.name for p in STATIC.glob("*.js")}
    assert shipped == {"npy.js", *MODULES}
    for module in MODULES:
        imports = set(MODULE_IMPORT.findall((STATIC / module).read_text()))
        if module == "common.js":
            assert imports == set(), imports
        elif module == "charts.js":
            assert imports == {"common.js"}, imports
        elif module != "playground.js":
            assert imports <= {"common.js", "charts.js"}, (module, imports)


def test_page_assets_and_policy() -> None:
    with TestClient(create_app(Settings(enable_onnx=False))) as http:
        page = http.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        csp = page.headers["content-security-policy"]
        assert csp.startswith("default-src 'none'") and "script-src 'self';" in csp and "unsafe" not in csp
        assert "<script>" not in page.text and " style=" not in page.text  # nothing inline: the policy allows none
        assets = re.findall(r'(?:src|href)="(playground/[^"]+)"', page.text)
        assert sorted(assets) == ["playground/npy.js", "playground/playground.css", "playground/playground.js"]
        for asset in assets:
            got = http.get("/" + asset)
            assert got.status_code == 200 and len(got.content) > 500
        assert '<script type="module" src="playground/playground.js">' in page.text  # the panels are ES modules
        for script in ("npy.js", *MODULES):
            assert "text/javascript" in http.get(f"/playground/{script}").headers["content-type"]
        assert imported(http) == set(MODULES)  # every module the entry point reaches, and nothing else shipped
        assert page.text.index("playground/npy.js") < page.text.index("playground/playground.js")  # it reads files
        assert "/" not in http.get("/openapi.json").json()["paths"]  # a page, not an operation


def test_every_panel_has_its_error_line_and_its_routes_exist() -> None:
    """Each panel reports errors in a polite live region of its own, and every /v1 path the script asks
    /openapi.json about (a panel's endpoint) is one this server serves.
    """
    with TestClient(create_app(Settings(enable_onnx=False))) as http:
        page = http.get("/").text
        panels = re.findall(r'<section id="(panel-[\w-]+)".*?</section>', page, re.S)
        assert panels == [
            "panel-softmax",
            "panel-heatmap",
            "panel-gradients",
            "panel-sampling",
            "panel-decode",
            "panel-rollout",
        ]
        for body in re.findall(r"<section .*?</section>", page, re.S):
            assert re.search(r'<p class="error" id="[\w-]+" role="status" aria-live="polite">', body), body[:80]
        decode = re.search(r'<section id="panel-decode".*?</section>', page, re.S)
        assert decode is not None
        buttons = re.findall(r'<button id="dec-[\w-]+" type="button">([^<]+)</button>', decode.group(0))
        assert buttons == ["Start", "Step", "Run 16 steps", "End"]
        script = "".join(http.get(f"/playground/{module}").text for module in MODULES)
        asked = set(re.findall(r'"(/v1/[^"]+)"', script))
        assert "/v1/sessions/{sequence_id}/steps" in asked and "/v1/attention/rollout" in asked
        assert asked <= set(http.get("/openapi.json").json()["paths"])
