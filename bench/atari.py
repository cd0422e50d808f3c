"""Benchmark: Atari (ALE/Pong-v5) training SPS with 1 and 8 envs, and replay memory per transition.

    python bench/atari.py            # Pong, 1 and 8 sync envs (about a minute on 2 cores)
    python bench/atari.py --async    # also 8 async (subprocess) envs
    python bench/atari.py --quick    # shorter runs

Needs the atari extra (``pip install -e ".[atari]"``). SPS is measured as in
``bench/vector.py``: short ``train`` runs with the ``configs/atari.yaml`` settings
(Nature CNN, hidden [512], batch 32, train_freq 4, n_step 3) on the CPU with one torch
thread, except that learning starts after a few thousand steps instead of 80k and the
buffer is small; *acting* is the SPS before learning starts, *learning* after.
Memory: bytes of storage per transition of the frame replay (one 84x84 frame plus
indices and scalars) and of the full-observation ReplayBuffer (obs and next_obs
stacks), and what a 1M-transition buffer costs with each.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from vector import machine, measure_sps

from agent.frame_replay import FrameReplayBuffer
from agent.replay import ReplayBuffer


def memory_table() -> None:
    shape = (4, 84, 84)
    frame = FrameReplayBuffer(10_000, shape, np.uint8, device="cpu", n_step=3)
    full = ReplayBuffer(10_000, shape, np.uint8, device="cpu", n_step=3)
    print("| replay | bytes / transition | 1M transitions |")
    print("|---|---|---|")
    for name, buf in (("FrameReplayBuffer (frame_replay: true)", frame), ("ReplayBuffer", full)):
        b = buf.bytes_per_transition
        print(f"| {name} | {b:,} | {b * 1_000_000 / 2**30:.1f} GiB |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="ALE/Pong-v5")
    parser.add_argument("--async", dest="use_async", action="store_true")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"# {args.env}: {machine()}")
    memory_table()
    print()
    print("| num_envs | vector | SPS acting | SPS learning (train_freq 4, batch 32) |")
    print("|---|---|---|---|")
    runs = [(1, "sync"), (8, "sync")] + ([(8, "async")] if args.use_async else [])
    for n, kind in runs:
        log = 160 if n == 1 else 320
        acting = (800 if args.quick else 2_400) * (2 if n > 1 else 1)
        learning = log * (3 if args.quick else 4)
        overrides = {"buffer_size": 20_000, "target_update_interval": 32_000}
        sps = measure_sps(args.env, n, acting, learning, log, kind, overrides)
        print(f"| {n} | {kind} | {sps['acting']:,.0f} | {sps['learning']:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
