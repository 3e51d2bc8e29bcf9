"""Readable tables of answers for a terminal, and plain JSON for machines.

Every renderer takes the answer as the service sent it, with its tensors decoded into numpy arrays
(:func:`decode_answer`), and the request's fields; it needs neither the client nor a server.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from service.cli.inputs import decode_wire

BAR_WIDTH = 30
MAX_ROWS = 16
"""Larger matrices are cut to their first 16 rows and columns on screen (``--json`` has them all)."""
MAX_SLICES = 8
"""Of a tensor with several (batch, head) slices, the first 8 are printed."""


def decode_answer(value: Any) -> Any:
    """The answer with every wire-form tensor (``{"shape", "dtype", "b64"|"data"}``) as a numpy array."""
    if isinstance(value, dict):
        if {"shape", "dtype"} <= value.keys() and ("b64" in value or "data" in value):
            return decode_wire(value)
        return {k: decode_answer(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode_answer(v) for v in value]
    return value


def as_json(value: Any) -> Any:
    """Plain JSON values: arrays as nested lists, non-finite numbers (a masked score's -inf) as null."""
    if isinstance(value, np.ndarray):
        return as_json(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): as_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [as_json(v) for v in value]
    if isinstance(value, np.generic):
        return as_json(value.item())
    return value


def bar(p: float) -> str:
    """A horizontal bar of ``p`` in [0, 1], in eighths of a character."""
    eighths = round(max(0.0, min(1.0, p)) * BAR_WIDTH * 8)
    full, part = divmod(eighths, 8)
    return "█" * full + ("" if part == 0 else " ▏▎▍▌▋▊▉"[part])


def _fmt(x: float, width: int = 8, digits: int = 4) -> str:
    if math.isinf(x):
        return f"{'-inf' if x < 0 else 'inf':>{width}}"
    return f"{x:>{width}.{digits}f}"


def _cell(x: float, zero_dot: bool) -> str:
    if zero_dot and x == 0:
        return "·"
    if not math.isfinite(x):
        return "nan" if math.isnan(x) else ("-inf" if x < 0 else "inf")
    if x == 0 or 1e-3 <= abs(x) < 1e4:
        return f"{x:.4f}"
    return f"{x:.3e}"


def distribution_table(scores: npt.NDArray[Any] | None, p: npt.NDArray[Any], label: str = "weight") -> list[str]:
    """One line per position: index, score, probability and its bar."""
    lines = [f"{'index':>5} {'score':>8} {label:>8}  "]
    for i, w in enumerate(p):
        score = "" if scores is None else _fmt(float(scores[i]), 8, 3)
        lines.append(f"{i:>5} {score:>8} {_fmt(float(w))}  {bar(float(w))}")
    return lines


def _rows(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    return a.reshape(-1, a.shape[-1]) if a.ndim > 1 else a.reshape(1, -1)


def matrix(w: npt.NDArray[Any], corner: str = "q\\k", *, zero_dot: bool = False) -> list[str]:
    """A 2-D array as a table (the first ``MAX_ROWS`` rows and columns), ``·`` for exact zeros if asked."""
    if w.ndim == 1:
        w = w.reshape(1, -1)
    rows, cols = w.shape
    cut_r, cut_c = min(rows, MAX_ROWS), min(cols, MAX_ROWS)
    cells = [[_cell(float(w[i, j]), zero_dot) for j in range(cut_c)] for i in range(cut_r)]
    width = max([8, *(len(c) + 2 for row in cells for c in row)])
    more = "    ..." if cols > cut_c else ""
    lines = [f"{corner:<4}" + "".join(f"{j:>{width}}" for j in range(cut_c)) + more]
    lines += [f"{i:>3} " + "".join(f"{c:>{width}}" for c in row) + more for i, row in enumerate(cells)]
    if rows > cut_r:
        lines.append(f"... {rows - cut_r} more rows")
    return lines


def _slices(a: npt.NDArray[Any]) -> list[tuple[tuple[int, ...], npt.NDArray[Any]]]:
    """The 2-D slices of an array with their leading indices (one slice, index (), for 1-D and 2-D)."""
    if a.ndim <= 2:
        return [((), a)]
    lead = a.shape[:-2]
    return [(index, a[index]) for index in np.ndindex(*lead)]


def _where(index: tuple[int, ...]) -> str:
    names = ["batch", "head"] if len(index) == 2 else ["head"] if len(index) == 1 else []
    return ", ".join(f"{n} {i}" for n, i in zip(names, index, strict=False)) or ", ".join(map(str, index))


def tensor_lines(name: str, a: npt.NDArray[Any], corner: str, *, zero_dot: bool = False) -> list[str]:
    """A titled tensor: its shape and dtype, then each (batch, head) slice as a table."""
    lines = [f"{name} {tuple(a.shape)} {a.dtype}"]
    slices = _slices(a)
    for index, part in slices[:MAX_SLICES]:
        if index:
            lines.append(f"{name}, {_where(index)}")
        lines += matrix(part, corner, zero_dot=zero_dot)
    if len(slices) > MAX_SLICES:
        lines.append(f"... {len(slices) - MAX_SLICES} more slices (--json has them all)")
    return lines


def _engine(answer: dict[str, Any]) -> str:
    engine = answer.get("engine")
    if not isinstance(engine, dict):
        return ""
    return f"engine {engine.get('name')} ({engine.get('provider')}): {engine.get('reason')}"


def _finish(lines: list[str]) -> str:
    return "\n".join(lines).strip() + "\n"


def softmax_text(answer: dict[str, Any], fields: dict[str, Any]) -> str:
    probs = _rows(np.asarray(answer["probabilities"], dtype=np.float64))
    scores = _rows(np.asarray(fields["logits"], dtype=np.float64))
    entropy = np.ravel((answer.get("diagnostics") or {}).get("entropy", []))
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
    log_probabilities = answer.get("log_probabilities")
    if log_probabilities is not None:
        lines.append("log-probabilities: " + np.array2string(log_probabilities, precision=4, separator=", "))
    return _finish(lines)


def _health(report: Any) -> list[str]:
    if not isinstance(report, dict):
        return []
    lines = [f"gradient health (a row's gradient vanishes below Jacobian norm {report.get('threshold')})"]
    for h in report.get("heads", []):
        lines.append(
            f"  batch {h['batch']} head {h['head']}: mean Jacobian norm {h['mean_jacobian_norm']:.4f} · "
            f"vanishing {h['vanishing_fraction']:.2%} of {h['rows']} rows"
        )
    return lines


def attention_text(answer: dict[str, Any], fields: dict[str, Any]) -> str:
    lines: list[str] = []
    output = answer.get("output")
    if output is not None:
        lines += tensor_lines("output", np.asarray(output), "q\\v")
    diag: dict[str, Any] = answer.get("diagnostics") or {}
    heads = diag.get("heads", [])
    for name in ("weights", "scores"):
        tensor = answer.get(name)
        if tensor is None:
            continue
        tensor = np.asarray(tensor)
        per_head = tensor.reshape((-1, *tensor.shape[-2:]))
        for n, part in enumerate(per_head[:MAX_SLICES]):
            who = heads[n] if name == "weights" and n < len(heads) else None
            lines.append("")
            where = f"batch {who['batch']} head {who['head']}" if who else _where(_lead(tensor, n))
            lines.append(f"{name}, {where}" + ("  (· = exactly 0)" if name == "weights" else ""))
            lines += matrix(part, zero_dot=name == "weights")
            if who is not None:
                flags = [flag for flag in ("collapsed", "uniform") if who.get(flag)]
                lines.append(
                    f"mean entropy {who['mean_entropy']:.4f} nats · normalized {who['mean_normalized_entropy']:.4f} · "
                    f"mean distance {who['mean_distance']:.4f}" + (f" · {', '.join(flags)}" if flags else "")
                )
        if len(per_head) > MAX_SLICES:
            lines.append(f"... {len(per_head) - MAX_SLICES} more heads (--json has them all)")
    if diag:
        lines.append("")
        if output is None and answer.get("weights") is None:
            for h in heads:
                lines.append(
                    f"batch {h['batch']} head {h['head']}: mean entropy {h['mean_entropy']:.4f} nats · "
                    f"normalized {h['mean_normalized_entropy']:.4f} · mean distance {h['mean_distance']:.4f}"
                )
        lines.append(
            f"fully masked rows {diag.get('fully_masked_rows', 0)} · saturated rows {diag.get('saturated_rows', 0)} · "
            f"max |row sum - 1| {float(diag.get('row_sum_max_error', 0.0)):.2e} · "
            f"non-finite {diag.get('non_finite', 0)}"
        )
    health = _health(answer.get("gradient_health"))
    if health:
        lines += ["", *health]
    engine = _engine(answer)
    if engine:
        lines.append(engine)
    return _finish(lines)


def _lead(tensor: npt.NDArray[Any], n: int) -> tuple[int, ...]:
    lead = tensor.shape[:-2]
    return tuple(int(i) for i in np.unravel_index(n, lead)) if lead else ()


GRADIENTS = {
    "grad_query": "q\\e",
    "grad_key": "k\\e",
    "grad_value": "k\\v",
    "grad_mask": "q\\k",
    "output": "q\\v",
    "weights": "q\\k",
}


def backward_text(answer: dict[str, Any], fields: dict[str, Any]) -> str:
    lines: list[str] = []
    for name, corner in GRADIENTS.items():
        tensor = answer.get(name)
        if tensor is not None:
            lines += [*tensor_lines(name, np.asarray(tensor), corner, zero_dot=name == "weights"), ""]
    for name in ("grad_scale", "grad_temperature"):
        if answer.get(name) is not None:
            lines.append(f"{name} {float(answer[name]):.6g}")
    health = _health(answer.get("gradient_health"))
    if health:
        lines += ["", *health]
    engine = _engine(answer)
    if engine:
        lines.append(engine)
    return _finish(lines)


ANALYZE_COLUMNS = [
    ("scale", "scale", "{:.4g}"),
    ("temperature", "T", "{:.4g}"),
    ("head_dim", "E", "{}"),
    ("score_std", "score std", "{:.4f}"),
    ("mean_entropy", "entropy", "{:.4f}"),
    ("mean_normalized_entropy", "normalized", "{:.4f}"),
    ("saturated_fraction", "saturated", "{:.2%}"),
    ("mean_jacobian_norm", "Jacobian", "{:.4f}"),
    ("vanishing_fraction", "vanishing", "{:.2%}"),
]


def analyze_text(answer: dict[str, Any], fields: dict[str, Any]) -> str:
    rows = answer.get("sweep") or []
    header = [title for _, title, _ in ANALYZE_COLUMNS]
    table = [
        [fmt.format(row[key]) if row.get(key) is not None else "" for key, _, fmt in ANALYZE_COLUMNS] for row in rows
    ]
    widths = [max(len(h), *(len(r[i]) for r in table)) for i, h in enumerate(header)] if table else map(len, header)
    widths = list(widths)
    lines = ["  ".join(f"{h:>{w}}" for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(f"{c:>{w}}" for c, w in zip(r, widths, strict=True)) for r in table]
    shape = answer.get("shape")
    about = [f"normalizer {answer.get('normalizer')}"]
    if shape is not None:
        about.append(f"scores {tuple(shape)}")
    if answer.get("seed") is not None:
        about.append(f"seed {answer['seed']}")
    if answer.get("vanishing_threshold") is not None:
        about.append(f"vanishing below {answer['vanishing_threshold']}")
    lines += ["", " · ".join(about)]
    return _finish(lines)


def sample_text(answer: dict[str, Any], fields: dict[str, Any]) -> str:
    lines: list[str] = []
    for name, precision in (("tokens", None), ("logprobs", 4), ("raw_logprobs", 4)):
        value = answer.get(name)
        if value is not None:
            lines.append(f"{name}: " + np.array2string(np.asarray(value), precision=precision, separator=", "))
    top = answer.get("top_logprobs")
    if top:
        per_row = top if isinstance(top[0], list) else [top]
        for r, entries in enumerate(per_row):
            listed = ", ".join(f"{e['token']} ({e['logprob']:.4f})" for e in entries)
            lines.append(f"top logprobs{f', row {r}' if len(per_row) > 1 else ''}: {listed}")
    lines.append(f"seed: {answer.get('seed')}")
    probabilities = answer.get("probabilities")
    if probabilities is not None:
        probabilities = np.asarray(probabilities)
        for r, p in enumerate(_rows(probabilities)):
            lines.append("")
            lines.append(f"final distribution{f', row {r}' if probabilities.ndim > 1 else ''}")
            lines += distribution_table(None, p, "p")
    diagnostics = answer.get("diagnostics")
    if isinstance(diagnostics, dict):
        lines.append(" · ".join(f"{k} {_num(v)}" for k, v in diagnostics.items()))
    return _finish(lines)


def calibrate_text(answer: dict[str, Any], fields: dict[str, Any]) -> str:
    nll, ece = answer.get("nll") or {}, answer.get("ece") or {}
    lines = [
        f"temperature {float(answer['temperature']):.4f}"
        + ("  (at an end of the search interval)" if answer.get("bounded") else "")
        + "  (divide the logits by it)",
        f"NLL {nll.get('before', math.nan):.4f} -> {nll.get('after', math.nan):.4f} · "
        f"ECE {ece.get('before', math.nan):.4f} -> {ece.get('after', math.nan):.4f} · "
        f"accuracy {float(answer.get('accuracy', math.nan)):.4f}",
    ]
    reliability = answer.get("reliability") or {}
    for when in ("before", "after"):
        bins = reliability.get(when)
        if not bins:
            continue
        lines += ["", f"reliability {when}", f"{'bin':>14} {'count':>6} {'confidence':>10} {'accuracy':>9}"]
        for b in bins:
            conf = "" if b.get("confidence") is None else f"{b['confidence']:.4f}"
            acc = "" if b.get("accuracy") is None else f"{b['accuracy']:.4f}"
            lines.append(f"({b['lower']:.3f}, {b['upper']:.3f}] {b['count']:>6} {conf:>10} {acc:>9}")
    return _finish(lines)


def _num(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4f}"
    if isinstance(v, list):
        return "[" + ", ".join(_num(x) for x in v) + "]"
    return str(v)
