"""Send /v1, /v2 and gRPC requests to a running container and compare its answers with the in-process engine.

    python deploy/podman/compare_with_engine.py URL        # API key, if any, in SMOKE_API_KEY;
                                                           # gRPC's host:port in SMOKE_GRPC_TARGET

The same requests go through the app built in this process (numpy engine,
``create_app`` with the ONNX engine off) and the container's answers must
match within float32 tolerance, for ``engine=numpy`` and ``engine=onnx`` on
``/v1/attention``, for ``/v2/models/attention/infer`` and for the same
inference over gRPC (``inference.GRPCInferenceService/ModelInfer``, this
repository's stubs). Exits 1 with the first difference (or an answer that is not
200), 2 when the comparison could not run (the in-process app failed to start).
The in-process app serves no gRPC: it listens on no port, so a server on this
machine (``make serve`` holds 8001) cannot stop the comparison.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings

RTOL, ATOL = 1e-4, 1e-5  # float32, two engines and two processes


def requests() -> list[tuple[str, str, dict[str, Any]]]:
    """(label, path, JSON body)."""
    rng = np.random.default_rng(12)
    q, k, v = (rng.standard_normal(shape).round(3) for shape in ((2, 3, 4), (2, 5, 4), (2, 5, 3)))
    v1 = {"query": q.tolist(), "key": k.tolist(), "value": v.tolist(), "causal": "bottom_right"}
    v1 |= {"return": ["output", "weights"]}
    v2 = {
        "id": "smoke",
        "inputs": [
            {"name": name, "shape": list(a.shape), "datatype": "FP32", "data": a.ravel().tolist()}
            for name, a in (("query", q), ("key", k), ("value", v))
        ],
        "parameters": {"causal": "bottom_right", "normalizer": "sparsemax", "diagnostics": False},
    }
    return [
        ("/v1 numpy", "/v1/attention", v1 | {"engine": "numpy"}),
        ("/v1 onnx", "/v1/attention", v1 | {"engine": "onnx"}),
        ("/v2 attention", "/v2/models/attention/infer", v2),
    ]


def outputs(body: dict[str, Any]) -> dict[str, np.ndarray]:
    """The named output tensors of a /v1 or /v2 answer."""
    if "outputs" in body:  # /v2
        return {o["name"]: np.asarray(o["data"], dtype=np.float64).reshape(o["shape"]) for o in body["outputs"]}
    return {name: np.asarray(body[name], dtype=np.float64) for name in ("output", "weights") if name in body}


def post(url: str, path: str, body: dict[str, Any], key: str) -> tuple[int, dict[str, Any]]:
    headers = {"content-type": "application/json"} | ({"authorization": f"Bearer {key}"} if key else {})
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {"error": exc.read().decode(errors="replace")[:500]}


def grpc_outputs(target: str, body: dict[str, Any], key: str) -> dict[str, np.ndarray]:
    """The /v2 request ``body`` sent over gRPC (typed contents), its outputs as arrays."""
    import grpc

    from service.grpc.generated import inference_pb2 as pb
    from service.grpc.generated import inference_pb2_grpc as pb_grpc

    request = pb.ModelInferRequest(model_name="attention", id=body["id"])
    for tensor in body["inputs"]:
        sent = request.inputs.add(name=tensor["name"], datatype=tensor["datatype"], shape=tensor["shape"])
        sent.contents.fp32_contents.extend(tensor["data"])
    for name, value in body["parameters"].items():
        param = request.parameters[name]
        if isinstance(value, bool):
            param.bool_param = value
        else:
            param.string_param = value
    metadata = (("authorization", f"Bearer {key}"),) if key else ()
    with grpc.insecure_channel(target) as channel:
        response = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, metadata=metadata, timeout=30)
    return {o.name: np.asarray(o.contents.fp32_contents, dtype=np.float64).reshape(o.shape) for o in response.outputs}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    url, key = argv[0].rstrip("/"), os.environ.get("SMOKE_API_KEY", "")
    with contextlib.ExitStack() as stack:
        try:  # the settings (ATTN_* from the environment) and the app's start-up
            app = create_app(Settings(enable_onnx=False, api_keys=None, grpc_enabled=False))
            local = stack.enter_context(TestClient(app))
        except Exception as exc:
            print(f"ERROR: the comparison did not run: the in-process app failed to start: {exc}", file=sys.stderr)
            return 2
        return compare(url, key, local)


def compare(url: str, key: str, local: TestClient) -> int:
    """0 when every answer of the service at ``url`` equals the in-process app's, else 1 with the first difference."""
    for label, path, body in requests():
        status, remote = post(url, path, body, key)
        if status != 200:
            print(f"FAIL {label}: the container answered {status}: {remote}", file=sys.stderr)
            return 1
        local_body = dict(body)
        if path.startswith("/v1"):
            local_body["engine"] = "numpy"
        expected = local.post(path, json=local_body)
        assert expected.status_code == 200, expected.text
        want, got = outputs(expected.json()), outputs(remote)
        if set(want) != set(got) or not want:
            print(f"FAIL {label}: outputs {sorted(got)}, expected {sorted(want)}", file=sys.stderr)
            return 1
        for name in want:
            if want[name].shape != got[name].shape or not np.allclose(got[name], want[name], RTOL, ATOL):
                diff = np.max(np.abs(got[name] - want[name])) if want[name].shape == got[name].shape else "shape"
                print(f"FAIL {label}: {name} differs from the in-process engine ({diff})", file=sys.stderr)
                return 1
        engine = remote.get("engine") or remote.get("parameters", {}).get("engine")
        engine = engine.get("name") if isinstance(engine, dict) else engine
        print(f"{label}: 200, {', '.join(sorted(want))} equal to the in-process numpy engine (ran on {engine})")
        target = os.environ.get("SMOKE_GRPC_TARGET")
        if target and path.startswith("/v2"):
            got = grpc_outputs(target, body, key)
            if set(got) != set(want) or not all(np.allclose(got[n], want[n], RTOL, ATOL) for n in want):
                print(f"FAIL {label} over gRPC: outputs differ from the in-process engine", file=sys.stderr)
                return 1
            print(f"{label} over gRPC ({target}): {', '.join(sorted(want))} equal to the in-process numpy engine")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
