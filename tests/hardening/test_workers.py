"""Several workers on a live server (issue 21, items 16 and 17): a metrics directory too small for the workers'
files is refused at start with the reason (workers died of SIGBUS, silently, over and over); every worker's exit
is logged with its cause; a replacement worker takes connections only once its engines are warm (it answered
503 "engines are starting" beside a ready sibling). And ``serve --workers 2`` (issue 27, item 1): the flag reaches
the workers as ``ATTN_WORKERS`` would (they read it from the environment, saw one worker and bound gRPC without port
sharing: the second worker's bind failed and the supervisor stopped the server), and a killed worker is replaced.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service.grpc.generated import inference_pb2 as pb
from service.grpc.generated import inference_pb2_grpc as pb_grpc
from tests.e2e.conftest import free_port
from tests.hardening.conftest import ROOT

INFER = "/v2/models/attention/infer"
V2_ATTENTION = {
    "inputs": [
        {"name": name, "shape": [2, 2], "datatype": "FP32", "data": [1.0, 0.0, 0.0, 1.0]}
        for name in ("query", "key", "value")
    ]
}

pytestmark = pytest.mark.slow  # each test starts a live server


def worker_pids(parent: int) -> set[int]:
    """The worker processes of a uvicorn supervisor: its children started by multiprocessing's spawn (Linux)."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_bytes().rpartition(b")")[2].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and b"spawn_main" in cmdline:
            pids.add(int(entry.name))
    return pids


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs (needs the right to mount, as root in a container)."""
    where = tmp_path / "tiny"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_metrics_dir_too_small_is_refused_at_start(tiny_tmpfs: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTN_", "PROMETHEUS_"))}
    env.update(
        {"ATTN_ENABLE_ONNX": "false", "ATTN_WORKERS": "2", "ATTN_METRICS_DIR": str(tiny_tmpfs), "ATTN_PORT": "0"}
    )
    env["ATTN_GRPC_ENABLED"] = "false"
    try:
        done = subprocess.run(
            [sys.executable, "-m", "service", "serve"], cwd=ROOT, env=env, capture_output=True, timeout=60
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the server ran with a full metrics directory: {exc.stderr!r}") from None
    assert done.returncode == 2, done.stderr.decode()[-2000:]
    err = done.stderr.decode()
    assert "refusing to start" in err and "ATTN_METRICS_DIR" in err and "MiB free" in err and "SIGBUS" in err


def test_every_worker_exit_is_logged_with_its_signal(live_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server = live_server({"ATTN_WORKERS": "2", "ATTN_METRICS_DIR": str(tmp_path / "metrics")})
    pids = worker_pids(server.proc.pid)
    assert len(pids) == 2, pids
    victim = min(pids)
    os.kill(victim, signal.SIGBUS)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and f"worker process {victim} was killed by signal SIGBUS" not in server.log():
        time.sleep(0.2)
    log = server.log()
    assert f"worker process {victim} was killed by signal SIGBUS (7; " in log, log[-3000:]
    assert "ATTN_METRICS_DIR" in log and "started worker process" in log
    server.terminate()
    assert server.proc.wait(60) == 0
    assert "stopped" in server.log()


def test_a_replacement_worker_takes_traffic_only_once_ready(live_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """SIGKILL to one of two workers while the other is stopped (SIGSTOP), so that the replacement takes every new
    connection: each inference is answered 200 once its engines are warm, none 503 "the engines are starting" (ONNX
    on, so that the warm-up takes a while).
    """
    env = {"ATTN_WORKERS": "2", "ATTN_METRICS_DIR": str(tmp_path / "metrics"), "ATTN_ENABLE_ONNX": "true"}
    server = live_server({**env, "ATTN_GRPC_ENABLED": "false"})
    pids = worker_pids(server.proc.pid)
    assert len(pids) == 2, pids
    victim, sibling = sorted(pids)
    statuses: list[int | str] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            try:
                r = httpx.post(server.url + INFER, json=V2_ATTENTION, headers={"connection": "close"}, timeout=60)
                statuses.append(r.status_code if r.status_code != 503 else f"503 {r.text[:200]}")
            except httpx.TransportError as exc:
                statuses.append(type(exc).__name__)

    os.kill(sibling, signal.SIGSTOP)
    try:
        os.kill(victim, signal.SIGKILL)
        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not worker_pids(server.proc.pid) - pids:
            time.sleep(0.1)
        replacement = worker_pids(server.proc.pid) - pids
        assert replacement, "no replacement worker"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and statuses.count(200) < 20:
            time.sleep(0.1)
    finally:
        stop.set()
        with contextlib.suppress(ProcessLookupError):  # the supervisor may have replaced it for not answering
            os.kill(sibling, signal.SIGCONT)
    for t in threads:
        t.join(60)
    refused = [s for s in statuses if isinstance(s, str)]
    assert not refused, refused[:3]
    assert statuses.count(200) >= 20


def answers_both(url: str, grpc_target: str, tries: int = 6) -> bool:
    """REST (a /v2 inference) and gRPC (a health check) answer ``tries`` times each, every time on a new connection
    (the kernel spreads new connections over the workers).
    """
    try:
        for _ in range(tries):
            r = httpx.post(url + INFER, json=V2_ATTENTION, headers={"connection": "close"}, timeout=5)
            with grpc.insecure_channel(grpc_target) as channel:
                health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            if r.status_code != 200 or health.status != health_pb2.HealthCheckResponse.SERVING:
                return False
    except (httpx.TransportError, grpc.RpcError):
        return False
    return True


def wait_for(condition: Callable[[], bool], timeout_s: float, proc: subprocess.Popen[bytes]) -> float:
    """Seconds until ``condition()`` holds (polled); fails when the server exits or the time is up."""
    t0 = time.monotonic()
    while not condition():
        assert proc.poll() is None, f"the server exited with {proc.returncode}"
        assert time.monotonic() - t0 < timeout_s, f"not within {timeout_s} s"
        time.sleep(0.1)
    return time.monotonic() - t0


def logged(log_path: Path, *lines: str) -> Callable[[], bool]:
    """A condition: the server's log holds each of ``lines``."""
    return lambda: all(line in log_path.read_text() for line in lines)


def test_the_workers_flag_serves_rest_and_grpc_and_replaces_a_killed_worker(tmp_path: Path) -> None:
    """``serve --workers 2 --port P --grpc-port G`` with no ATTN_* port or worker variable: both workers warm up
    before they take connections and serve gRPC on the shared port; the server stays up with no traffic (it stopped
    itself after 2-12 s), and after SIGKILL of either worker REST and gRPC still answer and a replacement starts.
    """
    port, grpc_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTN_", "PROMETHEUS_"))}
    env |= {"ATTN_ENABLE_ONNX": "false", "ATTN_COST_CALIBRATION": "off", "ATTN_METRICS_DIR": str(tmp_path / "m")}
    flags = ["--workers", "2", "--port", str(port), "--grpc-port", str(grpc_port)]
    url, target = f"http://127.0.0.1:{port}", f"127.0.0.1:{grpc_port}"
    log_path = tmp_path / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "service", "serve", *flags], cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    t0 = time.monotonic()
    try:
        wait_for(lambda: answers_both(url, target, tries=1), 60, proc)
        pids = worker_pids(proc.pid)
        assert len(pids) == 2, pids
        while time.monotonic() - t0 < 15:  # no traffic
            assert proc.poll() is None, f"the server stopped itself ({proc.returncode}):\n{log_path.read_text()}"
            time.sleep(0.25)
        log_text = log_path.read_text()
        assert worker_pids(proc.pid) == pids and "in its place" not in log_text, log_text[-3000:]
        for pid in pids:  # each worker warmed its engines before it took connections
            assert f"worker {pid}: engines started; taking connections" in log_text, log_text[-3000:]
        assert answers_both(url, target)
        # Sessions are off with several workers (a cache lives in one process): said per request and in metadata.
        assert "sequence" not in httpx.get(f"{url}/v2").json()["extensions"]
        step = {
            "parameters": {"sequence_id": 1, "sequence_start": True},
            "inputs": [
                {"name": n, "shape": [1, 2], "datatype": "FP32", "data": [1.0, 0.0]} for n in ("query", "key", "value")
            ],
        }
        refused = httpx.post(f"{url}/v2/models/attention_session/infer", json=step)
        assert refused.status_code == 400 and "several worker processes" in refused.json()["error"], refused.text
        for victim in sorted(pids):
            os.kill(victim, signal.SIGKILL)
            took = wait_for(lambda: answers_both(url, target), 5, proc)
            print(f"worker {victim} killed: REST and gRPC answered again after {took:.2f} s")
            wait_for(logged(log_path, f"worker process {victim} was killed by signal SIGKILL"), 30, proc)
            replacements = worker_pids(proc.pid) - pids
            assert replacements, log_path.read_text()[-3000:]
            wait_for(logged(log_path, *(f"worker {r}: engines started" for r in replacements)), 30, proc)
            assert answers_both(url, target)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log_path.read_text()[-3000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def test_statistics_are_the_sum_of_both_workers(tmp_path: Path) -> None:
    """``serve --workers 2``: requests over REST and gRPC, each on a new connection, until both workers have
    answered some (each worker's own metrics file says so); then ``GET /v2/models/softmax/stats`` and gRPC
    ``ModelStatistics``, asked several times on new connections (either worker answers), give the totals sent,
    never one worker's share (issue 28, item 5).
    """
    from prometheus_client.multiprocess import MultiProcessCollector

    port, grpc_port = free_port(), free_port()
    metrics_dir = tmp_path / "m"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTN_", "PROMETHEUS_"))}
    env |= {"ATTN_ENABLE_ONNX": "false", "ATTN_COST_CALIBRATION": "off", "ATTN_METRICS_DIR": str(metrics_dir)}
    flags = ["--workers", "2", "--port", str(port), "--grpc-port", str(grpc_port)]
    url, target = f"http://127.0.0.1:{port}", f"127.0.0.1:{grpc_port}"
    logits = {"inputs": [{"name": "logits", "shape": [1, 3], "datatype": "FP32", "data": [1.0, 2.0, 3.0]}]}
    wrong = {**logits, "parameters": {"bogus": 1}}  # refused by the model: a failure
    close = {"connection": "close"}  # a new connection each time: the kernel spreads them over the workers

    def per_worker(pids: set[int]) -> dict[int, int]:
        """Each worker's own count of softmax inferences answered (REST and gRPC), from its counters' file alone."""
        counts = dict.fromkeys(pids, 0)
        for pid in pids:
            path = metrics_dir / f"counter_{pid}.db"
            for family in MultiProcessCollector.merge([str(path)]) if path.exists() else ():
                for s in family.samples:
                    if (
                        s.name == "attn_http_requests_total"
                        and s.labels["model"] == "softmax"
                        and s.labels["route"]
                        in (INFER.replace("attention", "{model_name}"), "/inference.GRPCInferenceService/ModelInfer")
                    ):
                        counts[pid] += round(s.value)
        return counts

    def grpc_stats() -> Any:
        with grpc.insecure_channel(target) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            return stub.ModelStatistics(pb.ModelStatisticsRequest(name="softmax"), timeout=5).model_stats[0]

    log_path = tmp_path / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "service", "serve", *flags], cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        wait_for(lambda: ready(url, target), 60, proc)
        pids = worker_pids(proc.pid)
        assert len(pids) == 2, pids
        ok = failed = 0
        while min(per_worker(pids).values()) < 3:
            assert ok + failed < 600, f"one worker answered every request: {per_worker(pids)}"
            r = httpx.post(url + "/v2/models/softmax/infer", json=logits, headers=close, timeout=10)
            assert r.status_code == 200, r.text
            ok += 1
            if ok % 4 == 0:
                r = httpx.post(url + "/v2/models/softmax/infer", json=wrong, headers=close, timeout=10)
                assert r.status_code == 400 and "no parameter 'bogus'" in r.text, r.text
                failed += 1
            if ok % 5 == 0:
                with grpc.insecure_channel(target) as channel:
                    request = pb.ModelInferRequest(model_name="softmax")
                    tensor = request.inputs.add(name="logits", datatype="FP32", shape=[1, 3])
                    tensor.contents.fp32_contents.extend([1.0, 2.0, 3.0])
                    pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
                ok += 1
        # A worker counts a request in its file once the answer is sent: the last one's may still be on its way.
        wait_for(lambda: sum(per_worker(pids).values()) == ok + failed, 5, proc)
        shares = per_worker(pids)
        print(f"{ok} successes and {failed} failures sent; each worker answered {shares}")
        for _ in range(6):
            stats = httpx.get(url + "/v2/models/softmax/stats", headers=close, timeout=10).json()["model_stats"][0]
            assert stats["inference_count"] == stats["execution_count"] == ok, (stats, shares)
            inference = stats["inference_stats"]
            assert inference["success"]["count"] == ok and inference["fail"]["count"] == failed, (inference, shares)
            assert inference["success"]["ns"] > 0 and inference["fail"]["ns"] > 0
            over_grpc = grpc_stats()
            assert over_grpc.inference_count == ok and over_grpc.inference_stats.fail.count == failed
            assert over_grpc.inference_stats.success.ns == inference["success"]["ns"]
        metrics = httpx.get(url + "/metrics", headers=close, timeout=10).text
        assert f'attn_inference_request_duration_seconds_count{{model="softmax",outcome="success"}} {ok}.0' in metrics
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log_path.read_text()[-3000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def ready(url: str, grpc_target: str) -> bool:
    """``/readyz`` says ready and gRPC health says SERVING (without sending an inference)."""
    try:
        if httpx.get(url + "/readyz", timeout=5).status_code != 200:
            return False
        with grpc.insecure_channel(grpc_target) as channel:
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        return bool(health.status == health_pb2.HealthCheckResponse.SERVING)
    except (httpx.TransportError, grpc.RpcError):
        return False
