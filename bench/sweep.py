"""Benchmark: N CartPole seeds one after another vs through the Ray sweep, and Ray's start-up.

    python -m bench.sweep                         # 10 seeds x 5000 steps (a few minutes, 2 cores)
    python -m bench.sweep --seeds 4 --total-steps 2000      # quick

Three measurements, in one invocation, on the same configuration
(``--env CartPole-v1 --total-steps N --set early_stop=false --device cpu``):

* sequential: ``agent.train.train`` for each seed in turn, in this process, one torch
  thread (the work itself, without a Python start-up per run);
* sweep: ``python run.py --env CartPole-v1 --seeds K --total-steps N --set
  early_stop=false`` as a subprocess, end to end (Ray start, trials, summary, shutdown);
* Ray overhead: ``ray.init`` of a local instance, one task per CPU that imports torch
  (worker start-up), and ``ray.shutdown``, with no training.

Needs the sweep extra (``pip install -e ".[sweep]"``). Leaves no Ray processes behind.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def sequential(seeds: list[int], total_steps: int, run_root: Path) -> tuple[float, list[float]]:
    import torch

    from agent.config_files import load_config
    from agent.train import train

    torch.set_num_threads(1)
    finals = []
    start = time.perf_counter()
    for seed in seeds:
        overrides = {"total_steps": total_steps, "early_stop": False, "device": "cpu"}
        cfg = load_config("CartPole-v1", None, {**overrides, "seed": seed})
        res = train(cfg, run_root / f"seed_{seed}", progress=False, echo=lambda *a, **k: None)
        finals.append(res.final_eval_return)
    return time.perf_counter() - start, finals


def through_sweep(n_seeds: int, total_steps: int, sweep_dir: Path) -> tuple[float, list[float]]:
    cmd = [sys.executable, "run.py", "--env", "CartPole-v1", "--seeds", str(n_seeds)]
    cmd += ["--total-steps", str(total_steps), "--set", "early_stop=false", "--device", "cpu"]
    cmd += ["--run-dir", str(sweep_dir), "--no-progress"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"sweep failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    summary = json.loads((sweep_dir / "summary.json").read_text())
    finals = [t["final_eval_return"] for t in summary["trials"]]
    return wall, finals


def ray_overhead() -> dict[str, float]:
    import logging

    import ray

    t0 = time.perf_counter()
    ray.init(
        address="local", include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR
    )
    t1 = time.perf_counter()
    cpus = int(ray.cluster_resources()["CPU"])

    @ray.remote(num_cpus=1)
    def warm() -> int:
        import torch

        return torch.get_num_threads()

    ray.get([warm.remote() for _ in range(cpus)])
    t2 = time.perf_counter()
    ray.shutdown()
    t3 = time.perf_counter()
    return {"init_s": t1 - t0, "workers_s": t2 - t1, "shutdown_s": t3 - t2, "total_s": t3 - t0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--total-steps", type=int, default=5000)
    args = p.parse_args()
    seeds = list(range(1, args.seeds + 1))
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f} at start; python {platform.python_version()}"
    )
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        over = ray_overhead()
        print(
            f"Ray overhead: init {over['init_s']:.1f} s, worker start + torch import "
            f"{over['workers_s']:.1f} s, shutdown {over['shutdown_s']:.1f} s, "
            f"total {over['total_s']:.1f} s"
        )
        seq, seq_finals = sequential(seeds, args.total_steps, Path(tmp) / "seq")
        print(f"sequential: {len(seeds)} seeds x {args.total_steps} steps in {seq:.1f} s")
        swp, swp_finals = through_sweep(len(seeds), args.total_steps, Path(tmp) / "sweep")
        print(f"sweep:      {len(seeds)} seeds x {args.total_steps} steps in {swp:.1f} s")
        print(f"speed-up: {seq / swp:.2f}x; load average {os.getloadavg()[0]:.2f} at end")
        same = sorted(seq_finals) == sorted(swp_finals)
        print(f"same final returns in both (determinism check): {same}")


if __name__ == "__main__":
    main()
