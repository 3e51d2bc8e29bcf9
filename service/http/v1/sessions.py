"""``POST /v1/sessions/{sequence_id}/steps`` and ``DELETE /v1/sessions/{sequence_id}``: attention sessions for curl
users, the same sequences as the model ``attention_session`` (a path id of digits is the integer id that
tritonclient's ``sequence_id=7`` names; any other is a string id).
"""

from __future__ import annotations

from typing import Any

import anyio.to_thread
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from service.dataplane.context import Context
from service.dataplane.errors import invalid, not_found
from service.dataplane.options import SessionOptions
from service.dataplane.plane import DataPlane
from service.dataplane.scheduling import Job
from service.dataplane.sessions.step import (
    TIMING_ORDER,
    SessionStep,
    StepOutcome,
    prepare_step,
    sends_tensors,
    store_of,
)
from service.dataplane.sessions.store import MAX_STRING_ID, UINT64_MAX, SequenceId
from service.dataplane.timing import Timing
from service.http.callers import request_caller
from service.http.codecs.tensors import encode_tensor
from service.http.responses import json_bytes
from service.http.routing import operation_id
from service.http.v1.common import Route, answer, json_route, optional_tensor, parsed
from service.http.v1.session_schemas import SessionEndResponse, SessionStepRequest, SessionStepResponse

STEP_TENSORS = ("query", "key", "value", "mask")


def path_id(text: str) -> SequenceId:
    """The sequence a path names: digits (no leading zero, within uint64) are an integer id, else a string id."""
    if text.isascii() and text.isdigit() and (text == "0" or not text.startswith("0")) and int(text) <= UINT64_MAX:
        value = int(text)
        if value == 0:
            raise invalid("sequence id 0 means no sequence in the protocol; name a sequence", "sequence_id")
        return value
    if len(text) > MAX_STRING_ID:
        raise invalid(f"a sequence id is at most {MAX_STRING_ID} characters", "sequence_id")
    return text


def step_route(caller: str, sequence_id: SequenceId) -> Route[tuple[SessionStepRequest, SessionStep], StepOutcome]:
    """The step of ``caller``'s sequence ``sequence_id`` as a /v1 route of the door."""

    def decode(ctx: Context, raw: bytes) -> tuple[SessionStepRequest, SessionStep]:
        req = parsed(SessionStepRequest, raw, STEP_TENSORS)
        limits = ctx.limits
        tensors = {
            name: optional_tensor(getattr(req, name), name, limits, "mask" if name == "mask" else "float")
            for name in STEP_TENSORS
        }
        given = sends_tensors([name for name, arr in tensors.items() if arr is not None])
        returned = req.return_
        options = SessionOptions(
            scale=req.scale,
            temperature=req.temperature,
            normalizer=req.normalizer,
            alpha=req.alpha,
            engine=req.engine,
            window=req.window,
            sinks=req.sinks,
            sink_positions=req.sink_positions,
        )
        step = SessionStep(
            caller=caller,
            sequence_id=sequence_id,
            start=req.start,
            end=req.end,
            query=tensors["query"],
            key=tensors["key"],
            value=tensors["value"],
            mask=tensors["mask"],
            options=options,
            precision=req.precision,
            weights=None if returned is None else "weights" in returned,
            diagnostics=given and (returned is None or "diagnostics" in returned),
            encoding=req.encoding,
        )
        return req, step

    def run(ctx: Context, decoded: tuple[SessionStepRequest, SessionStep], timing: Timing) -> Job[StepOutcome]:
        return prepare_step(ctx, decoded[1], timing)

    def encode(decoded: tuple[SessionStepRequest, SessionStep], out: StepOutcome) -> bytes:
        req = decoded[0]
        body: dict[str, Any] = {}
        if out.output is not None and (req.return_ is None or "output" in req.return_):
            body["output"] = encode_tensor(out.output, req.encoding)
        if out.weights is not None:
            body["weights"] = encode_tensor(out.weights, req.encoding)
        out.timing.phase("encode")
        if out.diagnostics is not None:
            body["diagnostics"] = out.diagnostics
        body.update(
            cache_length=out.cache_length,
            positions_seen=out.positions_seen,
            restarted=out.restarted,
            ended=req.end,
        )
        if out.engine is not None:
            body["engine"] = {"name": out.engine.name, "provider": out.engine.provider, "reason": out.engine.reason}
        body["timing_ms"] = out.timing.ms(TIMING_ORDER)
        return json_bytes(body)

    return Route("/v1/sessions/{sequence_id}/steps", decode, run, encode)


def routes(plane: DataPlane) -> list[APIRoute]:
    """The session routes of /v1, bound to ``plane``."""

    async def post_step(request: Request, sequence_id: str) -> Response:
        """One step of an attention session: its key and value positions appended to the sequence's server-side
        cache, its query rows answered over every kept position (aligned bottom_right: the numbers of
        /v1/attention over those positions with `causal: "bottom_right"`).

        `start` begins the sequence (fixing its precision, batch, key heads, head and value sizes, and its window);
        `end` frees its cache after the step (a step with `end` and no tensors just frees it).
        """
        return await answer(plane, request, step_route(request_caller(plane, request), path_id(sequence_id)))

    async def delete_session(request: Request, sequence_id: str) -> Response:
        """End a session now: its cache is freed (waiting for a step in flight to finish first)."""
        store = store_of(plane.context)
        caller, sid = request_caller(plane, request), path_id(sequence_id)

        def end() -> int:
            if store.peek(caller, sid) is None:
                raise not_found(str(store.refusal(caller, sid)))
            return store.end_sequence(caller, sid)

        seen = await anyio.to_thread.run_sync(end)
        return Response(json_bytes({"sequence_id": sid, "positions_seen": seen}), media_type="application/json")

    step = json_route(
        "/v1/sessions/{sequence_id}/steps",
        post_step,
        tag="sessions",
        request=SessionStepRequest,
        response=SessionStepResponse,
        summary="One step of an attention session (a server-side key/value cache)",
    )
    delete = APIRoute(
        "/v1/sessions/{sequence_id}",
        delete_session,
        methods=["DELETE"],
        tags=["sessions"],
        generate_unique_id_function=operation_id,  # "delete_session", not FastAPI's path-derived id
        response_model=SessionEndResponse,
        responses={
            422: {
                "description": "Not a sequence id (0, or longer than 256 characters)",
                "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}},
            },
            404: {
                "description": "No such live session (never started, ended or evicted: the detail says which)",
                "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}},
            },
        },
        summary="End an attention session",
    )
    return [step, delete]
