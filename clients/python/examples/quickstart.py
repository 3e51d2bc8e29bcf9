"""Attention and softmax from numpy, against a running service.

python quickstart.py [URL]          # default http://127.0.0.1:8000; API key from $ATTENTION_API_KEY
"""

from __future__ import annotations

import sys

import numpy as np
from attention_client import AttentionClient


def main(url: str) -> None:
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 4, 6, 16), dtype=np.float32)  # (batch, heads, queries, head dim)
    k = rng.standard_normal((1, 2, 6, 16), dtype=np.float32)  # grouped-query: 2 key/value heads
    v = rng.standard_normal((1, 2, 6, 16), dtype=np.float32)
    with AttentionClient(url) as client:
        r = client.attention(q, k, v, causal=True, normalizer="entmax15")  # output, weights, diagnostics
        print(f"output {r.output.shape} {r.output.dtype}, weights {r.weights.shape}, engine {r.engine.name}")
        print("upper triangle of head 0 is zero:", bool(np.all(np.triu(r.weights[0, 0], 1) == 0)))
        print("mean entropy per head:", [round(h["mean_entropy"], 4) for h in r.diagnostics["heads"]])
        print("request id:", r.request_id)

        s = client.softmax([2.1, 0.5, -1.2, 3.0], log=True, precision="float64")
        print("softmax:", np.round(s.probabilities, 4).tolist())
        assert s.log_probabilities is not None
        print("log_softmax:", np.round(s.log_probabilities, 4).tolist())
        print("entropy:", round(float(s.diagnostics["entropy"]), 4))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000")
