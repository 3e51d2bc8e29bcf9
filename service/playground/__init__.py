"""The playground page at ``/``: plain HTML, CSS and JavaScript (ES modules, one per panel) shipped as package data.

The page calls the service's own ``/v1`` API from the browser (no library, no CDN: it works
offline). It is served under its own Content-Security-Policy, which allows scripts, styles
and requests from this origin only (the API's answers keep the deny-all policy).
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from starlette.responses import HTMLResponse

STATIC = files("service.playground") / "static"
ASSETS_PATH = "/playground"
PAGE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


def install_playground(app: FastAPI) -> None:
    """``GET /`` (the page) and ``/playground/*`` (its script and style sheet)."""
    page = (STATIC / "index.html").read_text(encoding="utf-8")
    app.mount(ASSETS_PATH, StaticFiles(directory=str(STATIC)), name="playground")

    @app.get("/", include_in_schema=False)
    async def playground() -> HTMLResponse:
        return HTMLResponse(page, headers={"Content-Security-Policy": PAGE_CSP, "Cache-Control": "no-cache"})
