"""Benchmark: microseconds per action, eager torch vs ActionSelector, on CPU and GPU.

    python -m bench.acting            # full run (about a minute on CPU)
    python -m bench.acting --quick    # short run
    python -m bench.acting --der      # also the DER preset's network on the CPU

For each device (CPU always, CUDA when present), network (a 4-64-64-2 MLP as for
CartPole, plain and noisy; the same noisy MLP written as a user would write it, a
plain ``nn.Module`` with ``NoisyLinear`` attributes and a functional forward; on GPU
also an Atari-shaped Nature-CNN; with ``--der``, the network ``--config der`` builds for
Krull, acting on the CPU as training does at 1 env and as evaluation does at 10) and
batch size (num_envs 1 and 8), it times single calls of

* eager: what a plain training loop does per step, under ``torch.inference_mode()``:
  observation to the device, ``reset_noise()`` if the network is noisy, forward,
  argmax, actions back to a numpy array;
* selector: ``ActionSelector(...)(obs)`` with the same network (fresh noise every
  step when noisy; the CUDA graph on GPU, the numpy forward on CPU);

and reports the median over many calls, taken as the median over several repeats
(eager and selector repeats interleaved, so drift hits both), and the ratios. One
torch thread, as training uses on CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from agent.acting import ActionSelector
from agent.config_files import load_config
from agent.networks import QNetwork
from agent.noisy import NoisyLinear, reset_noise, set_noise
from agent.setup import build_q_network, cpu_name, describe_software, limit_cpu_threads

__all__ = ["machine", "make_obs", "time_calls"]

MLP_SHAPE = (4,)
CNN_SHAPE = (4, 84, 84)


class UserMLP(nn.Module):
    """A noisy 4-64-64-2 MLP as users write one: not a QNetwork, a functional forward."""

    def __init__(self) -> None:
        super().__init__()
        self.obs_shape = MLP_SHAPE
        self.fc1 = NoisyLinear(4, 64)
        self.fc2 = NoisyLinear(64, 64)
        self.fc3 = NoisyLinear(64, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def time_calls(fn: Callable[[], object], calls: int, cuda_sync: bool = False) -> float:
    """Median microseconds of ``calls`` single calls.

    ``cuda_sync``: synchronise CUDA before and after each call. A CUDA call returns once
    its kernels are queued: the first synchronize empties the queue, so a call never pays
    for the previous one's kernels; the second waits for its own, so the time is launch
    plus execution.
    """
    times = []
    clock = time.perf_counter_ns
    sync = torch.cuda.synchronize
    for _ in range(calls):
        if cuda_sync:
            sync()
        start = clock()
        fn()
        if cuda_sync:
            sync()
        times.append(clock() - start)
    return statistics.median(times) / 1000.0


def eager_actor(
    q_network: nn.Module, device: torch.device, noisy: bool
) -> Callable[[np.ndarray], np.ndarray]:
    """The straightforward per-step action code of a training loop, for comparison."""

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            x = torch.as_tensor(obs, device=device)
            if noisy:
                reset_noise(q_network)
            return q_network(x).argmax(dim=1).cpu().numpy()

    return act


def make_obs(shape: tuple[int, ...], num_envs: int, rng: np.random.Generator) -> list[np.ndarray]:
    """A small pool of observations in the env's dtype, cycled through by the calls."""
    if len(shape) == 3:
        return [rng.integers(0, 256, (num_envs, *shape), dtype=np.uint8) for _ in range(8)]
    return [rng.standard_normal((num_envs, *shape)).astype(np.float32) for _ in range(8)]


def make_case(
    device: torch.device,
    shape: tuple[int, ...],
    noisy: bool,
    num_envs: int,
    user: bool = False,
    der: bool = False,
) -> dict:
    """One benchmark case: the two runners (eager, selector) and what to report about them.

    ``der``: the network of ``--config der`` for Krull (18 actions) in place of a QNetwork
    of the bench's own sizes."""
    torch.manual_seed(0)
    cnn = len(shape) == 3
    q_network: nn.Module
    if user:
        q_network = UserMLP().to(device)
    elif der:
        cfg = load_config("KrullNoFrameskip-v4", "der")
        q_network = build_q_network(cfg, shape, 18, device, "uint8")
        set_noise(q_network, noisy)  # evaluation: both runners on the mean weights
    else:
        q_network = QNetwork(
            shape,
            6 if cnn else 2,
            (512,) if cnn else (64, 64),
            noisy_layers="all" if noisy else "none",
            input_scale=255.0 if cnn else None,  # the uint8 frames of make_obs
        ).to(device)
    pool = make_obs(shape, num_envs, np.random.default_rng(0))
    eager = eager_actor(q_network, device, noisy)
    selector = ActionSelector(q_network, shape, num_envs, device, noise=noisy)
    counter = [0]

    def next_obs() -> np.ndarray:
        counter[0] += 1
        return pool[counter[0] % len(pool)]

    return {
        "device": device.type,
        "network": ("user's " if user else "")
        + ("DER preset 4x84x84" if der else "Nature-CNN 4x84x84" if cnn else "MLP 4-64-64-2")
        + (" noisy" if noisy else " mean weights" if der else " plain"),
        "noisy": noisy,
        "cnn": cnn,
        "user": user,
        "der": der,
        "num_envs": num_envs,
        "selector": selector,
        "runners": {
            "eager": lambda: eager(next_obs()),
            "selector": lambda: selector(next_obs()),
        },
        "medians": {"eager": [], "selector": []},
    }


def run_cases(cases: list[dict], calls: int, repeats: int, warmup: int) -> None:
    """Warm up every runner, then time them all once per repeat, interleaved.

    Interleaving every case in every repeat keeps slow drift of a shared machine from
    landing on one case only, so ratios across cases stay meaningful.
    """
    for case in cases:
        for run in case["runners"].values():  # warm-up (and capture, for the selector)
            for _ in range(warmup):
                run()
    for _ in range(repeats):
        for case in cases:
            for name, run in case["runners"].items():
                case["medians"][name].append(time_calls(run, calls))
    for case in cases:
        for name in ("eager", "selector"):
            case[f"{name}_us"] = statistics.median(case["medians"][name])
        selector = case["selector"]
        case["backend"] = selector.backend + (" (captured)" if selector.captured else "")
        case["spread"] = " / ".join(
            f"{min(case['medians'][name]):.1f}-{max(case['medians'][name]):.1f}"
            for name in ("eager", "selector")
        )


def machine() -> str:
    parts = [f"CPU: {cpu_name()} ({torch.get_num_threads()} torch thread(s))"]
    if torch.cuda.is_available():
        parts.append(f"GPU: {torch.cuda.get_device_name()}")
    parts.append(describe_software())  # the same line a run's result.json records
    return "; ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls and repeats")
    parser.add_argument("--der", action="store_true",
                        help="also the DER preset's network on the CPU: noisy at 1 env (training), "
                             "its mean weights at 10 (evaluation)")  # fmt: skip
    args = parser.parse_args()
    with contextlib.ExitStack() as cleanup:
        limit_cpu_threads(1, cleanup)  # as training on a CPU (the CUDA rows: one thread too)
        measure(args)


def measure(args: argparse.Namespace) -> None:
    """Time every selector backend on every device, and print the table."""
    calls, repeats, warmup = (300, 3, 50) if args.quick else (3000, 7, 300)

    devices = [torch.device("cpu")]
    if torch.cuda.is_available():
        devices.append(torch.device("cuda"))
    rows = []
    for device in devices:
        shapes = [MLP_SHAPE] + ([CNN_SHAPE] if device.type == "cuda" else [])
        cases = [
            make_case(device, shape, noisy, num_envs)
            for shape in shapes
            for noisy in (False, True)
            for num_envs in (1, 8)
        ] + [make_case(device, MLP_SHAPE, True, num_envs, user=True) for num_envs in (1, 8)]
        if args.der and device.type == "cpu":
            cases += [make_case(device, CNN_SHAPE, noisy, num_envs, der=True)
                      for noisy, num_envs in ((True, 1), (False, 10))]  # fmt: skip
        run_cases(cases, calls, repeats, warmup)
        for row in cases:
            print(
                f"  {row['device']:4} {row['network']:26} n={row['num_envs']}: "
                f"eager {row['eager_us']:8.1f} us, selector {row['selector_us']:8.1f} us",
                file=sys.stderr,
            )
        rows += cases

    print(f"Machine: {machine()}")
    print(f"Calls: medians of {calls} single calls, median over {repeats} repeats\n")
    print(
        "| device | network | num_envs | eager torch (µs) | selector (µs) | selector backend "
        "| eager / selector | spread of repeat medians (eager / selector) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['device']} | {r['network']} | {r['num_envs']} | {r['eager_us']:.1f} "
            f"| {r['selector_us']:.1f} | {r['backend']} | {r['eager_us'] / r['selector_us']:.2f}x "
            f"| {r['spread']} |"
        )
    print()
    for device in devices:
        for num_envs in (1, 8):
            sel = {
                (r["noisy"], r["cnn"]): r
                for r in rows
                if r["device"] == device.type and r["num_envs"] == num_envs
                and not r["user"] and not r["der"]
            }
            user = next(
                r for r in rows
                if r["device"] == device.type and r["num_envs"] == num_envs and r["user"]
            )
            noisy_sel = sel[(True, False)]["selector_us"]
            plain_eager = sel[(False, False)]["eager_us"]
            print(
                f"- {device.type}, num_envs={num_envs}: noisy selector / plain eager forward = "
                f"{noisy_sel / plain_eager:.2f} (CPU target <= 1.5); "
                f"user's noisy module, selector / plain eager forward = "
                f"{user['selector_us'] / plain_eager:.2f} (CPU target <= 1.5); "
                f"noisy eager / noisy selector = "
                f"{sel[(True, False)]['eager_us'] / noisy_sel:.2f}x"
                + (
                    f"; CNN noisy eager / selector = "
                    f"{sel[(True, True)]['eager_us'] / sel[(True, True)]['selector_us']:.2f}x "
                    "(GPU target >= 3)"
                    if (True, True) in sel
                    else ""
                )
            )


if __name__ == "__main__":
    main()
