"""The learner: double-DQN n-step TD target, Huber loss, Adam, target network."""

from __future__ import annotations

from typing import Literal, NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from agent.noisy import NoiseSnapshot, noisy_layers, set_noise
from agent.optim import Adam

__all__ = ["Learner", "NonFiniteError", "td_target"]


class BatchLike(Protocol):
    obs: torch.Tensor  # (B, *obs_shape)
    actions: torch.Tensor  # (B,) int64
    rewards: torch.Tensor  # (B,) discounted n-step return
    next_obs: torch.Tensor  # (B, *obs_shape)
    dones: torch.Tensor  # (B,) 1 where the episode terminated within the n steps
    discounts: torch.Tensor  # (B,) gamma^k for the k steps actually taken


class NonFiniteError(RuntimeError):
    """A loss or a Q value became NaN or infinite."""


class Metrics(NamedTuple):
    td_loss: float
    q_values: float
    updates: int


def td_target(
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    dones: torch.Tensor,
    next_q: torch.Tensor,
) -> torch.Tensor:
    """``r + gamma^k (1 - done) Q_target(s', a*)``: termination bootstraps nothing."""
    return rewards + discounts * (1.0 - dones) * next_q


class Learner:
    """Updates ``q_network`` from replay batches; owns the optimizer and the target sync.

    Before every update the noise of both networks is resampled (independent
    noise for the online and the target network, as in the NoisyNet paper).
    With ``noise=False`` (epsilon-greedy runs) the noise of both networks is switched
    off for good: they learn on their mean weights, exactly as they act, and the
    sigma parameters receive no gradient and stay as initialised.
    The online network's noise buffers are put back as they were after the
    update: the noise there is the acting noise, which belongs to the action
    selector (held for ``noise_interval`` steps or a whole episode), and an
    update in between must not replace it.
    Metrics are summed on the device and only turned into floats by
    :meth:`metrics`, at the log interval.
    """

    def __init__(
        self,
        q_network: nn.Module,
        target_network: nn.Module,
        *,
        lr: float,
        adam_eps: float = 1.5e-4,
        double_dqn: bool = True,
        loss: Literal["huber", "mse"] = "huber",
        huber_delta: float = 1.0,
        max_grad_norm: float | None = 10.0,
        tau: float = 1.0,
        noise: bool = True,
    ) -> None:
        self.q_network = q_network
        self.target_network = target_network
        self.double_dqn = double_dqn
        self.loss_name = loss
        self.huber_delta = huber_delta
        self.max_grad_norm = max_grad_norm
        self.tau = tau
        if not noise:
            set_noise(q_network, False)
            set_noise(target_network, False)
        self.target_network.requires_grad_(False)
        # Found once (by type): the reset runs before every update.
        online = noisy_layers(q_network) if noise else []
        self._noisy = [*online, *(noisy_layers(target_network) if noise else [])]
        # Where the acting noise (the selector's) waits during an update.
        self._acting_noise = NoiseSnapshot(online)
        params = list(q_network.parameters())
        # One fused kernel per step and one flat gradient buffer (agent/optim.py).
        self.optimizer = Adam(params, lr=lr, eps=adam_eps)
        self._online = params
        self._target = list(target_network.parameters())
        # Running sums of (td_loss, mean Q of the taken actions), on the device.
        self._sums = torch.zeros(2, device=params[0].device, dtype=params[0].dtype)
        self._count = 0
        self.updates = 0

    def loss_fn(self, q_taken: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self.loss_name == "huber":
            return F.huber_loss(q_taken, target, delta=self.huber_delta)
        return F.mse_loss(q_taken, target)

    def update(self, batch: BatchLike) -> torch.Tensor:
        """One gradient step on ``batch`` (tensors on the networks' device); returns the loss."""
        self._acting_noise.save()
        for layer in self._noisy:  # online first, then target: independent draws
            layer.reset_noise()
        batch_size = batch.obs.shape[0]

        # One online forward over obs and next_obs together: half the per-call overhead
        # of two forwards, and the same noise for both halves (as in Rainbow).
        q_both = self.q_network(torch.cat([batch.obs, batch.next_obs]))  # (2B, A)
        q, q_next_online = q_both[:batch_size], q_both[batch_size:].detach()
        with torch.no_grad():
            q_next_target = self.target_network(batch.next_obs)  # (B, A)
            if self.double_dqn:
                next_actions = q_next_online.argmax(dim=1, keepdim=True)  # (B, 1)
            else:
                next_actions = q_next_target.argmax(dim=1, keepdim=True)
            next_q = q_next_target.gather(1, next_actions).squeeze(1)  # (B,)
            target = td_target(batch.rewards, batch.discounts, batch.dones, next_q)
        q_taken = q.gather(1, batch.actions.unsqueeze(1)).squeeze(1)  # (B,)
        loss = self.loss_fn(q_taken, target)

        self.optimizer.zero_grad()
        loss.backward()
        if self.max_grad_norm is not None:
            self.optimizer.clip_grad_norm_(self.max_grad_norm)
        self.optimizer.step()
        self._acting_noise.restore()

        self._sums += torch.stack([loss.detach(), q_taken.detach().mean()])
        self._count += 1
        self.updates += 1
        return loss.detach()

    @torch.no_grad()
    def sync_target(self) -> None:
        """Hard copy (tau = 1) or Polyak average of the online parameters into the target."""
        if self.tau >= 1.0:
            torch._foreach_copy_(self._target, self._online)
        else:
            torch._foreach_lerp_(self._target, self._online, self.tau)

    def metrics(self) -> Metrics | None:
        """Means since the last call (one host read), or None without updates.

        Raises :class:`NonFiniteError` if the loss or the Q values stopped being finite.
        """
        if self._count == 0:
            return None
        loss_sum, q_sum = self._sums.tolist()
        count = self._count
        self._sums.zero_()
        self._count = 0
        if not (torch.isfinite(torch.tensor([loss_sum, q_sum])).all()):
            raise NonFiniteError(f"non-finite TD loss ({loss_sum / count}) or Q ({q_sum / count})")
        return Metrics(loss_sum / count, q_sum / count, count)

    @torch.no_grad()
    def parameters_finite(self) -> bool:
        """True when every online parameter is finite (one host read; checkpoint time only)."""
        return bool(torch.stack([p.isfinite().all() for p in self._online]).all())

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])
