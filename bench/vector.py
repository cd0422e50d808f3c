"""Benchmark: environment steps per second of the training loop with 1, 4 and 8 vector envs.

    python -m bench.vector                 # CartPole-v1, sync vector env, 1 / 4 / 8 envs
    python -m bench.vector --async         # also the async (subprocess) vector env
    python -m bench.vector --quick         # shorter runs

Each configuration is one short ``agent.train.train`` run on the CPU (one torch
thread, evaluation off). The loop logs ``charts/SPS`` over every ``log_interval``
env steps; the script reports the median window SPS of two phases of the same run:

* *acting*: before ``learning_starts`` (action selection, env steps, replay adds);
* *learning*: after it (the same plus one gradient update every ``train_freq`` env
  steps, summed over sub-envs, so updates per env step do not change with num_envs).

The first window of each phase is dropped (warm-up, and the window in which
learning starts). Numbers are medians of short
runs on a shared machine: compare rows of one invocation, not across machines.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from agent.config_files import load_config
from agent.train import train
from bench.acting import machine

__all__ = ["measure_sps"]


def measure_sps(
    env_id: str,
    num_envs: int,
    acting_steps: int,
    learning_steps: int,
    log_interval: int,
    vector: str = "sync",
    overrides: dict[str, Any] | None = None,
    config_file: str | None = None,
) -> dict[str, float]:
    """Median SPS of the acting and learning phases of one short training run
    (``config_file``: a preset's name or a YAML, as ``run.py --config``)."""
    values = {
        "num_envs": num_envs,
        "vector": vector,
        "total_steps": acting_steps + learning_steps,
        "learning_starts": acting_steps,
        "eval_interval": 0,
        "eval_episodes": 1,
        "confirm_episodes": 0,
        "log_interval": log_interval,
        "checkpoint_interval": 10**9,
        "device": "cpu",
        "torch_threads": 1,
        **(overrides or {}),
    }
    cfg = load_config(env_id, config_file, overrides=values)
    with tempfile.TemporaryDirectory() as tmp:
        train(cfg, Path(tmp) / "run", progress=False, echo=lambda _: None)
        acc = EventAccumulator(str(Path(tmp) / "run"), size_guidance={"scalars": 0})
        acc.Reload()
        windows = [(e.step, e.value) for e in acc.Scalars("charts/SPS")]
    acting = [v for s, v in windows if s <= acting_steps][1:]
    learning = [v for s, v in windows if s > acting_steps + log_interval]
    return {
        "acting": statistics.median(acting) if acting else float("nan"),
        "learning": statistics.median(learning) if learning else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--envs", default="1,4,8", help="comma-separated num_envs values")
    parser.add_argument("--async", dest="use_async", action="store_true")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    acting, learning = (2_400, 1_600) if args.quick else (8_000, 4_000)
    # The CartPole-v1 learning settings of configs/CartPole-v1.yaml, pinned here so
    # that a config change does not silently change the benchmark.
    overrides = {
        "hidden_sizes": [64, 64],
        "batch_size": 64,
        "train_freq": 2,
        "n_step": 3,
        "buffer_size": 50_000,
        "target_update_interval": 250,
    }
    print(f"# {args.env}: {machine()}")
    print("| num_envs | vector | SPS acting | SPS learning (train_freq 2, batch 64) |")
    print("|---|---|---|---|")
    kinds = ["sync", "async"] if args.use_async else ["sync"]
    for kind in kinds:
        for n in (int(x) for x in args.envs.split(",")):
            sps = measure_sps(args.env, n, acting, learning, 400, kind, overrides)
            print(f"| {n} | {kind} | {sps['acting']:,.0f} | {sps['learning']:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
