"""Tensors from the command line: ``.npy``, ``.npz`` (``file.npz:name``), JSON files, or inline numbers.

Inline: ``1.0,0.5,2.5`` is a row; ``;`` separates rows (``1,2;3,4`` is 2x2). JSON: a nested list, or a
wire-form object (``{"shape", "dtype", "data"}`` or ``{"shape", "dtype", "b64"}``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from attention_client import decode_tensor


class InputError(ValueError):
    """A command-line input that cannot be read (a usage error: exit status 2)."""


def read_tensor(text: str, name: str, *, mask: bool = False) -> npt.NDArray[Any]:
    """The array that ``text`` names or spells out; ``name`` is the option (and an ``.npz`` file's default member)."""
    path, member = text, ""
    if ".npz:" in text:
        path, _, member = text.rpartition(":")
    file = Path(path)
    if file.suffix in (".npy", ".npz", ".json") or file.exists():
        return _from_file(file, member or name, name)
    try:
        return _inline_array(text, mask=mask)
    except ValueError as exc:
        raise InputError(f"--{name}: {exc}") from None


def _inline_array(text: str, *, mask: bool) -> npt.NDArray[Any]:
    rows = [row.strip() for row in text.strip().split(";") if row.strip()]
    if not rows:
        raise ValueError("no numbers given")
    values = [[_number(v, mask) for v in row.split(",") if v.strip()] for row in rows]
    if len({len(r) for r in values}) != 1:
        raise ValueError(f"rows have different lengths: {[len(r) for r in values]}")
    array = np.array(values if len(values) > 1 else values[0])
    return array.astype(bool) if mask and array.dtype == bool else array.astype(np.float64)


def _number(text: str, mask: bool) -> float | bool:
    t = text.strip().lower()
    if mask and t in ("true", "false"):
        return t == "true"
    try:
        return float(t)
    except ValueError:
        raise ValueError(f"{text.strip()!r} is not a number") from None


def _from_file(file: Path, member: str, name: str) -> npt.NDArray[Any]:
    if not file.exists():
        raise InputError(f"--{name}: no file {str(file)!r}")
    try:
        if file.suffix == ".npy":
            return np.asarray(np.load(file, allow_pickle=False))
        if file.suffix == ".npz":
            with np.load(file, allow_pickle=False) as archive:
                if member not in archive.files:
                    raise InputError(
                        f"--{name}: {str(file)!r} has no array {member!r} (it has {', '.join(archive.files)}); "
                        f"name one as {file}:NAME"
                    )
                return np.asarray(archive[member])
        data = json.loads(file.read_text())
        return decode_tensor(data) if isinstance(data, dict) else np.asarray(data, dtype=_json_dtype(data))
    except InputError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"--{name}: cannot read {str(file)!r}: {exc}") from None


def _json_dtype(data: Any) -> type:
    flat = data
    while isinstance(flat, list) and flat:
        flat = flat[0]
    return bool if isinstance(flat, bool) else np.float64


def read_ints(text: str, name: str) -> list[int]:
    """A comma-separated list of integers (``0,2,2``)."""
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InputError(f"--{name}: expected integers separated by commas, got {text!r}") from None
