"""What one acting noise draw costs: numpy's normals and f() against PyTorch's, per network.

    python -m bench.noise_draw                 # about half a minute
    python -m bench.noise_draw --nets cartpole --json out.json

Every path stores its noise with ``agent.noisy.store_factors``; only the numpy acting path
(``NumpyForward.resample``) draws its standard normals and f(x) = sgn(x) sqrt(|x|) in
numpy, in one call for all layers, where the PyTorch paths draw layer by layer
(``reset_noise``, what eager acting and a captured graph run). Acting on a CPU draws once
a step wherever the noise is fresh every step, so this is the price of that second copy of
the draw. Networks as the presets build them (``bench.compiled_update.NETS``), one torch
thread, no gradients: medians of ``--calls`` draws per repeat, the two draws interleaved
repeat by repeat, the median over repeats. Run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agent.config_files import load_config
from agent.noisy import reset_noise
from agent.numpy_backend import NumpyForward
from agent.setup import build_q_network, limit_cpu_threads
from bench.acting import machine
from bench.compiled_update import NETS


def median_us(draw: Callable[[], None], calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter_ns()
        draw()
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1000.0


def draws(name: str) -> tuple[torch.nn.Module, dict[str, Callable[[], None]]]:
    """``name``'s network as its config builds it, and its two acting draws."""
    env_id, config, shape, actions = NETS[name]
    cfg = load_config(env_id, config)
    dtype = "uint8" if len(shape) == 3 and shape[-1] > 10 else "float32"
    net = build_q_network(cfg, shape, actions, torch.device("cpu"), dtype)
    generator = torch.Generator().manual_seed(0)
    return net, {
        "numpy": NumpyForward.build(net, np.random.default_rng(0)).resample,
        "torch": functools.partial(reset_noise, net, generator),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"machine": machine(), "nets": {}}
    print(out["machine"])
    for name in args.nets.split(","):
        _, draws_of = draws(name)
        times: dict[str, list[float]] = {label: [] for label in draws_of}
        with torch.no_grad():
            for draw in draws_of.values():
                median_us(draw, 100)  # warm-up
            for _ in range(args.repeats):
                for label, draw in draws_of.items():
                    times[label].append(median_us(draw, args.calls))
        row = {label: round(statistics.median(t), 1) for label, t in times.items()}
        out["nets"][name] = row
        print(f"{name}: numpy {row['numpy']:.1f} µs, torch {row['torch']:.1f} µs "
              f"({row['torch'] / row['numpy']:.2f}x numpy)")  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nets", default="cartpole,minatar,der", help=f"of {', '.join(NETS)}")
    parser.add_argument("--calls", type=int, default=2000, help="timed draws per repeat")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    with contextlib.ExitStack() as cleanup:
        limit_cpu_threads(1, cleanup)  # as acting on a CPU
        out = measure(args)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
