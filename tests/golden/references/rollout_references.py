"""Writes tests/golden/rollout.json: attention rollout computed by jacobgil/vit-explain's own torch code.

Not part of the service or its tests: run it in a virtual environment with PyTorch, e.g.

    python -m venv /tmp/tl && /tmp/tl/bin/pip install torch
    /tmp/tl/bin/python tests/golden/references/rollout_references.py > tests/golden/rollout.json

``rollout`` below is vit-explain's ``rollout`` (vit_rollout.py, https://github.com/jacobgil/vit-explain, MIT
licence, commit 1d68f22) copied with three changes, each marked ``# changed``:

1. its axis bug corrected: ``a / a.sum(dim=-1)`` broadcasts the row sums along the last axis (column ``j`` is
   divided by row ``j``'s sum); here ``keepdim=True`` divides each row by its own sum, as Abnar and Zuidema's
   rollout does;
2. it returns the rollout matrix ``result`` ``[1, L, L]``, where vit-explain goes on to cut row 0's patches into a
   square image mask;
3. an unknown head fusion raises ``ValueError`` (vit-explain raises a string, itself a ``TypeError``).

``grad_rollout`` is vit-explain's ``grad_rollout`` (vit_grad_rollout.py, commit 311da9a) with the same three changes,
and with Chefer et al.'s head fusion: ``(grad * A).clamp(min=0).mean(heads)``, the positive part before the mean,
``avg_heads`` (rule 5) of hila-chefer/Transformer-MM-Explainability ("Generic Attention-model Explainability for
Interpreting Bi-Modal and Encoder-Decoder Transformers", ICCV 2021), where vit-explain takes the mean and then zeroes
the negative entries. Its discard keeps the first token's own weight, as ``rollout`` does (the line
``indices = indices[indices != 0]`` is commented out in vit-explain's ``grad_rollout``, restored here).

Both run in float64 (``torch.set_default_dtype``: vit-explain's ``torch.eye`` is the default dtype), batch 1 (both
functions discard in batch entry 0 only). The stacks are random softmax weights (some layers causal, some with a
fully masked query row), with ``discard_ratio`` 0 or above; ``float32`` cases hold float32-representable weights
(rows sum to 1 within float32's rounding) and the rollout of exactly those values. Every fused value is distinct
but for exact zeros, so torch's ``topk`` and the service pick the same entries to discard (zeros tied at the
boundary are zeros either way).
"""

from __future__ import annotations

import datetime
import json
import sys

import numpy as np
import torch


def rollout(attentions, discard_ratio, head_fusion):  # type: ignore[no-untyped-def]  # vit-explain's signature
    result = torch.eye(attentions[0].size(-1))
    with torch.no_grad():
        for attention in attentions:
            if head_fusion == "mean":
                attention_heads_fused = attention.mean(axis=1)
            elif head_fusion == "max":
                attention_heads_fused = attention.max(axis=1)[0]
            elif head_fusion == "min":
                attention_heads_fused = attention.min(axis=1)[0]
            else:
                raise ValueError("Attention head fusion type Not supported")  # changed (3)

            # Drop the lowest attentions, but
            # don't drop the class token
            flat = attention_heads_fused.view(attention_heads_fused.size(0), -1)
            _, indices = flat.topk(int(flat.size(-1) * discard_ratio), -1, False)
            indices = indices[indices != 0]
            flat[0, indices] = 0

            I = torch.eye(attention_heads_fused.size(-1))  # noqa: E741 -- vit-explain's name
            a = (attention_heads_fused + 1.0 * I) / 2
            a = a / a.sum(dim=-1, keepdim=True)  # changed (1): keepdim, each row by its own sum

            result = torch.matmul(a, result)
    return result  # changed (2): the rollout itself


def grad_rollout(attentions, gradients, discard_ratio):  # type: ignore[no-untyped-def]  # vit-explain's signature
    result = torch.eye(attentions[0].size(-1))
    with torch.no_grad():
        for attention, grad in zip(attentions, gradients, strict=True):
            weights = grad
            attention_heads_fused = (attention * weights).clamp(min=0).mean(axis=1)  # Chefer et al.'s rule 5

            # Drop the lowest attentions, but
            # don't drop the class token
            flat = attention_heads_fused.view(attention_heads_fused.size(0), -1)
            _, indices = flat.topk(int(flat.size(-1) * discard_ratio), -1, False)
            indices = indices[indices != 0]  # restored, as in rollout
            flat[0, indices] = 0

            I = torch.eye(attention_heads_fused.size(-1))  # noqa: E741 -- vit-explain's name
            a = (attention_heads_fused + 1.0 * I) / 2
            a = a / a.sum(dim=-1, keepdim=True)  # changed (1)
            result = torch.matmul(a, result)
    return result  # changed (2)


def stack(rng: np.random.Generator, layers: int, heads: int, length: int, float32: bool) -> np.ndarray:
    """Random softmax weights [layers, 1, heads, L, L]: some layers causal, some with a fully masked query row."""
    out = np.empty((layers, 1, heads, length, length))
    for layer in range(layers):
        logits = rng.standard_normal((heads, length, length)) * float(rng.choice([0.5, 2.0, 5.0]))
        if rng.random() < 0.4:
            logits[:, np.triu_indices(length, 1)[0], np.triu_indices(length, 1)[1]] = -np.inf
        weights = np.exp(logits - logits.max(axis=-1, keepdims=True))
        weights /= weights.sum(axis=-1, keepdims=True)
        if length > 2 and rng.random() < 0.25:
            weights[:, int(rng.integers(1, length))] = 0.0  # a fully masked query (a padding position)
        out[layer, 0] = weights
    return out.astype(np.float32).astype(np.float64) if float32 else out


def main() -> int:
    torch.set_default_dtype(torch.float64)
    rng = np.random.default_rng(2026_11_28)
    cases = []
    for i in range(24):
        layers, heads, length = int(rng.integers(1, 5)), int(rng.integers(1, 5)), int(rng.integers(2, 7))
        float32 = i % 3 == 2
        weights = stack(rng, layers, heads, length, float32)
        discard_ratio = float(rng.choice([0.0, 0.0, 0.3, 0.6, 0.9]))
        attentions = [torch.tensor(w) for w in weights]
        if i < 16:
            head_fusion = ("mean", "max", "min")[i % 3]
            gradients = None
            expected = rollout(attentions, discard_ratio, head_fusion)
        else:
            head_fusion = "mean"
            gradients = rng.standard_normal(weights.shape)
            if float32:
                gradients = gradients.astype(np.float32).astype(np.float64)
            expected = grad_rollout(attentions, [torch.tensor(g) for g in gradients], discard_ratio)
        cases.append(
            {
                "weights": weights.tolist(),
                "gradients": None if gradients is None else gradients.tolist(),
                "head_fusion": head_fusion,
                "discard_ratio": discard_ratio,
                "dtype": "float32" if float32 else "float64",
                "expected": expected.numpy().tolist(),
            }
        )
    json.dump(
        {
            "about": (
                "Attention rollout (residual 0.5, batch 1) by jacobgil/vit-explain's rollout and grad_rollout, with "
                "the row-normalisation axis corrected and Chefer et al. 2021's head fusion in grad_rollout: computed "
                f"by tests/golden/references/rollout_references.py with torch {torch.__version__} on "
                f"{datetime.date.today().isoformat()}, in float64. The service's own code did not compute them."
            ),
            "cases": cases,
        },
        sys.stdout,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
