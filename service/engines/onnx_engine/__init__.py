"""The ONNX engine: the graphs of models/ run by ONNX Runtime on the best available provider.

Layout:

- ``manifest``: the models directory checked against its manifest (:func:`verify_models`), and its listing.
- ``providers``: which execution providers to request (:func:`choose_providers`), and what onnxruntime offers.
- ``heap``: the C heap's free memory given back to the OS after large runs (:func:`release_free_heap`), and
  whether malloc asks for transparent huge pages (:func:`malloc_huge_pages`, :func:`huge_pages_environment`).
- ``sessions``: one warmed-up onnxruntime session per graph, with the engine's options.
- ``routing``: which graph serves a request (normalizer, dtype, outputs, masking).
- ``feeds``: a graph's inputs for a request, validated and masked as the numpy reference does.
- ``forward``: the forward graph's outputs turned into an attention result, the contract checked.
- ``backward``: the backward graph's outputs turned into a backward result (mask, scale, temperature gradients).
- ``engine``: :class:`OnnxEngine`, its lifecycle, its runs and what it reports.
"""

from __future__ import annotations

from service.engines.onnx_engine.engine import OnnxEngine
from service.engines.onnx_engine.heap import (
    TRIM_AFTER_BYTES,
    huge_pages_environment,
    malloc_huge_pages,
    release_free_heap,
)
from service.engines.onnx_engine.manifest import MANIFEST_NAME, ModelCheckError, models_source, verify_models
from service.engines.onnx_engine.providers import PREFERRED_PROVIDERS, PROVIDER_ALIASES, choose_providers
from service.engines.onnx_engine.routing import SUPPORTED_DTYPES
from service.engines.onnx_engine.sessions import OPTIMIZATION_LEVELS

__all__ = [
    "MANIFEST_NAME",
    "OPTIMIZATION_LEVELS",
    "PREFERRED_PROVIDERS",
    "PROVIDER_ALIASES",
    "SUPPORTED_DTYPES",
    "TRIM_AFTER_BYTES",
    "ModelCheckError",
    "OnnxEngine",
    "choose_providers",
    "huge_pages_environment",
    "malloc_huge_pages",
    "models_source",
    "release_free_heap",
    "verify_models",
]
