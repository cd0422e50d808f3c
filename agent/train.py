"""The training loop: read it top to bottom, like CleanRL's dqn.py, but callable from tests."""

from __future__ import annotations

import copy
import json
import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import yaml

from agent.acting import ActionSelector
from agent.checkpoint import get_rng_state, save_checkpoint, set_rng_state
from agent.config import Config
from agent.errors import UserError
from agent.evaluate import run_episodes
from agent.learner import Learner, NonFiniteError
from agent.monitor import Monitor, noise_stats
from agent.networks import QNetwork
from agent.frame_replay import FrameReplayBuffer
from agent.replay import ReplayBuffer
from envs import episode_seed, inspect_env, make_env, make_vector_env

__all__ = ["TrainResult", "build_q_network", "resolve_device", "train"]

# Evaluation episodes played at once (one batched action per step for all of them).
EVAL_BATCH = 10


@dataclass
class TrainResult:
    """How a run ended, also written to ``RUN_DIR/result.json``."""

    run_dir: str
    status: Literal["finished", "solved", "interrupted"]
    global_step: int
    updates: int
    wall_time_s: float
    target_return: float | None
    solved_step: int | None
    """Env steps when the confirmed noise-free evaluation first reached target_return."""
    best_eval_return: float | None
    final_eval_return: float | None
    """Mean noise-free return of the final policy (confirm_episodes episodes)."""
    eval_curve: list[tuple[int, float]]
    """(env steps, mean noise-free return) of every periodic evaluation."""


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


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def crossed(step: int, stride: int, interval: int) -> bool:
    """True when the last ``stride`` steps (one vector step) passed a multiple of ``interval``."""
    return step // interval != (step - stride) // interval


def linear_schedule(start: float, end: float, duration: float, step: int) -> float:
    return end + (start - end) * max(0.0, 1.0 - step / max(duration, 1.0))


class _SigintFlag:
    """Turns the first Ctrl-C into a flag the loop checks; a second one interrupts at once."""

    def __init__(self) -> None:
        self.raised = False
        self._previous: Any = None

    def __enter__(self) -> _SigintFlag:
        try:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        except ValueError:  # not the main thread: leave signals alone
            self._previous = None
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.raised:
            raise KeyboardInterrupt
        self.raised = True

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def _lives(info: dict[str, Any], previous: np.ndarray | None) -> np.ndarray | None:
    """``info["lives"]`` of a vector env step or reset, kept from ``previous`` where masked out."""
    if "lives" not in info:
        return previous
    lives = np.asarray(info["lives"], dtype=np.int64)
    if previous is None:
        return lives.copy()
    mask = np.asarray(info.get("_lives", np.ones(len(lives), dtype=bool)), dtype=bool)
    return np.where(mask, lives, previous)


def _replay_episodes(
    envs: Any, seed: int, ep_index: np.ndarray, ep_actions: list[list[int]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rebuild each sub-env's current episode from its seed and its actions so far.

    Returns (obs, episode returns, episode lengths) as they were when the
    checkpoint was written. Needs direct access to the sub-envs (sync vector env).
    """
    n = len(ep_actions)
    seeds = [episode_seed(seed, i, int(ep_index[i])) for i in range(n)]
    obs, _ = envs.reset(seed=seeds)
    ep_return = np.zeros(n, dtype=np.float64)
    for i, actions in enumerate(ep_actions):
        sub_env = envs.envs[i]
        for a in actions:
            o, r, _, _, _ = sub_env.step(a)
            ep_return[i] += float(r)
            obs[i] = o
    ep_length = np.array([len(a) for a in ep_actions], dtype=np.int64)
    return obs, ep_return, ep_length


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
    ``best.pt``, and ``result.json`` under ``run_dir``.
    """
    wall_start = time.perf_counter()
    spec = inspect_env(cfg.env_id)  # user errors (bad id, spaces) before anything is written
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

    # --- set-up: device, seeds, environments ---
    dtype = getattr(torch, cfg.dtype)
    if device.type == "cpu":
        torch.set_num_threads(cfg.torch_threads)
        # Adam's moments of parameters whose gradients stay zero (dead ReLUs) decay into
        # denormal floats, which the CPU computes ~5x slower: measured 475 -> 89 us per
        # Adam step on a 4-128-128-2 net. Flushing them to zero changes nothing that matters.
        torch.set_flush_denormal(True)
    seed_everything(cfg.seed)
    envs = make_vector_env(cfg.env_id, cfg.num_envs, cfg.vector)
    # Evaluation plays up to eval_batch episodes at once on its own env copies.
    eval_envs = [make_env(cfg.env_id) for _ in range(min(EVAL_BATCH, cfg.eval_episodes))]
    n = cfg.num_envs
    target_return = cfg.target_return if cfg.target_return is not None else spec.reward_threshold

    # --- agent: online and target networks, replay, acting, learning ---
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
            num_envs=n,
            float_dtype=dtype,
        )
    except ValueError as e:
        raise UserError(f"invalid config: {e}") from None
    noisy_acting = cfg.exploration == "noisy"
    selector = ActionSelector(
        q_network,
        spec.obs_shape,
        n,
        device,
        noise=noisy_acting,
        noise_interval=None if cfg.noise_interval == "episode" else cfg.noise_interval,
    )
    greedy = ActionSelector(q_network, spec.obs_shape, len(eval_envs), device, noise=False)
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
    )
    sample_generator = torch.Generator(device=replay.storage_device).manual_seed(cfg.seed)
    explore_rng = np.random.default_rng([cfg.seed, 2])  # epsilon-greedy only

    # --- loop state (all of it goes into the checkpoint) ---
    global_step = 0
    episodes_done = 0
    eval_round = 0
    best_eval: float | None = None
    solved_step: int | None = None
    eval_curve: list[tuple[int, float]] = []
    ep_index = np.zeros(n, dtype=np.int64)  # episode number of each sub-env
    ep_actions: list[list[int]] = [[] for _ in range(n)]

    if checkpoint is not None:
        q_network.load_state_dict(checkpoint["q_network"])
        target_network.load_state_dict(checkpoint["target_network"])
        learner.load_state_dict(checkpoint["learner"])
        counters = checkpoint["counters"]
        global_step = int(counters["global_step"])
        episodes_done = int(counters["episodes"])
        eval_round = int(counters["eval_round"])
        best_eval = counters["best_eval"]
        solved_step = counters["solved_step"]
        eval_curve = [(int(s), float(r)) for s, r in checkpoint["eval_curve"].tolist()]
        if "replay" in checkpoint:
            replay.load_state_dict(checkpoint["replay"])
        set_rng_state(checkpoint["rng"])
        sample_generator.set_state(checkpoint["sample_generator"])
        explore_rng.bit_generator.state = checkpoint["explore_rng"]
        selector.load_state_dict(checkpoint["selector"])
        ep_index = checkpoint["envs"]["ep_index"].numpy().copy()
        ep_actions = [t.tolist() for t in checkpoint["envs"]["ep_actions"]]

    def make_payload() -> dict[str, Any]:
        if not learner.parameters_finite():
            raise NonFiniteError("non-finite network parameters")
        payload: dict[str, Any] = {
            "env_id": cfg.env_id,
            "obs_shape": list(spec.obs_shape),
            "obs_dtype": spec.obs_dtype,
            "n_actions": spec.n_actions,
            "config": cfg.to_dict(),
            "q_network": q_network.state_dict(),
            "target_network": target_network.state_dict(),
            "learner": learner.state_dict(),
            "counters": {
                "global_step": global_step,
                "episodes": episodes_done,
                "eval_round": eval_round,
                "best_eval": best_eval,
                "solved_step": solved_step,
            },
            "eval_curve": torch.tensor(eval_curve or [], dtype=torch.float64).reshape(-1, 2),
            "rng": get_rng_state(),
            "sample_generator": sample_generator.get_state(),
            "explore_rng": explore_rng.bit_generator.state,  # nested dict of Python ints
            "selector": selector.state_dict(),
            "envs": {
                "ep_index": torch.from_numpy(ep_index.copy()),
                "ep_actions": [torch.tensor(a, dtype=torch.int64) for a in ep_actions],
                "obs": torch.from_numpy(np.asarray(obs).copy()),
                **({} if lives is None else {"lives": torch.from_numpy(lives.copy())}),
            },
        }
        if cfg.save_buffer:
            payload["replay"] = replay.state_dict()
        return payload

    # --- first observations: fresh episodes, or the resumed ones replayed exactly ---
    ep_return = np.zeros(n, dtype=np.float64)
    ep_length = np.zeros(n, dtype=np.int64)
    lives: np.ndarray | None = None  # info["lives"] of each sub-env (Atari), for life loss
    if checkpoint is None:
        obs, info = envs.reset(seed=[episode_seed(cfg.seed, i, 0) for i in range(n)])
        lives = _lives(info, None)
    else:
        saved_obs = checkpoint["envs"]["obs"].numpy()
        replayed = None
        if hasattr(envs, "envs"):
            replayed = _replay_episodes(envs, cfg.seed, ep_index, ep_actions)
        if replayed is not None and np.array_equal(replayed[0], saved_obs):
            obs, ep_return, ep_length = replayed
            if "lives" in checkpoint["envs"]:
                lives = checkpoint["envs"]["lives"].numpy().copy()
        else:
            echo(
                "note: the environments could not be restored exactly (async vector env or a "
                "non-deterministic env); resumed episodes start afresh"
            )
            ep_index += 1
            ep_actions = [[] for _ in range(n)]
            obs, info = envs.reset(
                seed=[episode_seed(cfg.seed, i, int(ep_index[i])) for i in range(n)]
            )
            lives = _lives(info, None)
    if cfg.terminal_on_life_loss and lives is None:
        envs.close()
        for env in eval_envs:
            env.close()
        raise UserError(
            f"terminal_on_life_loss needs an env that reports info['lives'] (Atari); "
            f"{cfg.env_id} does not: --set terminal_on_life_loss=false"
        )

    monitor = Monitor(run_dir, cfg.total_steps, global_step, progress)
    status: Literal["finished", "solved", "interrupted"] = "finished"
    last_path = ckpt_dir / "last.pt"
    echo(f"run directory: {run_dir}")
    echo(f"watch it with: tensorboard --logdir {run_dir.parent}")

    with _SigintFlag() as sigint:
        while global_step < cfg.total_steps:
            # --- act: greedy on a noisy net (or epsilon-greedy on a plain one) ---
            actions = selector(obs)  # (n,) int64, the one device->host read per step
            if not noisy_acting:
                epsilon = linear_schedule(
                    cfg.epsilon_start,
                    cfg.epsilon_end,
                    cfg.epsilon_fraction * cfg.total_steps,
                    global_step,
                )
                explore = explore_rng.random(n) < epsilon
                if explore.any():
                    actions = actions.copy()
                    actions[explore] = explore_rng.integers(spec.n_actions, size=int(explore.sum()))
            if global_step < cfg.random_starts:
                actions = explore_rng.integers(spec.n_actions, size=n)

            # --- step the environments; store the real transitions ---
            next_obs, rewards, terminated, truncated, info = envs.step(actions)
            global_step += n
            # Training-only signals; the logged return stays the sum of the env's rewards.
            # A lost life ends bootstrapping in replay, but the env is not reset.
            train_rewards = np.sign(rewards) if cfg.clip_rewards else rewards
            train_terminated = terminated
            if lives is not None:
                new_lives = _lives(info, lives)
                if cfg.terminal_on_life_loss:
                    train_terminated = terminated | (new_lives < lives)
                lives = new_lives
            replay.add(obs, actions, train_rewards, next_obs, train_terminated, truncated)
            ep_return += rewards
            ep_length += 1
            for i, a in enumerate(actions.tolist()):
                ep_actions[i].append(a)

            # --- episode ends: log, then reset those envs with their next seeds ---
            done = terminated | truncated
            if done.any():
                for i in np.flatnonzero(done):
                    monitor.episode(global_step, float(ep_return[i]), int(ep_length[i]))
                    episodes_done += 1
                    ep_index[i] += 1
                    ep_return[i], ep_length[i], ep_actions[i] = 0.0, 0, []
                seeds = [
                    episode_seed(cfg.seed, i, int(ep_index[i])) if done[i] else None
                    for i in range(n)
                ]
                next_obs, info = envs.reset(seed=seeds, options={"reset_mask": done})
                lives = _lives(info, lives)
                if cfg.noise_interval == "episode":
                    selector.new_noise()  # one noise sample per episode
            obs = next_obs

            # --- learn: one update per train_freq env steps, once learning has started ---
            if global_step >= cfg.learning_starts and len(replay) >= cfg.batch_size:
                due = (global_step - cfg.learning_starts) // cfg.train_freq + 1
                while learner.updates < due:
                    learner.update(replay.sample(cfg.batch_size, sample_generator))
                if crossed(global_step, n, cfg.target_update_interval):
                    learner.sync_target()

            # --- log: the only place tensors become floats ---
            if crossed(global_step, n, cfg.log_interval):
                metrics = learner.metrics()  # raises NonFiniteError on divergence
                scalars = {"charts/episodes": float(episodes_done)}
                if metrics is not None:
                    scalars["losses/td_loss"] = metrics.td_loss
                    scalars["losses/q_values"] = metrics.q_values
                    scalars["charts/updates"] = float(learner.updates)
                if not noisy_acting:
                    scalars["charts/epsilon"] = epsilon
                scalars.update(noise_stats(q_network))
                monitor.scalars(global_step, scalars)
                sps = monitor.sps(global_step)
                monitor.progress(global_step, sps=f"{sps:.0f}")

            # --- evaluate the noise-free policy; stop early once solved ---
            if cfg.eval_interval and crossed(global_step, n, cfg.eval_interval):
                result = run_episodes(
                    greedy, eval_envs, cfg.eval_episodes, seed=cfg.seed, round_index=eval_round
                )
                eval_round += 1
                eval_curve.append((global_step, result.mean))
                monitor.scalars(
                    global_step, {"eval/mean_return": result.mean, "eval/std_return": result.std}
                )
                if best_eval is None or result.mean > best_eval:
                    best_eval = result.mean
                    save_checkpoint(ckpt_dir / "best.pt", make_payload())
                if cfg.early_stop and target_return is not None and result.mean >= target_return:
                    confirmed = result.mean
                    if cfg.confirm_episodes:
                        confirm = run_episodes(
                            greedy,
                            eval_envs,
                            cfg.confirm_episodes,
                            seed=cfg.seed,
                            round_index=eval_round,
                        )
                        eval_round += 1
                        confirmed = confirm.mean
                        monitor.scalars(global_step, {"eval/confirm_mean_return": confirmed})
                    if confirmed >= target_return:
                        solved_step = global_step
                        status = "solved"
                        break

            # --- checkpoint; Ctrl-C saves and stops ---
            if crossed(global_step, n, cfg.checkpoint_interval):
                save_checkpoint(last_path, make_payload())
            if sigint.raised:
                status = "interrupted"
                break

        # --- the end: save, measure the final policy, write the result ---
        save_checkpoint(last_path, make_payload())
    monitor.progress(global_step)
    final_eval: float | None = None
    if status == "solved" and cfg.confirm_episodes:
        final_eval = confirmed
    elif status != "interrupted":
        episodes = cfg.confirm_episodes or cfg.eval_episodes
        final_eval = run_episodes(
            greedy, eval_envs, episodes, seed=cfg.seed, round_index=eval_round
        ).mean
        monitor.scalars(global_step, {"eval/final_mean_return": final_eval})
    result = TrainResult(
        run_dir=str(run_dir),
        status=status,
        global_step=global_step,
        updates=learner.updates,
        wall_time_s=time.perf_counter() - wall_start,
        target_return=target_return,
        solved_step=solved_step,
        best_eval_return=best_eval,
        final_eval_return=final_eval,
        eval_curve=eval_curve,
    )
    (run_dir / "result.json").write_text(json.dumps(result.__dict__, indent=2))
    if status != "interrupted":
        hp_results = {"eval/final_mean_return": final_eval or float("nan")}
        monitor.hparams(cfg.to_dict(), hp_results)
    monitor.close()
    envs.close()
    for env in eval_envs:
        env.close()
    return result

