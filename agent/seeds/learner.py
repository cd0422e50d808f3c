"""The learner of S seeds at once: :class:`~agent.learner.Learner`'s update on stacked networks."""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

from agent.learner import Metrics, RunningMetrics, sync_parameters
from agent.objectives import BatchLike, make_objective, td_loss
from agent.optim import Adam
from agent.seeds.stacked import NoiseDraw, stacked_noisy_layers, with_own_noise
from agent.values import support_of

__all__ = ["SeedLearner", "diverged"]


class SeedLearner:
    """Updates S stacked Q-networks (:func:`~agent.seeds.stacked.stack_networks`) as S
    independent :class:`~agent.learner.Learner` s would, in one pass.

    Seed ``i`` learns from row block ``i`` of each batch (tensors ``(S, B, ...)``) with
    its own loss, its own gradient-norm clipping and Adam, on parameters no other seed
    reads: the total loss is the sum of the seeds' losses, so each seed's gradient is its
    own. Update noise: for each seed, drawn from ``generators[i]`` (the online network's,
    then the target's), into buffers of the learner's own (the online network's buffers
    keep the acting noise). ``noise=False`` or ``update_noise=0``: both networks learn
    on their mean weights. The other settings (``autocast`` included) are
    :class:`~agent.learner.Learner`'s.
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
        autocast: torch.dtype | None = None,
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
        self.support = support_of(q_network)  # one support, shared by every seed
        self.objective = make_objective(self.support, loss, huber_delta)
        self.max_grad_norm = max_grad_norm
        self.tau = tau
        self.update_noise = update_noise
        self.autocast = autocast
        # Both networks' parameters, with noise buffers and switches of the learner's own:
        # the networks it was given are never changed but by the optimizer and the sync.
        self.draws = noise and update_noise > 0
        self.online_for_update = with_own_noise(q_network, self.draws)
        self.target_for_update = with_own_noise(target_network, self.draws)
        online_layers = stacked_noisy_layers(self.online_for_update)
        target_layers = stacked_noisy_layers(self.target_for_update)
        self._noise = NoiseDraw([*online_layers, *target_layers])
        # A seed's step must not depend on how many seeds are stacked (Adam's rows).
        self.optimizer = Adam(params, lr=lr, eps=adam_eps, rows=self.seeds)
        self._online = params
        self._target = list(target_network.parameters())
        self.running = RunningMetrics(params[0].device, params[0].dtype, rows=self.seeds)
        self.updates = 0

    def update(self, batch: BatchLike) -> torch.Tensor:
        """One gradient step per seed on ``batch`` (``(S, B, ...)`` tensors on the networks'
        device); returns the per-sample errors ``(S, B)`` (:meth:`Learner.update
        <agent.learner.Learner.update>`'s, per seed)."""
        if self.draws:
            self._noise(self.generators, scale=self.update_noise)

        if self.autocast is None:
            losses, errors, q_taken = self.loss(batch)
        else:
            # No cache of cast weights: a CUDA graph's capture must not keep them past it.
            with torch.autocast(batch.obs.device.type, dtype=self.autocast, cache_enabled=False):
                losses, errors, q_taken = self.loss(batch)

        self.optimizer.zero_grad()
        losses.sum().backward()  # seed i's parameters get seed i's gradient only
        if self.max_grad_norm is not None:
            self.optimizer.clip_grad_norm_(self.max_grad_norm)  # per seed
        self.optimizer.step()

        with torch.no_grad():
            self.running.sums += torch.stack([losses, q_taken.mean(dim=1)], dim=1)
        self.running.count += 1
        self.updates += 1
        return errors

    def loss(self, batch: BatchLike) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each seed's loss ``(S,)``, per-sample errors ``(S, B)`` and Q values of the taken
        actions ``(S, B)`` under the drawn update noise: :meth:`Learner.loss
        <agent.learner.Learner.loss>`'s, per seed."""
        # The online network's next-state values in a forward of their own, without
        # autograd: with the states in one forward (as Learner does) the backward would
        # run its batched matmuls over both halves, twice the arithmetic for a zero half.
        out = self.online_for_update(batch.obs)  # (S, B, A) or (S, B, A, N)
        with torch.no_grad():
            out_next_target = self.target_for_update(batch.next_obs)
            if self.double_dqn:
                chooser = self.online_for_update(batch.next_obs)
            else:
                chooser = out_next_target
        return td_loss(self.objective, out, chooser, out_next_target, batch, by_row=True)

    def sync_target(self) -> None:
        """Hard copy (tau = 1) or Polyak average of every seed's online parameters."""
        sync_parameters(self._target, self._online, self.tau)

    def metrics(self) -> list[Metrics] | None:
        """Per seed, the means of (TD loss, Q of the taken actions) since the last call (one
        host read), or None without updates. Non-finite means are returned as they are:
        which seeds diverged is the caller's to act on (:func:`diverged`)."""
        running = self.running
        if running.count == 0:
            return None
        means = (running.sums / running.count).tolist()
        count = running.count
        running.sums.zero_()
        running.count = 0
        return [Metrics(loss, q, count) for loss, q in means]

    def take_running(self, other: SeedLearner, rows: list[int]) -> None:
        """Continue ``other``'s metric sums since its last :meth:`metrics` call, for its
        seeds ``rows`` (a learner rebuilt for fewer seeds)."""
        self.running.sums.copy_(other.running.sums[rows])
        self.running.count = other.running.count

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])

    def seed_states(self) -> list[dict]:
        """Each seed's learner state in :meth:`Learner.state_dict <agent.learner.Learner.
        state_dict>`'s format: what that seed's single learner would hold."""
        state = self.optimizer.state_dict()
        moments = {name: self._split(state[name]) for name in ("exp_avg", "exp_avg_sq")}
        return [
            {
                "optimizer": {**state, **{name: parts[i] for name, parts in moments.items()}},
                "updates": self.updates,
            }
            for i in range(self.seeds)
        ]

    def load_seed_states(self, states: list[dict]) -> None:
        """Load S single learners' states (:meth:`seed_states`' format). They must agree
        on the update count and the optimizer's step counts, as seeds stepped together do."""
        if len(states) != self.seeds:
            raise ValueError(f"{self.seeds} seeds need as many states, got {len(states)}")
        first = states[0]["optimizer"]
        for state in states[1:]:
            opt = state["optimizer"]
            if state["updates"] != states[0]["updates"] or opt["step"] != first["step"] or (
                not torch.equal(opt["steps"], first["steps"])
            ):
                raise ValueError("seeds stacked together must have made the same updates")
        joined = {
            name: self._join([state["optimizer"][name] for state in states])
            for name in ("exp_avg", "exp_avg_sq")
        }
        self.load_state_dict({"optimizer": {**first, **joined}, "updates": states[0]["updates"]})

    def _split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """A flat buffer over the stacked parameters -> each seed's flat buffer over its own."""
        parts, offset = [], 0
        for p in self._online:  # each (S, ...): seed blocks one after another
            parts.append(flat[offset : offset + p.numel()].reshape(self.seeds, -1))
            offset += p.numel()
        return [row.clone() for row in torch.cat(parts, dim=1)]

    def _join(self, flats: list[torch.Tensor]) -> torch.Tensor:
        """The inverse of :meth:`_split`."""
        rows = torch.stack([f.to(self._online[0].device) for f in flats])  # (S, per seed)
        parts, offset = [], 0
        for p in self._online:
            size = p[0].numel()
            parts.append(rows[:, offset : offset + size].reshape(-1))
            offset += size
        return torch.cat(parts)


def diverged(metrics: list[Metrics]) -> list[int]:
    """Indices of the seeds whose loss or Q stopped being finite."""
    return [i for i, m in enumerate(metrics) if not math.isfinite(m.td_loss + m.q_values)]
