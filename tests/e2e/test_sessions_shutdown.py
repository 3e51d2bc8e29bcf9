"""What a sequence sees when its server stops (docs/guides/sessions.md, "Several workers and replicas"): a step in
flight at SIGTERM is answered (the shutdown grace), the caches are not saved, and the next server refuses the next
step as never started, so the client starts the sequence again.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import httpx

from tests.e2e.conftest import free_port, started
from tests.hardening.conftest import wait_admitted

STEP = {
    "inputs": [{"name": n, "shape": [1, 2], "datatype": "FP32", "data": [1.0, 0.0]} for n in ("query", "key", "value")]
}
ENV = {"ATTN_ENABLE_ONNX": "false", "ATTN_GRPC_ENABLED": "false", "ATTN_LOG_LEVEL": "warning"}


def step(url: str, **parameters: Any) -> httpx.Response:
    body = {**STEP, "parameters": {"sequence_id": "survivor", "diagnostics": False, **parameters}}
    return httpx.post(f"{url}/v2/models/attention_session/infer", json=body, timeout=30)


def test_sigterm_answers_the_step_in_flight_and_the_next_server_starts_afresh() -> None:
    port = free_port()
    args = ["-m", "service", "serve", "--port", str(port)]
    # every admitted request holds a compute slot for 1.5 s: a step is surely in flight when SIGTERM comes
    with started(args, port, {**ENV, "ATTN_DEBUG_DELAY_S": "1.5"}) as server:
        assert step(server.url, sequence_start=True).status_code == 200
        answers: list[httpx.Response] = []
        in_flight = threading.Thread(target=lambda: answers.append(step(server.url)))
        in_flight.start()
        wait_admitted(server.url)
        os.kill(server.pid, signal.SIGTERM)
        in_flight.join(30)
        assert answers and answers[0].status_code == 200, answers
        assert answers[0].json()["outputs"][2]["data"] == [2]  # cache_length: the step was appended and answered
    with started(args, port, ENV) as server:
        refused = step(server.url)
        assert refused.status_code == 400 and "never started" in refused.json()["error"]
        assert step(server.url, sequence_start=True).status_code == 200
