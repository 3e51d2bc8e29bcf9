"""Readable tables of results for a terminal, and plain JSON for machines."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import numpy.typing as npt
from attention_client import AttentionResult, EngineInfo, SampleResult, SoftmaxResult

BAR_WIDTH = 30
MAX_ROWS = 16
"""Larger weight matrices are cut to their first 16 queries and keys on screen (``--json`` has them all)."""


def bar(p: float) -> str:
    """A horizontal bar of ``p`` in [0, 1], in eighths of a character."""
    eighths = round(max(0.0, min(1.0, p)) * BAR_WIDTH * 8)
    full, part = divmod(eighths, 8)
    return "█" * full + ("" if part == 0 else " ▏▎▍▌▋▊▉"[part])


def _fmt(x: float, width: int = 8, digits: int = 4) -> str:
    if math.isinf(x):
        return f"{'-inf' if x < 0 else 'inf':>{width}}"
    return f"{x:>{width}.{digits}f}"


def distribution_table(scores: npt.NDArray[Any] | None, p: npt.NDArray[Any], label: str = "weight") -> list[str]:
    """One line per position: index, score, probability and its bar."""
    lines = [f"{'index':>5} {'score':>8} {label:>8}  "]
    for i, w in enumerate(p):
        score = "" if scores is None else _fmt(float(scores[i]), 8, 3)
        lines.append(f"{i:>5} {score:>8} {_fmt(float(w))}  {bar(float(w))}")
    return lines


def _rows(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    return a.reshape(-1, a.shape[-1]) if a.ndim > 1 else a.reshape(1, -1)


def softmax_text(result: SoftmaxResult, logits: npt.NDArray[Any]) -> str:
    probs, scores = _rows(result.probabilities), _rows(np.asarray(logits, dtype=np.float64))
    entropy = np.ravel(result.diagnostics.get("entropy", []))
    lines: list[str] = []
    for r, p in enumerate(probs):
        if len(probs) > 1:
            lines.append(f"row {r}")
        lines += distribution_table(scores[r] if scores.shape == probs.shape else None, p)
        h = float(entropy[r]) if r < len(entropy) else float(-(p[p > 0] * np.log(p[p > 0])).sum())
        support = int(np.count_nonzero(p))
        lines.append(
            f"entropy {h:.4f} nats · effective support exp(H) {math.exp(h):.2f} · "
            f"nonzero {support}/{p.size} · max {float(p.max()):.4f} at {int(p.argmax())}"
        )
        lines.append("")
    if result.log_probabilities is not None:
        lines.append("log-probabilities: " + np.array2string(result.log_probabilities, precision=4, separator=", "))
    return "\n".join(lines).rstrip() + "\n"


def _matrix(w: npt.NDArray[Any]) -> list[str]:
    L, S = w.shape
    cut_l, cut_s = min(L, MAX_ROWS), min(S, MAX_ROWS)
    head = "q\\k " + "".join(f"{j:>7}" for j in range(cut_s)) + ("    ..." if S > cut_s else "")
    lines = [head]
    for i in range(cut_l):
        cells = "".join("      ·" if w[i, j] == 0 else f"{w[i, j]:>7.3f}" for j in range(cut_s))
        lines.append(f"{i:>3} " + cells + ("    ..." if S > cut_s else ""))
    if L > cut_l:
        lines.append(f"... {L - cut_l} more queries")
    return lines


def _engine(engine: EngineInfo | None) -> str:
    return "" if engine is None else f"engine {engine.name} ({engine.provider}): {engine.reason}"


def attention_text(result: AttentionResult) -> str:
    lines: list[str] = []
    if result.output is not None:
        lines.append(f"output {tuple(result.output.shape)} {result.output.dtype}")
    diag: dict[str, Any] = dict(result.diagnostics or {})
    heads = diag.get("heads", [])
    if result.weights is not None:
        w = result.weights.reshape((-1, *result.weights.shape[-2:]))
        for n, matrix in enumerate(w):
            who = heads[n] if n < len(heads) else {"batch": 0, "head": n}
            lines.append("")
            lines.append(f"weights, batch {who['batch']} head {who['head']}  (· = exactly 0)")
            lines += _matrix(matrix)
            if n < len(heads):
                h = heads[n]
                flags = [name for name in ("collapsed", "uniform") if h.get(name)]
                lines.append(
                    f"mean entropy {h['mean_entropy']:.4f} nats · normalized {h['mean_normalized_entropy']:.4f} · "
                    f"mean distance {h['mean_distance']:.4f}" + (f" · {', '.join(flags)}" if flags else "")
                )
    if diag:
        lines.append("")
        lines.append(
            f"fully masked rows {diag.get('fully_masked_rows', 0)} · saturated rows {diag.get('saturated_rows', 0)} · "
            f"max |row sum - 1| {float(diag.get('row_sum_max_error', 0.0)):.2e} · "
            f"non-finite {diag.get('non_finite', 0)}"
        )
    engine = _engine(result.engine)
    if engine:
        lines.append(engine)
    return "\n".join(lines).strip() + "\n"


def sample_text(result: SampleResult) -> str:
    lines: list[str] = []
    if result.tokens is not None:
        lines.append("tokens: " + np.array2string(result.tokens, separator=", "))
    if result.logprobs is not None:
        lines.append("logprobs: " + np.array2string(result.logprobs, precision=4, separator=", "))
    lines.append(f"seed: {result.seed}")
    if result.probabilities is not None:
        for r, p in enumerate(_rows(result.probabilities)):
            lines.append("")
            lines.append(f"final distribution{f', row {r}' if result.probabilities.ndim > 1 else ''}")
            lines += distribution_table(None, p, "p")
    diagnostics = result.diagnostics
    rows = diagnostics if isinstance(diagnostics, list) else [diagnostics] if isinstance(diagnostics, dict) else []
    for r, d in enumerate(rows):
        if isinstance(d, dict):
            parts = " · ".join(f"{k} {_num(v)}" for k, v in d.items())
            lines.append(f"row {r}: {parts}" if len(rows) > 1 else parts)
    return "\n".join(lines).strip() + "\n"


def _num(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4f}"
    if isinstance(v, list):
        return "[" + ", ".join(_num(x) for x in v) + "]"
    return str(v)


def as_json(result: Any) -> Any:
    """A result as plain JSON values: arrays as nested lists (-inf as null), no raw wire body."""
    if dataclasses.is_dataclass(result) and not isinstance(result, type):
        return {f.name: as_json(getattr(result, f.name)) for f in dataclasses.fields(result) if f.name != "raw"}
    if isinstance(result, np.ndarray):
        return as_json(result.tolist())
    if isinstance(result, float) and not math.isfinite(result):
        return None
    if isinstance(result, dict):
        return {str(k): as_json(v) for k, v in result.items()}
    if isinstance(result, (list, tuple)):
        return [as_json(v) for v in result]
    if isinstance(result, np.generic):
        return as_json(result.item())
    return result
