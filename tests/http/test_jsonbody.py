"""service.http.codecs.jsonbody: large bodies parsed by simdjson, tensors straight into numpy, as orjson reads them."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.core.errors import InvalidInput
from service.http.codecs import jsonbody, jsonerrors, jsonfast, jsonscan
from service.http.codecs import tensors as codecs
from service.http.errors import Refused

FIELDS = ("query", "key", "value", "mask")


def _refuse(exc: orjson.JSONDecodeError) -> Exception:
    return ValueError(str(exc))


def parse_fast(body: bytes) -> Any:
    """Parse with simdjson whatever the size (the threshold only picks the faster parser)."""
    saved = jsonbody.SIMDJSON_MIN_BYTES
    jsonbody.SIMDJSON_MIN_BYTES = 0
    try:
        return jsonbody.parse_object(body, FIELDS, _refuse)
    finally:
        jsonbody.SIMDJSON_MIN_BYTES = saved


def decode(value: Any, kind: codecs.TensorKind = "float") -> np.ndarray | str:
    """The decoded array, or the error message and location."""
    try:
        return codecs.decode_tensor(value, "query", kind=kind)
    except InvalidInput as exc:
        return f"{exc.message} @ {list(exc.loc)}"


def test_large_nested_lists_become_float64_buffers_equal_to_numpy() -> None:
    q = np.random.default_rng(0).standard_normal((2, 3, 40, 64))
    body = orjson.dumps({"query": q.tolist(), "return": ["output"], "scale": 0.5})
    assert len(body) > jsonbody.SIMDJSON_MIN_BYTES
    obj = jsonbody.parse_object(body, FIELDS, _refuse)
    assert isinstance(obj["query"], jsonbody.JsonArray) and obj["query"].shape == q.shape
    assert obj["return"] == ["output"] and obj["scale"] == 0.5
    arr = codecs.decode_tensor(obj["query"], "query")
    assert arr.dtype == np.float64 and arr.shape == q.shape
    np.testing.assert_array_equal(arr, q)


def test_flat_data_and_inference_inputs_stay_lazy() -> None:
    a = np.arange(24.0).reshape(2, 3, 4) / 7
    body = orjson.dumps({"query": {"shape": [2, 3, 4], "dtype": "float32", "data": a.reshape(-1).tolist()}})
    obj = parse_fast(body)
    assert isinstance(obj["query"]["data"], jsonbody.JsonArray) and obj["query"]["shape"] == [2, 3, 4]
    np.testing.assert_array_equal(codecs.decode_tensor(obj["query"], "query"), a.astype(np.float32))
    infer = orjson.dumps(
        {"id": "x[", "inputs": [{"name": "query", "shape": [2, 12], "datatype": "FP64", "data": a.tolist()}]}
    )
    saved = jsonbody.SIMDJSON_MIN_BYTES
    jsonbody.SIMDJSON_MIN_BYTES = 0
    try:
        req = jsonbody.parse_infer_request(infer, _refuse)
    finally:
        jsonbody.SIMDJSON_MIN_BYTES = saved
    data = req["inputs"][0]["data"]
    assert req["id"] == "x[" and isinstance(data, jsonbody.JsonArray) and data.shape == (2, 3, 4)
    np.testing.assert_array_equal(data.as_float64(), a)


@pytest.mark.parametrize(
    "value",
    [
        [[1.0, 2.0], [3.0]],  # as_buffer flattens this to 3 numbers
        [[1.0, [2.0]], 3.0],
        [[1.0, []], [[2.0, 3.0], 4.0]],  # every level has the right length and count: an array hides at the leaves
        [[1.0, [3.0, 4.0]], 2.0],
        [[[1.0]], 2.0],
        [[1.0, 2.0], [3.0, [4.0]]],
    ],
)
def test_ragged_arrays_never_take_the_fast_path(value: list[Any]) -> None:
    obj = parse_fast(orjson.dumps({"query": value}))
    assert obj["query"].shape is None and obj["query"].as_float64() is None
    assert "ragged" in str(decode(obj["query"]))
    assert decode(obj["query"]) == decode(value)


def test_a_bracket_in_a_string_or_an_escape_only_costs_the_fast_path() -> None:
    for extra in ({"id": "a[b"}, {"note": "\\u005b"}, {"x[": 1}):
        obj = parse_fast(orjson.dumps({"query": [[1.0, 2.0]], **extra}))
        np.testing.assert_array_equal(decode(obj["query"]), [[1.0, 2.0]])
    escaped = b'{"query": [[1.0, [2.0]]], "k": "\\u005b"}'  # an escaped bracket cannot hide an array
    obj = parse_fast(escaped)
    assert obj["query"].shape is None and "ragged" in str(decode(obj["query"]))


class Scanned(Exception):
    """The byte scan was asked for (jsonscan.Analysis)."""


def no_scan(text: bytes) -> Any:
    raise Scanned


def test_an_ordinary_tensor_is_confirmed_without_the_byte_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    q = np.random.default_rng(1).standard_normal((1, 8, 16, 8))
    k = np.arange(16, dtype=np.int64).reshape(2, 8)
    body = orjson.dumps({"query": q.tolist(), "key": k.tolist(), "id": "a[b", "return": ["output"]})
    monkeypatch.setattr(jsonscan, "Analysis", no_scan)
    obj = parse_fast(body)
    np.testing.assert_array_equal(codecs.decode_tensor(obj["query"], "query"), q)
    assert obj["query"].structure().fractions is True and obj["key"].structure().fractions is False
    np.testing.assert_array_equal(obj["key"].as_int64(), k)
    # a backslash anywhere (strings may then hide brackets), or more inner lists than the quick check walks:
    # the byte scan decides
    for other in (
        orjson.dumps({"query": q.tolist(), "note": "\\u005b"}),
        orjson.dumps({"query": [[1.0]] * (jsonfast.FAST_MAX_ARRAYS + 1)}),
    ):
        with pytest.raises(Scanned):
            parse_fast(other)["query"].structure()


@pytest.mark.parametrize(
    "text",  # minified, as the byte scan reads an array
    [
        b"[[1.5,-2.0],[3e2,4]]",
        b"[[1,0],[0,1]]",
        b"[[1.0,0.0],[-10000.0,0.0]]",
        b"[[1,0],[0,9223372036854775807]]",
        b"[[1,0],[0,9223372036854775808]]",  # beyond int64, written as an integer: not a fraction
        b"[[1,0],[0,1e19]]",
    ],
)
def test_the_quick_check_reads_the_structure_the_byte_scan_reads(text: bytes) -> None:
    array = parse_fast(b'{"query": ' + text + b"}")["query"]
    assert array.structure() == jsonscan.Analysis(text).structure()


def test_duplicate_keys_read_as_orjson_does() -> None:
    body = b'{"query": [[1.0]], "query": [[2.0]]}'
    assert parse_fast(body) == orjson.loads(body) == {"query": [[2.0]]}


def test_simdjson_refusals_fall_back_to_orjson() -> None:
    # simdjson refuses integers of 2**64 and more; orjson reads them as floats
    body = b'{"query": [[18446744073709551616, 1.0]]}'
    assert parse_fast(body) == orjson.loads(body)
    with pytest.raises(ValueError, match="unexpected character"):
        parse_fast(b'{"query": [[NaN]]}')


@pytest.mark.parametrize(
    "raw, path, text",
    [
        (b'{"query": [[1.0, NaN]]}', ("query", 0, 1), "NaN"),
        (b'{"a": 1, "query": {"data": [Infinity]}}', ("query", "data", 0), "Infinity"),
        (b'{"query": [-Infinity]}', ("query", 0), "-Infinity"),
        (b'{"query": [1, 2e400]}', ("query", 1), "2e400"),
    ],
)
def test_non_json_numbers_are_located(raw: bytes, path: tuple[Any, ...], text: str) -> None:
    with pytest.raises(orjson.JSONDecodeError) as info:
        orjson.loads(raw)
    found = jsonerrors.locate_bad_number(raw, info.value)
    assert found is not None and found[:2] == (path, text)


def test_other_json_errors_are_not_located() -> None:
    raw = b'{"query": [1, }'
    with pytest.raises(orjson.JSONDecodeError) as info:
        orjson.loads(raw)
    assert jsonerrors.locate_bad_number(raw, info.value) is None


def test_format_path() -> None:
    assert jsonerrors.format_path(("query", 0, 1)) == "query[0, 1]"
    assert jsonerrors.format_path(("query", "data", 3)) == "query.data[3]"
    assert jsonerrors.format_path(()) == "the body"


# Nested values of every shape: rectangular or not, numbers, booleans, strings, null.
_leaf = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    st.integers(-(2**53), 2**53),
    st.booleans(),
    st.sampled_from(["NaN", "x", None]),
)
_nested = st.recursive(st.lists(_leaf, max_size=4), lambda inner: st.lists(inner, max_size=3), max_leaves=24)
_rectangular = st.integers(1, 3).flatmap(
    lambda n: st.lists(st.integers(1, 3), min_size=n, max_size=n).flatmap(
        lambda shape: st.lists(
            st.floats(-1e6, 1e6, width=64), min_size=int(np.prod(shape)), max_size=int(np.prod(shape))
        ).map(lambda flat: np.array(flat).reshape(shape).tolist())
    )
)


@settings(max_examples=300, deadline=None)
@given(value=st.one_of(_nested, _rectangular), kind=st.sampled_from(["float", "mask", "logits"]))
def test_fast_path_decodes_exactly_as_the_python_path(value: list[Any], kind: codecs.TensorKind) -> None:
    """Whatever the nesting and the values: the same array, or the same message at the same place."""
    fast = parse_fast(json.dumps({"query": value}).encode())["query"]
    got, want = decode(fast, kind), decode(value, kind)
    if isinstance(want, str):
        assert got == want
    else:
        assert isinstance(got, np.ndarray) and got.shape == want.shape
        np.testing.assert_array_equal(got, want.astype(got.dtype))


# Leaves that stress the byte scan: strings holding brackets, commas and escaped quotes, objects holding arrays.
_awkward_leaf = st.one_of(
    _leaf,
    st.sampled_from(["x[,]", 'a"b[', "\\", 'q\\"],[', "{}", ""]),
    st.just({"a": [1, [2]], "b": "]"}),
    st.sampled_from([1e300, -0.0, 2.5e-7, 2**62]),
)
_awkward = st.recursive(st.lists(_awkward_leaf, max_size=4), lambda inner: st.lists(inner, max_size=3), max_leaves=30)


@settings(max_examples=400, deadline=None)
@given(value=st.one_of(_awkward, _rectangular), expect=st.sampled_from(["numbers", "numbers or booleans", "booleans"]))
def test_the_byte_scan_names_the_problem_the_python_walk_names(value: list[Any], expect: Any) -> None:
    """The byte scan reads a tensor's structure: the same first problem (index, words) as find_problem on
    the same value as Python lists, and a shape exactly when the lists are a rectangular array of numbers.
    """
    import simdjson

    from service.http.codecs.jsonscan import Analysis
    from service.http.codecs.nested_lists import find_problem

    analysis = Analysis(simdjson.Parser().parse(json.dumps(value).encode()).mini)
    want, got = find_problem(value, "query", expect), analysis.problem("query", expect)
    assert (None if got is None else (got.index, got.message, got.ragged)) == (
        None if want is None else (want.index, want.message, want.ragged)
    )
    structure = analysis.structure()
    if structure.only_numbers:
        assert find_problem(value, "query", "numbers") is None and np.array(value).shape == structure.shape


def test_pathological_arrays_are_read_without_python_objects() -> None:
    """Three million empty lists: the shape from the bytes (the decoders refuse it by its leading dimensions)."""
    body = b'{"query": [' + b"[]," * 2_999_999 + b"[]]}"
    obj = parse_fast(body)
    assert obj["query"].lead_dims() == (3_000_000, 0)
    assert "above the limit" in str(decode(obj["query"]))


# -- many keys, long strings (issue 27, items 4 and 5) ---------------------------------------------------------------


def parse_with_fields(body: bytes, fields: frozenset[str]) -> Any:
    saved = jsonbody.SIMDJSON_MIN_BYTES
    jsonbody.SIMDJSON_MIN_BYTES = 0
    try:
        return jsonbody.parse_object(body, FIELDS, _refuse, fields)
    finally:
        jsonbody.SIMDJSON_MIN_BYTES = saved


KNOWN = frozenset({*FIELDS, "scale"})


@pytest.mark.parametrize("large", [False, True])
def test_more_keys_than_fields_are_refused_by_the_first_unknown_ones(large: bool) -> None:
    body = b'{"query": [[1.0]], "scale": 1' + b"".join(b', "k%d": [0]' % i for i in range(30)) + b"}"
    parse = parse_with_fields if large else (lambda b, f: jsonbody.parse_object(b, FIELDS, _refuse, f))
    with pytest.raises(Refused) as caught:
        parse(body, KNOWN)
    assert caught.value.reason == "body_fields"
    assert caught.value.errors == [{"loc": [f"k{i}"], "msg": "Extra inputs are not permitted"} for i in range(10)]
    assert caught.value.message.startswith("the body has 32 fields, more than the 5 names its request knows")
    assert caught.value.message.endswith("'k8', 'k9', ...")
    # as many keys as fields: left to the request model, as before
    assert parse(b'{"query": [[1.0]], "a": 1, "b": 2, "c": 3, "d": 4}', KNOWN)["d"] == 4


def test_more_keys_than_fields_that_only_repeat_known_ones_read_as_orjson_does() -> None:
    body = b'{"query": [[1.0]]' + b', "scale": %d' * 40 % tuple(range(40)) + b"}"
    assert parse_with_fields(body, KNOWN) == {"query": [[1.0]], "scale": 39}


def test_a_tensor_object_with_more_keys_than_its_own_is_refused_by_its_field() -> None:
    body = b'{"query": {"shape": [1], "dtype": "float32", "data": [1.0], "x": 1, "y": 2}}'
    with pytest.raises(Refused) as caught:
        parse_with_fields(body, KNOWN)
    assert caught.value.errors is not None and caught.value.errors[0]["loc"] == ["query"]
    assert "more than a tensor object's b64, data, dtype, shape" in caught.value.message


def test_an_inference_request_keeps_the_keys_the_protocol_reads() -> None:
    extra = b"".join(b', "k%d": [0]' % i for i in range(10))
    infer = b'{"id": "a", "inputs": [{"name": "q", "shape": [1], "datatype": "FP32", "data": [1.0]' + extra + b"}]"
    saved = jsonbody.SIMDJSON_MIN_BYTES
    jsonbody.SIMDJSON_MIN_BYTES = 0
    try:
        req = jsonbody.parse_infer_request(infer + extra + b"}", _refuse)
    finally:
        jsonbody.SIMDJSON_MIN_BYTES = saved
    assert set(req) == {"id", "inputs"} and set(req["inputs"][0]) == {"name", "shape", "datatype", "data"}
    assert req["inputs"][0]["data"].as_float64().tolist() == [1.0]


_long_text = st.text(
    alphabet=st.sampled_from(["a", "\\", '"', "é", "\u2028", "\x01", "[", ","]), min_size=0, max_size=600
)


@settings(max_examples=200, deadline=None)
@given(text=_long_text, before=st.integers(0, 3))
def test_a_string_of_any_length_is_named_as_the_python_walk_names_it(text: str, before: int) -> None:
    """Long strings are read by their first bytes, backslashes before quotes counted with numpy: same words."""
    import simdjson

    from service.http.codecs.jsonscan import Analysis
    from service.http.codecs.nested_lists import find_problem

    value = [[1.0] * before + [text] + [1.0] * (3 - before)]
    analysis = Analysis(simdjson.Parser().parse(json.dumps(value, ensure_ascii=False).encode()).mini)
    want, got = find_problem(value, "query", "numbers"), analysis.problem("query", "numbers")
    assert got is not None and want is not None and (got.index, got.message) == (want.index, want.message)
