"""Evaluate a policy over whole episodes of a separate environment."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from agent import streams
from envs import episode_seed

__all__ = [
    "EVAL_STREAM",
    "EvalResult",
    "EvaluationStopped",
    "Evaluator",
    "format_return",
    "json_ready",
    "run_episodes",
]

# Seed stream of evaluation episodes: disjoint from the training envs' (agent/streams.py).
EVAL_STREAM = streams.EVAL
# The last entropy word of an evaluation episode's own random actions (eval_epsilon).
_EPSILON_KEY = 7


class EvaluationStopped(Exception):
    """:func:`run_episodes` was asked to stop (its ``stop`` returned True) before the
    episodes were played; ``played``: the episodes it had played to their end."""

    def __init__(self, played: int) -> None:
        super().__init__(f"stopped after {played} episodes")
        self.played = played


@dataclass(frozen=True)
class EvalResult:
    returns: np.ndarray  # (episodes,) float64
    lengths: np.ndarray  # (episodes,) int64

    @property
    def mean(self) -> float:
        return float(self.returns.mean())

    @property
    def std(self) -> float:
        return float(self.returns.std())

    @property
    def success_rate(self) -> float:
        """Share of episodes with a positive return: solved episodes of sparse goal tasks."""
        return float((self.returns > 0).mean())

    @property
    def standard_error(self) -> float:
        """Standard error of the mean return (sample std / sqrt(episodes); 0 for one episode)."""
        n = len(self.returns)
        return float(self.returns.std(ddof=1) / np.sqrt(n)) if n > 1 else 0.0


def run_episodes(
    policy: Callable[[np.ndarray], np.ndarray],
    envs: Sequence[gym.Env],
    episodes: int,
    *,
    seed: int,
    round_index: int = 0,
    stream: int = EVAL_STREAM,
    epsilon: float = 0.0,
    n_actions: int | None = None,
    stop: Callable[[], bool] | None = None,
) -> EvalResult:
    """Play ``episodes`` full episodes with ``policy`` on ``len(envs)`` copies at once.

    ``policy`` maps a batch ``(len(envs), *obs_shape)`` to actions; one call
    serves every copy, which makes evaluation several times cheaper than one
    env at a time (the per-call cost of acting is paid once per batch). A copy
    whose episodes are done keeps feeding its last observation; its actions are
    ignored.

    Episode ``k`` of evaluation round ``round_index`` is reset with its own seed,
    whichever copy plays it, so a deterministic policy scores the same for any
    number of copies, and evaluation is independent of training's envs
    (stream 0). Periodic evaluations during training use stream 1; ``run.py
    --eval`` uses stream 2, episodes the agent was never selected on.

    ``epsilon``: each step plays a uniform random action among ``n_actions`` with this
    probability instead of the policy's, drawn from the episode's own generator (seeded
    like its reset), so the score still does not depend on the number of copies.

    ``stop``: asked before every step; when it returns True the episodes are abandoned
    (:class:`EvaluationStopped`), so that Ctrl-C ends a long evaluation at once.
    """
    if epsilon > 0 and not n_actions:
        raise ValueError("run_episodes with epsilon > 0 needs n_actions")
    returns = [0.0] * episodes  # Python floats: per-step numpy scalar updates cost more
    lengths = [0] * episodes
    playing = [-1] * len(envs)  # episode index each copy plays, -1 when idle
    rngs: list[np.random.Generator | None] = [None] * len(envs)  # epsilon's, per episode
    next_episode = 0
    batch: np.ndarray | None = None

    def start(i: int) -> None:
        nonlocal next_episode, batch
        if next_episode >= episodes:
            playing[i] = -1
            return
        if epsilon > 0:
            rngs[i] = np.random.default_rng([seed, stream, round_index, next_episode, _EPSILON_KEY])
        obs, _ = envs[i].reset(seed=episode_seed(seed, round_index, next_episode, stream=stream))
        if batch is None:
            batch = np.zeros((len(envs), *np.shape(obs)), dtype=np.asarray(obs).dtype)
        batch[i] = obs
        playing[i] = next_episode
        next_episode += 1

    for i in range(len(envs)):
        start(i)
    steps = [env.step for env in envs]
    while batch is not None and any(k >= 0 for k in playing):
        if stop is not None and stop():
            raise EvaluationStopped(next_episode - sum(k >= 0 for k in playing))
        actions = policy(batch)
        for i, k in enumerate(playing):
            if k < 0:
                continue
            action = actions[i]
            rng = rngs[i]
            if rng is not None and rng.random() < epsilon:
                action = rng.integers(n_actions)
            # The action as the env's own space samples it (np.int64): the cheapest check.
            obs, reward, terminated, truncated, _ = steps[i](action)
            batch[i] = obs
            returns[k] += float(reward)
            lengths[k] += 1
            if terminated or truncated:
                start(i)
    return EvalResult(np.array(returns, dtype=np.float64), np.array(lengths, dtype=np.int64))



class EvalState(Protocol):
    """The evaluation counters a run keeps in its checkpoints."""

    eval_round: int
    best_eval: float | None
    solved_step: int | None


class Evaluator:
    """A run's noise-free evaluations: periodic rounds, the confirmation that decides an
    early stop, the best score, and the final score on fresh episodes.

    Every round plays episodes no earlier round played (``state.eval_round``). ``log``
    receives the ``eval/*`` scalars; ``on_best`` runs when a round beats the best so far
    (to save ``best.pt``); ``curve`` collects (step, mean return) of every periodic round.
    """

    def __init__(
        self,
        policy: Callable[[np.ndarray], np.ndarray],
        envs: Sequence[gym.Env],
        state: EvalState,
        *,
        seed: int,
        episodes: int,
        confirm_episodes: int,
        confirm_z: float,
        target_return: float | None,
        early_stop: bool,
        curve: list[tuple[int, float]],
        log: Callable[[int, dict[str, float]], None],
        on_best: Callable[[], None],
        final_episodes: int | None = None,
        epsilon: float = 0.0,
        n_actions: int | None = None,
    ) -> None:
        self.policy, self.envs, self.state, self.seed = policy, envs, state, seed
        self.episodes, self.confirm_episodes, self.confirm_z = episodes, confirm_episodes, confirm_z
        self.final_episodes = final_episodes or confirm_episodes or episodes
        self.target_return, self.early_stop = target_return, early_stop
        self.curve, self.log, self.on_best = curve, log, on_best
        self.epsilon, self.n_actions = epsilon, n_actions
        self.final_wall_s: float | None = None
        """Wall seconds of the final evaluation, once it ran."""

    def _episodes(self, episodes: int, stop: Callable[[], bool] | None = None) -> EvalResult:
        return run_episodes(
            self.policy, self.envs, episodes, seed=self.seed, round_index=self.state.eval_round,
            epsilon=self.epsilon, n_actions=self.n_actions, stop=stop,
        )  # fmt: skip

    def _round(self, episodes: int) -> EvalResult:
        result = self._episodes(episodes)
        self.state.eval_round += 1
        return result

    def __call__(self, step: int) -> bool:
        """A periodic evaluation; True when it reached the target, confirmed."""
        result = self._round(self.episodes)
        self.curve.append((step, result.mean))
        self.log(step, {"eval/mean_return": result.mean, "eval/std_return": result.std})
        if self.state.best_eval is None or result.mean > self.state.best_eval:
            self.state.best_eval = result.mean
            self.on_best()
        # A run extended after its early stop trains on: it solved once already.
        early_stop = self.early_stop and self.state.solved_step is None
        target = self.target_return
        if not (early_stop and target is not None and result.mean >= target):
            return False
        if not self.confirm_episodes:
            return True
        # Short evaluations near the threshold overstate a policy: confirm on fresh
        # episodes, with confidence (a policy whose true mean sits at the target passes a
        # bare-mean confirmation half the time, then scores below it in a fresh round).
        confirmed = self._round(self.confirm_episodes)
        lower = confirmed.mean - self.confirm_z * confirmed.standard_error
        self.log(step, {"eval/confirm_mean_return": confirmed.mean,
                        "eval/confirm_lower_bound": lower})
        return lower >= target

    def final(self, step: int, stop: Callable[[], bool] | None = None) -> float | None:
        """The final policy's mean over ``final_episodes`` fresh episodes: never the round
        that stopped the run, which is at the target by selection. None when ``stop``
        (asked every step) ended it first: the same episodes are played again in full
        when the run resumes."""
        start = time.perf_counter()
        try:
            mean = self._episodes(self.final_episodes, stop).mean
        except EvaluationStopped:
            return None
        self.final_wall_s = time.perf_counter() - start
        self.log(step, {"eval/final_mean_return": mean})
        return mean


def format_return(x: float) -> str:
    """A return for people: three significant digits, never an exponent (0.955, 9.30,
    487, -200, 1234)."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    decimals = max(0, 2 - math.floor(math.log10(abs(x))))
    return f"{x:.{decimals}f}"


def json_ready(value: Any) -> Any:
    """``value`` with every float rounded to 12 significant digits, so that JSON reads
    9.3 rather than 9.299999999999999 (sums of float32 rewards)."""
    if isinstance(value, float):
        return float(f"{value:.12g}")
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(v) for v in value]
    return value

