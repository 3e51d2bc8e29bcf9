"""Export the attention graphs to ``models/`` with a manifest.

``python -m service.export [--out DIR]`` (also ``python -m service export-models``;
default: the checkout's ``models/``, else ``./models``, never site-packages)
writes one ``.onnx`` file per graph of :data:`service.export.graphs.GRAPHS` and
``manifest.json`` listing each file's inputs, outputs, opset, IR version, what it
supports and its sha256. The export is deterministic: re-running it gives
byte-identical files, and a test checks the committed files against a fresh export.

Layout:

- ``builder``: a small deterministic wrapper around ``onnx.helper`` (:class:`~.builder.GraphBuilder`).
- ``graphs``: every attention graph, built with the builder (:data:`~service.export.graphs.GRAPHS`).
- ``__main__``: ``python -m service.export``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

import onnx

from service.export.builder import IR_VERSION, OPSET, PRODUCER_NAME, PRODUCER_VERSION, serialize
from service.export.graphs import BISECT_ITERATIONS, GRAPHS, GraphSpec
from service.models_location import MANIFEST_NAME, default_export_dir

DEFAULT_MODELS_DIR = default_export_dir()
MANIFEST_FORMAT = 1

_DTYPE_NAMES: dict[int, str] = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.BOOL: "bool",
    onnx.TensorProto.INT64: "int64",
}


def _value_info(vi: onnx.ValueInfoProto) -> dict[str, Any]:
    t = vi.type.tensor_type
    shape = [d.dim_param if d.HasField("dim_param") else d.dim_value for d in t.shape.dim]
    entry: dict[str, Any] = {"name": vi.name, "dtype": _DTYPE_NAMES[t.elem_type], "shape": shape}
    if vi.doc_string:
        entry["doc"] = vi.doc_string
    return entry


def manifest_entry(spec: GraphSpec, model: onnx.ModelProto, data: bytes) -> dict[str, Any]:
    """The manifest record of one exported graph."""
    return {
        "name": spec.name,
        "file": spec.file,
        "sha256": hashlib.sha256(data).hexdigest(),
        "bytes": len(data),
        "opset": OPSET,
        "ir_version": model.ir_version,
        "description": spec.description,
        "inputs": [_value_info(vi) for vi in model.graph.input],
        "outputs": [_value_info(vi) for vi in model.graph.output],
        "supports": spec.supports(),
    }


def build_all() -> list[tuple[GraphSpec, onnx.ModelProto, bytes]]:
    """Build and check every graph in memory: (spec, model, serialized bytes)."""
    built = []
    for spec in GRAPHS:
        model = spec.model()
        onnx.checker.check_model(model, full_check=True)
        built.append((spec, model, serialize(model)))
    return built


def manifest_bytes(manifest: dict[str, Any]) -> bytes:
    return (json.dumps(manifest, indent=2, ensure_ascii=True) + "\n").encode("ascii")


def export_models(directory: str | Path = DEFAULT_MODELS_DIR) -> dict[str, Any]:
    """Write every graph and ``manifest.json`` into ``directory``; returns the manifest.

    Files of graphs no longer exported are left alone; the manifest lists exactly
    the current set. Files whose bytes already match are not rewritten.
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    for spec, model, data in build_all():
        _write_if_changed(out / spec.file, data)
        entries.append(manifest_entry(spec, model, data))
    manifest = {
        "format": MANIFEST_FORMAT,
        "producer": {"name": PRODUCER_NAME, "version": PRODUCER_VERSION},
        "opset": OPSET,
        "ir_version": IR_VERSION,
        "entmax_bisect_iterations": BISECT_ITERATIONS,
        "graphs": entries,
    }
    _write_if_changed(out / MANIFEST_NAME, manifest_bytes(manifest))
    return manifest


def _write_if_changed(path: Path, data: bytes) -> None:
    if path.exists() and path.read_bytes() == data:
        return
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m service.export", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(DEFAULT_MODELS_DIR), help="directory to write (default: %(default)s)")
    args = parser.parse_args(argv)
    manifest = export_models(args.out)
    for g in manifest["graphs"]:
        print(f"{g['file']:<36} {g['bytes']:>7} bytes  sha256 {g['sha256'][:16]}")
    print(f"wrote {len(manifest['graphs'])} graphs and {MANIFEST_NAME} to {args.out}")
    return 0


__all__ = ["DEFAULT_MODELS_DIR", "MANIFEST_NAME", "build_all", "export_models", "main", "manifest_entry"]
