"""The exploration policy on top of the selector's actions, in one place: epsilon-greedy,
or the noisy agent's floor of random actions, and the uniform random warm-up of both."""

from __future__ import annotations

from typing import Literal

import numpy as np

__all__ = ["Exploration", "epsilon_greedy", "linear_schedule"]


def linear_schedule(start: float, end: float, duration: float, step: int) -> float:
    return end + (start - end) * max(0.0, 1.0 - step / max(duration, 1.0))


def epsilon_greedy(
    actions: np.ndarray, epsilon: float, rng: np.random.Generator, n_actions: int
) -> np.ndarray:
    """Replace each action by a uniformly random one with probability ``epsilon``."""
    explore = rng.random(len(actions)) < epsilon
    if not explore.any():
        return actions
    actions = actions.copy()
    actions[explore] = rng.integers(n_actions, size=int(explore.sum()))
    return actions


class Exploration:
    """What the agent plays, given what its selector chose: asked once per step.

    ``epsilon``: epsilon-greedy, epsilon decaying linearly from ``epsilon_start`` to
    ``epsilon_end`` over ``epsilon_fraction`` of ``total_steps``. ``noisy``: the
    selector's actions (greedy on the noisy net) with a floor of ``noisy_epsilon``
    random ones after the warm-up, marked as ``explored`` so that replay ends the n-step
    returns before them. Both play uniformly at random for the first ``random_starts``
    steps. ``rng`` is the run's exploration stream (saved in checkpoints).
    """

    def __init__(
        self,
        kind: Literal["noisy", "epsilon"],
        n_actions: int,
        rng: np.random.Generator,
        *,
        total_steps: int,
        random_starts: int = 0,
        noisy_epsilon: float = 0.0,
        epsilon_start: float = 1.0,
        epsilon_end: float = 0.05,
        epsilon_fraction: float = 0.1,
    ) -> None:
        self.kind = kind
        self.n_actions = n_actions
        self.rng = rng
        self.random_starts = random_starts
        self.noisy_epsilon = noisy_epsilon
        self.epsilon_start, self.epsilon_end = epsilon_start, epsilon_end
        self.decay_steps = epsilon_fraction * total_steps
        self.epsilon = epsilon_start if kind == "epsilon" else noisy_epsilon
        """The probability of a random action at the last step asked (for the logs)."""

    def __call__(self, actions: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray | None]:
        """(actions to play, where the floor replaced the policy's or None) at ``step``."""
        explored = None
        if self.kind == "epsilon":
            self.epsilon = linear_schedule(
                self.epsilon_start, self.epsilon_end, self.decay_steps, step
            )
            actions = epsilon_greedy(actions, self.epsilon, self.rng, self.n_actions)
        elif self.noisy_epsilon > 0 and step >= self.random_starts:
            # The floor retries actions that the noise has stopped trying.
            policy_actions = actions
            actions = epsilon_greedy(actions, self.noisy_epsilon, self.rng, self.n_actions)
            explored = actions != policy_actions
        if step < self.random_starts:
            actions = self.rng.integers(self.n_actions, size=len(actions))  # fill replay
        return actions, explored

    def scalars(self) -> dict[str, float]:
        """``charts/epsilon`` where there is one: the schedule, or the noisy agent's floor."""
        if self.kind == "epsilon" or self.noisy_epsilon > 0:
            return {"charts/epsilon": self.epsilon}
        return {}
