"""``ModelStreamInfer``: Triton's stream of inference requests on one call, each answered on the stream in order.

The stream is one call through :class:`~service.grpc.calls.Calls`, as every call is: the inference class's cap
for as long as it is open, the stopping check and the API key before any message is read, the request id, the
status, the metrics and the access log line. Each of its messages is one request through the data plane's door,
as a ``ModelInfer`` message is (:mod:`service.dataplane.door`: admission, the message held on the bodies' share
of the memory budget while it runs, the model's readiness, the statistics, scheduling,
:data:`~service.grpc.codecs.GRPC_CODEC`), with what is left of the call's deadline as its own.

- **Reading**: a stream cannot answer a message before it knows one came, so it reads its next message first,
  as ``ModelInfer`` reads its one (:meth:`~service.grpc.guard.Message.read`): the largest message reserved on the
  bodies' share while it arrives, then its size; among the messages read at once; within ``ATTN_BODY_TIMEOUT_S``
  of its turn (the call's headers, then each answer). The door's lease then takes the message over. Waiting for
  its next message, a stream holds no admission place, but it holds one of the places for messages being read and
  the largest message's reservation (grpc.aio reads a message whole or not at all: it cannot wait for one to
  begin without being ready to take all of it), for at most ``ATTN_BODY_TIMEOUT_S``.
- **Answers**: ``ModelStreamInferResponse(infer_response=...)``; for a refused request, Triton's per-message form:
  ``error_message``, the words a ``ModelInfer`` status would carry, and ``infer_response`` with the request's
  ``id`` only. The stream goes on.
- **The end**: the client half-closes (``OK``). Else a status ends it, the messages not yet answered with it:
  its next message late (``DEADLINE_EXCEEDED``), no room on the bodies' share for it (``UNAVAILABLE``), the server
  stopping (``UNAVAILABLE``, retry-after; a message in work is answered first, a stream waiting for its next one
  ends at once), the shutdown grace over, a message over the size limit (gRPC's ``RESOURCE_EXHAUSTED``), the
  client cancelling, the call's deadline.
- **What runs at the end**: each call has a :class:`Stream`; what :meth:`Stream.on_end` registers runs once
  when the stream ends, however it ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from grpc import aio

from service.dataplane.auth import ApiKeys
from service.dataplane.door import Call, Door
from service.dataplane.errors import (
    ANSWERABLE,
    OIP_REMEDY_WORDS,
    Kind,
    ServiceError,
    as_service_error,
    phrased,
    unavailable,
)
from service.dataplane.inference import InferRequest, InferResult
from service.dataplane.memory import BudgetShare, MemoryLease
from service.dataplane.models.base import SESSION_MODEL
from service.dataplane.runtime import Runtime
from service.dataplane.sessions.store import SessionStore
from service.grpc.calls import SERVICE, STATUS, STOPPING_MESSAGE, Calls, call_caller
from service.grpc.codecs import GRPC_CODEC, named_model, parameter_value
from service.grpc.generated import inference_pb2 as pb
from service.grpc.guard import EndOfMessages, Message, MessageTimeout
from service.grpc.wire import InferMessage

ROUTE = f"/{SERVICE}/ModelStreamInfer"

access_log = logging.getLogger("service.access")
logger = logging.getLogger("service.errors")


class Stream:
    """One ``ModelStreamInfer`` call: what runs once when it ends, however it ends (the client half-closes or
    cancels, a status ends it, the server stops).
    """

    __slots__ = ("answered", "ended", "ending", "sequences")

    def __init__(self) -> None:
        self.ending: list[Callable[[], None]] = []
        self.ended = False
        self.answered = 0
        """The messages answered so far."""
        self.sequences: set[int | str] = set()
        """The sequences whose steps it carried that end with it (``ATTN_SESSION_END_WITH_STREAM``)."""

    def on_end(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once when the stream ends (at once if it has ended). It runs on the event loop, in the
        call's task, and must not block; an exception it raises is logged.
        """
        self.ending.append(fn)
        if self.ended:
            self.end()

    def end(self) -> None:
        """Run what was registered, each once, in order (one that fails does not stop the others)."""
        self.ended = True
        ending, self.ending = self.ending, []
        for fn in ending:
            try:
                fn()
            except Exception:
                logger.exception("a callable registered to run at the end of a stream failed")


class StreamInfer:
    """``ModelStreamInfer`` on one data plane (module docstring); :meth:`serve` is the method's work."""

    def __init__(
        self,
        door: Door,
        body_share: BudgetShare,
        runtime: Runtime,
        calls: Calls,
        *,
        keys: ApiKeys | None = None,
        sessions: SessionStore | None = None,
    ) -> None:
        self.keys = keys
        self.sessions = sessions
        """The plane's sessions where a stream's end ends the sequences it stepped (``ATTN_SESSION_END_WITH_STREAM``),
        else None."""
        self.door = door
        self.body_share = body_share
        self.runtime = runtime
        self.metrics = calls.metrics
        self.retry_after_s = calls.retry_after_s
        self.waiting: set[asyncio.Task[Any]] = set()
        """The tasks of the streams waiting for their next message: ended when the server begins to stop."""
        self.stopped: set[asyncio.Task[Any]] = set()
        """Those ended so."""
        loop = asyncio.get_running_loop()

        def changed() -> None:  # from any thread: the streams are woken on the loop
            loop.call_soon_threadsafe(self.wake)

        runtime.on_change(changed)

    def wake(self) -> None:
        """The server begins to stop: the streams waiting for a message end (``UNAVAILABLE``, retry-after)."""
        if not self.runtime.stopping:
            return
        for task in self.waiting - self.stopped:
            if not task.cancelling():  # not already ended (its message late, the client gone)
                self.stopped.add(task)
                task.cancel()

    def stopping(self) -> ServiceError:
        self.metrics.refused("stopping")
        return unavailable(STOPPING_MESSAGE, self.retry_after_s)

    async def serve(self, message: Message[Any], context: aio.ServicerContext) -> None:
        """Read, answer and write each message of the stream, in order, until the client half-closes."""
        stream = Stream()
        caller = call_caller(self.keys, context)
        try:
            while True:
                if self.runtime.stopping:
                    raise self.stopping()
                lease = self.body_share.lease()
                try:
                    try:
                        request = await self.receive(message, lease)
                    except EndOfMessages:
                        return  # the client half-closed: the stream ends, OK
                    t0 = time.perf_counter()
                    answer, status = await self.answer(stream, request, message.nbytes, lease, context, caller)
                finally:
                    if lease.held:  # not taken over by the door (refused before): freed here
                        self.door.trimmer.release_after(lease.held)
                    lease.release()
                await context.write(answer)
                stream.answered += 1
                self.log(status, stream.answered, time.perf_counter() - t0)
        finally:
            stream.end()

    async def receive(self, message: Message[Any], lease: MemoryLease) -> InferMessage | ServiceError:
        """The next message, read on ``lease``, or the refusal of one that is not a ``ModelInferRequest``.
        ``EndOfMessages`` once the client has half-closed; the refusals that end the stream (late, no room on the
        bodies' share, the server stopping) raised.
        """
        task = asyncio.current_task()
        assert task is not None  # a handler runs in a task of its own
        self.waiting.add(task)
        try:
            request: InferMessage = await message.read(lease)
            return request
        except asyncio.CancelledError:
            if task not in self.stopped:
                raise  # the client went away, the deadline passed, or the shutdown grace ended
            task.uncancel()
            raise self.stopping() from None
        except MessageTimeout:
            raise MessageTimeout(
                Kind.TIMEOUT,
                f"the stream's next request message did not arrive within {message.reading.timeout_s:g} s "
                "(ATTN_BODY_TIMEOUT_S) of the call's headers or of the previous answer; send a stream's messages "
                "without a longer pause, and close a stream you no longer use",
            ) from None
        except EndOfMessages:
            raise
        except ServiceError as exc:
            if exc.kind is not Kind.INVALID:
                if exc.kind is Kind.UNAVAILABLE:
                    self.metrics.refused("body_memory")
                raise
            return exc  # not the method's message: refused, and the stream goes on
        finally:
            self.waiting.discard(task)
            self.stopped.discard(task)

    async def answer(
        self,
        stream: Stream,
        request: InferMessage | ServiceError,
        nbytes: int,
        held: MemoryLease,
        context: aio.ServicerContext,
        caller: str = "",
    ) -> tuple[pb.ModelStreamInferResponse, str]:
        """The answer to one message of ``stream``, through the door, and its status's name: the model's response,
        or the request's refusal in Triton's per-message form. ``held``: the message's bytes, handed to the door.
        """
        if isinstance(request, ServiceError):
            return refusal(request), STATUS[request.kind].name
        message = request

        async def read(lease: MemoryLease) -> InferMessage:
            held.release()  # the door's lease takes the message over
            lease.reserve(nbytes)
            return message

        call: Call[InferMessage, InferRequest, InferResult, pb.ModelInferResponse] = Call(
            read=read,
            size=lambda _: nbytes,
            codec=GRPC_CODEC,
            named_by=named_model,
            deadline_s=context.time_remaining(),
            caller=caller,
        )
        try:
            response = await self.door.serve(call)
        except ANSWERABLE as exc:
            error = as_service_error(exc)
            assert error is not None
            return refusal(error, message.request.id), STATUS[error.kind].name
        self.follow(stream, message, caller)
        return pb.ModelStreamInferResponse(infer_response=response), "OK"

    def follow(self, stream: Stream, message: InferMessage, caller: str) -> None:
        """With ``ATTN_SESSION_END_WITH_STREAM``, the sequence a step on ``stream`` named ends with the stream (once
        the stream ends; a sequence with a step in flight elsewhere then is left to its end or idle time).
        """
        sessions, request = self.sessions, message.request
        if sessions is None or request.model_name != SESSION_MODEL or "sequence_id" not in request.parameters:
            return
        sequence_id = parameter_value(request.parameters["sequence_id"])
        if not isinstance(sequence_id, int | str) or isinstance(sequence_id, bool) or sequence_id in stream.sequences:
            return
        stream.sequences.add(sequence_id)

        def end() -> None:
            sessions.end_idle(caller, sequence_id, "stream_closed")

        stream.on_end(end)

    def log(self, status: str, number: int, seconds: float) -> None:
        """An access line for each message answered (the stream's own comes when it ends, as a call's)."""
        if access_log.isEnabledFor(logging.INFO):
            access_log.info(
                "stream message",
                extra={
                    "protocol": "grpc",
                    "method": "POST",
                    "path": ROUTE,
                    "status": status,
                    "stream_message": number,
                    "duration_ms": round(seconds * 1e3, 3),
                },
            )


def refusal(error: ServiceError, request_id: str = "") -> pb.ModelStreamInferResponse:
    """Triton's per-message error: the words a ``ModelInfer`` status would carry, and the request's id."""
    return pb.ModelStreamInferResponse(
        error_message=phrased(error, OIP_REMEDY_WORDS), infer_response=pb.ModelInferResponse(id=request_id)
    )
