"""The MLServer runtime of ``python -m bench peers``: softmax attention in numpy, as a custom ``mlserver.MLModel``.

Runs inside MLServer's own venv (``build/mlserver-venv``), never in the service's: ``bench/bench_peers.py`` copies
this file into the model folder it writes and names ``peers_runtime.AttentionRuntime`` as the model's
implementation (MLServer puts the model folder on its import path while loading it). Nothing else imports it.

The maths, float32 throughout: ``scores = q @ k^T / sqrt(E)``, softmax over the keys (the row's maximum
subtracted first), ``output = weights @ v``. Inputs ``query``, ``key`` and ``value`` (any rank from 2, the last
two axes (L, E) and (S, E), (S, Ev)) decoded with MLServer's ``NumpyCodec``; outputs ``output`` and ``weights``,
FP32, encoded with it too: the outputs the request names, both when it names none.
"""

from __future__ import annotations

import math

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.errors import InferenceError
from mlserver.types import InferenceRequest, InferenceResponse

OUTPUTS = ("output", "weights")


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(output, weights) of softmax attention, float32."""
    scale = np.float32(1.0 / math.sqrt(q.shape[-1]))
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return np.matmul(scores, v), scores


class AttentionRuntime(MLModel):
    async def load(self) -> bool:
        self.ready = True
        return self.ready

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        arrays = {i.name: NumpyCodec.decode_input(i) for i in payload.inputs}
        try:
            q, k, v = (np.asarray(arrays[n], dtype=np.float32) for n in ("query", "key", "value"))
        except KeyError as missing:
            raise InferenceError(f"input {missing} is required (query, key, value)") from None
        output, weights = attention(q, k, v)
        results = {"output": output, "weights": weights}
        wanted = [o.name for o in payload.outputs] if payload.outputs else list(OUTPUTS)
        unknown = [name for name in wanted if name not in results]
        if unknown:
            raise InferenceError(f"unknown outputs {unknown}; this model has {list(OUTPUTS)}")
        return InferenceResponse(
            model_name=self.name,
            model_version=self.version,
            id=payload.id,
            outputs=[NumpyCodec.encode_output(name, results[name]) for name in wanted],
        )
