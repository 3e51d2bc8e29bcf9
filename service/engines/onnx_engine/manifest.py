"""The models directory against its manifest: every graph file present, with the sha256 the manifest lists."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

MANIFEST_NAME = "manifest.json"


class ModelCheckError(RuntimeError):
    """The models directory does not match its manifest (missing file, wrong hash, bad manifest).

    ``str(exc)`` is fit for clients (file names relative to the models directory, no hash);
    ``detail`` adds what only the server's log should show (the hashes).
    """

    def __init__(self, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.detail = detail or message


def verify_models(models_dir: Path) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Read the manifest and every model file, checking each file's sha256.

    Returns (manifest, {graph name: file bytes}); raises :class:`ModelCheckError`
    naming the first file that is missing or whose hash differs. The messages
    name files relative to the models directory: they reach clients' answers (not
    ready), which must not show the server's file system (the log line names the folder).
    """
    manifest_path = models_dir / MANIFEST_NAME
    try:
        manifest = json.loads(manifest_path.read_text())
        graphs = manifest["graphs"]
    except FileNotFoundError:
        raise ModelCheckError(
            f"model manifest {MANIFEST_NAME} is missing from the models directory "
            "(set ATTN_MODELS_DIR, or run `python -m service export-models --out DIR`)"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelCheckError(f"model manifest {MANIFEST_NAME} is unreadable: {type(exc).__name__}") from None
    blobs: dict[str, bytes] = {}
    for g in graphs:
        path = models_dir / g["file"]
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ModelCheckError(
                f"model file {g['file']} listed in the manifest cannot be read: {exc.strerror or type(exc).__name__}"
            ) from None
        digest = hashlib.sha256(data).hexdigest()
        if digest != g["sha256"]:
            raise ModelCheckError(
                f"model file {g['file']} is corrupted: its sha256 does not match the manifest's",
                f"model file {g['file']} is corrupted: sha256 {digest} does not match the manifest's {g['sha256']}",
            )
        blobs[g["name"]] = data
    return manifest, blobs


def models_source(models_dir: Path) -> str:
    """Where the graphs come from, in words (answers to clients name no server path)."""
    from service.models_location import checkout_models_dir, packaged_models_dir

    resolved = models_dir.resolve()
    for source, candidate in (("package", packaged_models_dir()), ("checkout", checkout_models_dir())):
        if candidate is not None and candidate.resolve() == resolved:
            return source
    return "ATTN_MODELS_DIR"


def models_listing(
    models_dir: Path, manifest: dict[str, Any] | None, error: str | None, timings: dict[str, dict[str, float]]
) -> dict[str, Any]:
    """JSON-ready manifest for /v1/models: the one verified at start-up, else the file as it is (unverified)."""
    if manifest is not None:
        verified = True
    else:
        try:
            manifest = json.loads((models_dir / MANIFEST_NAME).read_text())
        except (OSError, ValueError):
            manifest = {"graphs": []}
        verified = False
    assert manifest is not None
    return {
        "models_source": models_source(models_dir),
        "verified": verified,
        "error": error,
        "opset": manifest.get("opset"),
        "ir_version": manifest.get("ir_version"),
        "models": [
            {
                # the hash stays on the server: "verified" says it matched at start-up
                **{k: v for k, v in g.items() if k != "sha256"},
                "verified": verified,
                **({"timing": timings[g["name"]]} if g.get("name") in timings else {}),
            }
            for g in manifest.get("graphs", [])
        ],
    }
