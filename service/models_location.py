"""Where the exported ONNX graphs and their manifest are found.

They ship inside the package as ``service/models/`` (setup.py maps the
repository's top-level ``models/`` there), so an installed wheel finds them
through :mod:`importlib.resources` from any working directory. In a source
checkout or an editable install the package folder has no ``models/`` and the
repository's own ``models/`` is used. ``ATTN_MODELS_DIR`` overrides both
(:class:`service.settings.Settings`).

Kept free of onnx and onnxruntime imports: the server and the export both use it.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

MANIFEST_NAME = "manifest.json"
_PACKAGE_DIR = Path(__file__).resolve().parent


def packaged_models_dir() -> Path | None:
    """``service/models`` of an installed package, when it holds a manifest (wheels, sdists)."""
    try:
        candidate = resources.files("service").joinpath("models")
    except (ModuleNotFoundError, TypeError):  # pragma: no cover - service is this package
        return None
    # Installed packages are plain folders (pip never installs zipped); a zip import has no real path.
    if isinstance(candidate, Path) and (candidate / MANIFEST_NAME).is_file():
        return candidate
    return None


def checkout_models_dir() -> Path | None:
    """The repository's ``models/`` beside the package (source checkouts and editable installs)."""
    root = _PACKAGE_DIR.parent
    if (root / "pyproject.toml").is_file() and (root / "models").is_dir():
        return root / "models"
    return None


def default_models_dir() -> Path:
    """The graphs the server loads when ``ATTN_MODELS_DIR`` is not set.

    The packaged copy first, then a checkout's ``models/``; when neither exists
    (a broken install), the packaged location, whose absence the ONNX engine
    reports as a missing manifest.
    """
    return packaged_models_dir() or checkout_models_dir() or _PACKAGE_DIR / "models"


def default_export_dir() -> Path:
    """Where ``export-models`` writes without ``--out``: the checkout's ``models/``, else ``./models``.

    Never into site-packages: an installed package's files belong to pip (their
    hashes are in its RECORD); export elsewhere and point ``ATTN_MODELS_DIR`` there.
    """
    return checkout_models_dir() or Path.cwd() / "models"
