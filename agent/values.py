"""Q-values and greedy actions from a network's output: the one place that knows heads.

A Q-network's output is either the action values themselves, ``(..., A)`` (an
expected-value head: QNetwork's default, and any user's module), or logits over the
atoms of a fixed ``support``, ``(..., A, N)`` (a C51 head, :mod:`agent.distributional`),
whose action values are the expectations ``sum_j softmax(logits)_j support_j``. Acting
on every path (the CUDA graph, numpy, eager, the seed group), evaluation, export, the
exploration signals and the learner's bootstrap action all go through these functions,
so a new kind of head is added here and nowhere else.

The greedy action is the first of equal maxima (``argmax``), on torch and numpy alike.
"""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

__all__ = ["greedy_actions", "q_values", "softmax", "support_of"]

Array = TypeVar("Array", torch.Tensor, np.ndarray)


def support_of(network: nn.Module) -> torch.Tensor | None:
    """The atoms of a network's distributional head, ``(N,)``, or None for a network whose
    output is its action values."""
    support = getattr(network, "support", None)
    return support if isinstance(support, torch.Tensor) else None


def softmax(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, in numpy (shifted by the maximum, as torch's is)."""
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def q_values(output: Array, support: Any = None) -> Array:
    """Action values ``(..., A)`` of a network's ``output``: the output itself, or with a
    ``support`` ``(N,)`` the expectation of the distribution its logits ``(..., A, N)``
    define. Tensors or numpy arrays (``support`` of the same kind)."""
    if support is None:
        return output
    if isinstance(output, np.ndarray):
        return softmax(output) @ support
    # A product and a sum, not a matmul: a matrix-vector product's rounding depends on how
    # many rows it has, and a stacked network's seeds must not depend on each other.
    return (output.softmax(dim=-1) * support).sum(dim=-1)


def greedy_actions(output: Array, support: Any = None) -> Array:
    """The greedy actions ``(...)`` (int64) of a network's ``output`` (see :func:`q_values`)."""
    return q_values(output, support).argmax(-1)
