"""The learner of S seeds at once: :class:`~agent.learner.Learner`'s update on stacked networks."""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

from agent.learner import BatchLike, NonFiniteError, TDLoss, sync_parameters, td_target
from agent.optim import Adam
from agent.seeds.stacked import NoiseDraw, stacked_noisy_layers, with_own_noise

__all__ = ["SeedLearner"]


class SeedLearner:
    """Updates S stacked Q-networks (:func:`~agent.seeds.stacked.stack_networks`) as S
    independent :class:`~agent.learner.Learner` s would, in one pass.

    Seed ``i`` learns from row block ``i`` of each batch (tensors ``(S, B, ...)``) with
    its own loss, its own gradient-norm clipping and Adam, on parameters no other seed
    reads: the total loss is the sum of the seeds' losses, so each seed's gradient is its
    own. Update noise: for each seed, drawn from ``generators[i]`` (the online network's,
    then the target's), into buffers of the learner's own (the online network's buffers
    keep the acting noise). ``noise=False`` or ``update_noise=0``: both networks learn
    on their mean weights. The other settings are :class:`~agent.learner.Learner`'s.
    """

    def __init__(
        self,
        q_network: nn.Module,
        target_network: nn.Module,
        generators: list[torch.Generator],
        *,
        lr: float,
        adam_eps: float = 1.5e-4,
        double_dqn: bool = True,
        loss: Literal["huber", "mse"] = "huber",
        huber_delta: float = 1.0,
        max_grad_norm: float | None = 10.0,
        tau: float = 1.0,
        noise: bool = True,
        update_noise: float = 1.0,
    ) -> None:
        if update_noise < 0:
            raise ValueError(f"update_noise must be >= 0, got {update_noise}")
        params = list(q_network.parameters())
        self.seeds = params[0].shape[0]
        if len(generators) != self.seeds:
            raise ValueError(f"{self.seeds} seeds need as many generators, got {len(generators)}")
        self.q_network = q_network
        self.target_network = target_network
        self.generators = generators
        self.double_dqn = double_dqn
        self.loss = TDLoss(loss, huber_delta)
        self.max_grad_norm = max_grad_norm
        self.tau = tau
        self.update_noise = update_noise
        # Both networks' parameters, with noise buffers and switches of the learner's own:
        # the networks it was given are never changed but by the optimizer and the sync.
        self.online_for_update = with_own_noise(q_network)
        self.target_for_update = with_own_noise(target_network)
        online_layers = stacked_noisy_layers(self.online_for_update)
        target_layers = stacked_noisy_layers(self.target_for_update)
        self.draws = noise and update_noise > 0
        for layer in [*online_layers, *target_layers]:
            layer.noise_enabled = self.draws
        self._noise = NoiseDraw([*online_layers, *target_layers])
        self.optimizer = Adam(params, lr=lr, eps=adam_eps)
        self._online = params
        self._target = list(target_network.parameters())
        self._sums = torch.zeros(self.seeds, 2, device=params[0].device, dtype=params[0].dtype)
        self._count = 0
        self.updates = 0

    def update(self, batch: BatchLike) -> torch.Tensor:
        """One gradient step per seed on ``batch`` (``(S, B, ...)`` tensors on the networks'
        device); returns the seeds' losses, ``(S,)``."""
        if self.draws:
            self._noise(self.generators, scale=self.update_noise)
        batch_size = batch.obs.shape[1]

        # One online forward over obs and next_obs together, as Learner does.
        obs_both = torch.cat([batch.obs, batch.next_obs], dim=1)
        q_both = self.online_for_update(obs_both)  # (S, 2B, A)
        q, q_next_online = q_both[:, :batch_size], q_both[:, batch_size:].detach()
        with torch.no_grad():
            q_next_target = self.target_for_update(batch.next_obs)  # (S, B, A)
            chooser = q_next_online if self.double_dqn else q_next_target
            next_q = q_next_target.gather(2, chooser.argmax(dim=2, keepdim=True)).squeeze(2)
            target = td_target(batch.rewards, batch.discounts, batch.dones, next_q)  # (S, B)
        q_taken = q.gather(2, batch.actions.unsqueeze(2)).squeeze(2)  # (S, B)
        losses = self.loss.torch_by_row(q_taken, target)  # (S,)

        self.optimizer.zero_grad()
        losses.sum().backward()  # seed i's parameters get seed i's gradient only
        if self.max_grad_norm is not None:
            self._clip_by_seed(self.max_grad_norm)
        self.optimizer.step()

        with torch.no_grad():
            self._sums += torch.stack([losses, q_taken.mean(dim=1)], dim=1)
        self._count += 1
        self.updates += 1
        return losses.detach()

    @torch.no_grad()
    def _clip_by_seed(self, max_norm: float) -> None:
        """Each seed's gradients scaled to an L2 norm of at most ``max_norm`` (the rule of
        ``torch.nn.utils.clip_grad_norm_``, per seed)."""
        grads = self.optimizer.grads
        per_param = [torch.linalg.vector_norm(g.reshape(self.seeds, -1), dim=1) for g in grads]
        norms = torch.linalg.vector_norm(torch.stack(per_param), dim=0)  # (S,)
        scale = torch.clamp(max_norm / (norms + 1e-6), max=1.0)
        for g in grads:
            g.mul_(scale.view(-1, *([1] * (g.dim() - 1))))

    def sync_target(self) -> None:
        """Hard copy (tau = 1) or Polyak average of every seed's online parameters."""
        sync_parameters(self._target, self._online, self.tau)

    def metrics(self) -> list[tuple[float, float]] | None:
        """Per seed, (mean TD loss, mean Q of the taken actions) since the last call (one
        host read), or None without updates. Raises :class:`~agent.learner.NonFiniteError`
        naming the seeds whose loss or Q stopped being finite."""
        if self._count == 0:
            return None
        means = (self._sums / self._count).tolist()
        self._sums.zero_()
        self._count = 0
        bad = [i for i, (loss, q) in enumerate(means) if not math.isfinite(loss + q)]
        if bad:
            raise NonFiniteError(f"non-finite TD loss or Q for seed indices {bad}")
        return [(loss, q) for loss, q in means]

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])
