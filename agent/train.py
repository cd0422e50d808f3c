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
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import yaml
from threadpoolctl import threadpool_limits

from agent.acting import ActionSelector
from agent.checkpoint import (
    CheckpointWriteError,
    policy_checkpoint,
    restore_training,
    save_checkpoint,
    training_checkpoint,
)
from agent.config import Config
from agent.episodes import Episodes
from agent.errors import UserError
from agent.evaluate import json_ready, run_episodes
from agent.frame_replay import FrameReplayBuffer
from agent.learner import Learner, NonFiniteError
from agent.monitor import Monitor, exploration_stats, noise_stats
from agent.networks import QNetwork
from agent.replay import ReplayBuffer
from agent.signals import StopSignals
from envs import EnvSpec, episode_seed, inspect_env, make_env, make_vector_env

__all__ = [
    "Agent",
    "TrainResult",
    "build_agent",
    "build_q_network",
    "exploration_probe",
    "resolve_device",
    "train",
]

# Evaluation episodes played at once (one batched action per step for all of them).
EVAL_BATCH = 10
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
    """Mean noise-free return of the final policy over confirm_episodes fresh episodes
    (never the evaluation that decided an early stop: that one is biased upwards)."""
    eval_curve: list[tuple[int, float]]
    """(env steps, mean noise-free return) of every periodic evaluation."""
    learner_backend: str = "torch"
    """The learner backend that ran (``learner_backend: auto`` resolves to numpy or torch)."""
    stop_signal: int | None = None
    """The signal that interrupted the run (SIGINT 2, SIGTERM 15), if any."""


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
    replay: ReplayBuffer | FrameReplayBuffer
    selector: ActionSelector
    """Acting: greedy on the noisy net (or on the mean weights, for epsilon-greedy)."""
    greedy: ActionSelector
    """Evaluation: greedy on the mean weights, one action per evaluation env."""
    learner: Learner


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; a CUDA request without CUDA is a user error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name}: CUDA is not available here; use --device cpu or auto")
    return device


def build_q_network(
    cfg: Config, obs_shape: tuple[int, ...], n_actions: int, device: torch.device
) -> QNetwork:
    """The Q-network a config describes (training builds it, evaluation rebuilds it)."""
    return QNetwork(
        obs_shape,
        n_actions,
        cfg.hidden_sizes,
        noisy_layers=cfg.noisy_layers,
        sigma0=cfg.sigma0,
        dueling=cfg.dueling,
        device=device,
        dtype=getattr(torch, cfg.dtype),
    )


def build_agent(cfg: Config, spec: EnvSpec, device: torch.device, eval_envs: int) -> Agent:
    """Online and target networks, replay, the two selectors and the learner of a run."""
    q_network = build_q_network(cfg, spec.obs_shape, spec.n_actions, device)
    target_network = copy.deepcopy(q_network)
    # Image stacks (C, H, W) of integer frames: each frame stored once (agent/frame_replay.py).
    frames = cfg.frame_replay and len(spec.obs_shape) == 3 and spec.obs_dtype == "uint8"
    try:
        replay = (FrameReplayBuffer if frames else ReplayBuffer)(
            cfg.buffer_size,
            spec.obs_shape,
            np.dtype(spec.obs_dtype),
            device=device,
            n_step=cfg.n_step,
            gamma=cfg.gamma,
            num_envs=cfg.num_envs,
            float_dtype=getattr(torch, cfg.dtype),
        )
    except ValueError as e:
        raise UserError(f"invalid config: {e}") from None
    noisy = cfg.exploration == "noisy"
    selector = ActionSelector(
        q_network,
        spec.obs_shape,
        cfg.num_envs,
        device,
        noise=noisy,
        noise_interval=None if cfg.noise_interval == "episode" else cfg.noise_interval,
        capture_graph=cfg.capture_graph,
    )
    greedy = ActionSelector(
        q_network, spec.obs_shape, eval_envs, device, noise=False, capture_graph=cfg.capture_graph
    )
    try:
        learner = Learner(
            q_network,
            target_network,
            lr=cfg.lr,
            adam_eps=cfg.adam_eps,
            double_dqn=cfg.double_dqn,
            loss=cfg.loss,
            huber_delta=cfg.huber_delta,
            max_grad_norm=cfg.max_grad_norm,
            tau=cfg.tau,
            noise=noisy,  # epsilon-greedy: the noise is off in learning too, not only in acting
            update_noise=cfg.update_noise,
            backend=cfg.learner_backend,
        )
    except ValueError as e:  # learner_backend numpy where it does not apply (CUDA)
        raise UserError(f"invalid config: {e}: --set learner_backend=auto") from None
    return Agent(q_network, target_network, replay, selector, greedy, learner)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def crossed(step: int, stride: int, interval: int) -> bool:
    """True when the last ``stride`` steps (one vector step) passed a multiple of ``interval``."""
    return step // interval != (step - stride) // interval


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
    # User errors (bad id, spaces, env_kwargs) before anything is written.
    spec = inspect_env(cfg.env_id, cfg.env_kwargs, cfg.wrappers)
    device = resolve_device(cfg.device)
    run_dir = Path(run_dir)
    ckpt_dir = run_dir / "checkpoints"
    try:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    except OSError as e:
        raise UserError(
            f"cannot write the run directory {run_dir} ({e.strerror}): pass a writable --run-dir"
        ) from None

    # --- set-up: device, seeds, environments, agent ---
    if device.type == "cpu":
        torch.set_num_threads(cfg.torch_threads)
        # Adam's moments of parameters whose gradients stay zero (dead ReLUs) decay into
        # denormal floats, which the CPU computes several times slower (docs/research/log.md).
        # Flushing them to zero changes nothing that matters.
        torch.set_flush_denormal(True)
    seed_everything(cfg.seed)
    with contextlib.ExitStack() as cleanup:  # on every exit path, errors included
        if device.type == "cpu":
            # numpy's BLAS (the learner's numpy path) gets the same threads as torch: a thread
            # per core made small updates many times slower beside other busy processes
            # (docs/research/log.md). run.py's OPENBLAS_NUM_THREADS misses train() called from
            # a sweep's worker or a notebook, where numpy was imported first.
            cleanup.enter_context(threadpool_limits(cfg.torch_threads, user_api="blas"))
        envs = make_vector_env(cfg.env_id, cfg.num_envs, cfg.vector, cfg.env_kwargs, cfg.wrappers)
        cleanup.callback(_close_quietly, envs)
        # Evaluation plays up to EVAL_BATCH episodes at once on its own env copies.
        eval_envs = [
            make_env(cfg.env_id, env_kwargs=cfg.env_kwargs, wrappers=cfg.wrappers)
            for _ in range(min(EVAL_BATCH, cfg.eval_episodes))
        ]
        cleanup.callback(_close_quietly, *eval_envs)
        target_return = spec.reward_threshold if cfg.target_return is None else cfg.target_return
        agent = build_agent(cfg, spec, device, len(eval_envs))
        q_network, replay, selector, greedy, learner = (
            agent.q_network, agent.replay, agent.selector, agent.greedy, agent.learner
        )
        # The config as it ran: learner_backend auto resolved to the backend chosen.
        ran = cfg.to_dict() | {"learner_backend": learner.backend}
        (run_dir / "config.yaml").write_text(yaml.safe_dump(ran, sort_keys=False))
        sample_generator = torch.Generator(device=replay.storage_device).manual_seed(cfg.seed)
        explore_rng = np.random.default_rng([cfg.seed, 2])  # epsilon-greedy, random_starts
        episodes = Episodes(cfg.num_envs, cfg.seed)
        counters = Counters(learning_starts=cfg.learning_starts)
        eval_curve: list[tuple[int, float]] = []
        # What a checkpoint saves and a resume restores, besides the online network.
        resumable = {
            "target_network": agent.target_network,
            "learner": learner,
            "sample_generator": sample_generator,
            "explore_rng": explore_rng,
            "selector": selector,
        }

        # --- first observations: fresh episodes, or the resumed ones replayed exactly ---
        if checkpoint is None:
            obs = episodes.reset(envs)
        else:
            eval_curve = restore_training(
                checkpoint, q_network=q_network, replay=replay, **resumable
            )
            # (Checkpoints of older releases lack learning_starts and updates_before.)
            saved = {"learning_starts": cfg.learning_starts, **checkpoint["counters"]}
            counters = Counters(**saved)
            if "replay" not in checkpoint:
                # The buffer starts empty: fill it again before learning, as a new run does.
                counters.learning_starts = counters.global_step + cfg.learning_starts
                counters.updates_before = learner.updates
            obs = episodes.restore(envs, checkpoint["envs"], echo)
        if cfg.terminal_on_life_loss and episodes.lives is None:
            raise UserError(
                f"terminal_on_life_loss needs an env that reports info['lives'] (Atari); "
                f"{cfg.env_id} does not: --set terminal_on_life_loss=false"
            )

        # result.json reports the whole run's wall time, earlier pieces included.
        wall_before = 0.0 if checkpoint is None else float(checkpoint.get("wall_time_s", 0.0))

        def wall_time() -> float:
            return wall_before + time.perf_counter() - wall_start

        # --- checkpoints and evaluation: what they hold is defined in agent/checkpoint.py ---
        def policy() -> dict[str, Any]:
            if not learner.parameters_finite():
                raise NonFiniteError("non-finite network parameters")
            return policy_checkpoint(
                env_id=cfg.env_id,
                obs_shape=spec.obs_shape,
                obs_dtype=spec.obs_dtype,
                n_actions=spec.n_actions,
                config=cfg.to_dict(),
                q_network=q_network,
                counters=dataclasses.asdict(counters),
            )

        def save_last() -> None:
            data = training_checkpoint(
                policy(),
                eval_curve=eval_curve,
                episodes=episodes.state_dict(obs),
                replay=replay if cfg.save_buffer else None,
                wall_time_s=wall_time(),
                **resumable,
            )
            save_checkpoint(ckpt_dir / "last.pt", data)

        def save_best() -> None:
            try:
                save_checkpoint(ckpt_dir / "best.pt", policy())  # the policy only
            except CheckpointWriteError as e:
                # A full disk must not also cost the checkpoint that lets the run resume.
                with contextlib.suppress(CheckpointWriteError):
                    save_last()
                    e.saved_instead = (ckpt_dir / "last.pt", counters.global_step)
                raise e from None

        def evaluate(step: int) -> bool:
            """A periodic noise-free evaluation; True when it reached the target, confirmed."""
            result = run_episodes(
                greedy, eval_envs, cfg.eval_episodes, seed=cfg.seed, round_index=counters.eval_round
            )
            counters.eval_round += 1
            eval_curve.append((step, result.mean))
            monitor.scalars(step, {"eval/mean_return": result.mean, "eval/std_return": result.std})
            if counters.best_eval is None or result.mean > counters.best_eval:
                counters.best_eval = result.mean
                save_best()
            # A run extended after its early stop trains on: it solved once already.
            early_stop = cfg.early_stop and counters.solved_step is None
            if not (early_stop and target_return is not None and result.mean >= target_return):
                return False
            if not cfg.confirm_episodes:
                return True
            # Short evaluations near the threshold overstate a policy: confirm on fresh
            # episodes, with confidence. A policy whose true mean sits at the target passes a
            # bare-mean confirmation half the time and then scores below it in a fresh round.
            confirmed = run_episodes(
                greedy, eval_envs, cfg.confirm_episodes, seed=cfg.seed,
                round_index=counters.eval_round,
            )
            counters.eval_round += 1
            lower = confirmed.mean - cfg.confirm_z * confirmed.standard_error
            monitor.scalars(step, {"eval/confirm_mean_return": confirmed.mean,
                                   "eval/confirm_lower_bound": lower})
            return lower >= target_return

        monitor = Monitor(run_dir, cfg.total_steps, counters.global_step, progress)
        cleanup.callback(_close_quietly, monitor)  # flushes the events, whatever happens
        status: Literal["finished", "solved", "interrupted"] = "finished"
        n = cfg.num_envs
        echo(f"run directory: {run_dir}")
        echo(f"watch it with: tensorboard --logdir {run_dir.parent}")
        if counters.global_step < cfg.random_starts:  # not again on a resume past the warm-up
            whole = " (the whole run)" if cfg.random_starts >= cfg.total_steps else ""
            echo(f"uniform random actions for the first {cfg.random_starts:,} steps{whole}: "
                 "random_starts; --set random_starts=N to change it")

        stop = cleanup.enter_context(StopSignals())  # Ctrl-C and SIGTERM set stop.received
        while counters.global_step < cfg.total_steps:
            # --- act: greedy on a noisy net plus a floor of random actions (or epsilon-greedy) ---
            actions = selector(obs)  # (n,) int64, the one device->host read per step
            explored = None  # (n,) bool where a random action replaced the policy's
            if cfg.exploration == "epsilon":
                epsilon = linear_schedule(
                    cfg.epsilon_start,
                    cfg.epsilon_end,
                    cfg.epsilon_fraction * cfg.total_steps,
                    counters.global_step,
                )
                actions = epsilon_greedy(actions, epsilon, explore_rng, spec.n_actions)
            elif cfg.noisy_epsilon > 0 and counters.global_step >= cfg.random_starts:
                # The floor retries actions that the noise has stopped trying.
                policy_actions = actions
                actions = epsilon_greedy(actions, cfg.noisy_epsilon, explore_rng, spec.n_actions)
                explored = actions != policy_actions
            if counters.global_step < cfg.random_starts:
                actions = explore_rng.integers(spec.n_actions, size=n)  # fill replay uniformly

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
                if cfg.noise_interval == "episode":
                    selector.new_noise()  # one noise sample per episode
            obs = next_obs

            # --- learn: one update per train_freq env steps, once learning has started ---
            if step >= counters.learning_starts and len(replay) >= cfg.batch_size:
                while learner.updates < counters.updates_due(cfg.train_freq):
                    learner.update(replay.sample(cfg.batch_size, sample_generator))
                if crossed(step, n, cfg.target_update_interval):
                    learner.sync_target()

            # --- log: the only place tensors become floats ---
            if crossed(step, n, cfg.log_interval):
                metrics = learner.metrics()  # raises NonFiniteError on divergence
                scalars = {"charts/episodes": float(counters.episodes)}
                if metrics is not None:
                    scalars["losses/td_loss"] = metrics.td_loss
                    scalars["losses/q_values"] = metrics.q_values
                    scalars["charts/updates"] = float(learner.updates)
                if cfg.exploration == "epsilon":
                    scalars["charts/epsilon"] = epsilon
                elif cfg.noisy_epsilon > 0:
                    scalars["charts/epsilon"] = cfg.noisy_epsilon
                scalars.update(noise_stats(q_network))
                if len(replay) >= cfg.batch_size:  # how much the noise changes behaviour
                    probe_seed = episode_seed(cfg.seed, 0, step, stream=3)
                    noisy = cfg.exploration == "noisy"
                    scalars.update(
                        exploration_probe(q_network, replay, cfg.batch_size, probe_seed, noisy)
                    )
                monitor.scalars(step, scalars)
                monitor.progress(step, sps=f"{monitor.sps(step):.0f}")

            # --- evaluate the noise-free policy; stop early once solved ---
            if cfg.eval_interval and crossed(step, n, cfg.eval_interval) and evaluate(step):
                counters.solved_step = step
                status = "solved"
                break

            # --- checkpoint; Ctrl-C or SIGTERM saves and stops ---
            if crossed(step, n, cfg.checkpoint_interval):
                save_last()
            if stop.received is not None:
                status = "interrupted"
                break

        # --- the end: save, then measure the final policy on fresh episodes ---
        save_last()
        monitor.progress(counters.global_step)
        final_eval: float | None = None
        if status != "interrupted":
            final_eval = run_episodes(
                greedy, eval_envs, cfg.confirm_episodes or cfg.eval_episodes, seed=cfg.seed,
                round_index=counters.eval_round,
            ).mean
            monitor.scalars(counters.global_step, {"eval/final_mean_return": final_eval})
            monitor.hparams(ran, {"eval/final_mean_return": final_eval})
        result = TrainResult(
            run_dir=str(run_dir),
            status=status,
            global_step=counters.global_step,
            updates=learner.updates,
            wall_time_s=wall_time(),
            target_return=target_return,
            solved_step=counters.solved_step,
            best_eval_return=counters.best_eval,
            final_eval_return=final_eval,
            eval_curve=eval_curve,
            stop_signal=stop.received,
            learner_backend=learner.backend,
        )
        (run_dir / "result.json").write_text(json.dumps(json_ready(result.__dict__), indent=2))
        return result


def exploration_probe(
    q_network: QNetwork,
    replay: ReplayBuffer | FrameReplayBuffer,
    batch_size: int,
    seed: int,
    noisy: bool,
) -> dict[str, float]:
    """``exploration/*`` scalars over ``PROBE_STATES`` replay states (agent/monitor.py).

    Generators of its own, seeded with ``seed``: no training RNG stream moves. Samples
    of ``batch_size``, the size the pinned staging slots were made for.
    """
    generator = torch.Generator(device=replay.storage_device).manual_seed(seed)
    draws = max(1, PROBE_STATES // batch_size)
    obs = torch.cat([replay.sample(batch_size, generator).obs for _ in range(draws)])
    return exploration_stats(q_network, obs, draws=draws, seed=seed, noisy=noisy)


def _close_quietly(*things: Any) -> None:
    """``close()`` each, ignoring their errors: the error being raised, if any, matters more."""
    for thing in things:
        if thing is None:
            continue
        try:
            thing.close()
        except Exception:
            pass
