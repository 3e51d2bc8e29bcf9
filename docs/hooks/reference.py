"""MkDocs hook: the reference tables generated from the code when the site is built.

Markers in a page's Markdown are replaced, so that nothing is written twice:

- ``<!-- settings-table -->``: every field of ``service.settings.Settings`` as ``ATTN_<FIELD>``, with its type,
  allowed range, default and description (``<!-- settings-table prefix="grpc_" -->``: the fields whose name starts
  with the prefix);
- ``<!-- metrics-table -->``: every metric family ``service.observability.metrics.ServiceMetrics`` registers, with
  its type, labels and help text.

A setting without a description fails the build: the table is the settings' documentation.
"""

from __future__ import annotations

import enum
import re
import types
import typing
from pathlib import Path
from typing import Any

import annotated_types
from pydantic.fields import FieldInfo

SETTINGS_MARKER = re.compile(r'<!-- settings-table(?: prefix="([a-z_]+)")? -->')
METRICS_MARKER = "<!-- metrics-table -->"


def _cell(text: str) -> str:
    """Text fit for a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def breakable(name: str) -> str:
    """``ATTN_MAX_BODY_BYTES`` with a line-break opportunity after each underscore (a narrow column wraps there)."""
    return name.replace("_", "_<wbr>")


def type_name(annotation: Any) -> str:
    """A reader's name for a field's type: ``int``, ``one of `a`, `b` ``, ``list of str``, ``optional ...``."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        name = " or ".join(type_name(a) for a in rest)
        return f"{name}, optional" if len(rest) < len(args) else name
    if origin is list:
        return f"list of {type_name(args[0])}" if args else "list"
    if annotation is Path:
        return "path"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "one of " + ", ".join(f"`{m.value}`" for m in annotation)
    name = getattr(annotation, "__name__", str(annotation))
    return {"SecretStr": "str (secret)"}.get(name, name)


def default_text(field: FieldInfo) -> str:
    """The default as a reader would type it in the environment."""
    if field.default_factory is not None:
        return "computed at start"
    value = field.get_default()
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    if isinstance(value, list):
        return ", ".join(f"`{v}`" for v in value) if value else "empty"
    if isinstance(value, Path):
        return f"`{value}`"
    if value == "":
        return "empty"
    return f"`{value}`"


def range_text(field: FieldInfo) -> str:
    """The bounds pydantic enforces, e.g. ``>= 1, <= 64``."""
    bounds = []
    for item in field.metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            value = getattr(item, attr, None)
            if value is not None and isinstance(item, annotated_types.BaseMetadata):
                bounds.append(f"{sign} {value:g}" if isinstance(value, float) else f"{sign} {value}")
    return ", ".join(bounds)


def settings_table(prefix: str = "") -> str:
    from service.settings import ENV_PREFIX, Settings

    rows = ["| setting | default | description |", "|---|---|---|"]
    missing = []
    for name, field in Settings.model_fields.items():
        if not name.startswith(prefix):
            continue
        if not field.description:
            missing.append(name)
            continue
        kind = ", ".join(filter(None, (type_name(field.annotation), range_text(field))))
        rows.append(
            f"| <code>{breakable(ENV_PREFIX + name.upper())}</code><br><small>{_cell(kind)}</small> "
            f"| {_cell(default_text(field))} "
            f"| {_cell(field.description)} |"
        )
    if missing:
        raise ValueError(f"settings without a description in service/settings/: {', '.join(missing)}")
    if len(rows) == 2:
        raise ValueError(f"no setting starts with {prefix!r}")
    return "\n".join(rows)


def metrics_table() -> str:
    from service.observability.metrics import REJECT_REASONS, ServiceMetrics

    metrics = ServiceMetrics()
    rows = ["| family | type | labels | meaning |", "|---|---|---|---|"]
    for collector in vars(metrics).values():
        describe = getattr(collector, "describe", None)
        if describe is None or not hasattr(collector, "_labelnames"):
            continue
        for family in describe():
            name = family.name + ("_total" if family.type == "counter" else "")
            labels = ", ".join(f"`{label}`" for label in collector._labelnames) or "none"
            rows.append(f"| `{name}` | {family.type} | {labels} | {_cell(family.documentation)} |")
    reasons = ", ".join(f"`{r}`" for r in REJECT_REASONS)
    return "\n".join(rows) + f"\n\n`attn_http_requests_rejected_total`'s `reason` is one of {reasons}."


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """Replace the markers with the tables; the rendered schema's title is a section of its page, not a second
    page title.
    """
    markdown = re.sub(r"^# (Attention service <span class=\"api-version\">)", r"## \1", markdown, flags=re.M)
    markdown = SETTINGS_MARKER.sub(lambda m: settings_table(m.group(1) or ""), markdown)
    if METRICS_MARKER in markdown:
        markdown = markdown.replace(METRICS_MARKER, metrics_table())
    return markdown
