"""The exploration policy, in one place: when the noisy agent's acting noise is drawn
afresh (every K steps, once an episode, on a repeated observation), epsilon-greedy, the
noisy agent's floor of random actions, and the uniform random warm-up of both."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

__all__ = ["Exploration", "NoiseSchedule", "epsilon_greedy", "linear_schedule"]


def linear_schedule(
    start: float, end: float, duration: float, step: int, begin: int = 0
) -> float:
    """``start`` until step ``begin``, then linearly to ``end`` over ``duration`` steps,
    then ``end``."""
    # max(step - begin, 0) is step itself for begin 0: the schedule of before, to the bit.
    return end + (start - end) * max(0.0, 1.0 - max(step - begin, 0) / max(duration, 1.0))


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


class NoiseSchedule:
    """When the acting noise is drawn afresh: every ``interval`` acting steps (1: every
    step, as in the NoisyNet paper), or with ``interval`` None only at the first step and
    after :meth:`restart`. Asked once per acting step (:meth:`due`)."""

    def __init__(self, interval: int | None = 1) -> None:
        if interval is not None and (int(interval) != interval or interval < 1):
            raise ValueError(f"noise_interval must be a positive integer or None, got {interval}")
        self.interval = None if interval is None else int(interval)
        self.step = 0
        """Acting steps since the last draw was due (or the last restart)."""

    def due(self) -> bool:
        """Whether this acting step draws fresh noise; counts the step."""
        due = self.step == 0 if self.interval is None else self.step % self.interval == 0
        self.step += 1
        return due

    def restart(self) -> None:
        """The next step draws fresh noise, whatever the interval says."""
        self.step = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])


class Exploration:
    """What the agent plays, given what its selector chose: asked once per step.

    ``epsilon``: epsilon-greedy, epsilon holding ``epsilon_start`` until step
    ``epsilon_decay_start``, then decaying linearly to ``epsilon_end`` over
    ``epsilon_fraction`` of ``total_steps``. ``noisy``: the
    selector's actions (greedy on the noisy net) with a floor of ``noisy_epsilon``
    random ones after the warm-up, marked as ``explored`` so that replay ends the n-step
    returns before them; its acting noise is drawn afresh every ``noise_interval`` steps,
    or (``"episode"``) at every episode end (:meth:`episode_ended`), and with
    ``noise_on_repeat`` also when an observation repeats within an episode under held
    noise (:meth:`repeated`). Both play uniformly at random for the first
    ``random_starts`` steps. ``rng`` is the run's exploration stream; the policy's state
    (:meth:`state_dict`) is saved in checkpoints.

    A step asks, in order: :meth:`fresh_noise` (before the selector acts), then the
    policy itself with the selector's actions; after the env step, :meth:`episode_ended`
    and :meth:`repeated` where they apply.
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
        epsilon_decay_start: int = 0,
        noise_interval: int | Literal["episode"] = 1,
        noise_on_repeat: bool = False,
    ) -> None:
        self.kind = kind
        self.noise = NoiseSchedule(None if noise_interval == "episode" else noise_interval)
        self.noise_per_episode = noise_interval == "episode"
        self.watches_repeats = kind == "noisy" and noise_interval != 1 and noise_on_repeat
        """Whether a repeated observation draws fresh noise: noisy, held noise (an
        interval other than 1), ``noise_on_repeat``; the episodes' bookkeeping watches
        for repeats only then."""
        self.n_actions = n_actions
        self.rng = rng
        self.random_starts = random_starts
        self.noisy_epsilon = noisy_epsilon
        self.epsilon_start, self.epsilon_end = epsilon_start, epsilon_end
        self.decay_steps = epsilon_fraction * total_steps
        self.decay_start = int(epsilon_decay_start)
        self.epsilon = epsilon_start if kind == "epsilon" else noisy_epsilon
        """The probability of a random action at the last step asked (for the logs)."""
        self._off_greedy = [0, 0]  # actions played off the noise-free greedy ones, of those seen

    @property
    def noisy(self) -> bool:
        """True when the agent explores by acting on its noisy network."""
        return self.kind == "noisy"

    def fresh_noise(self) -> bool:
        """Whether this step's action is taken under freshly drawn noise (asked once per
        step, before acting; always False for epsilon-greedy, which acts on the mean
        weights)."""
        due = self.noise.due()
        return due and self.noisy

    def episode_ended(self) -> None:
        """An episode ended (any sub-env's): per-episode noise is drawn afresh next."""
        if self.noise_per_episode:
            self.noise.restart()

    def repeated(self) -> None:
        """An observation repeated within its episode under held noise: a loop the same
        noise would replay to the time limit, so fresh noise is drawn next."""
        if self.watches_repeats:
            self.noise.restart()

    def state_dict(self) -> dict[str, Any]:
        """The exploration stream and the noise schedule (plain values)."""
        return {"rng": self.rng.bit_generator.state, "noise": self.noise.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.noise.load_state_dict(state["noise"])

    def __call__(self, actions: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray | None]:
        """(actions to play, where the floor replaced the policy's or None) at ``step``."""
        explored = None
        if self.kind == "epsilon":
            self.epsilon = linear_schedule(
                self.epsilon_start, self.epsilon_end, self.decay_steps, step, self.decay_start
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

    def off_greedy(self, played: np.ndarray, greedy: np.ndarray, step: int) -> None:
        """Count the actions ``played`` at ``step`` that differ from the noise-free greedy
        ``greedy`` ones (a sample of the steps is enough); the warm-up's are not the
        policy's and are not counted."""
        if step >= self.random_starts:
            self._off_greedy[0] += int(np.count_nonzero(played != greedy))
            self._off_greedy[1] += len(played)

    def scalars(self) -> dict[str, float]:
        """``charts/epsilon`` where there is one: the schedule, or the noisy agent's floor;
        ``exploration/off_greedy_fraction``: the share of the actions counted by
        :meth:`off_greedy` since the last call that were not the noise-free greedy ones."""
        scalars = {}
        if self.kind == "epsilon" or self.noisy_epsilon > 0:
            scalars["charts/epsilon"] = self.epsilon
        off, seen = self._off_greedy
        if seen:
            scalars["exploration/off_greedy_fraction"] = off / seen
        self._off_greedy = [0, 0]
        return scalars
