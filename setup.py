"""Package layout that pyproject.toml cannot say on its own.

The ONNX graphs stay in the repository's top-level ``models/`` (the export
writes there and every branch re-exports into it) and ship inside the package
as ``service/models/`` (package data, found through ``importlib.resources``):
``package_dir`` maps the one onto the other for wheels, sdists and editable
installs alike. Everything else is in pyproject.toml.

The Python client (``clients/python``, import ``attention_client``) is not part
of this distribution: it is its own, ``attention-client``, the one owner of that
package. The ``client`` extra depends on it (``service.client`` and the command
line's remote calls use it when it is installed).
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["service", "service.*"]), "service.models"],
    package_dir={"service.models": "models"},
    package_data={
        "service.models": ["*.onnx", "manifest.json"],
        "service.playground": ["static/*"],
    },
)
