"""The training loop: read it top to bottom, like CleanRL's dqn.py, but callable from tests.

Bookkeeping that is not the algorithm lives beside the loop: episode returns, seeds
and exact resume in ``agent/episodes.py``, the checkpoint's contents in
``agent/checkpoint.py``, TensorBoard and the progress bar in ``agent/monitor.py``,
Ctrl-C and SIGTERM in ``agent/signals.py``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import yaml
from threadpoolctl import threadpool_limits

from agent import streams
from agent.acting import ActionSelector
from agent.augment import RandomShift, make_augment
from agent.acting.graph import CaptureFn, capture_cuda_graph
from agent.checkpoint import (
    CheckpointWriteError,
    buffer_left_out,
    keeps_buffer,
    policy_checkpoint,
    restore_training,
    save_checkpoint,
    training_checkpoint,
)
from agent.config import Config
from agent.episodes import Episodes
from agent.errors import UserError
from agent.evaluate import Evaluator, json_ready
from agent.exploration import Exploration
from agent.learner import CapturedUpdate, Learner, Metrics, NonFiniteError
from agent.monitor import Monitor, exploration_stats, noise_stats
from agent.networks import QNetwork, resolve_torso
from agent.replay import Batch, FrameReplayBuffer, Replay, ReplayBuffer, choose_storage
from agent.replay.prioritized import annealed_beta
from agent.signals import StopSignals
from agent.tracking import Tracker, require_wandb
from envs import EnvSpec, episode_seed, inspect_env, make_env, make_vector_env

# The loop's pieces beside train() are public too: seeds/group.py steps S such runs
# together with them (prepare_run, Checkpoints, log_training, finish_run, ...).
__all__ = [
    "Agent",
    "Checkpoints",
    "Run",
    "TrainResult",
    "build_agent",
    "build_q_network",
    "check_observations",
    "close_quietly",
    "crossed",
    "exploration_probe",
    "finish_run",
    "learner_settings",
    "log_training",
    "prepare_run",
    "resolve_device",
    "run_outputs",
    "train",
]

# Replay states behind the exploration/* scalars, drawn at each log (batch_size at a time).
PROBE_STATES = 256


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


@dataclass
class Counters:
    """The loop's counters, saved in every checkpoint."""

    global_step: int = 0
    episodes: int = 0
    eval_round: int = 0
    best_eval: float | None = None
    solved_step: int | None = None
    learning_starts: int = 0
    """Env step from which updates run: ``learning_starts``, pushed back by a resume
    whose checkpoint had no replay buffer (the buffer refills first)."""
    updates_before: int = 0
    """Learner updates done before ``learning_starts`` (the updates of earlier pieces)."""

    def updates_due(self, train_freq: int) -> int:
        """Updates that should have run by ``global_step``: one per ``train_freq`` steps."""
        return self.updates_before + (self.global_step - self.learning_starts) // train_freq + 1


@dataclass
class Agent:
    """The parts of a run, built from a config by :func:`build_agent`."""

    q_network: QNetwork
    target_network: QNetwork
    replay: Replay
    selector: ActionSelector
    """Acting: greedy on the noisy net (or on the mean weights, for epsilon-greedy)."""
    greedy: ActionSelector
    """Evaluation: greedy on the mean weights, one action per evaluation env."""
    learner: Learner
    update: Callable[[Batch], torch.Tensor]
    """``learner.update``, or on CUDA with ``capture_graph`` the same captured as a graph:
    a batch in, its per-sample errors out (for prioritized replay)."""


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; a CUDA request without CUDA is a user error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name}: CUDA is not available here; use --device cpu or auto")
    return device


def build_q_network(
    cfg: Config,
    obs_shape: tuple[int, ...],
    n_actions: int,
    device: torch.device,
    obs_dtype: str = "float32",
) -> QNetwork:
    """The Q-network a config describes (training builds it, evaluation rebuilds it);
    0-255 frames (``obs_dtype`` uint8, images) are divided by 255 before the torso."""
    frames = obs_dtype == "uint8" and resolve_torso(obs_shape, cfg.torso) != "mlp"
    return QNetwork(
        obs_shape,
        n_actions,
        cfg.hidden_sizes,
        noisy_layers=cfg.noisy_layers,
        sigma0=cfg.sigma0,
        dueling=cfg.dueling,
        dueling_streams=cfg.dueling_streams,
        num_atoms=cfg.num_atoms if cfg.distributional else 1,
        v_min=cfg.v_min,
        v_max=cfg.v_max,
        torso=cfg.torso,
        input_scale=255.0 if frames else None,
        device=device,
        dtype=getattr(torch, cfg.dtype),
    )


def check_observations(cfg: Config, spec: EnvSpec) -> None:
    """A :class:`UserError` for a torso or an augmentation that does not fit the env's
    observations."""
    try:
        torso = resolve_torso(spec.obs_shape, cfg.torso)
    except ValueError as e:
        raise UserError(f"invalid config: {e}: --set torso=auto") from None
    if torso == "der" and spec.obs_dtype != "uint8":
        raise UserError(
            f"invalid config: torso der takes frames of 0-255 (uint8), and {cfg.env_id} "
            f"gives {spec.obs_dtype} images: --set torso=auto"
        )
    if cfg.augment != "none" and len(spec.obs_shape) != 3:
        raise UserError(
            f"invalid config: augment {cfg.augment} moves images, and {cfg.env_id} gives "
            f"vectors of shape {spec.obs_shape}: --set augment=none"
        )


def build_agent(cfg: Config, spec: EnvSpec, device: torch.device, eval_envs: int) -> Agent:
    """Online and target networks, replay, the two selectors and the learner of a run."""
    q_network = build_q_network(cfg, spec.obs_shape, spec.n_actions, device, spec.obs_dtype)
    target_network = copy.deepcopy(q_network).requires_grad_(False)  # it never learns
    # Image stacks (C, H, W) of integer frames: each frame stored once (agent/replay/frames.py).
    frames = cfg.frame_replay and len(spec.obs_shape) == 3 and spec.obs_dtype == "uint8"
    float_dtype = getattr(torch, cfg.dtype)
    size = ReplayBuffer.storage_bytes(cfg.buffer_size, spec.obs_shape, np.dtype(spec.obs_dtype),
                                      float_dtype)  # fmt: skip
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None
    try:
        storage = choose_storage(cfg.replay_storage, device, frames, size, free)
    except ValueError as e:
        raise UserError(f"invalid config: {e}") from None
    try:
        replay = (FrameReplayBuffer if frames else ReplayBuffer)(
            cfg.buffer_size,
            spec.obs_shape,
            np.dtype(spec.obs_dtype),
            device=device,
            storage_device=storage,
            n_step=cfg.n_step,
            gamma=cfg.gamma,
            num_envs=cfg.num_envs,
            float_dtype=float_dtype,
            alpha=cfg.priority_alpha if cfg.prioritized_replay else None,
            priority_eps=cfg.priority_eps,
        )
    except ValueError as e:
        raise UserError(f"invalid config: {e}") from None
    # Acting on the noisy net (the exploration policy says when its noise is drawn) or, for
    # epsilon-greedy, on the mean weights.
    selector = ActionSelector(
        q_network,
        spec.obs_shape,
        cfg.num_envs,
        device,
        noise=cfg.exploration == "noisy",
        capture_graph=cfg.capture_graph,
    )
    greedy = ActionSelector(
        q_network, spec.obs_shape, eval_envs, device, noise=False, capture_graph=cfg.capture_graph
    )
    try:
        learner = Learner(
            q_network, target_network, **learner_settings(cfg), backend=cfg.learner_backend
        )
    except ValueError as e:  # learner_backend numpy where it does not apply or compile
        raise UserError(f"invalid config: {e}: --set learner_backend=auto") from None
    capture = update_capture(device, cfg.capture_graph)
    update = learner.update if capture is None else CapturedUpdate(learner, capture)
    return Agent(q_network, target_network, replay, selector, greedy, learner, update)


def learner_settings(cfg: Config) -> dict[str, Any]:
    """The learner's settings in a config (``Learner`` and ``SeedLearner`` take them alike);
    epsilon-greedy learns on the mean weights too (``noise``)."""
    keys = ("lr", "adam_eps", "double_dqn", "loss", "huber_delta", "max_grad_norm", "tau")
    return {k: getattr(cfg, k) for k in (*keys, "update_noise")} | {
        "noise": cfg.exploration == "noisy"
    }


def update_capture(device: torch.device, capture_graph: bool) -> CaptureFn | None:
    """How the learner update is captured: as a CUDA graph on CUDA with ``capture_graph``,
    else not at all (eager updates)."""
    return capture_cuda_graph if capture_graph and device.type == "cuda" else None


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def crossed(step: int, stride: int, interval: int) -> bool:
    """True when the last ``stride`` steps (one vector step) passed a multiple of ``interval``."""
    return step // interval != (step - stride) // interval


@dataclass
class Run:
    """What :func:`train` sets up before its loop (:func:`prepare_run`)."""

    cfg: Config
    spec: EnvSpec
    run_dir: Path
    ran: dict[str, Any]
    """The config as it ran (``learner_backend`` resolved), for config.yaml and hparams."""
    envs: Any
    eval_envs: list[Any]
    agent: Agent
    episodes: Episodes
    counters: Counters
    eval_curve: list[tuple[int, float]]
    obs: np.ndarray
    """The first observations: fresh episodes, or the resumed ones replayed exactly."""
    sample_generator: torch.Generator
    exploration: Exploration
    target_return: float | None
    wall_before: float
    """Wall seconds of the run's earlier pieces (a resume), for result.json."""
    augment: RandomShift | None = None
    """The augmentation of the replay batches (``augment``), or None."""

    @property
    def resumable(self) -> dict[str, Any]:
        """What a checkpoint saves and a resume restores, besides the online network."""
        return {
            "target_network": self.agent.target_network,
            "learner": self.agent.learner,
            "sample_generator": self.sample_generator,
            "exploration": self.exploration,
            "selector": self.agent.selector,
            "augment": self.augment,
        }


def prepare_run(
    cfg: Config,
    run_dir: Path,
    checkpoint: dict[str, Any] | None,
    cleanup: contextlib.ExitStack,
    echo: Any,
) -> Run:
    """Check the config against the env, then build everything a run needs (environments,
    agent, random streams), restored from ``checkpoint`` when resuming. What must be
    closed goes on ``cleanup``."""
    # User errors (bad id, spaces, env_kwargs, a torso or augmentation that does not fit)
    # before anything is written.
    spec = inspect_env(cfg.env_id, cfg.env_kwargs, cfg.wrappers)
    check_observations(cfg, spec)
    if cfg.track:
        require_wandb()
    device = resolve_device(cfg.device)
    try:
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        hold_run_dir(run_dir, cleanup)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    except OSError as e:
        raise UserError(
            f"cannot write the run directory {run_dir} ({e.strerror}): pass a writable --run-dir"
        ) from None
    if device.type == "cpu":
        torch.set_num_threads(cfg.torch_threads)
        # Denormal Adam moments of dead units are slow on a CPU; flushing them changes nothing.
        torch.set_flush_denormal(True)
        # numpy's BLAS gets torch's threads: a thread per core is many times slower beside
        # other busy processes, and train() may run where numpy was imported first.
        cleanup.enter_context(threadpool_limits(cfg.torch_threads, user_api="blas"))
    seed_everything(cfg.seed)
    envs = make_vector_env(cfg.env_id, cfg.num_envs, cfg.vector, cfg.env_kwargs, cfg.wrappers)
    cleanup.callback(close_quietly, envs)
    # Evaluation plays up to eval_envs episodes at once on its own env copies.
    episodes = max(cfg.eval_episodes, cfg.final_episodes or cfg.confirm_episodes)
    eval_envs = [
        make_env(cfg.env_id, env_kwargs=cfg.env_kwargs, wrappers=cfg.wrappers)
        for _ in range(min(cfg.eval_envs, episodes))
    ]
    cleanup.callback(close_quietly, *eval_envs)
    agent = build_agent(cfg, spec, device, len(eval_envs))
    ran = cfg.to_dict() | {"learner_backend": agent.learner.backend}
    if device.type == "cuda":  # where replay_storage auto put the buffer
        ran["replay_storage"] = "device" if agent.replay.storage_device.type == "cuda" else "pinned"
    (run_dir / "config.yaml").write_text(yaml.safe_dump(ran, sort_keys=False))
    sample_generator = torch.Generator(device=agent.replay.generator_device).manual_seed(cfg.seed)
    exploration = Exploration(
        cfg.exploration, spec.n_actions, np.random.default_rng([cfg.seed, streams.EXPLORATION]),
        total_steps=cfg.total_steps, random_starts=cfg.random_starts,
        noisy_epsilon=cfg.noisy_epsilon, epsilon_start=cfg.epsilon_start,
        epsilon_end=cfg.epsilon_end, epsilon_fraction=cfg.epsilon_fraction,
        noise_interval=cfg.noise_interval, noise_on_repeat=cfg.noise_on_repeat,
    )  # fmt: skip
    episodes = Episodes(cfg.num_envs, cfg.seed, watch_repeats=exploration.watches_repeats)
    run = Run(
        cfg, spec, run_dir, ran, envs, eval_envs, agent, episodes,
        Counters(learning_starts=cfg.learning_starts), [], np.empty(0), sample_generator,
        exploration, spec.reward_threshold if cfg.target_return is None else cfg.target_return,
        0.0 if checkpoint is None else float(checkpoint.get("wall_time_s", 0.0)),
        make_augment(cfg.augment, agent.replay.device, cfg.seed),
    )  # fmt: skip
    if checkpoint is None:
        run.obs = episodes.reset(envs)
    else:
        run.eval_curve = restore_training(
            checkpoint, q_network=agent.q_network, replay=agent.replay, **run.resumable
        )
        run.counters = Counters(**checkpoint["counters"])
        if "replay" not in checkpoint:
            # The buffer starts empty: fill it again before learning, as a new run does.
            run.counters.learning_starts = run.counters.global_step + cfg.learning_starts
            run.counters.updates_before = agent.learner.updates
        run.obs = episodes.restore(envs, checkpoint["envs"], echo)
    if cfg.terminal_on_life_loss and episodes.lives is None:
        raise UserError(
            f"terminal_on_life_loss needs an env that reports info['lives'] (Atari); "
            f"{cfg.env_id} does not: --set terminal_on_life_loss=false"
        )
    return run


def hold_run_dir(run_dir: Path, cleanup: contextlib.ExitStack) -> None:
    """Hold ``run_dir`` for this process until ``cleanup`` closes (an advisory lock on
    ``run_dir/.lock``, which the OS drops when the process dies, even by SIGKILL).

    A second process training into the same directory, a ``--resume`` of a run still
    going included, would overwrite its checkpoints and results: it is refused instead
    (UserError). Where the OS has no ``fcntl`` (Windows) nothing is held.
    """
    try:
        import fcntl
    except ImportError:
        return
    fd = os.open(run_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = os.read(fd, 32).decode(errors="replace").strip()
        os.close(fd)
        raise UserError(
            f"{run_dir} is being trained by {f'process {pid}' if pid else 'another process'}: "
            "wait for it to end (a second run there would overwrite its checkpoints), or "
            "pass another --run-dir"
        ) from None
    except OSError:  # a file system without locks (some NFS mounts): train unguarded
        os.close(fd)
        return
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    cleanup.callback(os.close, fd)  # closing it releases the lock


class Checkpoints:
    """``last.pt`` and ``best.pt`` of a run; what they hold is defined in agent/checkpoint.py."""

    def __init__(self, run: Run, wall_time: Any) -> None:
        self.run, self.wall_time = run, wall_time
        self.extra: Callable[[], dict[str, Any]] | None = None  # more for last.pt (a group's)
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
        run = self.run
        data = training_checkpoint(
            self.policy(),
            eval_curve=run.eval_curve,
            episodes=run.episodes.state_dict(obs),
            replay=run.agent.replay if self.keeps_buffer else None,
            wall_time_s=self.wall_time(),
            **run.resumable,
        )
        if self.extra is not None:
            data.update(self.extra())
        save_checkpoint(self.dir / "last.pt", data)

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
    divergence.
    """
    wall_start = time.perf_counter()
    with contextlib.ExitStack() as cleanup:  # on every exit path, errors included
        # --- set-up: environments, agent, random streams; a resume restores them ---
        run = prepare_run(cfg, Path(run_dir), checkpoint, cleanup, echo)
        envs, episodes, counters, obs, explore = (
            run.envs, run.episodes, run.counters, run.obs, run.exploration
        )
        selector, replay, learner = run.agent.selector, run.agent.replay, run.agent.learner
        update = run.agent.update
        monitor, checkpoints, evaluate = run_outputs(run, wall_start, progress, lambda: obs)
        cleanup.callback(close_quietly, monitor)  # flushes the events, whatever happens
        status: Literal["finished", "solved", "interrupted"] = "finished"
        n = cfg.num_envs
        announce(run, echo, checkpoints.buffer_left_out)
        stop = cleanup.enter_context(StopSignals())  # Ctrl-C and SIGTERM set stop.received
        while counters.global_step < cfg.total_steps:
            # --- act: greedy on a noisy net, then the exploration policy on top ---
            actions = selector(obs, explore.fresh_noise())  # (n,) int64: the host read
            # explored: (n,) bool where the floor's random action replaced the policy's
            actions, explored = explore(actions, counters.global_step)

            # --- step the environments; store the real transitions ---
            next_obs, rewards, terminated, truncated, info = envs.step(actions)
            counters.global_step += n
            step = counters.global_step
            life_lost = episodes.step(actions, rewards, info)
            # Training-only signals; the logged return stays the sum of the env's rewards.
            # A lost life ends bootstrapping in replay, but the env is not reset.
            train_rewards = np.sign(rewards) if cfg.clip_rewards else rewards
            train_dones = terminated | life_lost if cfg.terminal_on_life_loss else terminated
            # The floor's random actions end the n-step returns before them (explored).
            replay.add(obs, actions, train_rewards, next_obs, train_dones, truncated, explored)

            # --- episode ends: log them, reset those envs with their next seeds ---
            done = terminated | truncated
            if done.any():
                next_obs, finished = episodes.finish(envs, done)
                for episodic_return, length in finished:
                    monitor.episode(step, episodic_return, length)
                counters.episodes += len(finished)
                explore.episode_ended()  # per-episode noise: drawn afresh next step
            if episodes.observe(next_obs):  # a repeat under held noise: a loop; break it
                explore.repeated()
            obs = next_obs

            # --- learn: one update per train_freq env steps, once learning has started ---
            if step >= counters.learning_starts and len(replay) >= cfg.batch_size:
                beta = annealed_beta(cfg.priority_beta, step / cfg.total_steps)
                while learner.updates < counters.updates_due(cfg.train_freq):
                    batch = replay.sample(cfg.batch_size, run.sample_generator, beta)
                    if run.augment is not None:  # e.g. DrQ's random shift of the images
                        batch = run.augment(batch)
                    # per-sample errors, for a prioritized replay's priorities
                    replay.update_priorities(batch.indices, update(batch))
                if crossed(step, n, cfg.target_update_interval):
                    learner.sync_target()

            # --- log: the only place tensors become floats ---
            if crossed(step, n, cfg.log_interval):
                log_training(run, monitor, step, learner.metrics(), learner.updates)

            # --- evaluate the noise-free policy; stop early once solved ---
            if cfg.eval_interval and crossed(step, n, cfg.eval_interval) and evaluate(step):
                counters.solved_step = step
                status = "solved"
                break

            # --- checkpoint; Ctrl-C or SIGTERM saves and stops ---
            if crossed(step, n, cfg.checkpoint_interval):
                checkpoints.save_last(obs)
            if stop.received is not None:
                status = "interrupted"
                break

        # --- the end: save, then measure the final policy on fresh episodes ---
        return finish_run(run, monitor, checkpoints, evaluate, obs, status, stop.received)


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
        final_episodes=cfg.final_episodes, epsilon=cfg.eval_epsilon, n_actions=run.spec.n_actions,
    )  # fmt: skip
    return monitor, checkpoints, evaluate


def finish_run(
    run: Run,
    monitor: Monitor,
    checkpoints: Checkpoints,
    evaluate: Evaluator,
    obs: np.ndarray,
    status: Literal["finished", "solved", "interrupted"],
    stop_signal: int | None,
    learner_backend: str | None = None,
) -> TrainResult:
    """The end of a run: save ``last.pt``, measure the final policy on fresh episodes
    (not after an interruption), write ``result.json``. ``learner_backend``: where not
    the run's own learner learned (a seed group's stacked one)."""
    counters, learner = run.counters, run.agent.learner
    checkpoints.save_last(obs)
    monitor.progress(counters.global_step)
    final_eval = None if status == "interrupted" else evaluate.final(counters.global_step)
    if final_eval is not None:
        monitor.hparams(run.ran, {"eval/final_mean_return": final_eval})
    result = TrainResult(
        run_dir=str(run.run_dir),
        status=status,
        global_step=counters.global_step,
        updates=learner.updates,
        wall_time_s=checkpoints.wall_time(),
        target_return=run.target_return,
        solved_step=counters.solved_step,
        best_eval_return=counters.best_eval,
        final_eval_return=final_eval,
        eval_curve=run.eval_curve,
        stop_signal=stop_signal,
        learner_backend=learner_backend or learner.backend,
        buffer_left_out=checkpoints.buffer_left_out,
        final_eval_wall_s=evaluate.final_wall_s,
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
    scalars.update(run.exploration.scalars())
    scalars.update(noise_stats(run.agent.q_network))
    if len(replay) >= cfg.batch_size:  # how much the noise changes behaviour
        probe_seed = episode_seed(cfg.seed, 0, step, stream=streams.PROBE)
        noisy = cfg.exploration == "noisy"
        scalars.update(
            exploration_probe(run.agent.q_network, replay, cfg.batch_size, probe_seed, noisy)
        )
    monitor.scalars(step, scalars)
    monitor.progress(step, sps=f"{monitor.sps(step):.0f}")


def exploration_probe(
    q_network: QNetwork,
    replay: Replay,
    batch_size: int,
    seed: int,
    noisy: bool,
) -> dict[str, float]:
    """``exploration/*`` scalars over ``PROBE_STATES`` replay states (agent/monitor.py).

    Generators of its own, seeded with ``seed``: no training RNG stream moves. Samples
    of ``batch_size``, the size the pinned staging slots were made for.
    """
    generator = torch.Generator(device=replay.generator_device).manual_seed(seed)
    draws = max(1, PROBE_STATES // batch_size)
    obs = torch.cat([replay.sample(batch_size, generator).obs for _ in range(draws)])
    return exploration_stats(q_network, obs, draws=draws, seed=seed, noisy=noisy)


def close_quietly(*things: Any) -> None:
    """``close()`` each, ignoring their errors: the error being raised, if any, matters more."""
    for thing in things:
        if thing is None:
            continue
        try:
            thing.close()
        except Exception:
            pass
