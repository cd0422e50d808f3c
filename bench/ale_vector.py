"""Benchmark: Atari envs stepped by ale-py's ``AtariVectorEnv`` (``vector: ale``) against
gymnasium's sync and async vector envs, the same preprocessing in each.

    python -m bench.ale_vector                      # both measurements, Pong
    python -m bench.ale_vector --only steps --envs 16 --steps 4000
    python -m bench.ale_vector --only eval --episodes 100

*steps*: env steps per second of ``--envs`` copies under uniform random actions (a reset
where an episode ends, as the training loop does it), the median of ``--repeats`` timed
runs after one warm-up. *eval*: the wall seconds of a final evaluation as a run plays it,
``--episodes`` episodes at ``eval_epsilon`` 0.001, ``eval_envs`` copies at once, with the
noise-free greedy actions of an untrained ``der`` network (Pong's episodes end however it
plays: the opponent scores 21).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from bench.acting import machine

__all__ = ["eval_seconds", "steps_per_second"]

KINDS = ("sync", "async", "ale")


def steps_per_second(env_id: str, kind: str, num_envs: int, steps: int, seed: int = 0) -> float:
    """Env steps (summed over copies) per second under random actions."""
    from envs import make_vector_env

    envs = make_vector_env(env_id, num_envs, kind)
    try:
        rng = np.random.default_rng(seed)
        n_actions = int(envs.single_action_space.n)
        envs.reset(seed=[seed * 1000 + i for i in range(num_envs)])
        episode = np.zeros(num_envs, dtype=np.int64)
        start = time.perf_counter()
        for _ in range(steps // num_envs):
            _, _, terminated, truncated, _ = envs.step(rng.integers(n_actions, size=num_envs))
            done = terminated | truncated
            if done.any():
                episode += done
                seeds = [int(i * 1000 + e) if d else None
                         for i, (e, d) in enumerate(zip(episode, done, strict=True))]  # fmt: skip
                envs.reset(seed=seeds, options={"reset_mask": done})
        return (steps // num_envs) * num_envs / (time.perf_counter() - start)
    finally:
        envs.close()


def eval_seconds(env_id: str, kind: str, episodes: int, copies: int) -> tuple[float, float]:
    """(wall seconds, mean return) of a final evaluation of an untrained der network."""
    from agent.acting import ActionSelector
    from agent.config_files import load_config
    from agent.evaluate import run_episodes
    from agent.setup import build_q_network
    from envs import inspect_env, make_env, make_vector_env

    cfg = load_config(env_id, "der")
    spec = inspect_env(env_id, cfg.env_kwargs)
    torch.manual_seed(0)
    net = build_q_network(cfg, spec.obs_shape, spec.n_actions, torch.device("cpu"),
                          spec.obs_dtype)  # fmt: skip
    greedy = ActionSelector(net, spec.obs_shape, copies, noise=False, seed=0)
    if kind == "sync":
        envs = [make_env(env_id, env_kwargs=cfg.env_kwargs) for _ in range(copies)]
    else:
        envs = make_vector_env(env_id, copies, kind, cfg.env_kwargs)
    try:
        start = time.perf_counter()
        result = run_episodes(greedy, envs, episodes, seed=1, epsilon=cfg.eval_epsilon,
                              n_actions=spec.n_actions)  # fmt: skip
        return time.perf_counter() - start, result.mean
    finally:
        for env in envs if isinstance(envs, list) else [envs]:
            env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="PongNoFrameskip-v4")
    parser.add_argument("--only", choices=["steps", "eval"])
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--envs", type=int, default=16, help="copies for the steps/s runs")
    parser.add_argument("--steps", type=int, default=8000, help="env steps of each timed run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--eval-envs", type=int, default=25)
    args = parser.parse_args()
    torch.set_num_threads(1)
    kinds = args.kinds.split(",")
    print(f"# {args.env}: {machine()}")
    if args.only in (None, "steps"):
        print(f"\n| vector | steps/s, {args.envs} envs, random actions (median of "
              f"{args.repeats}; min-max) |\n|---|---|")  # fmt: skip
        for kind in kinds:
            steps_per_second(args.env, kind, args.envs, args.envs * 20)  # warm-up
            sps = [steps_per_second(args.env, kind, args.envs, args.steps, seed=r + 1)
                   for r in range(args.repeats)]  # fmt: skip
            print(f"| {kind} | {statistics.median(sps):,.0f} ({min(sps):,.0f}-{max(sps):,.0f}) |",
                  flush=True)  # fmt: skip
    if args.only in (None, "eval"):
        print(f"\n| eval_vector | final evaluation, {args.episodes} episodes, {args.eval_envs} "
              "copies: seconds | mean return |\n|---|---|---|")  # fmt: skip
        for kind in kinds:
            seconds, mean = eval_seconds(args.env, kind, args.episodes, args.eval_envs)
            print(f"| {kind} | {seconds:.1f} | {mean:.2f} |", flush=True)


if __name__ == "__main__":
    main()
