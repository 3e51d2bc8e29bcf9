"""Backward pass through attention, and the health of the gradients (docs/concepts/contract.md, "Gradients").

With ``Z = (scale * Q K^T + bias) / T`` the normalizer input (``-inf`` where
masked), ``A = normalizer(Z)`` and ``O = A V``, for an upstream gradient ``dO``
(and optionally ``dA_extra`` on the weights):

* ``dV = A^T dO``; ``dA = dO V^T + dA_extra``; ``dZ = backward(dA)`` (the
  normalizer's vector-Jacobian product, :func:`service.core.normalizers.normalize_backward`);
* ``dQ = (scale/T) dZ K``; ``dK = (scale/T) dZ^T Q``; the query heads sharing a
  key/value head (grouped-query attention) add their contributions to it;
* ``grad_mask = dZ / T`` summed over the axes the float mask broadcasts along;
* ``grad_scale = sum(dZ * Q K^T) / T``, computed as ``sum(Q * dQ) / scale``
  (the same number: ``sum(Q * dQ) = (scale/T) sum(dZ * Q K^T)``), so it costs no
  extra product;
* ``grad_temperature = -sum(dZ * Z) / T`` over unmasked positions.

ReLU is the exception to the order above: ``relu(Z) / sum(relu(Z))`` does not
change when ``Z`` is multiplied by a positive number, so its weights are those
of ``T = 1`` whatever the temperature (the forward pass already leaves the
temperature out for it). Its backward pass therefore runs at ``T = 1`` too, and
a temperature that would overflow the scores (``1e-40`` in float32) is no
error there either; its ``grad_temperature`` is exactly 0 (Euler's theorem for
a function homogeneous of degree 0: ``sum_j Z_j dA_i/dZ_j = 0``), and its
Jacobian norms are those at ``T = 1`` times ``T`` (``J(Z / T) = T J(Z)``).
Like the forward pass it forms the scores, the weights and ``dZ`` in float64
and rounds only the results, so float32 scores that would underflow, overflow
or turn subnormal still give the float64 gradients to float32 precision.

Masked positions get exactly zero gradient (every normalizer's Jacobian is zero
off its support, and masked weights are exactly 0); fully masked rows give zero
gradients, never NaN.

Gradient health of a row is the Frobenius norm of the normalizer's Jacobian
``J = dA/dZ`` (:func:`jacobian_norms`). The work is done on the same chunks of
query rows as the forward pass (:mod:`service.core.attention.chunks`), so the
extra memory is a few chunk-sized temporaries per thread.

Layout:

- ``health``: :func:`jacobian_norms` per row and their per-head summary :func:`gradient_health`;
- ``importance``: :func:`head_importance` per (batch, head), from the output and its upstream gradient.
- ``task``: :class:`BackwardTask`, :class:`BackwardResult`, what may be returned, the upstream gradients' checks.
- ``run``: :func:`run_backward`, the backward pass on numpy.
"""

from __future__ import annotations

from service.core.backward.health import DEFAULT_VANISHING_THRESHOLD, GradientHealth, gradient_health, jacobian_norms
from service.core.backward.importance import head_importance
from service.core.backward.run import run_backward
from service.core.backward.task import (
    BACKWARD_RETURNS,
    DEFAULT_RETURNS,
    GRADIENTS,
    BackwardResult,
    BackwardTask,
    checked_gradient,
    sum_to_shape,
)

__all__ = [
    "BACKWARD_RETURNS",
    "DEFAULT_RETURNS",
    "DEFAULT_VANISHING_THRESHOLD",
    "GRADIENTS",
    "BackwardResult",
    "BackwardTask",
    "GradientHealth",
    "checked_gradient",
    "gradient_health",
    "head_importance",
    "jacobian_norms",
    "run_backward",
    "sum_to_shape",
]
