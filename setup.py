"""Package layout that pyproject.toml cannot say on its own.

The ONNX graphs stay in the repository's top-level ``models/`` (the export
writes there and every branch re-exports into it) and ship inside the package
as ``service/models/`` (package data, found through ``importlib.resources``):
``package_dir`` maps the one onto the other for wheels, sdists and editable
installs alike. The Python client (``clients/python``, its own distribution
``attention-client``) is mapped in the same way as the package ``attention_client``,
so that ``service.client`` and the command line work from the server's install.
Everything else is in pyproject.toml.
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["service", "service.*"]), "service.models", "attention_client"],
    package_dir={"service.models": "models", "attention_client": "clients/python/attention_client"},
    package_data={
        "service.models": ["*.onnx", "manifest.json"],
        "service.playground": ["static/*"],
        "attention_client": ["py.typed"],
    },
)
