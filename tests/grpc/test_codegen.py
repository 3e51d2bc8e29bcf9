"""The committed gRPC stubs are what the proto generates (service/grpc/codegen.py): they cannot drift apart."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.grpc import codegen

pytest.importorskip("grpc_tools", reason="grpcio-tools (the test extra) regenerates the stubs")


def test_regenerating_the_stubs_gives_the_committed_files(tmp_path: Path) -> None:
    written = codegen.generate(tmp_path)
    assert sorted(p.name for p in written) == sorted(codegen.FILES)
    for path in written:
        committed = codegen.GENERATED / path.name
        assert path.read_text() == committed.read_text(), f"{committed} is stale: run `python -m service.grpc.codegen`"


def test_the_service_is_the_protocols() -> None:
    """Method and field numbers as the protocol (and Triton's clients) have them."""
    from service.grpc.generated import inference_pb2 as pb

    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert service.full_name == "inference.GRPCInferenceService"
    assert [m.name for m in service.methods] == [
        "ServerLive",
        "ServerReady",
        "ModelReady",
        "ServerMetadata",
        "ModelMetadata",
        "ModelInfer",
        "ModelStreamInfer",
        "ModelStatistics",
    ]
    fields = {f.name: f.number for f in pb.ModelInferRequest.DESCRIPTOR.fields}
    assert fields == {
        "model_name": 1,
        "model_version": 2,
        "id": 3,
        "parameters": 4,
        "inputs": 5,
        "outputs": 6,
        "raw_input_contents": 7,
    }
    params = {f.name: f.number for f in pb.InferParameter.DESCRIPTOR.fields}
    assert params == {"bool_param": 1, "int64_param": 2, "string_param": 3, "double_param": 4, "uint64_param": 5}


def test_the_statistics_and_stream_messages_are_tritonclients() -> None:
    """ModelStatistics' and ModelStreamInfer's messages: every field as tritonclient's stubs have it (name, number,
    type), so its ``get_inference_statistics()`` and its stream read the answers; tritonclient's newer statistics
    fields (memory usage, response statistics) are left out.
    """
    from tritonclient.grpc import service_pb2 as triton

    from service.grpc.generated import inference_pb2 as pb

    def fields(message: object) -> dict[str, tuple[int, int, str]]:
        return {
            f.name: (f.number, f.type, f.message_type.name if f.message_type else "")
            for f in message.DESCRIPTOR.fields  # type: ignore[attr-defined]
        }

    for name in (
        "ModelStreamInferResponse",
        "ModelStatisticsRequest",
        "ModelStatisticsResponse",
        "ModelStatistics",
        "InferStatistics",
        "StatisticDuration",
        "InferBatchStatistics",
    ):
        ours, theirs = fields(getattr(pb, name)), fields(getattr(triton, name))
        assert ours == {k: theirs[k] for k in ours}, name
    assert set(fields(triton.ModelStatistics)) - set(fields(pb.ModelStatistics)) == {"memory_usage", "response_stats"}
    methods = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name
    method = methods["ModelStatistics"]
    assert (method.input_type.name, method.output_type.name) == ("ModelStatisticsRequest", "ModelStatisticsResponse")
    stream, theirs = methods["ModelStreamInfer"], triton.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    for method in (stream, theirs.methods_by_name["ModelStreamInfer"]):
        assert (method.client_streaming, method.server_streaming) == (True, True)
        assert (method.input_type.name, method.output_type.name) == ("ModelInferRequest", "ModelStreamInferResponse")
