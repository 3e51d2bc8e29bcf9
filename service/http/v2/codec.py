"""The /v2 REST wire form of an inference, as the data plane's door takes it (:class:`~service.dataplane.door.Codec`):
the body (JSON, or JSON followed by binary tensor data) decoded into an
:class:`~service.dataplane.inference.InferRequest`, the model's answer encoded as the request asked.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.dataplane.context import Context
from service.dataplane.inference import InferRequest, InferResult
from service.dataplane.models import MODEL_VERSION, Model
from service.http.v2.tensors import encode_response, parse_request, split_body

Encoded = tuple[bytes, dict[str, str], str]
"""An inference response: body, headers, media type."""


@dataclass(frozen=True, slots=True)
class Body:
    """An inference request's bytes, and the length of their JSON part (``Inference-Header-Content-Length``)."""

    data: bytes
    header_length: str | None = None


def model_of(operation: object) -> Model:
    """The door hands a codec the operation it serves: for /v2, always a model of the protocol."""
    assert isinstance(operation, Model), operation
    return operation


class RestCodec:
    """JSON ``data`` or the binary tensor data extension, in and out (:mod:`service.http.v2.tensors`)."""

    def decode(self, ctx: Context, operation: object, raw: Body, caller: str) -> InferRequest:
        model = model_of(operation)
        obj, binary = split_body(raw.data, raw.header_length)
        request = parse_request(
            obj,
            binary,
            model=model.name,
            inputs=model.inputs,
            outputs=model.output_names,
            limits=model.input_limits(ctx),
        )
        request.caller = caller
        return request

    def encode(self, operation: object, request: InferRequest, result: InferResult) -> Encoded:
        """Each output as the request asked (JSON data or binary)."""
        outputs = [(name, arr, request.outputs.get(name, request.binary_default)) for name, arr in result.outputs]
        return encode_response(
            model=model_of(operation).name,
            version=MODEL_VERSION,
            request_id=request.id,
            parameters=result.parameters,
            outputs=outputs,
        )


REST_CODEC = RestCodec()
