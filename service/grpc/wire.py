"""A ``ModelInferRequest`` read off the wire without copying its tensors' bytes.

Python's protobuf (upb) copies a message's ``bytes`` fields into the parsed message, and copies them again each
time one is read: a 30 MB ``raw_input_contents`` cost 30 MB in the message for as long as the call ran, plus
the 30 MB the codec read from it, beside the 30 MB message itself while it was parsed. protobuf has no
zero-copy ``bytes`` field in Python, so :func:`parse_infer` takes the top level apart itself (the wire format:
https://protobuf.dev/programming-guides/encoding/): each ``raw_input_contents`` entry (field 7, length-delimited)
becomes a view of the received bytes, and protobuf parses the rest (names, shapes, parameters: a few hundred
bytes). A message whose top level is not well formed is parsed whole by protobuf, which says what is wrong.

Messages under :data:`VIEW_MIN_BYTES` are parsed whole: their copies cost less than walking their fields. So are
messages with more than :data:`MAX_TOP_FIELDS` fields at the top level (a request has a few dozen: its names,
parameters, inputs, outputs and contents): the walk is Python, on the event loop, and a 32 MiB message of
three-byte parameters would hold it for seconds.
"""

from __future__ import annotations

from service.grpc.generated import inference_pb2 as pb

RAW_INPUT_CONTENTS = 7
"""``ModelInferRequest.raw_input_contents``' field number (``protos/inference.proto``)."""
VIEW_MIN_BYTES = 64 << 10
"""Messages from this size on have their raw contents read as views (smaller ones are parsed whole)."""
MAX_TOP_FIELDS = 1024
"""The walk gives up (protobuf parses the message whole) past this many top-level fields."""

_CONTENTS_KEY = (RAW_INPUT_CONTENTS << 3) | 2  # field 7, wire type 2 (length-delimited)
_FIXED = {1: 8, 5: 4}  # wire type: its payload's size (I64, I32)


class InferMessage:
    """A ``ModelInferRequest``: ``request`` with every field, or (a large message) every field but
    ``raw_input_contents``, whose entries are then ``contents``, views of the message's bytes.
    """

    __slots__ = ("contents", "request")

    def __init__(self, request: pb.ModelInferRequest, contents: list[memoryview] | None = None) -> None:
        self.request = request
        self.contents = contents

    @property
    def model_name(self) -> str:
        return self.request.model_name

    def take_contents(self) -> list[bytes] | list[memoryview]:
        """The raw input contents, one entry per input (none: typed contents), handed over: the message no longer
        holds them, so the received bytes are freed once no decoded array views them.
        """
        if self.contents is None:
            return list(self.request.raw_input_contents)
        contents, self.contents = self.contents, []
        return contents


def parse_infer(raw: bytes) -> InferMessage:
    """``raw`` as a ``ModelInferRequest`` (module docstring); protobuf's ``DecodeError`` when it is not one."""
    if len(raw) >= VIEW_MIN_BYTES:
        split = split_contents(raw)
        if split is not None:
            rest, contents = split
            return InferMessage(pb.ModelInferRequest.FromString(rest), contents)
    return InferMessage(pb.ModelInferRequest.FromString(raw))


def split_contents(raw: bytes) -> tuple[bytes, list[memoryview]] | None:
    """The message's bytes without its top-level field 7 entries, and those entries' payloads as views of
    ``raw``, in order; None where the top level is not a sequence of well-formed fields, or has more than
    :data:`MAX_TOP_FIELDS`.
    """
    view = memoryview(raw)
    end = len(raw)
    contents: list[memoryview] = []
    rest: list[memoryview] = []
    kept_from = pos = fields = 0
    while pos < end:
        fields += 1
        if fields > MAX_TOP_FIELDS:
            return None
        field_at = pos
        key, pos = _varint(raw, pos)
        wire_type = key & 7
        if wire_type == 2:
            length, pos = _varint(raw, pos)
            if key == _CONTENTS_KEY and pos + length <= end:
                rest.append(view[kept_from:field_at])
                contents.append(view[pos : pos + length])
                kept_from = pos + length
            pos += length
        elif wire_type == 0:
            _, pos = _varint(raw, pos)
        elif wire_type in _FIXED:
            pos += _FIXED[wire_type]
        else:
            return None  # groups or no wire type at all: protobuf's parser decides
        if pos > end or key >> 3 == 0:
            return None
    if not contents:
        return raw, contents
    rest.append(view[kept_from:])
    return b"".join(rest), contents


def _varint(raw: bytes, pos: int) -> tuple[int, int]:
    """The base-128 varint at ``pos`` and the position after it (past the end where it is cut short)."""
    value = shift = 0
    while pos < len(raw):
        byte = raw[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift >= 64:
            break
    return 0, len(raw) + 1
