"""What an update optimises, written once for every learner: the double-DQN TD target,
the TD loss (Huber or squared) and the expected-value objective (:class:`ValueObjective`;
C51's is :class:`~agent.distributional.CategoricalObjective`), and :func:`td_loss` /
:func:`td_loss_numpy`, the update's loss around either: the next action chosen, valued by
the target network, the target, the loss and the per-sample errors."""

from __future__ import annotations

from typing import Literal, Protocol, TypeVar

import numpy as np
import torch
import torch.nn.functional as F

from agent.distributional import CategoricalObjective
from agent.values import greedy_actions

__all__ = [
    "BatchLike",
    "Objective",
    "TDLoss",
    "ValueObjective",
    "make_objective",
    "td_loss",
    "td_loss_numpy",
    "td_target",
    "weighted_mean",
]


class BatchLike(Protocol):
    obs: torch.Tensor  # (B, *obs_shape)
    actions: torch.Tensor  # (B,) int64
    rewards: torch.Tensor  # (B,) discounted n-step return
    next_obs: torch.Tensor  # (B, *obs_shape)
    dones: torch.Tensor  # (B,) 1 where the episode terminated within the n steps
    discounts: torch.Tensor  # (B,) gamma^k for the k steps actually taken
    weights: torch.Tensor | None  # (B,) importance weights (prioritized replay), or None


Array = TypeVar("Array", torch.Tensor, np.ndarray)


def td_target(rewards: Array, discounts: Array, dones: Array, next_q: Array) -> Array:
    """``r + gamma^k (1 - done) Q_target(s', a*)``: termination bootstraps nothing.
    Tensors (the autograd backend) or numpy arrays (the numpy backend)."""
    return rewards + discounts * (1.0 - dones) * next_q


class TDLoss:
    """The TD loss, a mean over the batch: Huber with threshold ``delta``, or the squared
    error. One definition for both backends: :meth:`torch` for autograd, :meth:`numpy`
    with its gradient written out."""

    def __init__(self, kind: Literal["huber", "mse"], delta: float = 1.0) -> None:
        if kind not in ("huber", "mse"):
            raise ValueError(f"loss must be huber or mse, got {kind!r}")
        self.kind, self.delta = kind, delta

    def torch(self, q_taken: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self.kind == "huber":
            return F.huber_loss(q_taken, target, delta=self.delta)
        return F.mse_loss(q_taken, target)

    def per_sample(self, q_taken: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The loss of each element (no reduction)."""
        if self.kind == "huber":
            return F.huber_loss(q_taken, target, reduction="none", delta=self.delta)
        return F.mse_loss(q_taken, target, reduction="none")

    def numpy(
        self, q_taken: np.ndarray, target: np.ndarray, weights: np.ndarray | None = None
    ) -> tuple[float, np.ndarray]:
        """(the loss, its gradient with respect to ``q_taken``); with ``weights``, the
        weighted mean."""
        batch_size = len(q_taken)
        diff = q_taken - target  # (B,)
        if self.kind == "huber":
            grad = np.minimum(np.maximum(diff, -self.delta), self.delta)  # clip(diff, -d, d)
            # clip * (diff - clip / 2) is diff^2 / 2 inside [-d, d], d (|diff| - d / 2) outside
            if weights is None:
                loss = np.dot(grad, diff - 0.5 * grad) / batch_size
            else:
                loss = np.dot(weights * grad, diff - 0.5 * grad) / batch_size
        else:
            loss = np.dot(diff, diff if weights is None else weights * diff) / batch_size
            grad = 2.0 * diff
        if weights is not None:
            grad = grad * weights
        return loss, grad / batch_size


def weighted_mean(
    per_sample: torch.Tensor, weights: torch.Tensor | None, by_row: bool = False
) -> torch.Tensor:
    """The mean of per-sample losses, weighted by importance ``weights`` if any; over the
    last axis only with ``by_row`` (one seed's batch per row)."""
    values = per_sample if weights is None else weights * per_sample
    return values.mean(dim=-1) if by_row else values.mean()


class ValueObjective:
    """The expected-value head's double-DQN TD target and loss, for Q values ``(..., B, A)``:
    autograd over any leading axes (a seed axis), and numpy with its gradient. Per-sample
    errors ``|Q(s, a) - target|`` are what prioritized replay keeps."""

    support = None  # action values, not atoms (CategoricalObjective has a support)
    support_np = None

    def __init__(self, loss: TDLoss) -> None:
        self.loss = loss

    def target(
        self,
        next_target: torch.Tensor,
        next_actions: torch.Tensor,
        rewards: torch.Tensor,
        discounts: torch.Tensor,
        dones: torch.Tensor,
    ) -> torch.Tensor:
        next_q = next_target.gather(-1, next_actions.unsqueeze(-1)).squeeze(-1)  # (..., B)
        return td_target(rewards, discounts, dones, next_q)

    def loss_and_errors(
        self,
        output: torch.Tensor,
        actions: torch.Tensor,
        target: torch.Tensor,
        weights: torch.Tensor | None,
        by_row: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(the loss: a scalar, or ``(S,)`` ``by_row``; per-sample errors; Q of the taken
        actions), the last two detached."""
        q_taken = output.gather(-1, actions.unsqueeze(-1)).squeeze(-1)  # (..., B)
        if weights is None and not by_row:
            loss = self.loss.torch(q_taken, target)
        else:
            loss = weighted_mean(self.loss.per_sample(q_taken, target), weights, by_row)
        q_taken = q_taken.detach()
        return loss, (q_taken - target).abs(), q_taken

    def target_numpy(
        self,
        next_target: np.ndarray,
        next_actions: np.ndarray,
        rewards: np.ndarray,
        discounts: np.ndarray,
        dones: np.ndarray,
    ) -> np.ndarray:
        next_q = next_target[np.arange(len(next_actions)), next_actions]  # (B,)
        return td_target(rewards, discounts, dones, next_q)

    def loss_numpy(
        self,
        output: np.ndarray,
        actions: np.ndarray,
        target: np.ndarray,
        weights: np.ndarray | None,
    ) -> tuple[float, np.ndarray, np.ndarray, float]:
        """(the loss; its gradient with respect to ``output`` ``(B, A)``; per-sample
        errors ``(B,)``; the mean Q of the taken actions)."""
        batch_size = len(actions)
        rows = np.arange(batch_size)
        q_taken = output[rows, actions]  # (B,)
        loss, grad_taken = self.loss.numpy(q_taken, target, weights)
        grad = np.zeros_like(output)
        grad[rows, actions] = grad_taken
        return loss, grad, np.abs(q_taken - target), q_taken.sum() / batch_size


Objective = ValueObjective | CategoricalObjective


def make_objective(
    support: torch.Tensor | None, loss: Literal["huber", "mse"], huber_delta: float
) -> Objective:
    """The head decides the objective: a network with a ``support`` (a C51 head) learns
    by C51's cross entropy, any other by the TD ``loss``."""
    if support is None:
        return ValueObjective(TDLoss(loss, huber_delta))
    return CategoricalObjective(support)


def td_loss(
    objective: Objective,
    output: torch.Tensor,
    chooser: torch.Tensor,
    next_target: torch.Tensor,
    batch: BatchLike,
    by_row: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The update's loss, one definition for every autograd learner.

    ``output``: the online network's on ``batch.obs``; ``next_target``: the target
    network's on ``batch.next_obs``, which values the next action, chosen greedily on
    ``chooser`` (the online network's next-state output for double DQN, else
    ``next_target``). Leading axes (a seed axis) are kept; ``by_row`` means per row.
    Returns (the loss, the per-sample errors that prioritized replay keeps, the values of
    the taken actions), the last two detached.
    """
    with torch.no_grad():
        next_actions = greedy_actions(chooser, objective.support)  # (..., B)
        target = objective.target(
            next_target, next_actions, batch.rewards, batch.discounts, batch.dones
        )
    return objective.loss_and_errors(output, batch.actions, target, batch.weights, by_row)


def td_loss_numpy(
    objective: Objective,
    output: np.ndarray,
    chooser: np.ndarray,
    next_target: np.ndarray,
    batch: BatchLike,
) -> tuple[float, np.ndarray, np.ndarray, float]:
    """:func:`td_loss` on the numpy backend's outputs (CPU tensors in ``batch``), with
    the gradient written out: (the loss, its gradient with respect to ``output``, the
    per-sample errors, the mean value of the taken actions)."""
    next_actions = greedy_actions(chooser, objective.support_np)  # (B,)
    target = objective.target_numpy(next_target, next_actions, batch.rewards.numpy(),
                                    batch.discounts.numpy(), batch.dones.numpy())  # fmt: skip
    weights = None if batch.weights is None else batch.weights.numpy()
    return objective.loss_numpy(output, batch.actions.numpy(), target, weights)
