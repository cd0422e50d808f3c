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
    envs: Sequence[gym.Env] | gym.vector.VectorEnv,
    episodes: int,
    *,
    seed: int,
    round_index: int = 0,
    stream: int = EVAL_STREAM,
    epsilon: float = 0.0,
    n_actions: int | None = None,
    stop: Callable[[], bool] | None = None,
) -> EvalResult:
    """Play ``episodes`` full episodes with ``policy`` on the copies ``envs`` at once.

    ``policy`` maps a batch ``(copies, *obs_shape)`` to actions; one call serves every
    copy, which makes evaluation several times cheaper than one env at a time (the
    per-call cost of acting is paid once per batch). A copy whose episodes are done
    keeps feeding its last observation; its actions are ignored.

    ``envs``: a list of envs, stepped one after another in this process, or a vector
    env (autoreset disabled, ``envs.make_vector_env``) whose copies step at once, each
    in its own worker process when it is async; the scores are the same. A vector's
    copy with no episode left plays a throwaway one, so that no copy is stepped past
    its end.

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
    vector = isinstance(envs, gym.vector.VectorEnv)
    r = _Round(envs.num_envs if vector else len(envs), episodes, seed, round_index, stream,
               epsilon, n_actions)  # fmt: skip
    if vector:
        return _play_vector(envs, policy, r, stop)

    def start(i: int) -> None:
        episode = r.assign(i)
        if episode is not None:
            r.put(i, envs[i].reset(seed=episode)[0])

    for i in range(r.copies):
        start(i)
    playing, returns, lengths = r.playing, r.returns, r.lengths
    steps = [env.step for env in envs]
    while r.batch is not None and any(k >= 0 for k in playing):
        if stop is not None and stop():
            raise EvaluationStopped(r.played)
        actions = policy(r.batch)
        for i, k in enumerate(playing):
            if k < 0:
                continue
            # The action as the env's own space samples it (np.int64): the cheapest check.
            obs, reward, terminated, truncated, _ = steps[i](r.act(i, actions[i]))
            r.batch[i] = obs
            returns[k] += float(reward)
            lengths[k] += 1
            if terminated or truncated:
                start(i)
    return r.result()


def _play_vector(
    envs: gym.vector.VectorEnv,
    policy: Callable[[np.ndarray], np.ndarray],
    r: _Round,
    stop: Callable[[], bool] | None,
) -> EvalResult:
    """:func:`run_episodes` on a vector env: every copy steps at once, and the copies whose
    episodes ended reset together (to their next episodes, or to throwaway ones)."""

    def reset(ended: list[int]) -> None:
        seeds: list[int | None] = [None] * r.copies
        for i in ended:  # in copy order, as the list loop hands the episodes out
            episode = r.assign(i)
            seeds[i] = r.throwaway_seed(i) if episode is None else episode
        mask = np.zeros(r.copies, dtype=bool)
        mask[ended] = True
        obs, _ = envs.reset(seed=seeds, options={"reset_mask": mask})
        for i in ended:
            r.put(i, obs[i])

    reset(list(range(r.copies)))
    while any(k >= 0 for k in r.playing):
        if stop is not None and stop():
            raise EvaluationStopped(r.played)
        proposed = policy(r.batch)
        pairs = enumerate(zip(r.playing, proposed, strict=True))
        actions = np.array([r.act(i, a) if k >= 0 else a for i, (k, a) in pairs])
        obs, rewards, terminated, truncated, _ = envs.step(actions)
        ended = []
        for i, k in enumerate(r.playing):
            if terminated[i] or truncated[i]:
                ended.append(i)
            if k >= 0:
                r.batch[i] = obs[i]
                r.returns[k] += float(rewards[i])
                r.lengths[k] += 1
        if ended:
            reset(ended)
    return r.result()


class _Round:
    """One :func:`run_episodes` call's bookkeeping: which copy plays which episode, the
    episodes' returns and lengths, their epsilon generators, the batch of observations."""

    def __init__(self, copies: int, episodes: int, seed: int, round_index: int, stream: int,
                 epsilon: float, n_actions: int | None) -> None:  # fmt: skip
        self.copies, self.episodes, self.seed = copies, episodes, seed
        self.round_index, self.stream = round_index, stream
        self.epsilon, self.n_actions = epsilon, n_actions
        self.returns = [0.0] * episodes  # Python floats: per-step numpy updates cost more
        self.lengths = [0] * episodes
        self.playing = [-1] * copies  # the episode each copy plays, -1 when idle
        self.rngs: list[np.random.Generator | None] = [None] * copies  # epsilon's
        self.next_episode = 0
        self.batch: np.ndarray | None = None

    def assign(self, i: int) -> int | None:
        """Copy i's next episode (its reset seed), or None when none is left."""
        k = self.next_episode
        if k >= self.episodes:
            self.playing[i] = -1
            return None
        if self.epsilon > 0:
            key = [self.seed, self.stream, self.round_index, k, _EPSILON_KEY]
            self.rngs[i] = np.random.default_rng(key)
        self.playing[i] = k
        self.next_episode = k + 1
        return episode_seed(self.seed, self.round_index, k, stream=self.stream)

    def throwaway_seed(self, i: int) -> int:
        """A reset seed for copy i past the round's episodes (a vector's idle copy)."""
        return episode_seed(self.seed, self.round_index, self.episodes + i, stream=self.stream)

    def put(self, i: int, obs: Any) -> None:
        if self.batch is None:
            self.batch = np.zeros((self.copies, *np.shape(obs)), dtype=np.asarray(obs).dtype)
        self.batch[i] = obs

    def act(self, i: int, action: Any) -> Any:
        """The policy's action, or with probability epsilon a uniform one (copy i's episode's)."""
        rng = self.rngs[i]
        if rng is not None and rng.random() < self.epsilon:
            return rng.integers(self.n_actions)
        return action

    @property
    def played(self) -> int:
        """Episodes played to their end."""
        return self.next_episode - sum(k >= 0 for k in self.playing)

    def result(self) -> EvalResult:
        return EvalResult(np.array(self.returns, dtype=np.float64),
                          np.array(self.lengths, dtype=np.int64))  # fmt: skip


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
        envs: Sequence[gym.Env] | gym.vector.VectorEnv,
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
        start = time.perf_counter()
        result = self._round(self.episodes)
        self.curve.append((step, result.mean))
        # Lengths and seconds show a policy caught in a loop until the time limit: the
        # round's cost, which the returns alone do not show.
        self.log(step, {
            "eval/mean_return": result.mean, "eval/std_return": result.std,
            "eval/mean_length": float(result.lengths.mean()),
            "eval/max_length": float(result.lengths.max()),
            "eval/seconds": time.perf_counter() - start,
        })  # fmt: skip
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

