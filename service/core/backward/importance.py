"""Head importance (Michel, Levy and Neubig 2019, "Are Sixteen Heads Really Better than One?").

Gate each head's output with a scalar ``xi_h`` (1 in the model as it is): ``O_h -> xi_h O_h``. The importance of
head ``h`` for one example is how much the loss moves when the gate moves, ``|dL / d xi_h|`` at ``xi_h = 1``, and
since ``O_h`` is linear in ``xi_h``,

    dL / d xi_h = sum over query rows l and value features d of dL/dO[b, h, l, d] * O[b, h, l, d]

with ``dL/dO`` the upstream gradient a backward request carries (``grad_output``). This is the unnormalised,
per-example form: Michel et al. average its absolute value over a dataset, and Hugging Face's bertology script
then divides each layer's scores by their L2 norm (``importance / ||importance_layer||_2``); both are steps over
many requests, left to the client (docs/concepts/diagnostics.md, "Head importance").
"""

from __future__ import annotations

import numpy as np

from service.core.attention import promote_to_4d


def head_importance(output: np.ndarray, grad_output: np.ndarray) -> np.ndarray:
    """``|sum_{l, d} grad_output * output|`` per (batch, query head), shape ``(B, H)``, summed in float64 and
    returned in the output's dtype. Ranks 2 and 3 are promoted (their missing leading axes have size 1).
    """
    o = promote_to_4d(output)
    g = promote_to_4d(grad_output)
    if o.shape != g.shape:
        raise ValueError(f"output {o.shape} and grad_output {g.shape} differ")
    total: np.ndarray = np.einsum("bhld,bhld->bh", o.astype(np.float64, copy=False), g.astype(np.float64, copy=False))
    importance: np.ndarray = np.abs(total).astype(output.dtype, copy=False)
    return importance
