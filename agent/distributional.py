"""C51 (Bellemare et al. 2017): a categorical return distribution over a fixed support.

The network's head gives logits ``(..., A, N)`` over ``N`` atoms ``z_j`` evenly spaced
in ``[v_min, v_max]`` (``QNetwork(num_atoms=N)``); its action values are expectations
(:mod:`agent.values`). The learner's target is the distribution of
``r + gamma^k (1 - done) Z(s', a*)``, with ``a*`` chosen as double DQN chooses it,
projected back onto the support: each shifted atom ``Tz_j`` (clipped to the support)
splits its probability between the two atoms around it in proportion to its distance,
written for torch as the hat kernel ``max(0, 1 - |b_j - i|)`` with ``b_j = (Tz_j -
v_min) / dz``: no scatter (deterministic on every device, capturable in a CUDA graph),
and all the mass kept when ``b_j`` falls on an atom; numpy counts the same two shares
into each row's atoms (``bincount``), without the N x N kernel. The loss is the cross
entropy ``-sum_i m_i log p_i(s, a)``, per sample: also the priority that prioritized
replay keeps, as in Rainbow.

:class:`CategoricalObjective` is that loss for the three learners: autograd over any
leading axes (a seed axis), and numpy with its gradient written out.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import torch
import torch.nn.functional as F

from agent.values import q_values, softmax

__all__ = ["CategoricalObjective", "make_support", "project"]

Array = TypeVar("Array", torch.Tensor, np.ndarray)


def make_support(
    v_min: float, v_max: float, num_atoms: int, *, device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:  # fmt: skip
    """``num_atoms`` evenly spaced atoms from ``v_min`` to ``v_max`` (ValueError unless
    ``num_atoms >= 2`` and ``v_min < v_max``)."""
    if num_atoms < 2:
        raise ValueError(f"a categorical head needs at least 2 atoms, got {num_atoms}")
    if not v_min < v_max:
        raise ValueError(f"the support is empty: v_min ({v_min}) must be below v_max ({v_max})")
    return torch.linspace(v_min, v_max, num_atoms, device=device, dtype=dtype)


def project(probs: Array, rewards: Array, bootstrap: Array, support: Array) -> Array:
    """The distribution of ``rewards + bootstrap * Z`` on ``support``.

    ``probs`` ``(..., N)`` over ``support`` ``(N,)``; ``rewards`` and ``bootstrap``
    ``(...)`` (``gamma^k (1 - done)``). Returns ``(..., N)``, each row summing to its
    row of ``probs``. Tensors or numpy arrays, all of one kind.
    """
    n = support.shape[0]
    if isinstance(probs, np.ndarray):
        # The same split, as two weighted counts into each row's atoms (no N x N kernel).
        v_min, v_max = float(support[0]), float(support[-1])
        shifted = np.clip(rewards[..., None] + bootstrap[..., None] * support, v_min, v_max)
        b = (shifted - v_min) / ((v_max - v_min) / (n - 1))  # (..., N): where atoms land
        lower = np.minimum(np.floor(b), n - 2).astype(np.int64)  # b = N-1: all to the top
        upper_share = b - lower  # in [0, 1]
        rows = np.arange(b.size // n).reshape(*b.shape[:-1], 1) * n
        size = b.size
        m = np.bincount((rows + lower).ravel(), (probs * (1.0 - upper_share)).ravel(), size)
        m += np.bincount((rows + lower + 1).ravel(), (probs * upper_share).ravel(), size)
        return m.reshape(b.shape).astype(probs.dtype, copy=False)
    # The bounds stay tensors: no host read (a CUDA graph, the meta device).
    v_min, v_max = support[0], support[-1]
    shifted = torch.clamp(rewards.unsqueeze(-1) + bootstrap.unsqueeze(-1) * support, v_min, v_max)
    b = (shifted - v_min) / ((v_max - v_min) / (n - 1))
    atoms = torch.arange(n, device=b.device, dtype=b.dtype).unsqueeze(1)
    kernel = (1.0 - (b.unsqueeze(-2) - atoms).abs()).clamp(min=0.0)
    return (kernel * probs.unsqueeze(-2)).sum(dim=-1)


def _taken(output: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Rows ``(..., B, N)`` of ``output`` ``(..., B, A, N)`` at ``actions`` ``(..., B)``."""
    index = actions[..., None, None].expand(*actions.shape, 1, output.shape[-1])
    return output.gather(-2, index).squeeze(-2)


class CategoricalObjective:
    """C51's target and cross-entropy loss, for logits ``(..., B, A, N)`` on ``support``."""

    def __init__(self, support: torch.Tensor) -> None:
        self.support = support
        self.support_np = support.detach().cpu().numpy() if support.device.type != "meta" else None

    # --- autograd (any leading axes) ---
    def target(
        self,
        next_target: torch.Tensor,
        next_actions: torch.Tensor,
        rewards: torch.Tensor,
        discounts: torch.Tensor,
        dones: torch.Tensor,
    ) -> torch.Tensor:
        """The projected target distribution ``(..., B, N)`` (no gradient)."""
        probs = _taken(next_target, next_actions).softmax(dim=-1)
        return project(probs, rewards, discounts * (1.0 - dones), self.support)

    def loss_and_errors(
        self,
        output: torch.Tensor,
        actions: torch.Tensor,
        target: torch.Tensor,
        weights: torch.Tensor | None,
        by_row: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(the loss: the mean cross entropy, weighted by ``weights`` if any, a scalar or
        ``(S,)`` ``by_row``; the per-sample cross entropies; the expected values of the
        taken actions), the last two detached."""
        logits = _taken(output, actions)  # (..., B, N)
        per_sample = -(target * F.log_softmax(logits, dim=-1)).sum(dim=-1)  # (..., B)
        weighted = per_sample if weights is None else weights * per_sample
        loss = weighted.mean(dim=-1) if by_row else weighted.mean()
        q_taken = q_values(logits.detach(), self.support)
        return loss, per_sample.detach(), q_taken

    # --- numpy, gradient by hand ---
    def target_numpy(
        self,
        next_target: np.ndarray,
        next_actions: np.ndarray,
        rewards: np.ndarray,
        discounts: np.ndarray,
        dones: np.ndarray,
    ) -> np.ndarray:
        rows = np.arange(len(next_actions))
        probs = softmax(next_target[rows, next_actions])  # (B, N)
        return project(probs, rewards, discounts * (1.0 - dones), self.support_np)

    def loss_numpy(
        self,
        output: np.ndarray,
        actions: np.ndarray,
        target: np.ndarray,
        weights: np.ndarray | None,
    ) -> tuple[float, np.ndarray, np.ndarray, float]:
        """(the loss: a mean over the batch, weighted by ``weights`` if any; its gradient
        with respect to ``output`` ``(B, A, N)``; the per-sample cross entropies ``(B,)``;
        the mean expected value of the taken actions)."""
        batch_size = len(actions)
        rows = np.arange(batch_size)
        logits = output[rows, actions]  # (B, N)
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_sum = np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        log_probs = shifted - log_sum
        per_sample = -(target * log_probs).sum(axis=1)  # (B,)
        probs = np.exp(log_probs)
        # d(-sum m log softmax(z))/dz = softmax(z) * sum(m) - m
        grad_rows = probs * target.sum(axis=1, keepdims=True) - target
        scale = np.full(batch_size, 1.0 / batch_size) if weights is None else weights / batch_size
        loss = float(per_sample @ scale)
        grad = np.zeros_like(output)
        grad[rows, actions] = grad_rows * scale[:, None].astype(output.dtype)
        q_taken = float((probs @ self.support_np).mean())
        return loss, grad, per_sample, q_taken
