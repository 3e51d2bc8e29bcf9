"""ASGI entry for uvicorn: ``uvicorn --factory service.asgi:create_app_from_env``.

Each worker builds its app from the ``ATTN_*`` environment.
"""

from __future__ import annotations

from fastapi import FastAPI

from service.app import create_app
from service.settings import Settings


def create_app_from_env() -> FastAPI:
    """The app configured from the environment."""
    return create_app(Settings())
