"""Benchmark: what a learner update and an action cost per seed, S seeds stacked against one.

    python -m bench.seeds                 # S = 1, 4, 16, 64 (about two minutes on CPU)
    python -m bench.seeds --seeds 16 --quick

The CartPole network (4-128-128-2, noise in the last layer, batch 32), one torch
thread. For each S it times, as medians of single calls (repeats interleaved, so drift
hits every variant):

* one seed alone: ``Learner.update`` with the backend training picks (``auto``: the
  numpy program on a CPU), and an ``ActionSelector`` call on one observation (its noise
  held: ``fresh_noise=False``);
* S seeds stacked (``agent.seeds``): ``SeedLearner.update`` on ``(S, 32, 4)`` batches,
  and the stacked network's forward and argmax on ``(S, 1, 4)`` observations under
  ``torch.inference_mode()`` (the acting noise held, as it is within an episode);

and prints each per seed, with the speed-up of stacking per seed. ``--device cuda``
times the stacked variants on the GPU (synchronised per call), against the same
single-seed CPU figures.
"""

from __future__ import annotations

import argparse
import copy
import statistics

import numpy as np
import torch

from agent.acting import ActionSelector
from agent.learner import Learner
from agent.networks import QNetwork
from agent.replay import Batch
from agent.seeds import SeedLearner, stack_networks
from bench.acting import machine, time_calls

HIDDEN, BATCH, LR = (128, 128), 32, 1e-4


def make_batch(shape: tuple[int, ...], device: torch.device) -> Batch:
    """A batch of ``shape`` rows (``(B,)`` or ``(S, B)``) of CartPole-like transitions."""
    g = torch.Generator().manual_seed(0)
    return Batch(
        obs=torch.randn(*shape, 4, generator=g).to(device),
        actions=torch.randint(0, 2, shape, generator=g).to(device),
        rewards=torch.ones(shape).to(device),
        next_obs=torch.randn(*shape, 4, generator=g).to(device),
        dones=(torch.rand(shape, generator=g) < 0.05).float().to(device),
        discounts=torch.full(shape, 0.99**3).to(device),
    )


def networks(seeds: int) -> list[QNetwork]:
    nets = []
    for i in range(seeds):
        torch.manual_seed(i)
        nets.append(QNetwork((4,), 2, HIDDEN, noisy_layers="last"))
    return nets


def variants(seeds: int, device: torch.device) -> dict[str, tuple[object, int]]:
    """name -> (a call to time, how many seed-updates or seed-actions one call does)."""
    single = networks(1)[0]
    learner = Learner(single, copy.deepcopy(single), lr=LR)
    batch = make_batch((BATCH,), torch.device("cpu"))
    selector = ActionSelector(single, (4,), 1, "cpu")
    obs = np.zeros((1, 4), dtype=np.float32)
    selector(obs)  # picks its backend and draws the noise that the timed calls hold

    stacked = stack_networks(networks(seeds)).to(device)
    generators = [torch.Generator(device=device).manual_seed(i) for i in range(seeds)]
    seed_learner = SeedLearner(stacked, copy.deepcopy(stacked), generators, lr=LR)
    stacked_batch = make_batch((seeds, BATCH), device)
    stacked_obs = np.zeros((seeds, 1, 4), dtype=np.float32)

    def act_stacked() -> np.ndarray:
        with torch.inference_mode():
            q = stacked(torch.from_numpy(stacked_obs).to(device))
            return q.argmax(dim=2).cpu().numpy()

    return {
        f"update, one seed ({learner.backend})": (lambda: learner.update(batch), 1),
        f"update, {seeds} stacked": (lambda: seed_learner.update(stacked_batch), seeds),
        f"act, one seed ({selector.backend})": (lambda: selector(obs, fresh_noise=False), 1),
        f"act, {seeds} stacked": (act_stacked, seeds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--quick", action="store_true", help="fewer calls and repeats")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    device = torch.device(args.device)
    calls, repeats = (100, 3) if args.quick else (400, 5)
    print(f"4-128-128-2 MLP, noisy last layer, batch {BATCH}; stacked on {device}; {machine()}")
    print("\n| seeds | variant | µs per call | µs per seed | stacked speed-up per seed |")
    print("|---|---|---|---|---|")
    for seeds in args.seeds:
        runs = variants(seeds, device)
        sync = device.type == "cuda"
        times: dict[str, list[float]] = {name: [] for name in runs}
        for fn, _ in runs.values():
            time_calls(fn, 20, sync)  # warm-up (and the numpy programs' first compile)
        for _ in range(repeats):
            for name, (fn, _) in runs.items():
                times[name].append(time_calls(fn, calls, sync and "stacked" in name))
        per_seed = {name: statistics.median(times[name]) / n for name, (_, n) in runs.items()}
        names = list(runs)
        for name in names:
            call = statistics.median(times[name])
            single = per_seed[names[0] if name.startswith("update") else names[2]]
            ratio = f"{single / per_seed[name]:.2f}x" if "stacked" in name else ""
            print(f"| {seeds} | {name} | {call:.0f} | {per_seed[name]:.1f} | {ratio} |")


if __name__ == "__main__":
    main()
