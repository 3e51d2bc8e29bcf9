"""What the service's own layers cost over the bare maths for a tiny request, per form, in process (issue 29 item 8).

No sockets and no server: each form's request is handed to the service as its front end receives it, and the
time beyond the bare maths is what the service adds (target: at most 50 us each):

- **bare maths**: :func:`bench.http_bare_app.tiny_answer` on the /v2 JSON body: orjson's parse, ``service.core``'s
  attention and diagnostics, orjson's answer, with none of the service's checks, budgets, dispatch or metrics;
- **bare maths behind FastAPI**: the same function on :mod:`bench.http_bare_app`'s ``/bare/attention`` route,
  called through ASGI as the REST forms are: the framework's own floor (its middleware stack, routing, the body
  read and the response), which the REST forms pay whatever the service does. Its own column gives each REST
  form's layers over it;
- **/v1 JSON**, **/v2 JSON**, **/v2 binary**: the service's ASGI app called as uvicorn calls it
  (:mod:`bench.asgi`): the edge (request id, key, limits, deadline, metrics), routing, the data plane's door
  (admission, the body read on its lease, scheduling, statistics), the codec, the model's checks, budgets,
  dispatch, the engine and the diagnostics, the encoded answer;
- **gRPC**: ``ModelInfer``'s servicer method with a decoded message (what grpcio hands it after its own C core):
  the door, the gRPC codec, the same model. gRPC's transport and ``Calls``' cap, key and metrics around it are
  not included (they need a live call).

All four ask for ``output`` and ``weights`` with diagnostics on, the bare maths' own work. Each cell is the median
of ``--rounds`` interleaved rounds of ``--calls`` calls.

A second table takes the gRPC form apart (it has no framework in front of it, so its layers are all the
service's): the maths alone, the codec's decode and encode, the model's preparation (options, checks, estimates)
and run (fresh jobs, each run once), the codec and the model composed without the door, and the servicer; each
the fastest of ``--rounds`` runs of ``--part-calls`` calls (the least disturbed: these parts are a few
microseconds each). The door is the servicer less the composed path. Parts timed alone run hot in the caches, so
they add up to less than the whole.

    python -m bench layers [--rounds 7] [--calls 2000] [--part-calls 4000]
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import orjson

from bench.asgi import call
from bench.http_bare_app import app as bare_app
from bench.http_bare_app import tiny_answer
from bench.suite import Parser
from service.app import create_app
from service.core.attention import run_attention
from service.core.diagnostics import attention_diagnostics
from service.core.types import AttentionInputs, AttentionParams, AttentionTask
from service.dataplane.memory import MemoryLease
from service.dataplane.plane import DataPlane
from service.dataplane.timing import Timing
from service.grpc.codecs import GRPC_CODEC, named_model
from service.grpc.generated import inference_pb2 as pb
from service.grpc.wire import InferMessage
from service.settings import Settings

TARGET_US = 50.0
"""Issue 29 item 8: each form's layers cost at most this over the bare maths."""

FRAMEWORK = "bare maths behind FastAPI"
"""The row of the bare maths on a plain route of a FastAPI app, driven as the REST forms are."""


def tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {name: rng.standard_normal((1, 1, 4, 4), dtype=np.float32) for name in ("query", "key", "value")}


def v2_json(arrays: dict[str, np.ndarray]) -> bytes:
    inputs = [
        {"name": n, "shape": list(a.shape), "datatype": "FP32", "data": a.ravel().tolist()} for n, a in arrays.items()
    ]
    return orjson.dumps({"inputs": inputs, "outputs": [{"name": "output"}, {"name": "weights"}]})


def v2_binary(arrays: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
    header = orjson.dumps(
        {
            "inputs": [
                {"name": n, "shape": list(a.shape), "datatype": "FP32", "parameters": {"binary_data_size": a.nbytes}}
                for n, a in arrays.items()
            ],
            "outputs": [{"name": "output"}, {"name": "weights"}],
        }
    )
    body = header + b"".join(a.tobytes() for a in arrays.values())
    return body, {"inference-header-content-length": str(len(header)), "content-type": "application/octet-stream"}


def v1_json(arrays: dict[str, np.ndarray]) -> bytes:
    return orjson.dumps({**{n: a.tolist() for n, a in arrays.items()}, "return": ["output", "weights", "diagnostics"]})


def grpc_message(arrays: dict[str, np.ndarray]) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="attention")
    for name, a in arrays.items():
        request.inputs.add(name=name, datatype="FP32", shape=list(a.shape))
        request.raw_input_contents.append(a.tobytes())
    for name in ("output", "weights"):
        request.outputs.add(name=name)
    return request


class Decoded:
    """``ModelInfer``'s :class:`~service.grpc.guard.Message` once read: the message as the server parses it (a tiny
    one whole, :func:`~service.grpc.wire.parse_infer`), its size.
    """

    def __init__(self, message: pb.ModelInferRequest) -> None:
        self.message = message
        self.nbytes = message.ByteSize()

    async def read(self, lease: Any = None) -> InferMessage:
        return InferMessage(self.message)


class NoDeadline:
    """A servicer context of a call without a deadline (all ``ModelInfer`` reads of it)."""

    def time_remaining(self) -> None:
        return None


async def timed(fn: Callable[[], Awaitable[object]], calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        await fn()
    return (time.perf_counter() - t0) / calls * 1e6


def arguments() -> Parser:
    parser = Parser(__name__, __doc__, quick={"rounds": 1, "calls": 20, "part_calls": 20})
    parser.add_rounds(7)
    parser.add_argument("--calls", type=int, default=2000, help="calls per round and form (default 2000)")
    parser.add_argument(
        "--part-calls", type=int, default=4000, help="calls per run of each part of the gRPC form (default 4000)"
    )
    return parser


def servicer_of(plane: DataPlane) -> Any:
    """``ModelInfer``'s servicer on ``plane``, its class as the gRPC server builds it, holding what it reads."""
    from service.grpc.service import InferenceService

    servicer = InferenceService.__new__(InferenceService)
    servicer.plane = plane
    return servicer


def fastest_sync(fn: Callable[[], object], calls: int, rounds: int) -> float:
    """Microseconds per call of ``fn``, the fastest of ``rounds`` runs of ``calls`` calls (after a warm-up)."""
    for _ in range(max(10, calls // 10)):
        fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


async def grpc_parts(plane: DataPlane, message: pb.ModelInferRequest, rounds: int, calls: int) -> dict[str, float]:
    """The gRPC form taken apart (module docstring): microseconds per call of each part."""
    ctx = plane.context
    model = named_model(InferMessage(message))
    request = GRPC_CODEC.decode(ctx, model, InferMessage(message), "")
    result = model.prepare(ctx, request, Timing()).run(MemoryLease(None, wait=False))
    arrays = request.inputs
    task = AttentionTask(
        AttentionInputs(arrays["query"], arrays["key"], arrays["value"]),
        AttentionParams("softmax"),
        need_weights=True,
        need_scores=True,
    )

    def maths() -> object:
        out = run_attention(task)
        assert out.weights is not None
        return attention_diagnostics(out.weights, out.valid_keys, scores=out.scores, output=out.output)

    def fresh_jobs() -> float:  # each job runs once, as in a request: prepared beforehand, outside the clock
        best = float("inf")
        for _ in range(rounds):
            jobs = [model.prepare(ctx, request, Timing()) for _ in range(calls)]
            t0 = time.perf_counter()
            for job in jobs:
                job.run(MemoryLease(None, wait=False))
            best = min(best, (time.perf_counter() - t0) / calls * 1e6)
        return best

    def composed() -> object:
        decoded = GRPC_CODEC.decode(ctx, model, InferMessage(message), "")
        outcome = model.prepare(ctx, decoded, Timing()).run(MemoryLease(None, wait=False))
        return GRPC_CODEC.encode(model, decoded, outcome)

    servicer = servicer_of(plane)

    async def infer() -> object:
        return await servicer.ModelInfer(Decoded(message), NoDeadline())  # type: ignore[arg-type]

    await timed(infer, max(10, calls // 10))  # warm-up
    best = min([await timed(infer, calls) for _ in range(rounds)])
    parts = {
        "the maths alone (run_attention and attention_diagnostics)": fastest_sync(maths, calls, rounds),
        "the codec's decode": fastest_sync(
            lambda: GRPC_CODEC.decode(ctx, model, InferMessage(message), ""), calls, rounds
        ),
        "the model's preparation (options, checks, estimates)": fastest_sync(
            lambda: model.prepare(ctx, request, Timing()), calls, rounds
        ),
        "the model's run (dispatch, engine, diagnostics, response parameters)": fresh_jobs(),
        "the codec's encode": fastest_sync(lambda: GRPC_CODEC.encode(model, request, result), calls, rounds),
        "the codec and the model composed, without the door": fastest_sync(composed, calls, rounds),
        "the servicer": best,
    }
    parts["the door (the servicer less the composed path)"] = (
        parts["the servicer"] - parts["the codec and the model composed, without the door"]
    )
    return parts


async def measure(rounds: int, calls: int, part_calls: int) -> tuple[dict[str, list[float]], dict[str, float]]:
    app = create_app(Settings(enable_onnx=False, log_level="warning"))
    plane: DataPlane = app.state.plane
    arrays = tensors()
    v2 = v2_json(arrays)
    binary, binary_headers = v2_binary(arrays)
    v1 = v1_json(arrays)
    message = grpc_message(arrays)
    servicer = servicer_of(plane)

    async def bare() -> object:
        return tiny_answer(v2)

    async def rest(path: str, body: bytes, headers: dict[str, str] | None = None) -> object:
        status, _, content = await call(app, "POST", path, body, headers)
        if status != 200:
            raise SystemExit(f"POST {path}: {status} {content[:300]!r}")
        return content

    async def grpc() -> object:
        return await servicer.ModelInfer(Decoded(message), NoDeadline())  # type: ignore[arg-type]

    async def bare_framework() -> object:
        status, _, content = await call(bare_app, "POST", "/bare/attention", v2)
        if status != 200:
            raise SystemExit(f"POST /bare/attention: {status} {content[:300]!r}")
        return content

    forms: dict[str, Callable[[], Awaitable[object]]] = {
        "bare maths": bare,
        FRAMEWORK: bare_framework,
        "/v1 JSON": lambda: rest("/v1/attention", v1),
        "/v2 JSON": lambda: rest("/v2/models/attention/infer", v2),
        "/v2 binary": lambda: rest("/v2/models/attention/infer", binary, binary_headers),
        "gRPC (servicer)": grpc,
    }
    results: dict[str, list[float]] = {name: [] for name in forms}
    async with app.router.lifespan_context(app):
        while plane.runtime.not_ready_reason() is not None:
            await asyncio.sleep(0.05)
        for fn in forms.values():  # warm every path
            await timed(fn, max(10, calls // 10))
        for _ in range(rounds):
            for name, fn in forms.items():
                results[name].append(await timed(fn, calls))
        parts = await grpc_parts(plane, message, rounds, part_calls)
        parts["the bare maths"] = fastest_sync(lambda: tiny_answer(v2), part_calls, rounds)
    return results, parts


def main(argv: list[str]) -> int:
    args = arguments().parse(argv)
    results, parts = asyncio.run(measure(args.rounds, args.calls, args.part_calls))
    base = statistics.median(results["bare maths"])
    framework = statistics.median(results[FRAMEWORK])
    print(
        f"tiny (1, 1, 4, 4) float32, output + weights + diagnostics, in process; median of {args.rounds} interleaved "
        f"rounds of {args.calls} calls\n"
    )
    print(f"| form | us per request | layers over the bare maths (us) | target | over the {FRAMEWORK} (us) |")
    print("|---|---:|---:|---|---:|")
    for name, values in results.items():
        median = statistics.median(values)
        if name == "bare maths":
            print(f"| {name} | {median:.1f} | - | | |")
            continue
        over = median - base
        verdict = f"<= {TARGET_US:g}: {'met' if over <= TARGET_US else 'missed'}" if name != FRAMEWORK else ""
        rest = f"{median - framework:.1f}" if name.startswith("/v") else ""
        print(f"| {name} | {median:.1f} | {over:.1f} | {verdict} | {rest} |")
    print(
        f"\nthe gRPC form taken apart, each part the fastest of {args.rounds} runs of {args.part_calls} calls "
        "(parts timed alone run hot in the caches: they add up to less than the whole)\n"
    )
    print("| part | us per call |")
    print("|---|---:|")
    print(f"| the bare maths (tiny_answer) | {parts.pop('the bare maths'):.1f} |")
    for name, us in parts.items():
        print(f"| {name} | {us:.1f} |")
    return 0
