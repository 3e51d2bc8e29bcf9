"""Structured logs: one JSON object per line, with the id of the request being served.

``REQUEST_ID`` is set by the request-context middleware for the whole request
(tasks and worker threads inherit it), so any log line written while serving a
request carries its id. :func:`log_config` is the ``logging.config`` dict that
``python -m service serve`` hands to uvicorn (its own access log is replaced by
one ``service.access`` line per request).
"""

from __future__ import annotations

import logging
import re
import time
from contextvars import ContextVar
from typing import Any

import orjson

REQUEST_ID: ContextVar[str | None] = ContextVar("request_id", default=None)

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "color_message"}


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """A log record as a flat dict: time, level, logger, message, request id and ``extra`` fields."""
    fields: dict[str, Any] = {
        "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
        "level": record.levelname.lower(),
        "logger": record.name,
        "message": record.getMessage(),
    }
    request_id = getattr(record, "request_id", None) or REQUEST_ID.get()
    if request_id:
        fields["request_id"] = request_id
    for key, value in record.__dict__.items():
        if key not in _STANDARD and key not in fields:
            fields[key] = value
    if record.exc_info:
        fields["exc_info"] = logging.Formatter().formatException(record.exc_info)
    return fields


class JsonFormatter(logging.Formatter):
    """One JSON object per line (orjson; values it cannot encode become strings)."""

    def format(self, record: logging.LogRecord) -> str:
        return orjson.dumps(record_fields(record), default=str).decode()


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\\\u2028\u2029]")
"""Characters escaped in text lines: C0 and C1 controls, the Unicode line separators, and the backslash itself (so
that an escape in the log always means an escaped character)."""


def _escape_char(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02X}" if code <= 0xFF else f"\\u{code:04X}"


def escape_text(value: object) -> str:
    """``value`` as text with control characters escaped as a backslash, ``x`` and two hex digits (nginx's
    ``escape=default``): a request path with ``%0A`` in it cannot start a line of its own in the log.
    """
    text = str(value)
    return _CONTROL.sub(_escape_char, text) if _CONTROL.search(text) else text


_QUOTED = frozenset(' ="')
"""A value with one of these characters is quoted in a text line (logfmt): unquoted, a space in a client's path
could add a field (``path=/v1/x status=200``)."""


def quote_text(value: object, quote_when: frozenset[str] = _QUOTED) -> str:
    """``value`` as :func:`escape_text` writes it, between double quotes when it is empty or holds a character of
    ``quote_when`` (a quote inside preceded by a backslash), as logfmt does: one value stays one field.
    """
    text = escape_text(value)
    if text and quote_when.isdisjoint(text):
        return text
    return '"' + text.replace('"', '\\"') + '"'


_MESSAGE_QUOTED = frozenset('="')
"""A message with one of these is quoted (spaces are its own): ``key=value`` in it would read as a field."""


class TextFormatter(logging.Formatter):
    """``ts level logger message key=value ...`` for people reading a terminal; one line per record (control
    characters in the message and the fields escaped, values quoted as logfmt does), then the traceback if any.
    """

    def format(self, record: logging.LogRecord) -> str:
        fields = record_fields(record)
        head = " ".join(escape_text(fields.pop(k)) for k in ("ts", "level", "logger"))
        message = quote_text(fields.pop("message"), _MESSAGE_QUOTED)
        exc = fields.pop("exc_info", None)
        line = f"{head} {message}" + "".join(f" {escape_text(k)}={quote_text(v)}" for k, v in fields.items())
        return f"{line}\n{exc}" if exc else line


def log_config(level: str = "info", fmt: str = "json") -> dict[str, Any]:
    """``logging.config.dictConfig`` for the server: uvicorn's and the service's loggers, one format."""
    formatter = {"()": f"{__name__}.{'JsonFormatter' if fmt == 'json' else 'TextFormatter'}"}
    handler = {"class": "logging.StreamHandler", "formatter": "default", "stream": "ext://sys.stderr"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"default": formatter},
        "handlers": {"default": handler},
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": level.upper(), "propagate": False},
            "uvicorn.access": {"handlers": [], "level": "WARNING", "propagate": False},
            "service": {"handlers": ["default"], "level": level.upper(), "propagate": False},
        },
    }
