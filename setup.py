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

import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py


class BuildPy(build_py):
    """setuptools' build_py, with ``build/lib`` holding this distribution's packages only.

    A wheel takes everything under ``build/lib``, which setuptools never cleans: a checkout that built a
    wheel when this distribution still carried ``attention_client`` would ship it again from there.
    """

    def run(self) -> None:
        own = {name.split(".")[0] for name in self.packages or []}
        base = Path(self.build_lib)
        if base.is_dir():
            for entry in base.iterdir():
                if entry.is_dir() and entry.name not in own:
                    shutil.rmtree(entry)
        super().run()


setup(
    cmdclass={"build_py": BuildPy},
    packages=[*find_packages(include=["service", "service.*"]), "service.models"],
    package_dir={"service.models": "models"},
    package_data={
        "service.models": ["*.onnx", "manifest.json"],
        "service.playground": ["static/*"],
    },
)
