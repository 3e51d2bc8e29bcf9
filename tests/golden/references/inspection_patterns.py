"""Writes tests/golden/inspection.json: head pattern scores computed by TransformerLens itself.

Not part of the service or its tests: run it in a virtual environment with ``transformer_lens`` (and PyTorch), e.g.

    python -m venv /tmp/tl && /tmp/tl/bin/pip install torch transformer_lens
    /tmp/tl/bin/python tests/golden/references/inspection_patterns.py > tests/golden/inspection.json

Each case is one head's attention pattern (random, lower triangular, rows summing to 1) over a random token
sequence with repeats, scored by ``transformer_lens.head_detector``'s own functions: the three
``get_*_detection_pattern`` and ``compute_head_attention_similarity_score`` with ``error_measure="mul"``, for each
combination of ``exclude_bos`` and ``exclude_current_token`` (on a copy: the function writes into its input).
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import sys

import numpy as np
import torch
from transformer_lens import head_detector

HEADS = ("previous_token_head", "duplicate_token_head", "induction_head")


def main() -> int:
    rng = np.random.default_rng(2026_11_27)
    cases = []
    for i in range(24):
        seq = int(rng.integers(2, 13))
        vocab = int(rng.integers(2, 6))
        tokens = rng.integers(0, vocab, size=seq)
        logits = rng.standard_normal((seq, seq)) * float(rng.choice([0.5, 2.0, 6.0]))
        logits[np.triu_indices(seq, 1)] = -np.inf
        weights = np.exp(logits - logits.max(axis=1, keepdims=True))
        weights /= weights.sum(axis=1, keepdims=True)
        exclude_bos, exclude_current = bool(i % 2), bool((i // 2) % 2)
        t = torch.tensor(tokens)[None, :]
        scores = {}
        for head in HEADS:
            detection = getattr(head_detector, f"get_{head}_detection_pattern")(t)
            scores[head] = head_detector.compute_head_attention_similarity_score(
                torch.tensor(weights, dtype=torch.float64).clone(),
                detection_pattern=detection.to(torch.float64),
                exclude_bos=exclude_bos,
                exclude_current_token=exclude_current,
                error_measure="mul",
            )
        cases.append(
            {
                "tokens": tokens.tolist(),
                "weights": weights.tolist(),
                "exclude_bos": exclude_bos,
                "exclude_current_token": exclude_current,
                "expected": scores,
            }
        )
    json.dump(
        {
            "about": (
                "Head pattern scores (TransformerLens head_detector, error_measure 'mul') of random attention "
                "patterns: "
                "computed by tests/golden/references/inspection_patterns.py with transformer_lens "
                f"{importlib.metadata.version('transformer_lens')} and torch {torch.__version__} on "
                f"{datetime.date.today().isoformat()}, in float64. The service's own code did not compute them."
            ),
            "cases": cases,
        },
        sys.stdout,
        indent=1,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
