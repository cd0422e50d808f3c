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
    "BEST_STREAM",
    "EVAL_STREAM",
    "EvalResult",
    "EvaluationStopped",
    "Evaluator",
    "episodes_named",
    "format_return",
    "json_ready",
    "run_episodes",
]

# Seed stream of evaluation episodes: disjoint from the training envs' (agent/streams.py).
EVAL_STREAM = streams.EVAL
# Seed stream of the episodes that confirm a candidate for best.pt: its own, so that the
# periodic rounds (and the early stops they decide) play the episodes they always played.
BEST_STREAM = streams.BEST
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
    first: int = 0,
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

    ``first``: the round's episode to start from, so that a round can be played in parts
    (``first=10`` plays episodes 10, 11, ...); the parts together score as the whole.
    """
    if epsilon > 0 and not n_actions:
        raise ValueError("run_episodes with epsilon > 0 needs n_actions")
    vector = isinstance(envs, gym.vector.VectorEnv)
    r = _Round(envs.num_envs if vector else len(envs), episodes, seed, round_index, stream,
               epsilon, n_actions, first)  # fmt: skip
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
                 epsilon: float, n_actions: int | None, first: int = 0) -> None:  # fmt: skip
        self.copies, self.episodes, self.seed, self.first = copies, episodes, seed, first
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
        episode = self.first + k  # its number in the round: its seeds
        if self.epsilon > 0:
            key = [self.seed, self.stream, self.round_index, episode, _EPSILON_KEY]
            self.rngs[i] = np.random.default_rng(key)
        self.playing[i] = k
        self.next_episode = k + 1
        return episode_seed(self.seed, self.round_index, episode, stream=self.stream)

    def throwaway_seed(self, i: int) -> int:
        """A reset seed for copy i past the round's episodes (a vector's idle copy)."""
        past = self.first + self.episodes + i
        return episode_seed(self.seed, self.round_index, past, stream=self.stream)

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
    best_confirmed: bool
    best_step: int | None
    best_episodes: dict[str, Any] | None
    solved_step: int | None


def episodes_named(
    seed: int, stream: int, round_index: int, episodes: int, epsilon: float
) -> dict[str, Any]:
    """The episodes a score was measured on, as ``run.py --eval`` replays them:
    ``--seed SEED --stream STREAM --round ROUND --episodes EPISODES --epsilon EPSILON``."""
    return {"seed": seed, "stream": stream, "round": round_index, "episodes": episodes,
            "epsilon": epsilon}  # fmt: skip


class Evaluator:
    """A run's noise-free evaluations: periodic rounds, the confirmation that decides an
    early stop, the confirmed best policy, and the final score on fresh episodes.

    Every periodic round plays episodes no earlier round played (``state.eval_round``,
    stream 1). ``log`` receives the ``eval/*`` scalars; ``curve`` collects (step, mean
    return) of every periodic round; ``on_best`` runs when a policy becomes the best
    (to save ``best.pt``), once ``state.best_*`` describe it.

    The best policy is chosen on fresh episodes: a periodic round is a candidate when its
    mean beats best.pt's confirmed score by more than ``confirm_z`` of its standard
    errors (the first round always is); the candidate plays ``best_confirm_episodes``
    fresh episodes (stream 5, :data:`BEST_STREAM`, numbered by the round), and
    becomes the best when their mean beats best.pt's. The maximum of many short rounds
    overstates the policy it picks; the fresh mean does not. An early-stop confirmation
    is such a fresh evaluation too, and counts as one. ``best_confirm_episodes`` 0: the
    best periodic round, unconfirmed (``state.best_confirmed`` False).
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
        best_confirm_episodes: int = 0,
        epsilon: float = 0.0,
        n_actions: int | None = None,
    ) -> None:
        self.policy, self.envs, self.state, self.seed = policy, envs, state, seed
        self.episodes, self.confirm_episodes, self.confirm_z = episodes, confirm_episodes, confirm_z
        self.final_episodes = final_episodes or confirm_episodes or episodes
        self.best_confirm_episodes = best_confirm_episodes
        self.target_return, self.early_stop = target_return, early_stop
        self.curve, self.log, self.on_best = curve, log, on_best
        self.epsilon, self.n_actions = epsilon, n_actions
        self.final_wall_s: float | None = None
        """Wall seconds of the final evaluation, once it ran."""
        self.final_mean_length: float | None = None
        """Mean episode length of the final evaluation, once it ran."""
        self.final_played: dict[str, Any] | None = None
        """The final evaluation's episodes (:func:`episodes_named`), once it ran."""

    def _episodes(
        self,
        episodes: int,
        stop: Callable[[], bool] | None = None,
        *,
        stream: int = EVAL_STREAM,
        round_index: int | None = None,
    ) -> EvalResult:
        return run_episodes(
            self.policy, self.envs, episodes, seed=self.seed,
            round_index=self.state.eval_round if round_index is None else round_index,
            stream=stream, epsilon=self.epsilon, n_actions=self.n_actions, stop=stop,
        )  # fmt: skip

    def _named(self, stream: int, round_index: int, episodes: int) -> dict[str, Any]:
        return episodes_named(self.seed, stream, round_index, episodes, self.epsilon)

    def _round(self, episodes: int) -> EvalResult:
        result = self._episodes(episodes)
        self.state.eval_round += 1
        return result

    def __call__(self, step: int) -> bool:
        """A periodic evaluation; True when it reached the target, confirmed."""
        start = time.perf_counter()
        round_index = self.state.eval_round
        result = self._round(self.episodes)
        self.curve.append((step, result.mean))
        # Lengths and seconds show a policy caught in a loop until the time limit: the
        # round's cost, which the returns alone do not show.
        self.log(step, {
            "eval/mean_return": result.mean, "eval/std_return": result.std,
            "eval/mean_length": float(result.lengths.mean()),
            "eval/max_length": float(result.lengths.max()),
            "eval/seconds": time.perf_counter() - start,
            "eval/round": float(round_index),
        })  # fmt: skip
        candidate = self._candidate(result)
        # A run extended after its early stop trains on: it solved once already.
        early_stop = self.early_stop and self.state.solved_step is None
        target = self.target_return
        if not (early_stop and target is not None and result.mean >= target):
            self._choose_best(step, result, round_index, candidate, None)
            return False
        if not self.confirm_episodes:
            self._choose_best(step, result, round_index, candidate, None)
            return True
        # Short evaluations near the threshold overstate a policy: confirm on fresh
        # episodes, with confidence (a policy whose true mean sits at the target passes a
        # bare-mean confirmation half the time, then scores below it in a fresh round).
        confirm_round = self.state.eval_round
        confirmed = self._round(self.confirm_episodes)
        lower = confirmed.mean - self.confirm_z * confirmed.standard_error
        self.log(step, {"eval/confirm_mean_return": confirmed.mean,
                        "eval/confirm_lower_bound": lower})
        fresh = (confirmed, self._named(EVAL_STREAM, confirm_round, self.confirm_episodes))
        self._choose_best(step, result, round_index, candidate, fresh)
        return lower >= target

    def _candidate(self, result: EvalResult) -> bool:
        """Whether a periodic round's policy may be better than best.pt's: the first round;
        above an unconfirmed best (the best periodic round's mean, as it is recorded); or
        above a confirmed one by more than ``confirm_z`` of the round's standard errors
        (a policy only as good as best.pt is then a candidate one round in twenty)."""
        best = self.state.best_eval
        if best is None:
            return True
        if not self.state.best_confirmed:
            return result.mean > best
        return result.mean - self.confirm_z * result.standard_error > best

    def _choose_best(
        self,
        step: int,
        result: EvalResult,
        round_index: int,
        candidate: bool,
        fresh: tuple[EvalResult, dict[str, Any]] | None,
    ) -> None:
        """best.pt after a periodic round: the round's policy replaces it when fresh
        episodes (``fresh``, an early stop's confirmation, or played here for a candidate)
        score it above best.pt's confirmed mean, or above an unconfirmed one."""
        state = self.state
        if not self.best_confirm_episodes:  # the best periodic round, unconfirmed
            if candidate:
                self._set_best(step, result.mean, False,
                               self._named(EVAL_STREAM, round_index, self.episodes))  # fmt: skip
            return
        if fresh is None and candidate:
            confirmed = self._confirm_candidate(round_index)
            self.log(step, {"eval/best_confirm_mean_return": confirmed.mean,
                            "eval/best_confirm_episodes": float(len(confirmed.returns))})
            fresh = (confirmed, self._named(BEST_STREAM, round_index, len(confirmed.returns)))
        if fresh is None:
            return
        confirmed, named = fresh
        if state.best_eval is None or not state.best_confirmed or confirmed.mean > state.best_eval:
            self._set_best(step, confirmed.mean, True, named)

    def _confirm_candidate(self, round_index: int) -> EvalResult:
        """A candidate's fresh episodes (the best stream, the candidate's round number: no
        other evaluation plays them), ``eval_episodes`` at a time, until ``confirm_z``
        standard errors put their mean clearly above or below best.pt's, or
        ``best_confirm_episodes`` are played: a clear improvement costs one part, not all.
        Against no confirmed best, all of them."""
        best = self.state.best_eval if self.state.best_confirmed else None
        returns, lengths = [], []
        while len(returns) < self.best_confirm_episodes:
            part = min(self.episodes, self.best_confirm_episodes - len(returns))
            played = run_episodes(
                self.policy, self.envs, part, seed=self.seed, round_index=round_index,
                stream=BEST_STREAM, epsilon=self.epsilon, n_actions=self.n_actions,
                first=len(returns),
            )  # fmt: skip
            returns.extend(played.returns.tolist())
            lengths.extend(played.lengths.tolist())
            so_far = EvalResult(np.array(returns), np.array(lengths, dtype=np.int64))
            margin = self.confirm_z * so_far.standard_error
            if best is not None and len(returns) > 1 and abs(so_far.mean - best) > margin:
                break
        return EvalResult(np.array(returns), np.array(lengths, dtype=np.int64))

    def _set_best(self, step: int, score: float, confirmed: bool, named: dict[str, Any]) -> None:
        state = self.state
        state.best_eval, state.best_confirmed, state.best_step = score, confirmed, step
        state.best_episodes = named
        self.log(step, {"eval/best_return": score})
        self.on_best()

    def final(self, step: int, stop: Callable[[], bool] | None = None) -> float | None:
        """The final policy's mean over ``final_episodes`` fresh episodes: never the round
        that stopped the run, which is at the target by selection; also best.pt's score
        where best.pt is this policy. None when ``stop``
        (asked every step) ended it first: the same episodes are played again in full
        when the run resumes."""
        start = time.perf_counter()
        try:
            result = self._episodes(self.final_episodes, stop)
        except EvaluationStopped:
            return None
        self.final_wall_s = time.perf_counter() - start
        self.final_mean_length = float(result.lengths.mean())
        self.final_played = self._named(EVAL_STREAM, self.state.eval_round, self.final_episodes)
        self.log(step, {"eval/final_mean_return": result.mean,
                        "eval/final_mean_length": self.final_mean_length})
        state = self.state
        if state.best_confirmed and state.best_step == step:
            # best.pt is this policy (saved at this step: an early stop, or a candidate of
            # the last round), and the stop chose it for its high confirming mean: the
            # final episodes, chosen by nothing, are its score.
            state.best_eval, state.best_episodes = result.mean, self.final_played
            self.log(step, {"eval/best_return": result.mean})
        return result.mean


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

