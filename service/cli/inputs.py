"""Tensors from the command line: ``.npy``, ``.npz`` (``file.npz:name``), JSON files, inline numbers, or ``-``
for standard input.

Inline: ``1.0,0.5,2.5`` is a row; ``;`` separates rows (``1,2;3,4`` is 2x2). JSON: a nested list, or a
wire-form object (``{"shape", "dtype", "data"}`` or ``{"shape", "dtype", "b64"}``). ``-`` reads standard
input as bytes and tells the format by its content: ``.npy`` (numpy's magic string), ``.npz`` (a zip
archive; ``--value=-:NAME`` picks a member, by default the option's name, so ``--query - --key -`` can
read one archive), JSON, or inline numbers. Standard input is read once; options that name ``-`` share it.
"""

from __future__ import annotations

import binascii
import io
import json
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGIC = b"PK\x03\x04"

_stdin: bytes | None = None


class InputError(ValueError):
    """A command-line input that cannot be read (a usage error: exit status 2)."""


def stdin_bytes() -> bytes:
    """Standard input, read once as bytes (binary-safe)."""
    global _stdin
    if _stdin is None:
        _stdin = sys.stdin.buffer.read()
    return _stdin


def read_tensor(text: str, name: str, *, mask: bool = False) -> npt.NDArray[Any]:
    """The array that ``text`` names or spells out; ``name`` is the option (and an ``.npz`` file's default member)."""
    if text == "-" or text.startswith("-:"):
        return _from_stdin(text[2:] or name, name, mask=mask)
    path, member = text, ""
    if ".npz:" in text:
        path, _, member = text.rpartition(":")
    file = Path(path)
    if file.suffix in (".npy", ".npz", ".json") or _is_file(file):
        return _from_file(file, member or name, name)
    try:
        return _inline_array(text, mask=mask)
    except ValueError as exc:
        raise InputError(f"--{name}: {exc}") from None


def _is_file(file: Path) -> bool:
    """Whether ``file`` names something on disk; False for text no file can be named (an inline list of 20,000
    numbers is longer than a file name may be: ``exists`` raised "File name too long").
    """
    try:
        return file.exists()
    except OSError:
        return False


def _from_stdin(member: str, name: str, *, mask: bool) -> npt.NDArray[Any]:
    data = stdin_bytes()
    where = "standard input"
    if not data.strip():
        raise InputError(f"--{name}: {where} is empty")
    try:
        if data.startswith(NPY_MAGIC):
            return np.asarray(np.load(io.BytesIO(data), allow_pickle=False))
        if data.startswith(ZIP_MAGIC):
            with np.load(io.BytesIO(data), allow_pickle=False) as archive:
                return _member(archive, member, name, where, f"--{name}=-:NAME")
    except InputError:
        raise
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        raise InputError(f"--{name}: cannot read {where}: {exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"--{name}: {where} is neither .npy, .npz, JSON nor numbers") from None
    stripped = text.strip()
    if stripped[:1] in ("[", "{"):
        try:
            return _from_json(json.loads(stripped))
        except (ValueError, KeyError, TypeError) as exc:
            raise InputError(f"--{name}: cannot read {where} as JSON: {exc}") from None
    try:
        return _inline_array(stripped.replace("\n", ";"), mask=mask)
    except ValueError as exc:
        raise InputError(f"--{name}: {where}: {exc}") from None


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


def _member(archive: Any, member: str, name: str, where: str, how: str) -> npt.NDArray[Any]:
    if member not in archive.files:
        raise InputError(
            f"--{name}: {where} has no array {member!r} (it has {', '.join(archive.files)}); name one as {how}"
        )
    return np.asarray(archive[member])


def _from_file(file: Path, member: str, name: str) -> npt.NDArray[Any]:
    if not file.exists():
        raise InputError(f"--{name}: no file {str(file)!r}")
    try:
        if file.suffix == ".npy":
            return np.asarray(np.load(file, allow_pickle=False))
        if file.suffix == ".npz":
            with np.load(file, allow_pickle=False) as archive:
                return _member(archive, member, name, repr(str(file)), f"{file}:NAME")
        return _from_json(json.loads(file.read_text()))
    except InputError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"--{name}: cannot read {str(file)!r}: {exc}") from None


def _from_json(data: Any) -> npt.NDArray[Any]:
    if isinstance(data, dict):
        return decode_wire(data)
    return np.asarray(data, dtype=_json_dtype(data))


def decode_wire(value: dict[str, Any]) -> npt.NDArray[Any]:
    """A wire-form tensor (``{"shape", "dtype", "b64"}`` little-endian C order, or ``{"shape", "dtype", "data"}``)."""
    name = str(value["dtype"])
    dtype = np.dtype(np.bool_) if name == "bool" else np.dtype(name).newbyteorder("<")
    if "b64" in value:
        raw = binascii.a2b_base64(value["b64"])
        array = np.frombuffer(bytearray(raw), dtype=dtype).reshape(value["shape"])
    else:
        array = np.array(value["data"], dtype=dtype).reshape(value["shape"])
    return array if dtype == np.bool_ else array.astype(dtype.newbyteorder("="), copy=False)


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


def read_int_rows(text: str, name: str) -> list[int] | list[list[int]]:
    """Integers, or rows of them separated by ``;`` (``0,2;1``: one list per row)."""
    if ";" not in text:
        return read_ints(text, name)
    return [read_ints(row, name) for row in text.split(";")]


def read_floats(text: str, name: str) -> list[float]:
    """A comma-separated list of numbers (``0.5,1,2``)."""
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InputError(f"--{name}: expected numbers separated by commas, got {text!r}") from None


def read_labels(text: str, name: str) -> list[int]:
    """Class indices: inline (``0,2,1``) or any tensor input holding integers."""
    flat = np.ravel(read_tensor(text, name))
    if flat.dtype == np.bool_ or (flat.size and not np.all(np.isfinite(flat) & (flat == np.round(flat)))):
        raise InputError(f"--{name}: class indices must be integers")
    return [int(v) for v in flat]
