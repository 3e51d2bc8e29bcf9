"""What a live server says and writes for bad input (issue 21, items 5, 6, 10 and 12): /v2 names its own remedy for
float32 overflow (the FP64 datatype, not /v1's ``precision``), deep JSON nesting is refused as a rank, a number of
400 digits names its field, key lengths follow the one documented rule (0 to S), the route-label cache keeps no
memory for scanners' paths, and the text log escapes control characters in a path.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.hardening.conftest import LiveServer, status_kb

pytestmark = pytest.mark.slow  # starts live servers

V2 = "/v2/models/attention/infer"
BASE = {"query": [[1.0, 0.0]], "key": [[1.0, 0.0], [0.0, 1.0]], "value": [[1.0], [2.0]]}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = LiveServer({}, tmp_path_factory.mktemp("messages"))
    try:
        live.wait_ready()
        yield live
    finally:
        live.close()


def v2_inputs(datatype: str, q: Any, k: Any, v: Any, **params: Any) -> dict[str, Any]:
    return {
        "inputs": [
            {"name": name, "shape": [len(x), len(x[0])], "datatype": datatype, "data": x}
            for name, x in (("query", q), ("key", k), ("value", v))
        ],
        "parameters": params,
    }


def error_of(r: httpx.Response, status: int = 400) -> str:
    assert r.status_code == status, r.text
    return str(r.json()["error"])


# ---------------------------------------------------------------------------------------- item 5: remedies


def test_v2_names_the_fp64_datatype_where_v1_names_precision(server: LiveServer) -> None:
    big = [[3e19, 3e19]]
    message = error_of(httpx.post(server.url + V2, json=v2_inputs("FP32", big, big, [[1.0, 1.0]])))
    assert "overflow float32" in message and "the FP64 datatype" in message and "precision" not in message
    r = httpx.post(server.url + "/v1/attention", json={"query": big, "key": big, "value": [[1.0, 1.0]]})
    assert r.status_code == 422 and "retry with precision float64 or smaller inputs" in r.json()["detail"]
    # a value beyond the declared FP32: the input is named, and the remedy is the protocol's
    message = error_of(httpx.post(server.url + V2, json=v2_inputs("FP32", [[1e39, 0.0]], big, big)))
    assert message.startswith("input 'query': data[0, 0] = 1e+39 overflows FP32") and "as FP64" in message
    assert "precision" not in message
    # softmax's remedies too (InvalidInput carries them as NumericalError does)
    logits = {"name": "logits", "shape": [3], "datatype": "FP32", "data": [3e38, -3e38, 1.0]}
    r = httpx.post(server.url + "/v2/models/softmax/infer", json={"inputs": [logits], "parameters": {"log": True}})
    message = error_of(r)
    assert "use the FP64 datatype (or leave out log)" in message and "precision" not in message
    # already FP64: no float64 advice at all
    huge = [[1e200, 1e200]]
    message = error_of(httpx.post(server.url + V2, json=v2_inputs("FP64", huge, huge, [[1.0, 1.0]])))
    assert "FP64" not in message and "float64 or" not in message


def test_deep_nesting_is_a_rank_error(server: LiveServer) -> None:
    for depth, pad in ((64, 0), (65, 0), (200, 0), (1000, 0), (65, 40_000)):  # small and large (simdjson) bodies
        query = b"[" * (depth - 1) + b"[1.0, 0.0]" + b"]" * (depth - 1)
        raw = b'{"query": ' + query + b', "key": [[1.0, 0.0]], "value": [[1.0]]' + b" " * pad + b"}"
        r = httpx.post(server.url + "/v1/attention", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        assert f"query has rank {depth}" in detail and "out of range" not in detail, detail


@pytest.mark.parametrize("digits", [400, 5000])
def test_a_huge_integer_names_its_field(server: LiveServer, digits: int) -> None:
    raw = b'{"query": [[1.0, 1' + b"0" * (digits - 1) + b'], [0.0, 1.0]], "key": [[1.0, 0.0]], "value": [[1.0]]}'
    r = httpx.post(server.url + "/v1/attention", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    problem = r.json()
    assert problem["errors"][0]["loc"] == ["query", 0, 1], problem
    assert "query[0, 1] = 1000" in problem["detail"] and f"({digits} characters)" in problem["detail"]
    assert "beyond the range of float64" in problem["detail"] and len(problem["detail"]) < 300


# --------------------------------------------------------------------------------------- item 6: key lengths


def test_key_lengths_follow_one_rule(server: LiveServer) -> None:
    """0 to S, on /v1 and /v2 alike, and the message for a length no int64 holds states that same rule."""
    ok = httpx.post(server.url + "/v1/attention", json={**BASE, "key_lengths": [2]})
    assert ok.status_code == 200, ok.text
    r = httpx.post(server.url + "/v1/attention", json={**BASE, "key_lengths": [3]})
    assert r.status_code == 422 and "key_lengths[0] = 3 is outside [0, S] with S = 2" in r.json()["detail"]
    r = httpx.post(server.url + "/v1/attention", json={**BASE, "key_lengths": [2**63]})
    detail = r.json()["detail"]
    assert r.status_code == 422 and "0 to S" in detail and "2**63" not in detail, detail
    analyze = {"query": [[1.0, 0.0]], "key": [[1.0, 0.0], [0.0, 1.0]], "key_lengths": [2**63]}
    r = httpx.post(server.url + "/v1/attention/analyze", json=analyze)  # it was a 500 (int64 overflow)
    assert r.status_code == 422 and "0 to S" in r.json()["detail"], r.text
    body = v2_inputs("FP32", [[1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [2.0, 0.0]])
    body["inputs"].append({"name": "key_lengths", "shape": [1], "datatype": "INT64", "data": [3]})
    assert "outside [0, S] with S = 2" in error_of(httpx.post(server.url + V2, json=body))


def test_the_readme_states_the_rule_the_server_applies() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert "`key_lengths` beyond 2^63 - 1" not in readme and "from 0 to 2**63 - 1" not in readme
    assert "0 <= key_lengths[b] <= S" in readme


# ----------------------------------------------------------------------------------- item 10: route labels


def test_scanners_paths_leave_no_memory_behind(tmp_path: Path) -> None:
    live = LiveServer({"ATTN_API_KEYS": "k" * 32}, tmp_path)
    try:
        live.wait_ready()
        pid = live.proc.pid
        filler = "a" * 15_000  # under the 16 KiB header limit
        with httpx.Client(base_url=live.url, timeout=10) as c:
            for i in range(200):  # warm-up: the interpreter's own allocations settle
                c.get(f"/w{i}")
            before = status_kb(pid, "VmRSS")
            for i in range(1200):
                path = f"/x{i}{filler}" if i % 2 else f"/v2/models/m{i}{filler}/ready"
                assert c.get(path).status_code == 401
            after = status_kb(pid, "VmRSS")
        # 1,200 paths of 15 KB: 18 MB if remembered (4,096 of them were kept before, whatever their size)
        assert (after - before) * 1024 < 6 << 20, (after - before) / 1024
    finally:
        live.close()


# -------------------------------------------------------------------------------------- item 12: text logs


def test_the_text_log_escapes_control_characters(tmp_path: Path) -> None:
    live = LiveServer({"ATTN_LOG_FORMAT": "text"}, tmp_path)
    try:
        live.wait_ready()
        forged = '{"level":"error","message":"forged"}'
        path = "/v2/models/x%0A" + httpx.URL("/" + forged).raw_path.decode()[1:] + "%0D%1B[31m/infer"
        r = httpx.post(live.url + path, json={"inputs": []})
        assert r.status_code == 404
        time.sleep(0.3)
        lines = live.log().splitlines()
        assert not any(line.startswith('{"level":"error"') for line in lines), lines[-5:]
        access = [line for line in lines if "service.access request" in line and "/v2/models/x" in line]
        assert len(access) == 1 and "/v2/models/x\\x0A{" in access[0] and "\\x0D\\x1B[31m" in access[0], access
        assert forged.replace('"', '\\"') in access[0].replace("\\x0A", "")  # the path quoted as logfmt does
    finally:
        live.close()
