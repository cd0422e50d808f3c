"""CartPole-v1: how fast and how reliably each agent solves it, in one invocation.

    python -m bench.cartpole --seeds 101-110 --sb3-seeds 3 --ablation --plot docs/img/cartpole.png

Agents (each seed is a separate process, timed as a whole, start-up included):

* ``noisy``: ``python run.py --env CartPole-v1 --seed S`` — our defaults, nothing else.
* ``epsilon`` (``--ablation``): the same agent with the noise off and a linear
  epsilon-greedy schedule, to show what noisy exploration buys.
* ``sb3`` (when stable-baselines3 is installed): SB3's DQN with the rl-zoo3 tuned
  CartPole-v1 hyperparameters (50k steps, [256, 256], train_freq 256,
  gradient_steps 128, ...), evaluated the same way.

Solved means: the final policy's noise-free (deterministic) evaluation over 100
episodes has mean return >= 475. "Steps to 475" is the env steps at the first
periodic evaluation whose mean reached 475 (ours: 10 episodes every
``eval_interval`` steps of the config, 1,000 for CartPole-v1; SB3: 20 episodes every
1,500 steps). Wall-clock is the whole command. Ratios
are against SB3 measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

__all__ = ["ROOT", "SB3_ZOO", "parse_seeds", "run_ours", "run_sb3", "timed_run_py"]

ROOT = Path(__file__).resolve().parent.parent
THRESHOLD = 475.0

# rl-zoo3 hyperparams/dqn.yml, CartPole-v1.
SB3_ZOO = {
    "learning_rate": 2.3e-3,
    "batch_size": 64,
    "buffer_size": 100_000,
    "learning_starts": 1_000,
    "gamma": 0.99,
    "target_update_interval": 10,
    "train_freq": 256,
    "gradient_steps": 128,
    "exploration_fraction": 0.16,
    "exploration_final_eps": 0.04,
    "policy_kwargs": {"net_arch": [256, 256]},
}
SB3_STEPS = 50_000

# Runs in a child process: SB3 training with a periodic deterministic evaluation.
SB3_SCRIPT = r"""
import json, sys, time
import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import DQN
from stable_baselines3.common.callbacks import BaseCallback

seed, steps, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
kwargs = json.loads(sys.argv[4])
env_id, eval_every, eval_episodes = sys.argv[5], int(sys.argv[6]), int(sys.argv[7])
torch.set_num_threads(1)

def evaluate(model, episodes, round_index):
    env = gym.make(env_id)
    returns = []
    for k in range(episodes):
        obs, _ = env.reset(seed=10_000 * (round_index + 1) + k + 1_000_000 * seed)
        done, total = False, 0.0
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, r, term, trunc, _ = env.step(action)
            total += r
            done = term or trunc
        returns.append(total)
    return float(np.mean(returns))

class Curve(BaseCallback):
    def __init__(self):
        super().__init__()
        self.curve, self.rounds, self.eval_time = [], 0, 0.0
    def _on_step(self):
        if self.num_timesteps % eval_every == 0:
            t = time.perf_counter()
            ret = evaluate(self.model, eval_episodes, self.rounds)
            self.curve.append((self.num_timesteps, ret))
            self.eval_time += time.perf_counter() - t
            self.rounds += 1
        return True

start = time.perf_counter()
model = DQN("MlpPolicy", gym.make(env_id), seed=seed, device="cpu", **kwargs)
cb = Curve()
model.learn(total_timesteps=steps, callback=cb)
final = evaluate(model, 100, 999)
json.dump({"eval_curve": cb.curve, "final_eval_return": final, "global_step": steps,
           "train_time_s": time.perf_counter() - start, "periodic_eval_s": cb.eval_time},
          open(out, "w"))
"""


def parse_seeds(text: str) -> list[int]:
    if "-" in text:
        lo, hi = (int(x) for x in text.split("-"))
        return list(range(lo, hi + 1))
    return [int(x) for x in text.split(",")]


def timed_run_py(args: list[str], what: str) -> float:
    """Wall seconds of ``python run.py args`` in its own process; a failure raises
    ``RuntimeError`` naming ``what`` with the end of its stderr."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, capture_output=True,
                          text=True)  # fmt: skip
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed: {proc.stderr[-2000:]}")
    return wall


def run_ours(seed: int, extra: list[str], workdir: Path, env_id: str = "CartPole-v1") -> dict:
    """``python run.py --env ENV --seed S [extra]`` in its own process, timed as a whole."""
    run_dir = workdir / f"seed{seed}"
    wall = timed_run_py(["--env", env_id, "--seed", str(seed), "--no-progress", "--run-dir",
                         str(run_dir), *extra], f"seed {seed}")  # fmt: skip
    result = json.loads((run_dir / "result.json").read_text())
    result["wall_s"] = wall
    return result


def run_sb3(
    seed: int,
    workdir: Path,
    env_id: str = "CartPole-v1",
    hyperparams: dict | None = None,
    steps: int = SB3_STEPS,
    eval_every: int = 1500,
    eval_episodes: int = 20,
) -> dict:
    """SB3's DQN (rl-zoo3 hyperparameters) in its own process, timed as a whole.

    Every ``eval_every`` steps a deterministic ``eval_episodes``-episode evaluation,
    at the end one of 100 episodes; ``periodic_eval_s`` is the time the periodic ones took.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / f"sb3_{env_id.replace('/', '_')}_seed{seed}.json"
    cmd = [sys.executable, "-c", SB3_SCRIPT, str(seed), str(steps), str(out),
           json.dumps(SB3_ZOO if hyperparams is None else hyperparams), env_id,
           str(eval_every), str(eval_episodes)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"SB3 seed {seed} failed: {proc.stderr[-2000:]}")
    result = json.loads(out.read_text())
    result["wall_s"] = wall
    return result


def first_reach(curve: list) -> int | None:
    return next((int(step) for step, value in curve if value >= THRESHOLD), None)


def summarise(name: str, results: list[dict], baseline_wall: float | None) -> dict:
    solved = [r["final_eval_return"] is not None and r["final_eval_return"] >= THRESHOLD
              for r in results]
    reach = [first_reach(r["eval_curve"]) for r in results]
    reached = [s for s in reach if s is not None]
    walls = [r["wall_s"] for r in results]
    sps = [r["global_step"] / r["wall_s"] for r in results]
    row = {
        "agent": name,
        "solved": f"{sum(solved)}/{len(results)}",
        "steps_to_475": (
            f"{statistics.median(reached):,.0f} ({min(reached):,}-{max(reached):,})"
            if reached else "never"
        ) + ("" if len(reached) == len(results) else f", {len(results) - len(reached)} never"),
        "final_returns": " ".join(f"{r['final_eval_return']:.0f}" for r in results),
        "wall_s": statistics.median(walls),
        "sps": statistics.median(sps),
        "speedup": None if baseline_wall is None else baseline_wall / statistics.median(walls),
    }
    return row


def plot(curves: dict[str, list[list]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, runs in curves.items():
        grid = np.arange(500, 50_001, 500)
        values = []
        for curve in runs:
            steps = np.array([s for s, _ in curve] or [0])
            rets = np.array([v for _, v in curve] or [0.0])
            # After an early stop the policy is kept: carry its last evaluation forward.
            idx = np.clip(np.searchsorted(steps, grid, side="right") - 1, 0, None)
            values.append(np.where(grid >= steps[0], rets[idx], np.nan))
        arr = np.array(values)
        with warnings.catch_warnings():  # steps before an agent's first evaluation: all NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            mean = np.nanmean(arr, axis=0)
            lo, hi = np.nanpercentile(arr, 25, axis=0), np.nanpercentile(arr, 75, axis=0)
        ax.plot(grid, mean, label=f"{name} (mean, IQR band, {len(runs)} seeds)")
        ax.fill_between(grid, lo, hi, alpha=0.2)
    ax.axhline(THRESHOLD, color="gray", ls="--", lw=1)
    ax.set_xlabel("environment steps")
    ax.set_ylabel("noise-free evaluation return")
    ax.set_title("CartPole-v1")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", default="101-110", help="our seeds, e.g. 101-110 or 1,2,3")
    p.add_argument("--sb3-seeds", type=int, default=3, help="first N of --seeds for SB3 (0: none)")
    p.add_argument("--ablation", action="store_true", help="also run epsilon-greedy")
    p.add_argument("--set", action="append", default=[], help="extra --set for our agent")
    p.add_argument("--jobs", type=int, default=1,
                   help="parallel runs (timings are only valid with 1)")
    p.add_argument("--plot", type=Path, help="write a learning-curve PNG here")
    p.add_argument("--json", type=Path, help="write all per-seed results here")
    args = p.parse_args()
    seeds = parse_seeds(args.seeds)
    extra = [x for s in args.set for x in ("--set", s)]
    workdir = Path(tempfile.mkdtemp(prefix="bench_cartpole_"))
    agents: dict[str, list[dict]] = {}

    def batch(fn, items):
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            return list(pool.map(fn, items))

    sb3_available = True
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        sb3_available = False
    if args.sb3_seeds and sb3_available:
        agents["sb3 (rl-zoo3)"] = batch(lambda s: run_sb3(s, workdir), seeds[: args.sb3_seeds])
    agents["noisy (ours)"] = batch(lambda s: run_ours(s, extra, workdir / "noisy"), seeds)
    if args.ablation:
        eps = ["--set", "exploration=epsilon", "--set", "noisy_layers=none", *extra]
        agents["epsilon-greedy (ours)"] = batch(lambda s: run_ours(s, eps, workdir / "eps"), seeds)

    base = agents.get("sb3 (rl-zoo3)")
    base_wall = statistics.median(r["wall_s"] for r in base) if base else None
    rows = [summarise(name, res, base_wall) for name, res in agents.items()]
    print(f"\nCartPole-v1, seeds {args.seeds} (SB3: first {args.sb3_seeds}), jobs={args.jobs}, "
          f"{os.cpu_count()} CPUs\n")
    print("| agent | solved (100-ep eval >= 475) | steps to first eval >= 475, median (min-max) "
          "| median wall-clock (s) | median SPS | speed-up vs SB3 | final 100-ep returns |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        speed = "-" if r["speedup"] is None else f"{r['speedup']:.1f}x"
        print(f"| {r['agent']} | {r['solved']} | {r['steps_to_475']} | {r['wall_s']:.1f} | "
              f"{r['sps']:.0f} | {speed} | {r['final_returns']} |")
    if args.json:
        args.json.write_text(json.dumps(agents, indent=1))
    if args.plot:
        plot({name: [r["eval_curve"] for r in res] for name, res in agents.items()}, args.plot)
        print(f"\nplot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
