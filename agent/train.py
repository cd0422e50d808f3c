"""The training loop: read it top to bottom, like CleanRL's dqn.py, but callable from tests.

Bookkeeping that is not the algorithm lives beside the loop: the set-up (a config into
a run's components, a resume restoring them) in ``agent/setup.py``, episode returns,
seeds and exact resume in ``agent/episodes.py``, the checkpoint's contents in
``agent/checkpoint.py``, TensorBoard and the progress bar in ``agent/monitor.py``,
Ctrl-C and SIGTERM in ``agent/signals.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import gymnasium as gym
import numpy as np

from agent import streams
from agent.checkpoint import (
    CheckpointWriteError,
    buffer_left_out,
    keeps_buffer,
    policy_checkpoint,
    save_checkpoint,
    training_checkpoint,
)
from agent.config import Config
from agent.evaluate import Evaluator, json_ready
from agent.learner import Metrics, NonFiniteError
from agent.monitor import Monitor, exploration_probe, noise_stats
from agent.replay.base import Batch
from agent.replay.prioritized import annealed_beta
from agent.setup import (
    Agent,
    NewRunDir,
    Run,
    build_agent,
    build_q_network,
    check_observations,
    close_quietly,
    learner_settings,
    prepare_run,
    resolve_device,
)
from agent.signals import StopSignals
from agent.tracking import Tracker
from envs import episode_seed

# The loop's pieces beside train() are public too: seeds/group.py runs train_loop with S
# such runs as its members (prepare_run, Checkpoints, finish_run, ...); the set-up's names
# are re-exported from agent/setup.py.
__all__ = [
    "Agent",
    "Checkpoints",
    "Learning",
    "Member",
    "OwnAgent",
    "Run",
    "TrainResult",
    "build_agent",
    "build_q_network",
    "check_observations",
    "close_quietly",
    "crossed",
    "env_receive",
    "env_send",
    "finish_run",
    "learner_settings",
    "log_training",
    "prepare_run",
    "resolve_device",
    "run_outputs",
    "train",
    "train_loop",
]

# Every this many vector steps, the played actions are set against the noise-free greedy
# ones (exploration/off_greedy_fraction): a sample keeps the extra forward's cost small.
OFF_GREEDY_EVERY = 4


@dataclass
class TrainResult:
    """How a run ended, also written to ``RUN_DIR/result.json``."""

    run_dir: str
    status: Literal["finished", "solved", "interrupted"]
    global_step: int
    updates: int
    wall_time_s: float
    """Wall seconds of the whole run, every resumed piece included."""
    target_return: float | None
    solved_step: int | None
    """Env steps when the confirmed noise-free evaluation first reached target_return."""
    best_eval_return: float | None
    """best.pt's score: the mean of the fresh episodes that confirmed its policy
    (``best_confirmed``), or the mean of its periodic round where none confirmed it."""
    final_eval_return: float | None
    """Mean noise-free return of the final policy over final_episodes fresh episodes
    (never the evaluation that decided an early stop: that one is biased upwards)."""
    eval_curve: list[tuple[int, float]]
    """(env steps, mean noise-free return) of every periodic evaluation."""
    learner_backend: str = "torch"
    """The learner backend that ran (``learner_backend: auto`` resolves to numpy or torch;
    ``stacked``: seeds trained together, ``agent/seeds``)."""
    stop_signal: int | None = None
    """The signal that interrupted the run (SIGINT 2, SIGTERM 15), if any."""
    buffer_left_out: str | None = None
    """How ``last.pt`` was saved without the replay buffer, so that a resume from it is
    approximate (:func:`agent.checkpoint.buffer_left_out`), or None: with it, exact."""
    final_eval_wall_s: float | None = None
    """Wall seconds of the final evaluation (included in ``wall_time_s``)."""
    final_eval_mean_length: float | None = None
    """Mean episode length (agent steps) of the final evaluation."""
    final_eval_episodes: dict[str, Any] | None = None
    """The episodes of ``final_eval_return``: seed, stream, round, episodes, epsilon, as
    ``run.py --eval RUN_DIR/checkpoints/last.pt`` replays them (docs/evaluation.md)."""
    best_confirmed: bool = False
    """Whether fresh episodes, not the round that picked it, measured best_eval_return
    (False: ``best_confirm_episodes: 0``, or none confirmed yet)."""
    best_step: int | None = None
    """Env steps when best.pt's policy was saved."""
    best_eval_episodes: dict[str, Any] | None = None
    """The episodes of ``best_eval_return``, as ``final_eval_episodes`` names them."""
    pieces: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """Each piece of the run, its start then each resume: ``machine`` (the CPU, its torch
    threads, the GPU on CUDA), ``software`` (Python and the package versions),
    ``from_step``, ``to_step``, ``wall_s``. The wall times of a
    run resumed on other hardware add up machines that differ."""


def crossed(step: int, stride: int, interval: int) -> bool:
    """True when the last ``stride`` steps (one vector step) passed a multiple of ``interval``."""
    return step // interval != (step - stride) // interval


class Checkpoints:
    """``last.pt`` and ``best.pt`` of a run; what they hold is defined in agent/checkpoint.py."""

    def __init__(self, run: Run, wall_time: Any) -> None:
        self.run, self.wall_time = run, wall_time
        self.dir = run.run_dir / "checkpoints"
        replay = run.agent.replay
        nbytes = replay.capacity * replay.bytes_per_transition
        self.keeps_buffer = keeps_buffer(run.cfg.save_buffer, nbytes)
        self.buffer_left_out = (
            None if self.keeps_buffer else buffer_left_out(run.cfg.save_buffer, nbytes)
        )
        """How ``last.pt`` is saved without the replay buffer (:func:`buffer_left_out`),
        or None where it keeps it."""

    def policy(self) -> dict[str, Any]:
        run = self.run
        if not run.agent.learner.parameters_finite():
            raise NonFiniteError("non-finite network parameters")
        return policy_checkpoint(
            env_id=run.cfg.env_id,
            obs_shape=run.spec.obs_shape,
            obs_dtype=run.spec.obs_dtype,
            n_actions=run.spec.n_actions,
            config=run.cfg.to_dict(),
            q_network=run.agent.q_network,
            counters=dataclasses.asdict(run.counters),
        )

    def save_last(self, obs: np.ndarray) -> None:
        run, wall = self.run, self.wall_time()
        data = training_checkpoint(
            self.policy(),
            components=run.components,
            eval_curve=run.eval_curve,
            episodes=run.episodes.state_dict(obs),
            replay=run.agent.replay if self.keeps_buffer else None,
            wall_time_s=wall,
            pieces=self.pieces(wall),
        )
        save_checkpoint(self.dir / "last.pt", data)

    def pieces(self, wall_time_s: float) -> list[dict[str, Any]]:
        """The run's earlier pieces and this one so far (:class:`TrainResult`'s ``pieces``),
        the run's wall time being ``wall_time_s``."""
        run = self.run
        before = run.pieces_before
        now = {
            "machine": run.machine,
            "software": run.software,
            "from_step": before[-1]["to_step"] if before else 0,  # the step resumed from
            "to_step": run.counters.global_step,
            "wall_s": wall_time_s - run.wall_before,
        }
        return [*run.pieces_before, now]

    def save_best(self, obs: np.ndarray) -> None:
        try:
            save_checkpoint(self.dir / "best.pt", self.policy())  # the policy only
        except CheckpointWriteError as e:
            # A full disk must not also cost the checkpoint that lets the run resume.
            with contextlib.suppress(CheckpointWriteError):
                self.save_last(obs)
                e.saved_instead = (self.dir / "last.pt", self.run.counters.global_step)
            raise e from None


def train(
    cfg: Config,
    run_dir: str | Path,
    *,
    checkpoint: dict[str, Any] | None = None,
    progress: bool = True,
    echo: Any = print,
) -> TrainResult:
    """Train a Noisy DQN agent as configured; ``checkpoint`` resumes a run exactly.

    Writes TensorBoard events, ``config.yaml``, ``checkpoints/last.pt`` and
    ``best.pt``, and ``result.json`` under ``run_dir``. Raises
    :class:`~agent.checkpoint.CheckpointWriteError` when a checkpoint cannot be
    written (after saving whatever still can be), :class:`NonFiniteError` on
    divergence, :class:`~agent.errors.UserError` on a mistake the user can fix.
    """
    wall_start = time.perf_counter()
    new = NewRunDir(Path(run_dir)) if checkpoint is None else None
    with contextlib.ExitStack() as cleanup:  # on every exit path, errors included
        # Environments, agent, random streams (a resume restores them), then the outputs.
        run = prepare_run(cfg, Path(run_dir), checkpoint, cleanup, echo)
        with NewRunDir.removed_on_error(new, cleanup):  # a logger that cannot start (--track)
            member = Member(run, *run_outputs(run, wall_start, progress, lambda: run.obs))
        cleanup.callback(close_quietly, member.monitor)  # flushes the events, whatever happens
        announce(run, echo, member.checkpoints.buffer_left_out)
        member.monitor.start_progress()  # below the lines above, none glued to its frame
        stop = cleanup.enter_context(StopSignals())  # Ctrl-C and SIGTERM set stop.received
        outcomes: list[str | BaseException] = []
        train_loop([member], OwnAgent(run.agent), cfg, stop,
                   end=lambda _, outcome: outcomes.append(outcome))  # fmt: skip
        if isinstance(outcomes[0], BaseException):
            raise outcomes[0]
        # The end: save, then measure the final policy on fresh episodes.
        return finish_run(run, member.monitor, member.checkpoints, member.evaluate, run.obs,
                          outcomes[0], stop)  # type: ignore[arg-type]  # fmt: skip


@dataclass
class Member:
    """A run inside :func:`train_loop`: its components and its outputs."""

    run: Run
    monitor: Monitor
    checkpoints: Checkpoints
    evaluate: Evaluator

    def sample(self, batch_size: int, beta: float) -> Batch:
        """A replay batch for an update, augmented where the run augments (DrQ's shift)."""
        run = self.run
        batch = run.agent.replay.sample(batch_size, run.sample_generator, beta)
        return batch if run.augment is None else run.augment(batch)


class Learning(Protocol):
    """How :func:`train_loop`'s members act and learn, one call for all of them: a single
    run's own agent (:class:`OwnAgent`) or S seeds' stacked networks
    (:class:`agent.seeds.group.SeedStack`)."""

    @property
    def updates(self) -> int: ...

    def act(self, obs: list[np.ndarray]) -> np.ndarray:
        """Each member's greedy actions ``(S, n)``; fresh noise where its exploration
        policy asks for it."""
        ...

    def noise_free(self, obs: list[np.ndarray], actions: np.ndarray) -> np.ndarray:
        """Each member's greedy actions ``(S, n)`` with the noise off, for the observations
        that :meth:`act` just gave ``actions`` for (which they are, without noise)."""
        ...

    def update(self, batches: list[Batch]) -> None:
        """One gradient step per member on its batch; priorities back to its replay."""
        ...

    def sync_target(self) -> None: ...

    def metrics(self) -> list[Metrics | NonFiniteError | None]:
        """Each member's learner means since the last call; an error where it diverged."""
        ...

    def write_back(self) -> None:
        """Each member's own networks and learner up to date, before anything reads them."""
        ...

    def without(self, kept: list[int]) -> Learning:
        """The same learning for the members ``kept`` only (the others left the loop)."""
        ...


class OwnAgent:
    """A single run's agent as :class:`Learning`: its selector, update and learner."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    @property
    def updates(self) -> int:
        return self.agent.learner.updates

    def act(self, obs: list[np.ndarray]) -> np.ndarray:
        agent = self.agent
        return agent.selector(obs[0], agent.exploration.fresh_noise())[None]

    def noise_free(self, obs: list[np.ndarray], actions: np.ndarray) -> np.ndarray:
        selector = self.agent.noise_free
        return actions if selector is None else selector(obs[0])[None]

    def update(self, batches: list[Batch]) -> None:
        # per-sample errors, for a prioritized replay's priorities
        self.agent.replay.update_priorities(batches[0].indices, self.agent.update(batches[0]))

    def sync_target(self) -> None:
        self.agent.learner.sync_target()

    def metrics(self) -> list[Metrics | NonFiniteError | None]:
        try:
            return [self.agent.learner.metrics()]
        except NonFiniteError as e:
            return [e]

    def write_back(self) -> None:
        pass  # the agent learns in place

    def without(self, kept: list[int]) -> Learning:
        return self


def train_loop(
    members: Sequence[Member],
    learning: Learning,
    cfg: Config,
    stop: StopSignals,
    end: Callable[[Member, str | BaseException], Any],
    bar: Any = None,
) -> None:
    """The training loop, for one run or S seeds stepped together (``members``; their
    counters move together). Returns once every member has ended: ``end`` gets each with
    its status (``finished``, ``solved``, ``interrupted``) or the error that ended it, and
    finishes it. ``bar``: a tqdm bar that counts the env steps, if any."""
    n = cfg.num_envs
    members = list(members)  # those still training
    counters = members[0].run.counters
    if counters.global_step >= cfg.total_steps:  # resumed at the end: nothing left to step
        for member in members:
            end(member, "finished")
        return
    while members:
        # --- act: greedy on a noisy net; the exploration policy on top, in env_send ---
        obs = [m.run.obs for m in members]
        actions = learning.act(obs)  # (S, n) int64: the host read
        # On a sample of steps, what the agent would play with the noise off.
        probe = counters.global_step // n % OFF_GREEDY_EVERY == 0
        greedy = learning.noise_free(obs, actions) if probe else [None] * len(members)
        # --- step the environments: every member's actions go out before any step is read,
        # so envs in worker processes (vector: async) step together; then each member
        # records its step: transitions into replay, ended episodes reset ---
        sent = [env_send(m.run, a, g) for m, a, g in zip(members, actions, greedy, strict=True)]
        for member, (played, explored) in zip(members, sent, strict=True):
            env_receive(member.run, member.monitor, played, explored)
        step = counters.global_step
        if bar is not None:
            bar.update(n)

        # --- learn: one update per train_freq env steps, once learning has started ---
        if step >= counters.learning_starts and len(members[0].run.agent.replay) >= cfg.batch_size:
            beta = annealed_beta(cfg.priority_beta, step / cfg.total_steps)
            while learning.updates < counters.updates_due(cfg.train_freq):
                learning.update([m.sample(cfg.batch_size, beta) for m in members])
            if crossed(step, n, cfg.target_update_interval):
                learning.sync_target()

        # --- log, evaluate (stop early once solved), checkpoint: each member on its own ---
        leaving: dict[int, str | BaseException] = {}
        log = crossed(step, n, cfg.log_interval)
        evaluate = bool(cfg.eval_interval) and crossed(step, n, cfg.eval_interval)
        save = crossed(step, n, cfg.checkpoint_interval)
        last = step >= cfg.total_steps or stop.requested()
        if log or evaluate or save or last:
            learning.write_back()
        if log:  # where the learner's metrics become floats
            for i, metrics in enumerate(learning.metrics()):
                if isinstance(metrics, NonFiniteError):
                    leaving[i] = metrics
                else:
                    log_training(members[i].run, members[i].monitor, step, metrics,
                                 learning.updates)  # fmt: skip
            if bar is not None:
                bar.set_postfix(seeds=len(members))
        for i, member in enumerate(members):
            if i in leaving:
                continue
            if evaluate and member.evaluate(step):
                member.run.counters.solved_step = step
                leaving[i] = "solved"
            elif save:
                member.checkpoints.save_last(member.run.obs)
        # --- the end of the budget, or Ctrl-C / SIGTERM: save and stop ---
        if last:
            status = "interrupted" if stop.requested() else "finished"
            leaving.update({i: status for i in range(len(members)) if i not in leaving})

        # --- members that are done leave; the rest go on ---
        if leaving:
            for i in sorted(leaving):
                end(members[i], leaving[i])
            kept = [i for i in range(len(members)) if i not in leaving]
            members = [members[i] for i in kept]
            if members:
                learning = learning.without(kept)
                counters = members[0].run.counters


def env_send(
    run: Run, actions: np.ndarray, greedy: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The first half of a step of the run's environments: the exploration policy on top
    of its selector's ``actions``, sent to the envs (an async vector env's workers start
    stepping). Returns the actions played and ``explored``, ``(n,)`` bool where the floor's
    random action replaced the policy's. ``greedy``: the noise-free greedy actions, where
    this step is one the off-greedy share samples."""
    counters, explore = run.counters, run.agent.exploration
    actions, explored = explore(actions, counters.global_step)
    if greedy is not None:
        explore.off_greedy(actions, greedy, counters.global_step)
    if isinstance(run.envs, gym.vector.AsyncVectorEnv):
        run.envs.step_async(actions)
    return actions, explored


def env_receive(run: Run, monitor: Monitor, actions: np.ndarray, explored: np.ndarray) -> None:
    """The second half, after :func:`env_send`: the real transitions into replay, ended
    episodes logged and their envs reset, repeats told to the policy; ``run.obs`` becomes
    the next observations. Both loops take their steps here (a single run's, and each
    seed's of a group)."""
    cfg, counters, episodes, explore = run.cfg, run.counters, run.episodes, run.agent.exploration
    if isinstance(run.envs, gym.vector.AsyncVectorEnv):  # stepping since env_send
        next_obs, rewards, terminated, truncated, info = run.envs.step_wait()
    else:
        next_obs, rewards, terminated, truncated, info = run.envs.step(actions)
    counters.global_step += cfg.num_envs
    life_lost = episodes.step(actions, rewards, info)
    # Training-only signals; the logged return stays the sum of the env's rewards.
    # A lost life ends bootstrapping in replay, but the env is not reset.
    train_rewards = np.sign(rewards) if cfg.clip_rewards else rewards
    train_dones = terminated | life_lost if cfg.terminal_on_life_loss else terminated
    # The floor's random actions end the n-step returns before them (explored).
    run.agent.replay.add(run.obs, actions, train_rewards, next_obs, train_dones, truncated,
                         explored)  # fmt: skip
    # Episode ends: log them, reset those envs with their next seeds.
    done = terminated | truncated
    if done.any():
        next_obs, finished = episodes.finish(run.envs, done)
        for episodic_return, length in finished:
            monitor.episode(counters.global_step, episodic_return, length)
        counters.episodes += len(finished)
        explore.episode_ended()  # per-episode noise: drawn afresh next step
    if episodes.observe(next_obs):  # a repeat under held noise: a loop; break it
        explore.repeated()
    run.obs = next_obs


def run_outputs(
    run: Run, wall_start: float, progress: bool, current_obs: Callable[[], np.ndarray]
) -> tuple[Monitor, Checkpoints, Evaluator]:
    """A run's TensorBoard monitor (the caller closes it), checkpoints and evaluator;
    ``current_obs``: what a failed ``best.pt`` write saves ``last.pt`` with."""
    cfg, counters = run.cfg, run.counters
    tracker = None  # W&B beside TensorBoard (--track)
    if cfg.track:
        tracker = Tracker(run.run_dir, cfg.wandb_project, cfg.wandb_entity, run.ran)
    monitor = Monitor(run.run_dir, cfg.total_steps, counters.global_step, progress, tracker)
    checkpoints = Checkpoints(run, lambda: run.wall_before + time.perf_counter() - wall_start)
    evaluate = Evaluator(
        run.agent.greedy, run.eval_envs, counters, seed=cfg.seed,
        episodes=cfg.eval_episodes, confirm_episodes=cfg.confirm_episodes,
        confirm_z=cfg.confirm_z, target_return=run.target_return,
        early_stop=cfg.early_stop, curve=run.eval_curve, log=monitor.scalars,
        on_best=lambda: checkpoints.save_best(current_obs()),
        final_episodes=cfg.final_episodes, best_confirm_episodes=_best_confirm_episodes(cfg),
        epsilon=cfg.eval_epsilon, n_actions=run.spec.n_actions,
    )  # fmt: skip
    return monitor, checkpoints, evaluate


def _best_confirm_episodes(cfg: Config) -> int:
    """The fresh episodes that confirm a candidate for best.pt (``best_confirm_episodes``,
    null: ``confirm_episodes``)."""
    if cfg.best_confirm_episodes is None:
        return cfg.confirm_episodes
    return cfg.best_confirm_episodes


def finish_run(
    run: Run,
    monitor: Monitor,
    checkpoints: Checkpoints,
    evaluate: Evaluator,
    obs: np.ndarray,
    status: Literal["finished", "solved", "interrupted"],
    stop: StopSignals,
    learner_backend: str | None = None,
) -> TrainResult:
    """The end of a run: save ``last.pt``, measure the final policy on fresh episodes
    (not after an interruption), write ``result.json``. ``stop``: the run's Ctrl-C and
    SIGTERM; one during the final evaluation ends it there, and the run is interrupted
    (its resume plays the final evaluation alone). ``learner_backend``: where not the
    run's own learner learned (a seed group's stacked one)."""
    counters, learner = run.counters, run.agent.learner
    checkpoints.save_last(obs)
    monitor.progress(counters.global_step)
    final_eval = None
    if status != "interrupted":
        final_eval = evaluate.final(counters.global_step, stop.requested)
        if final_eval is None:
            status = "interrupted"
    if final_eval is not None:
        monitor.hparams(run.ran, {"eval/final_mean_return": final_eval})
    wall = checkpoints.wall_time()
    result = TrainResult(
        run_dir=str(run.run_dir),
        status=status,
        global_step=counters.global_step,
        updates=learner.updates,
        wall_time_s=wall,
        target_return=run.target_return,
        solved_step=counters.solved_step,
        best_eval_return=counters.best_eval,
        final_eval_return=final_eval,
        eval_curve=run.eval_curve,
        stop_signal=stop.received,
        learner_backend=learner_backend or learner.backend,
        buffer_left_out=checkpoints.buffer_left_out,
        final_eval_wall_s=evaluate.final_wall_s,
        final_eval_mean_length=evaluate.final_mean_length if final_eval is not None else None,
        final_eval_episodes=evaluate.final_played if final_eval is not None else None,
        best_confirmed=counters.best_confirmed,
        best_step=counters.best_step,
        best_eval_episodes=counters.best_episodes,
        pieces=checkpoints.pieces(wall),
    )
    (run.run_dir / "result.json").write_text(json.dumps(json_ready(result.__dict__), indent=2))
    return result


def announce(run: Run, echo: Any, buffer_left_out: str | None = None) -> None:
    """Where the run is, how to watch it, a ``last.pt`` without the replay buffer
    (``buffer_left_out``, :class:`Checkpoints`) and a random warm-up still ahead."""
    cfg = run.cfg
    echo(f"run directory: {run.run_dir}")
    echo(f"watch it with: tensorboard --logdir {run.run_dir.parent}")
    if buffer_left_out is not None:
        echo(f"checkpoints/last.pt is saved {buffer_left_out}")
    if run.agent.replay.device.type == "cuda":
        where = "GPU memory" if run.ran["replay_storage"] == "device" else "pinned host memory"
        echo(f"replay: {cfg.buffer_size:,} transitions in {where} (replay_storage)")
    if run.counters.global_step < cfg.random_starts:  # not again on a resume past the warm-up
        whole = " (the whole run)" if cfg.random_starts >= cfg.total_steps else ""
        echo(f"uniform random actions for the first {cfg.random_starts:,} steps{whole}: "
             "random_starts; --set random_starts=N to change it")


def log_training(
    run: Run, monitor: Monitor, step: int, metrics: Metrics | None, updates: int
) -> None:
    """The training scalars at a log interval: losses (``metrics``, the learner's means
    since the last log), exploration, noise."""
    cfg, replay = run.cfg, run.agent.replay
    scalars = {"charts/episodes": float(run.counters.episodes)}
    if metrics is not None:
        scalars["losses/td_loss"] = metrics.td_loss
        scalars["losses/q_values"] = metrics.q_values
        scalars["charts/updates"] = float(updates)
    scalars.update(run.agent.exploration.scalars())
    scalars.update(noise_stats(run.agent.q_network))
    if len(replay) >= cfg.batch_size:  # how much the noise changes behaviour
        probe_seed = episode_seed(cfg.seed, 0, step, stream=streams.PROBE)
        noisy = run.agent.exploration.noisy
        scalars.update(
            exploration_probe(run.agent.q_network, replay, cfg.batch_size, probe_seed, noisy)
        )
    monitor.scalars(step, scalars)
    monitor.progress(step, sps=f"{monitor.sps(step):.0f}")
