"""A run's set-up, beside the training loop (``agent/train.py``): the config checked
against its env, then turned into components (networks, replay, selectors, learner,
exploration policy, augmentation, random streams), restored from a checkpoint when the
run resumes. The config is read here; the components take plain values."""

from __future__ import annotations

import contextlib
import copy
import importlib.metadata
import os
import platform
import random
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import yaml
from threadpoolctl import threadpool_limits

from agent import streams
from agent.acting import ActionSelector
from agent.acting.graph import CaptureFn, capture_cuda_graph
from agent.augment import Augmentation, make_augment
from agent.checkpoint import (
    GeneratorState,
    holds_training,
    remove_partial_writes,
    restore_policy,
    restore_training,
    run_pieces,
)
from agent.config import Config
from agent.episodes import Episodes
from agent.errors import UserError
from agent.exploration import Exploration
from agent.learner import CapturedUpdate, Learner
from agent.monitor import above_bars
from agent.networks import QNetwork, resolve_torso
from agent.replay import Batch, FrameReplayBuffer, Replay, ReplayBuffer, choose_storage
from agent.tracking import require_wandb
from envs import EnvSpec, inspect_env, make_env, make_vector_env

__all__ = [
    "Agent",
    "Counters",
    "NewRunDir",
    "Run",
    "build_agent",
    "build_q_network",
    "check_observations",
    "close_quietly",
    "cpu_name",
    "describe_machine",
    "describe_software",
    "hold_run_dir",
    "learner_autocast",
    "learner_backend",
    "learner_settings",
    "limit_cpu_threads",
    "prepare_run",
    "resolve_device",
    "seed_everything",
    "update_capture",
]


@dataclass
class Counters:
    """The loop's counters, saved in every checkpoint."""

    global_step: int = 0
    episodes: int = 0
    eval_round: int = 0
    best_eval: float | None = None
    """best.pt's score: the mean of the fresh episodes that confirmed it, or, unconfirmed
    (``best_confirmed`` False), the mean of its periodic round."""
    best_confirmed: bool = False
    best_step: int | None = None
    """Env steps when best.pt's policy was saved."""
    best_episodes: dict[str, Any] | None = None
    """The episodes that measured ``best_eval`` (:func:`agent.evaluate.episodes_named`)."""
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
    exploration: Exploration
    """What the agent plays given the selector's actions, and when the acting noise is
    drawn; the one place that knows whether the agent explores by its noise."""
    update: Callable[[Batch], torch.Tensor]
    """``learner.update``, or on CUDA with ``capture_graph`` the same captured as a graph:
    a batch in, its per-sample errors out (for prioritized replay)."""
    noise_free: ActionSelector | None = None
    """The noisy agent's actions had its noise been off, one per training env: what
    ``exploration/off_greedy_fraction`` compares the played ones with (None for
    epsilon-greedy, whose selector acts on the mean weights already)."""


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; a CUDA request without CUDA is a user error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name}: CUDA is not available here; use --device cpu or auto")
    return device


def cpu_name() -> str:
    """The CPU's model name as Linux gives it (``Intel(R) Xeon(R) Processor``), else what
    ``platform`` knows."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def describe_machine(device: torch.device) -> str:
    """The hardware a run's piece ran on, for result.json: the CPU's model name and the
    torch threads, and the GPU's name where the run is on CUDA."""
    threads = torch.get_num_threads()
    text = f"{cpu_name()}, {threads} torch thread{'s' if threads > 1 else ''}"
    if device.type == "cuda":
        text += f", {torch.cuda.get_device_name(device)}"
    return text


# What sets a run's numbers besides the code and the machine: the packages always used,
# then each env family's own package where this process has imported it.
_RUN_PACKAGES = ("torch", "numpy", "gymnasium")
_ENV_PACKAGES = {"ale_py": "ale-py", "minatar": "minatar", "minigrid": "minigrid"}


def describe_software() -> str:
    """The software a run's piece ran with, for result.json: Python and the versions of
    torch, numpy, gymnasium and the env families' packages imported so far
    (``Python 3.11.7, torch 2.13.0+cpu, numpy 2.4.6, gymnasium 1.4.0, ale-py 0.12.1``)."""
    names = [*_RUN_PACKAGES, *(dist for module, dist in _ENV_PACKAGES.items()
                                if module in sys.modules)]  # fmt: skip
    parts = [f"Python {platform.python_version()}"]
    for name in names:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            parts.append(f"{name} {importlib.metadata.version(name)}")
    return ", ".join(parts)


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
    if cfg.intensity_scale > 0 and len(spec.obs_shape) != 3:
        raise UserError(
            f"invalid config: intensity_scale {cfg.intensity_scale} scales images, and "
            f"{cfg.env_id} gives vectors of shape {spec.obs_shape}: --set intensity_scale=0"
        )


def build_agent(
    cfg: Config,
    spec: EnvSpec,
    device: torch.device,
    eval_envs: int,
    echo: Callable[[str], None] | None = None,
) -> Agent:
    """Online and target networks, replay, the selectors and the learner of a run;
    ``echo`` prints the learner's one-line news (how long compiling its update took)."""
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
    exploration = build_exploration(cfg, spec.n_actions)
    # Acting on the noisy net (the exploration policy says when its noise is drawn) or, for
    # epsilon-greedy, on the mean weights.
    selector = ActionSelector(
        q_network,
        spec.obs_shape,
        cfg.num_envs,
        device,
        noise=exploration.noisy,
        capture_graph=cfg.capture_graph,
    )
    greedy = ActionSelector(
        q_network, spec.obs_shape, eval_envs, device, noise=False, capture_graph=cfg.capture_graph
    )
    try:
        learner = Learner(
            q_network,
            target_network,
            **learner_settings(cfg, exploration.noisy),
            backend=learner_backend(cfg, q_network.torso_name, device),
            announce=None if echo is None else above_bars(echo),
            autocast=learner_autocast(cfg),
        )
    except ValueError as e:  # learner_backend numpy or compile where it does not apply
        raise UserError(f"invalid config: {e}: --set learner_backend=auto") from None
    capture = update_capture(device, cfg.capture_graph)
    update = learner.update if capture is None else CapturedUpdate(learner, capture)
    noise_free = None
    if exploration.noisy:  # seeded: building it draws nothing from torch's generator
        noise_free = ActionSelector(q_network, spec.obs_shape, cfg.num_envs, device, noise=False,
                                    seed=0, capture_graph=cfg.capture_graph)  # fmt: skip
    return Agent(q_network, target_network, replay, selector, greedy, learner, exploration,
                 update, noise_free)  # fmt: skip


def build_exploration(cfg: Config, n_actions: int) -> Exploration:
    """The run's exploration policy, on its own random stream."""
    # The config's learning_starts, not the counters' (which a resume without its buffer
    # pushes back): the schedule stays a function of the step alone.
    decay_start = (cfg.learning_starts if cfg.epsilon_decay_start == "learning_starts"
                   else cfg.epsilon_decay_start)  # fmt: skip
    return Exploration(
        cfg.exploration, n_actions, np.random.default_rng([cfg.seed, streams.EXPLORATION]),
        total_steps=cfg.total_steps, random_starts=cfg.random_starts,
        noisy_epsilon=cfg.noisy_epsilon, epsilon_start=cfg.epsilon_start,
        epsilon_end=cfg.epsilon_end, epsilon_fraction=cfg.epsilon_fraction,
        epsilon_decay_start=decay_start,
        noise_interval=cfg.noise_interval, noise_on_repeat=cfg.noise_on_repeat,
    )  # fmt: skip


def learner_settings(cfg: Config, noise: bool) -> dict[str, Any]:
    """The learner's settings in a config (``Learner`` and ``SeedLearner`` take them alike);
    ``noise``: the exploration policy's ``noisy`` (epsilon-greedy learns on the mean weights
    too)."""
    keys = ("lr", "adam_eps", "double_dqn", "loss", "huber_delta", "max_grad_norm", "tau",
            "update_noise")
    return {k: getattr(cfg, k) for k in keys} | {"noise": noise}


# Torsos whose compiled update beats the numpy engine's, and the updates a run needs to
# pay back compiling it (the figures: docs/performance.md#compiled-update).
COMPILED_TORSOS = ("der", "nature")
COMPILE_MIN_UPDATES = 50_000


def learner_backend(cfg: Config, torso: str, device: torch.device) -> str:
    """The learner backend a run asks for: ``learner_backend``, where ``auto`` on a CPU takes
    ``compile`` for a torso of ``COMPILED_TORSOS`` over a run of at least
    ``COMPILE_MIN_UPDATES`` updates (counted over the whole run, so a resume keeps it)."""
    if cfg.learner_backend != "auto" or device.type != "cpu" or torso not in COMPILED_TORSOS:
        return cfg.learner_backend
    updates = max(0, cfg.total_steps - cfg.learning_starts) // cfg.train_freq
    return "compile" if updates >= COMPILE_MIN_UPDATES else "auto"


def learner_autocast(cfg: Config) -> torch.dtype | None:
    """The dtype the update's loss runs under autocast to (``learner_autocast``), or None."""
    return None if cfg.learner_autocast == "none" else getattr(torch, cfg.learner_autocast)


def update_capture(device: torch.device, capture_graph: bool) -> CaptureFn | None:
    """How the learner update is captured: as a CUDA graph on CUDA with ``capture_graph``,
    else not at all (eager updates)."""
    return capture_cuda_graph if capture_graph and device.type == "cuda" else None


def limit_cpu_threads(threads: int, cleanup: contextlib.ExitStack) -> None:
    """Training's CPU settings: ``threads`` torch threads, as many for numpy's BLAS (until
    ``cleanup`` closes), denormals flushed. Benchmarks that time training's parts apply
    them too."""
    torch.set_num_threads(threads)
    # Denormal Adam moments of dead units are slow on a CPU; flushing them changes nothing.
    torch.set_flush_denormal(True)
    # numpy's BLAS gets torch's threads: a thread per core is many times slower beside
    # other busy processes, and train() may run where numpy was imported first.
    cleanup.enter_context(threadpool_limits(threads, user_api="blas"))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@dataclass(kw_only=True)
class Run:
    """What :func:`train` sets up before its loop (:func:`prepare_run`)."""

    cfg: Config
    spec: EnvSpec
    run_dir: Path
    ran: dict[str, Any]
    """The config as it ran (``learner_backend`` resolved), for config.yaml and hparams."""
    envs: Any
    eval_envs: list[Any] | gym.vector.VectorEnv
    agent: Agent
    episodes: Episodes
    counters: Counters
    eval_curve: list[tuple[int, float]]
    obs: np.ndarray
    """The first observations: fresh episodes, or the resumed ones replayed exactly."""
    sample_generator: torch.Generator
    target_return: float | None
    wall_before: float
    """Wall seconds of the run's earlier pieces (a resume), for result.json."""
    pieces_before: list[dict[str, Any]] = field(default_factory=list)
    """The run's earlier pieces (:func:`agent.checkpoint.run_pieces`), for result.json."""
    machine: str = ""
    """Where this piece runs (:func:`describe_machine`)."""
    software: str = ""
    """What this piece runs with (:func:`describe_software`)."""
    augment: Augmentation | None = None
    """The augmentation of the replay batches (``augment``, ``intensity_scale``), or None."""
    extra_components: dict[str, Any] = field(default_factory=dict)
    """More stateful parts for ``last.pt``, by name (a stacked seed's own streams)."""

    @property
    def components(self) -> dict[str, Any]:
        """The stateful parts a checkpoint saves and a resume restores, by name, besides
        the online network and the replay buffer (each with ``state_dict`` and
        ``load_state_dict``; None where the run has none)."""
        return {
            "target_network": self.agent.target_network,
            "learner": self.agent.learner,
            "sample_generator": GeneratorState(self.sample_generator),
            "exploration": self.agent.exploration,
            "selector": self.agent.selector,
            "augment": self.augment,
            **self.extra_components,
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
        if hold_run_dir(run_dir, cleanup):
            remove_partial_writes(run_dir / "checkpoints")
        (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    except OSError as e:
        raise UserError(
            f"cannot write the run directory {run_dir} ({e.strerror}): pass a writable --run-dir"
        ) from None
    if device.type == "cpu":
        limit_cpu_threads(cfg.torch_threads, cleanup)
    seed_everything(cfg.seed)
    envs = make_vector_env(cfg.env_id, cfg.num_envs, cfg.vector, cfg.env_kwargs, cfg.wrappers)
    cleanup.callback(close_quietly, envs)
    # Evaluation plays up to eval_envs episodes at once on its own env copies: envs of
    # this process, or one vector env (eval_vector async or ale).
    episodes = max(cfg.eval_episodes, cfg.final_episodes or cfg.confirm_episodes)
    copies = min(cfg.eval_envs, episodes)
    eval_envs: list[gym.Env] | gym.vector.VectorEnv
    if cfg.eval_vector != "sync":
        eval_envs = make_vector_env(cfg.env_id, copies, cfg.eval_vector, cfg.env_kwargs,
                                    cfg.wrappers)  # fmt: skip
        cleanup.callback(close_quietly, eval_envs)
    else:
        eval_envs = [
            make_env(cfg.env_id, env_kwargs=cfg.env_kwargs, wrappers=cfg.wrappers)
            for _ in range(copies)
        ]
        cleanup.callback(close_quietly, *eval_envs)
    agent = build_agent(cfg, spec, device, copies, echo)
    ran = cfg.to_dict() | {"learner_backend": agent.learner.backend}
    if device.type == "cuda":  # where replay_storage auto put the buffer
        ran["replay_storage"] = "device" if agent.replay.storage_device.type == "cuda" else "pinned"
    (run_dir / "config.yaml").write_text(yaml.safe_dump(ran, sort_keys=False))
    sample_generator = torch.Generator(device=agent.replay.generator_device).manual_seed(cfg.seed)
    watch_repeats = agent.exploration.watches_repeats
    episodes = Episodes(cfg.num_envs, cfg.seed, watch_repeats=watch_repeats)
    run = Run(
        cfg=cfg, spec=spec, run_dir=run_dir, ran=ran, envs=envs, eval_envs=eval_envs,
        agent=agent, episodes=episodes, counters=Counters(learning_starts=cfg.learning_starts),
        eval_curve=[], obs=np.empty(0), sample_generator=sample_generator,
        target_return=spec.reward_threshold if cfg.target_return is None else cfg.target_return,
        wall_before=0.0 if checkpoint is None else float(checkpoint.get("wall_time_s", 0.0)),
        pieces_before=[] if checkpoint is None else run_pieces(checkpoint),
        machine=describe_machine(device),
        software=describe_software(),
        augment=make_augment(cfg.augment, agent.replay.device, cfg.seed, cfg.intensity_scale),
    )  # fmt: skip
    if checkpoint is None:
        run.obs = episodes.reset(envs)
    elif holds_training(checkpoint):
        run.eval_curve = restore_training(
            checkpoint, q_network=agent.q_network, replay=agent.replay, components=run.components
        )
    else:
        # A policy checkpoint (best.pt, where last.pt cannot be read): its network goes on
        # from its step; the optimizer, replay, streams and episodes start afresh.
        restore_policy(checkpoint, q_network=agent.q_network, target_network=agent.target_network)
    if checkpoint is not None:
        run.counters = Counters(**checkpoint["counters"])
        if "replay" not in checkpoint:
            # The buffer starts empty: fill it again before learning, as a new run does.
            run.counters.learning_starts = run.counters.global_step + cfg.learning_starts
            run.counters.updates_before = agent.learner.updates
        if holds_training(checkpoint):
            run.obs = episodes.restore(envs, checkpoint["envs"], echo)
        else:
            run.obs = episodes.reset(envs)
    if cfg.terminal_on_life_loss and episodes.lives is None:
        raise UserError(
            f"terminal_on_life_loss needs an env that reports info['lives'] (Atari); "
            f"{cfg.env_id} does not: --set terminal_on_life_loss=false"
        )
    return run


def hold_run_dir(run_dir: Path, cleanup: contextlib.ExitStack) -> bool:
    """Hold ``run_dir`` for this process until ``cleanup`` closes (an advisory lock on
    ``run_dir/.lock``, which the OS drops when the process dies, even by SIGKILL);
    True when held.

    A second process training into the same directory, a ``--resume`` of a run still
    going included, would overwrite its checkpoints and results: it is refused instead
    (UserError). Where the OS has no ``fcntl`` (Windows) nothing is held.
    """
    try:
        import fcntl
    except ImportError:
        return False
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
        return False
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    cleanup.callback(os.close, fd)  # closing it releases the lock
    return True


class NewRunDir:
    """What a new run's set-up adds under ``run_dir``, to take away again when the run
    cannot start (:meth:`remove`): the directory and any parent it lacked, or, where it
    was already there, the entries it did not hold. Made before anything is written."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        missing = [p for p in (run_dir, *run_dir.parents) if not p.exists()]
        self.top = missing[-1] if missing else None
        """The outermost directory that did not exist: the set-up makes it, and all below."""
        self.held: set[str] | None = None
        if self.top is None and run_dir.is_dir():
            self.held = {p.name for p in run_dir.iterdir()}

    @staticmethod
    @contextlib.contextmanager
    def removed_on_error(
        new: NewRunDir | None, cleanup: contextlib.ExitStack
    ) -> Iterator[None]:
        """On a :class:`UserError` inside it (a run's outputs that cannot start: W&B
        without a login), close ``cleanup`` (the run's envs, its directory's lock), then
        take away what ``new`` (a new run's; None for a resume, whose directory is kept
        whole) added."""
        try:
            yield
        except UserError:
            cleanup.close()
            if new is not None:
                new.remove()
            raise

    def remove(self) -> None:
        """Take away what the set-up added, unless a run's ``last.pt`` is there (whoever
        wrote it, a run's state is never removed)."""
        import shutil

        if (self.run_dir / "checkpoints" / "last.pt").exists():
            return
        if self.top is not None:
            shutil.rmtree(self.top, ignore_errors=True)
        elif self.held is not None:
            for path in self.run_dir.iterdir():
                if path.name in self.held:
                    continue
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)


def close_quietly(*things: Any) -> None:
    """``close()`` each, ignoring their errors: the error being raised, if any, matters more."""
    for thing in things:
        if thing is None:
            continue
        try:
            thing.close()
        except Exception:
            pass
