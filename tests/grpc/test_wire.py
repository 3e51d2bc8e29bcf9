"""service.grpc.wire: a large ``ModelInferRequest`` is read with its tensors' bytes as views of the message, with
the same fields protobuf's own parser gives, and the decoded arrays read those views without a copy.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from service.dataplane.models import MODELS
from service.dataplane.tensors import TensorLimits
from service.grpc.codecs import decode_request
from service.grpc.generated import inference_pb2 as pb
from service.grpc.wire import MAX_TOP_FIELDS, VIEW_MIN_BYTES, parse_infer, split_contents

ATTENTION = MODELS["attention"]


def attention_message(length: int, header: str = "") -> pb.ModelInferRequest:
    """A float32 attention request of ``(1, 2, length, 16)`` tensors, with some of every kind of field."""
    request = pb.ModelInferRequest(model_name="attention", model_version="1", id=header)
    request.parameters["scale"].double_param = 0.25
    request.parameters["causal"].bool_param = True
    rng = np.random.default_rng(length)
    for name in ("query", "key", "value"):
        tensor = request.inputs.add(name=name, datatype="FP32", shape=[1, 2, length, 16])
        tensor.parameters["note"].string_param = name
        request.raw_input_contents.append(rng.standard_normal((1, 2, length, 16)).astype("<f4").tobytes())
    request.outputs.add(name="output")
    return request


def varint(value: int) -> bytes:
    """``value`` as a base-128 varint (the wire format's)."""
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def joined(rest: bytes, contents: list[memoryview]) -> pb.ModelInferRequest:
    """``rest`` parsed, with ``contents`` put back as its raw input contents."""
    message = pb.ModelInferRequest.FromString(rest)
    assert len(message.raw_input_contents) == 0
    message.raw_input_contents.extend(bytes(c) for c in contents)
    return message


def test_the_views_and_the_rest_make_the_message_protobuf_parses() -> None:
    request = attention_message(1024)
    raw = request.SerializeToString()
    split = split_contents(raw)
    assert split is not None
    rest, contents = split
    assert len(rest) < 300 and [len(c) for c in contents] == [2 * 1024 * 16 * 4] * 3
    assert all(c.obj is raw for c in contents)  # views of the received bytes, not copies
    assert joined(rest, contents) == request


def test_fields_in_any_order_and_unknown_fields_are_kept() -> None:
    """Protobuf merges a message's fields in whatever order they come: contents first, fields twice, a field
    number this server does not know (kept as unknown, as protobuf keeps it).
    """
    request = attention_message(8)
    contents_only = pb.ModelInferRequest(raw_input_contents=request.raw_input_contents).SerializeToString()
    header = pb.ModelInferRequest(model_name="attention", inputs=request.inputs).SerializeToString()
    unknown = varint(99 << 3 | 2) + varint(3) + b"abc" + varint(98 << 3) + varint(150)  # fields 99 and 98
    raw = contents_only + header + unknown + pb.ModelInferRequest(id="second").SerializeToString()
    split = split_contents(raw)
    assert split is not None
    assert joined(*split) == pb.ModelInferRequest.FromString(raw)
    assert joined(*split).SerializeToString() == pb.ModelInferRequest.FromString(raw).SerializeToString()


@settings(max_examples=200, deadline=None)
@given(
    names=st.lists(st.text(max_size=20), max_size=4),
    blobs=st.lists(st.binary(max_size=300), max_size=4),
    ints=st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=6),
    number=st.floats(allow_nan=False),
    order=st.randoms(use_true_random=False),
)
def test_any_message_splits_into_what_protobuf_parses(
    names: list[str], blobs: list[bytes], ints: list[int], number: float, order: object
) -> None:
    """Random messages, their top-level fields serialized in a random order: the rest parsed with the contents put
    back is the message protobuf parses from the whole.
    """
    pieces = [pb.ModelInferRequest(raw_input_contents=[blob]).SerializeToString() for blob in blobs]
    for name in names:
        tensor = pb.ModelInferRequest.InferInputTensor(name=name, datatype="INT64", shape=[len(ints)])
        tensor.contents.int64_contents.extend(ints)
        pieces.append(pb.ModelInferRequest(inputs=[tensor], id=name).SerializeToString())
    message = pb.ModelInferRequest()
    message.parameters["x"].double_param = number
    message.parameters["n"].int64_param = ints[0] if ints else 0
    pieces.append(message.SerializeToString())
    order.shuffle(pieces)  # type: ignore[attr-defined]
    raw = b"".join(pieces)
    split = split_contents(raw)
    assert split is not None
    assert joined(*split) == pb.ModelInferRequest.FromString(raw)


@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(lambda raw: raw[:-1], id="the last entry cut short"),
        pytest.param(lambda raw: raw + b"\x3a\xff\xff\xff\x7f", id="an entry longer than the message"),
        pytest.param(lambda raw: raw + b"\x3a\xff", id="a length cut short"),
        pytest.param(lambda raw: raw + b"\x0b", id="a group (wire type 3)"),
        pytest.param(lambda raw: raw + b"\x07", id="field 0"),
    ],
)
def test_a_malformed_message_is_protobufs_to_refuse(cut: object) -> None:
    """What the top-level walk cannot read, protobuf's parser reads whole, and refuses."""
    raw = cut(attention_message(1024).SerializeToString())  # type: ignore[operator]
    assert split_contents(raw) is None
    with pytest.raises(DecodeError):
        pb.ModelInferRequest.FromString(raw)
    with pytest.raises(DecodeError):
        parse_infer(raw)


def test_a_message_of_many_top_level_fields_is_parsed_whole() -> None:
    """Past MAX_TOP_FIELDS top-level fields (here parameters) the walk gives up, so a hostile message of millions
    of tiny fields costs protobuf's parse, not a Python loop on the event loop; the message is the same.
    """
    request = attention_message(1024)
    for i in range(MAX_TOP_FIELDS):
        request.parameters[f"p{i}"].int64_param = i
    raw = request.SerializeToString()
    assert split_contents(raw) is None
    message = parse_infer(raw)
    assert message.contents is None and message.request == request
    fewer = attention_message(1024)
    for i in range(MAX_TOP_FIELDS - 20):
        fewer.parameters[f"p{i}"].int64_param = i
    assert split_contents(fewer.SerializeToString()) is not None


def test_small_messages_are_parsed_whole_and_large_ones_as_views() -> None:
    small, large = attention_message(8), attention_message(1024)
    assert small.ByteSize() < VIEW_MIN_BYTES <= large.ByteSize()
    message = parse_infer(small.SerializeToString())
    assert message.contents is None and message.request == small and message.model_name == "attention"
    assert message.take_contents() == list(small.raw_input_contents)
    raw = large.SerializeToString()
    message = parse_infer(raw)
    assert message.request.model_name == "attention" and len(message.request.raw_input_contents) == 0
    contents = message.take_contents()
    assert [bytes(c) for c in contents] == list(large.raw_input_contents)
    assert message.contents == []  # handed over: the message holds the received bytes no longer


@pytest.mark.parametrize("pad", [0, 1, 2, 3])
def test_decoded_arrays_read_the_message_in_place(pad: int) -> None:
    """A large message's tensors decode without copying its bytes (tracemalloc counts every bytes object and
    array Python allocates): where a tensor's bytes sit at an offset that is not a multiple of 4 within the
    message, that one tensor is copied to aligned memory, as numpy's BLAS calls need; the values are the sent ones.
    """
    request = attention_message(4096, header="x" * pad)  # the id's length moves every tensor's offset
    raw = request.SerializeToString()
    message = parse_infer(raw)
    contents = message.take_contents()
    aligned = [np.frombuffer(c, np.float32).flags.aligned for c in contents]
    tracemalloc.start()
    try:
        decoded = decode_request(
            message.request, "attention", ATTENTION.inputs, ATTENTION.output_names, TensorLimits(), contents
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    size = len(contents[0])
    assert peak < 64 * 1024 + size * aligned.count(False), (peak, aligned)
    wire = np.frombuffer(raw, np.uint8)
    for name, data, in_place in zip(("query", "key", "value"), request.raw_input_contents, aligned, strict=True):
        array = decoded.inputs[name]
        assert np.shares_memory(array, wire) == in_place
        assert array.flags.aligned
        np.testing.assert_array_equal(array, np.frombuffer(data, "<f4").reshape(1, 2, 4096, 16))
