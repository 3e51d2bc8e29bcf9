"""ASGI entry for uvicorn: ``uvicorn --factory service.asgi:create_app_from_env``.

Each worker builds its app from the ``ATTN_*`` environment (``serve`` puts its flags there first).
"""

from __future__ import annotations

from starlette.types import ASGIApp

from service.app import create_app
from service.settings import Settings
from service.startup import report_startup_errors


def create_app_from_env() -> ASGIApp:
    """The app configured from the environment; a start-up that fails on a taken port says so in one line."""
    return report_startup_errors(create_app(Settings()))
