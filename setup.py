"""Package layout that pyproject.toml cannot say on its own.

The ONNX graphs stay in the repository's top-level ``models/`` (the export
writes there and every branch re-exports into it) and ship inside the package
as ``service/models/`` (package data, found through ``importlib.resources``):
``package_dir`` maps the one onto the other for wheels, sdists and editable
installs alike. Everything else is in pyproject.toml.
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["service", "service.*"]), "service.models"],
    package_dir={"service.models": "models"},
    package_data={"service.models": ["*.onnx", "manifest.json"]},
)
