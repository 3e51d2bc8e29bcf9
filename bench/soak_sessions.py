"""A soak of attention sessions (issue 30): sequences started, stepped and abandoned at random by many clients.

    python -m bench sessions-soak [--duration 60] [--clients 32] [--sequences 1000] [--idle 2]

Starts the service as production runs it (``python -m service serve``, one worker) with ``ATTN_SESSION_IDLE_S`` at
``--idle`` seconds. ``--clients`` threads then start ``--sequences`` sequences over ``--duration`` seconds, each
with a random prompt (1 to 64 positions, 4 query heads over 2 key heads, head size 32, float32), step each 1 to
20 times (one position a step), and end half of them; the other half are abandoned. Every step's output is
compared with its own stateless recompute (``service.core``'s attention over the whole prefix, ``bottom_right``,
in the client), within the engines' float32 agreement (1e-5: the server's ``auto`` may run ONNX). The server's
resident memory is sampled every 0.2 s.

Afterwards each abandoned sequence is stepped once more: the refusal says how long it had been idle when it was
evicted (``after N s without a step``). Checks: RSS stays within the memory budget plus 400 MB, every abandoned
session was evicted within its idle time plus 1 s (or earlier, to make room: counted apart), no step differs from
its recompute, and ``attn_sessions_live`` is 0 at the end.
"""

from __future__ import annotations

import random
import re
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.serving import rss_bytes, service
from bench.suite import Parser
from service.core.attention import run_attention
from service.core.types import AttentionInputs, AttentionParams, AttentionTask

HQ, HKV, E = 4, 2, 32
BUDGET = 1 << 30
IDLE_AT_EVICTION = re.compile(r"after ([0-9.]+) s without a step")


def arguments() -> Parser:
    parser = Parser(__name__, __doc__, quick={"duration": 3, "clients": 4, "sequences": 20, "idle": 1.0})
    parser.add_argument("--duration", type=float, default=60.0, help="seconds over which sequences start")
    parser.add_argument("--clients", type=int, default=32, help="client threads (default 32)")
    parser.add_argument("--sequences", type=int, default=1000, help="sequences started in all (default 1000)")
    parser.add_argument("--idle", type=float, default=2.0, help="ATTN_SESSION_IDLE_S for the run (default 2)")
    return parser


def recompute(q: np.ndarray, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    task = AttentionTask(AttentionInputs(q, keys, values), AttentionParams("softmax", causal="bottom_right"))
    return run_attention(task).output


def body(arrays: dict[str, np.ndarray], **parameters: Any) -> dict[str, Any]:
    inputs = [
        {"name": n, "shape": list(a.shape), "datatype": "FP32", "data": a.ravel().tolist()} for n, a in arrays.items()
    ]
    return {"inputs": inputs, "outputs": [{"name": "output"}], "parameters": {"diagnostics": False, **parameters}}


class Soak:
    def __init__(self, url: str, sequences: int, duration: float) -> None:
        self.url = url
        self.left = sequences
        self.duration = duration
        self.lock = threading.Lock()
        self.steps = 0
        self.mismatches: list[str] = []
        self.errors: list[str] = []
        self.abandoned: dict[str, float] = {}
        self.ended = 0
        self.t0 = time.monotonic()

    def take(self) -> bool:
        with self.lock:
            if self.left <= 0:
                return False
            self.left -= 1
            return True

    def client(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        pick = random.Random(seed)
        per_client_gap = self.duration / max(1, self.left) * 32
        with httpx.Client(base_url=self.url, timeout=60) as http:
            while self.take():
                self.sequence(http, rng, pick)
                time.sleep(pick.uniform(0, per_client_gap))

    def sequence(self, http: httpx.Client, rng: np.random.Generator, pick: random.Random) -> None:
        sid = uuid.uuid4().hex
        keys = np.zeros((1, HKV, 0, E), np.float32)
        values = np.zeros((1, HKV, 0, E), np.float32)
        end = pick.random() < 0.5
        steps = pick.randint(1, 20)
        for i in range(steps + 1):
            m = pick.randint(1, 64) if i == 0 else 1
            q = rng.standard_normal((1, HQ, m, E), dtype=np.float32)
            k = rng.standard_normal((1, HKV, m, E), dtype=np.float32)
            v = rng.standard_normal((1, HKV, m, E), dtype=np.float32)
            keys, values = np.concatenate([keys, k], 2), np.concatenate([values, v], 2)
            last = i == steps
            params = {"sequence_id": sid, "sequence_start": i == 0, "sequence_end": end and last}
            r = http.post("/v2/models/attention_session/infer", json=body({"query": q, "key": k, "value": v}, **params))
            if r.status_code != 200:
                with self.lock:
                    self.errors.append(f"{r.status_code} {r.text[:200]}")
                return
            out = r.json()["outputs"][0]
            got = np.array(out["data"], np.float32).reshape(out["shape"])
            want = recompute(q, keys, values)
            with self.lock:
                self.steps += 1
                if not np.allclose(got, want, rtol=1e-5, atol=1e-6):  # the engines' agreement in float32
                    self.mismatches.append(f"{sid} step {i}: max error {np.abs(got - want).max():.3g}")
        with self.lock:
            if end:
                self.ended += 1
            else:
                self.abandoned[sid] = time.monotonic()


def main(argv: list[str]) -> int:
    args = arguments().parse(argv)
    env = {
        "ATTN_SESSION_IDLE_S": str(args.idle),
        "ATTN_MEMORY_BUDGET_BYTES": str(BUDGET),
        "ATTN_COST_CALIBRATION": "off",
    }
    with tempfile.TemporaryDirectory() as tmp, service(Path(tmp) / "service.log", env) as served:
        url, pid = served.url, served.proc.pid
        samples: list[int] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.2):
                samples.append(rss_bytes(pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        soak = Soak(url, args.sequences, args.duration)
        threads = [threading.Thread(target=soak.client, args=(seed,)) for seed in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ran = time.monotonic() - soak.t0
        time.sleep(args.idle + 1.0)
        stop.set()
        sampler.join()
        idle_at_eviction, pressure, other = [], 0, []
        with httpx.Client(base_url=url, timeout=30) as http:
            one = {n: np.zeros((1, HKV, 1, E), np.float32) for n in ("query", "key", "value")}
            one["query"] = np.zeros((1, HQ, 1, E), np.float32)
            for sid in soak.abandoned:
                r = http.post("/v2/models/attention_session/infer", json=body(one, sequence_id=sid))
                text = r.json().get("error", "")
                found = IDLE_AT_EVICTION.search(text)
                if found:
                    idle_at_eviction.append(float(found.group(1)))
                elif "to make room" in text:
                    pressure += 1
                else:
                    other.append(f"{r.status_code} {text[:160]}")
            live = re.search(r"^attn_sessions_live ([0-9.e+]+)$", http.get("/metrics").text, re.MULTILINE)
    peak = max(samples) if samples else 0
    late = [s for s in idle_at_eviction if s > args.idle + 1.0]
    print(
        f"{args.sequences} sequences from {args.clients} clients in {ran:.1f} s: {soak.steps} steps, {soak.ended} "
        f"ended, {len(soak.abandoned)} abandoned; ATTN_SESSION_IDLE_S={args.idle:g}\n"
    )
    print("| check | measured | target | |")
    print("|---|---:|---:|---|")
    rows = [
        (
            "peak RSS",
            f"{peak / 2**20:.0f} MiB",
            f"<= {(BUDGET + (400 << 20)) / 2**20:.0f} MiB",
            peak <= BUDGET + (400 << 20),
        ),
        ("steps unlike their recompute", str(len(soak.mismatches)), "0", not soak.mismatches),
        ("steps refused", str(len(soak.errors)), "0", not soak.errors),
        (
            "abandoned: idle when evicted, median / max",
            f"{statistics.median(idle_at_eviction) if idle_at_eviction else 0:.2f} / "
            f"{max(idle_at_eviction, default=0):.2f} s",
            f"<= {args.idle + 1:g} s",
            not late and not other,
        ),
        ("abandoned: evicted earlier to make room", str(pressure), "-", True),
        ("sessions live at the end", live.group(1) if live else "?", "0", bool(live) and float(live.group(1)) == 0),
    ]
    for name, measured, target, ok in rows:
        print(f"| {name} | {measured} | {target} | {'met' if ok else 'missed'} |")
    for line in (soak.mismatches + soak.errors + other)[:10]:
        print(f"- {line}")
    return 0 if all(ok for *_, ok in rows) else 1
