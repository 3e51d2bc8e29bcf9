"""The names docs/concepts/fixed-names.md promises are the names the service's schema has.

Every request and answer field named in the page's tables is a property of the route's request or answer schema
(as the app serves it, so also of the committed openapi.yaml, which tests/test_openapi.py keeps equal); every
quoted value (``"top_left"``, ``["output", "weights"]``) is one the schema accepts; the names its prose lists
(the sweep's columns, the problem's fields, the wire forms' keys) are in the schema too; every operational route
exists with its method. A rename in the code fails here before a client notices.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from service.openapi import openapi_schema
from tests.docs.markdown import DOCS

PAGE = DOCS / "concepts" / "fixed-names.md"
SCHEMA = openapi_schema()
COMPONENTS = SCHEMA["components"]["schemas"]
IDENTIFIER = re.compile(r"^[a-z][a-z0-9_]*$")
LITERALS = frozenset({"true", "false", "null"})


def resolve(node: Any) -> Any:
    while isinstance(node, dict) and "$ref" in node:
        node = COMPONENTS[node["$ref"].rsplit("/", 1)[1]]
    return node


def walk(node: Any, seen: frozenset[str] = frozenset()) -> Iterator[dict[str, Any]]:
    """Every schema object reachable from ``node`` (through refs, properties, items and unions)."""
    if isinstance(node, dict) and "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[1]
        if name in seen:
            return
        seen = seen | {name}
    node = resolve(node)
    if not isinstance(node, dict):
        return
    yield node
    children = [*node.get("properties", {}).values(), *node.get("anyOf", []), *node.get("oneOf", [])]
    children += [*node.get("allOf", []), node.get("items"), node.get("additionalProperties")]
    for child in children:
        if isinstance(child, dict):
            yield from walk(child, seen)


def names(node: Any) -> set[str]:
    return {name for schema in walk(node) for name in schema.get("properties", {})}


def enums(node: Any) -> set[Any]:
    return {
        value
        for schema in walk(node)
        for value in [*schema.get("enum", []), *([schema["const"]] if "const" in schema else [])]
    }


def sections() -> dict[str, str]:
    """The page's sections by heading."""
    text = PAGE.read_text(encoding="utf-8")
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def tables(section: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """Each table of a section: its first header cell and its rows' first two cells."""
    found: list[tuple[str, list[tuple[str, str]]]] = []
    rows: list[tuple[str, str]] | None = None
    for line in section.splitlines():
        if not line.startswith("|"):
            rows = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if rows is None:
            rows = []
            found.append((cells[0], rows))
        elif not set(cells[0]) <= {"-", ":"}:
            rows.append((cells[0], cells[1] if len(cells) > 1 else ""))
    return found


def code_spans(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


def route_schemas(heading: str) -> tuple[Any, Any]:
    method, path = heading.strip("`").split(" ", 1)
    operation = SCHEMA["paths"][path][method.lower()]
    request = operation["requestBody"]["content"]["application/json"]["schema"]
    answer = operation["responses"]["200"]["content"]["application/json"]["schema"]
    return request, answer


ROUTES = [h for h in sections() if h.startswith("`POST /v1/")]


def test_the_page_lists_every_v1_post_route() -> None:
    documented = {h.strip("`").split(" ", 1)[1] for h in ROUTES}
    served = {p for p, item in SCHEMA["paths"].items() if p.startswith("/v1/") and "post" in item}
    assert documented == served


@pytest.mark.parametrize("heading", ROUTES)
def test_request_and_answer_names(heading: str) -> None:
    request, answer = route_schemas(heading)
    request_names, answer_names = set(resolve(request)["properties"]), set(resolve(answer)["properties"])
    values = enums(request) | enums(answer)
    deep = names(request) | names(answer)
    problems = []
    section_tables = tables(sections()[heading])
    assert {kind for kind, _ in section_tables} == {"request field", "answer field"} or heading.endswith(
        ("/backward`", "/analyze`")
    ), section_tables
    for kind, rows in section_tables:
        own = request_names if kind == "request field" else answer_names
        for first, meaning in rows:
            for name in code_spans(first):
                if name not in own:
                    problems.append(f"{kind} {name!r} is not in the schema")
            for span in code_spans(meaning):
                if span.startswith('"') and span.endswith('"') and span.strip('"') not in values:
                    problems.append(f"{first}: the value {span} is not one the schema has")
                elif span.startswith('["'):
                    problems += [
                        f"{first}: {v!r} is not a value the schema has" for v in json.loads(span) if v not in values
                    ]
                elif IDENTIFIER.match(span) and span not in LITERALS | deep | values:
                    problems.append(f"{first}: {span!r} is not a name in the schema")
    assert not problems, problems


def test_the_sweep_columns() -> None:
    request, answer = route_schemas("`POST /v1/attention/analyze`")
    text = sections()["`POST /v1/attention/analyze`"]
    paragraph = text[text.index("The answer's `sweep`") :]
    columns = [s for s in code_spans(paragraph) if IDENTIFIER.match(s)]
    assert len(columns) >= 10
    missing = [c for c in columns if c not in names(answer) | names(request)]
    assert not missing


def test_the_wire_forms() -> None:
    text = sections()["Tensors on the wire"]
    forms = [json.loads(s) for s in code_spans(text) if s.startswith("{")]
    assert len(forms) == 2
    for form in forms:
        component = COMPONENTS["FlatTensor" if "data" in form else "Base64Tensor"]
        assert set(form) == set(component["properties"]), form
        assert form["dtype"] in enums(component)
    dtypes = re.search(r"`dtype` is one of (.+?)\.", text.replace("\n", " "))
    assert dtypes is not None
    assert set(code_spans(dtypes.group(1))) == enums(COMPONENTS["FlatTensor"]["properties"]["dtype"])
    assert {"encoding"} <= set(COMPONENTS["AttentionRequest"]["properties"])
    assert "base64" in enums(COMPONENTS["AttentionRequest"]["properties"]["encoding"])


def test_the_operational_routes() -> None:
    _, rows = tables(sections()["Operations"])[0]
    for route, _ in rows:
        method, path = code_spans(route)[0].split(" ", 1)
        assert method.lower() in SCHEMA["paths"].get(path, {}), route


def test_the_problem_fields() -> None:
    text = sections()["Errors"]
    paragraph = text[: text.index("| status |")]
    fields = {s for s in code_spans(paragraph) if IDENTIFIER.match(s)}
    assert fields == {"type", "title", "status", "detail"}
    assert 'errors: [{"loc": [...], "msg": ...}]' in code_spans(paragraph)
    assert fields | {"errors"} <= names(COMPONENTS["Problem"])
    responses = SCHEMA["paths"]["/v1/attention"]["post"]["responses"]
    example = responses["422"]["content"]["application/problem+json"]["example"]  # tests/http/test_docs.py sends it
    assert {"loc", "msg"} <= set(example["errors"][0])
