"""The tables and ratios that ``python -m bench http`` (``bench/bench_http.py``) prints."""

from __future__ import annotations

from bench.http_cases import (
    BARE_GET,
    BARE_MEDIUM_JSON,
    BARE_POST,
    BARE_TINY_MATHS,
    EDGE_TINY_MATHS,
    HEALTHZ,
    LARGE,
    LIVE_GET,
    SMALL,
    TARGET_CASES,
    Case,
)


def fmt(x: float | None, digits: int = 2) -> str:
    return "" if x is None else f"{x:.{digits}f}"


def ratio_line(label: str, num: float, den: float, target: str, ok: bool, overhead: str = "") -> str:
    return (
        f"| {label} | {num:.2f} / {den:.2f} | **{num / den:.2f}x** | {target} | {'met' if ok else 'MISSED'} "
        f"| {overhead} |"
    )


ISSUE8_TARGETS = (
    # (label, numerator case, denominator case, target ratio): p50 at 1 connection, same run
    ("tiny `/v1 (1, 1, 4, 4) lists` (diagnostics) / `GET /healthz`", f"/v1 {SMALL} lists", HEALTHZ, 2.0),
    ("tiny `/v2 (1, 1, 4, 4) JSON` (diagnostics) / `GET /healthz`", f"/v2 {SMALL} JSON", HEALTHZ, 2.0),
    ("tiny `/v2 (1, 1, 4, 4) binary` (diagnostics) / `GET /healthz`", f"/v2 {SMALL} binary", HEALTHZ, 2.0),
    (
        "medium `/v2 (1, 8, 128, 64) JSON` / `/v2 (1, 8, 128, 64) binary`",
        f"/v2 {LARGE} JSON",
        f"/v2 {LARGE} binary",
        4.0,
    ),
)


def print_issue8_ratios(p50: dict[str, float], floor: dict[str, float], rounds: int = 1) -> None:
    """Issue 8's targets: tiny requests near the HTTP floor, JSON within 4x of binary; and the JSON floor.

    ``p50`` holds, for the targets' cases and their floors, the median of ``rounds`` interleaved rounds.

    ``floor`` (ms): the transport of the medium JSON sizes (bare app), simdjson's parse of the request,
    orjson's writing of the answer's tensors, and the binary request's engine and diagnostics: what any
    JSON request of this size costs here before the service does anything else.
    """
    tiny, edge, healthz = p50[BARE_TINY_MATHS], p50[EDGE_TINY_MATHS], p50[HEALTHZ]
    how = "same run" if rounds == 1 else f"same run, median of {rounds} interleaved rounds"
    print(
        f"\n| target (p50, c=1, {how}) | ms / ms | ratio | target | "
        "| our layers over the bare app | the job's layers over the edge floor |"
    )
    print("|---|---:|---:|---|---|---:|---:|")
    for label, num, den, target in ISSUE8_TARGETS:
        # A tiny request's own layers: its p50 minus the bare app computing the same answer with service.core;
        # its job's layers: its p50 minus the service's edge running that bare answer as the job.
        tiny_row = den == HEALTHZ
        overhead = f"{(p50[num] - tiny) * 1e3:.0f} us" if tiny_row else ""
        overhead += f" | {(p50[num] - edge) * 1e3:.0f} us" if tiny_row else " |"
        print(ratio_line(label, p50[num], p50[den], f"<= {target:g}x", p50[num] <= target * p50[den], overhead))
    print(
        f"| floor of tiny `/v2 {SMALL} JSON`: the bare app computing it with service.core, no service layers / "
        f"`GET /healthz` | {tiny:.2f} / {healthz:.2f} | {tiny / healthz:.2f}x | (lower bound) | | | |"
    )
    print(
        f"| edge floor of tiny `/v2 {SMALL} JSON`: the service's HTTP edge with the bare app's maths as its job / "
        f"`GET /healthz` | {edge:.2f} / {healthz:.2f} | {edge / healthz:.2f}x | (lower bound here) | | | |"
    )
    lower = sum(floor.values())
    binary = p50[f"/v2 {LARGE} binary"]
    parts = " + ".join(f"{name} {ms:.2f}" for name, ms in floor.items())
    print(
        f"| floor of medium JSON: {parts} ms / `/v2 {LARGE} binary` | {lower:.2f} / {binary:.2f} "
        f"| {lower / binary:.2f}x | (lower bound) | | | |"
    )


def print_report(
    cases: list[Case],
    *,
    duration: float,
    connections: int,
    rounds: int,
    machine_lines: list[str],
    load_start: str,
    load_end: str,
    engines_used: dict[str, str],
    codec_floor: dict[str, float],
) -> None:
    """The run's Markdown: the machine, every case, issue 4's ratios and issue 8's targets."""
    print(f"### HTTP end to end (wrk, {round(duration)} s per run)\n")
    print(*machine_lines, sep="\n")
    chosen = "; ".join(f"{name}: {engine}" for name, engine in engines_used.items())
    print(f"- load average (1, 5, 15 min) at start: {load_start}; at end: {load_end}")
    print(f"- engine chosen by `auto`: {chosen}\n")
    print(
        "| case | request bytes | response bytes | p50 ms (c=1) | p99 ms (c=1) | req/s (c=1) | "
        f"req/s (c={connections}) | non-2xx | in-process ms: app | job | engine | diagnostics | rest |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in cases:
        errors = c.e2e["non_2xx"] + c.e2e_c["non_2xx"] + c.e2e["socket_errors"] + c.e2e_c["socket_errors"]
        loc = c.local
        print(
            f"| {c.name} | {len(c.body) if c.method == 'POST' else 'GET'} | {c.response_bytes} "
            f"| {c.e2e['p50_us'] / 1e3:.2f} | {c.e2e['p99_us'] / 1e3:.2f} | "
            f"{c.e2e['rps']:.0f} | {c.e2e_c['rps']:.0f} | {errors} | {fmt(loc.get('total'))} "
            f"| {fmt(loc.get('job'))} | {fmt(loc.get('compute'))} | "
            f"{fmt(loc.get('diagnostics'))} | {fmt(loc.get('codec'))} |"
        )

    by = {c.name: c for c in cases}
    p50 = {name: c.e2e["p50_us"] / 1e3 for name, c in by.items()}
    bare = p50[BARE_POST]
    s, lg = f"{SMALL}", f"{LARGE}"
    lists_large = p50[f"/v1 {lg} lists"]
    local_large = by[f"/v1 {lg} lists"].local["total"]
    print("\n| ratio (p50, same run) | ms / ms | ratio | target | |")
    print("|---|---:|---:|---|---|")
    live, bare_get = p50[LIVE_GET], p50[BARE_GET]
    print(
        f"| service middleware and routing: `{LIVE_GET}` / `{BARE_GET}` | {live:.2f} / {bare_get:.2f} "
        f"| {live / bare_get:.2f}x | (no target) | |"
    )
    for name in (f"/v1 {s} lists", f"/v1 {s} lists, no diagnostics", f"/v2 {s} binary"):
        print(
            ratio_line(f"small request `{name}` / bare endpoint", p50[name], bare, "<= 1.5x", p50[name] <= 1.5 * bare)
        )
    print(
        ratio_line(
            f"`/v1 {lg} lists` / `/v1 {lg} b64`",
            lists_large,
            p50[f"/v1 {lg} b64"],
            ">= 5x",
            lists_large >= 5 * p50[f"/v1 {lg} b64"],
        )
    )
    print(
        ratio_line(
            f"`/v1 {lg} lists` / `/v2 {lg} binary`",
            lists_large,
            p50[f"/v2 {lg} binary"],
            ">= 5x",
            lists_large >= 5 * p50[f"/v2 {lg} binary"],
        )
    )
    print(
        ratio_line(
            f"`/v1 {lg} lists` end to end / in-process decode+compute+encode",
            lists_large,
            local_large,
            "<= 3x",
            lists_large <= 3 * local_large,
        )
    )
    binary_local = by[f"/v2 {lg} binary"].local
    medians = {name: by[name].p50 for name in TARGET_CASES}
    print_issue8_ratios(
        {**p50, **medians},
        {
            "transport": medians[BARE_MEDIUM_JSON],
            "parse": codec_floor["parse"],
            "write": codec_floor["write"],
            "engine and diagnostics": binary_local["compute"] + binary_local["diagnostics"],
        },
        rounds,
    )
    if rounds > 1:
        print("\np50 (ms, one connection) of each round, the first pass first:")
        for name in TARGET_CASES:
            print(f"- {name}: {' '.join(f'{x:.3f}' for x in by[name].p50s)}")
    print(
        "\nin-process (medians): app = the service's app called through ASGI, no sockets, from the call to the last "
        "byte of the answer; job, engine and diagnostics = the answer's timing_ms (total, compute, diagnostics); "
        "rest = app - engine - diagnostics (the edge, body read, parse, validation, decode, encode, serialize)."
    )
