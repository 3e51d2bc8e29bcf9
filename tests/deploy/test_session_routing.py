"""deploy/nginx/sessions.conf in front of two replicas: every step of a sequence reaches the replica that holds its
cache (the header X-Sequence-ID, hashed consistently), sequences spread over both, and without the header the same
steps land on either replica, so about half of them find no cache (the routing is what makes sessions work).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import free_port, started

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "deploy" / "nginx" / "sessions.conf"
ENV = {"ATTN_ENABLE_ONNX": "false", "ATTN_GRPC_ENABLED": "false", "ATTN_LOG_LEVEL": "warning"}
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed (.ci/run installs nginx-light)")


def nginx_conf(snippet: str, replicas: list[str], port: int, prefix: Path) -> str:
    """The shipped snippet with this test's replicas and port, in a minimal nginx.conf of its own prefix."""
    servers = "".join(f"    server {r};\n" for r in replicas)
    snippet, count = re.subn(r"(    server \S+:8000;\n)+", servers, snippet)
    assert count == 1, "the snippet's upstream has its server lines together"
    snippet = snippet.replace("listen 8080;", f"listen 127.0.0.1:{port};")
    temp = "\n".join(
        f"{kind}_temp_path {prefix / kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return (
        f"pid {prefix / 'nginx.pid'};\nerror_log {prefix / 'error.log'} warn;\nevents {{}}\n"
        f"http {{\naccess_log off;\n{temp}\n{snippet}\n}}\n"
    )


def step(http: httpx.Client, sid: str, start: bool, header: bool) -> httpx.Response:
    body = {
        "parameters": {"sequence_id": sid, "sequence_start": start, "diagnostics": False},
        "inputs": [
            {"name": n, "shape": [1, 2], "datatype": "FP32", "data": [1.0, 0.5]} for n in ("query", "key", "value")
        ],
    }
    return http.post("/v2/models/attention_session/infer", json=body, headers={"x-sequence-id": sid} if header else {})


def live_sessions(url: str) -> float:
    found = re.search(r"^attn_sessions_live (\S+)$", httpx.get(f"{url}/metrics").text, re.MULTILINE)
    assert found
    return float(found.group(1))


def test_each_sequence_reaches_the_replica_that_holds_it() -> None:
    assert NGINX is not None
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        replicas = []
        for _ in range(2):
            port = free_port()
            replicas.append(stack.enter_context(started(["-m", "service", "serve", "--port", str(port)], port, ENV)))
        port, prefix = free_port(), Path(tmp)
        (prefix / "nginx.conf").write_text(nginx_conf(CONF.read_text(), [r.authority for r in replicas], port, prefix))
        proc = subprocess.Popen([NGINX, "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-g", "daemon off;"])
        stack.callback(proc.wait, 10)
        stack.callback(proc.terminate)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            deadline = time.monotonic() + 20
            while True:
                try:
                    http.get("/healthz")
                    break
                except httpx.TransportError:
                    assert proc.poll() is None and time.monotonic() < deadline, (prefix / "error.log").read_text()
                    time.sleep(0.1)
            sequences = [f"routed-{i}" for i in range(24)]
            for sid in sequences:
                assert step(http, sid, True, header=True).status_code == 200
            for sid in sequences:
                for expected in (2, 3):
                    r = step(http, sid, False, header=True)
                    assert r.status_code == 200, r.text
                    assert r.json()["outputs"][2]["data"] == [expected]
            assert all(live_sessions(r.url) > 0 for r in replicas)  # spread over both
            lost = sum(step(http, sid, False, header=False).status_code == 400 for sid in sequences)
            assert 0 < lost < len(sequences)  # without the header a step reaches either replica


def test_the_kubernetes_ingress_hashes_the_same_header() -> None:
    """deploy/k8s/sessions-ingress.yaml routes the session paths by the header the tested NGINX snippet hashes."""
    import yaml

    ingress = yaml.safe_load((ROOT / "deploy" / "k8s" / "sessions-ingress.yaml").read_text())
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/upstream-hash-by"] == "$http_x_sequence_id"
    assert re.search(r"default\s+\$http_x_sequence_id;", CONF.read_text())
    paths = {p["path"] for rule in ingress["spec"]["rules"] for p in rule["http"]["paths"]}
    assert paths == {"/v2/models/attention_session", "/v1/sessions"}
