"""What a learning step costs by learner backend: the numpy engine, autograd, and autograd
with its loss compiled by ``torch.compile`` (``learner_backend: compile``), on the networks
the presets build.

    python -m bench.compiled_update                       # every network, fp32
    python -m bench.compiled_update --nets der,drq-epsilon --bf16 --json out.json

Each network is built from its config as a run builds it (``build_q_network``, the
learner's settings), batch 32 of random frames (or vectors), prioritized weights where
the config has them. ``Learner.update`` is timed whole (noise draws, both forwards,
target, loss, backward, clipping, Adam), one torch thread: medians of ``--calls`` calls
per repeat, the backends interleaved repeat by repeat so that drift hits each alike, then
the median over repeats. ``--bf16`` adds the compiled update with its loss under bfloat16
autocast (the parameters and Adam stay fp32), to see where the CPU's kernels make it pay.
Compile times are printed, not timed into the step. Run it with nothing else on the
machine: a figure taken beside training runs is not a figure.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from agent.config_files import load_config
from agent.learner import Learner
from agent.replay import Batch
from agent.setup import build_q_network, learner_settings, limit_cpu_threads
from bench.acting import machine

__all__ = ["NETS", "build", "main", "measure", "median_ms"]

# name: (env id, --config, observation shape, actions)
NETS: dict[str, tuple[str, str | None, tuple[int, ...], int]] = {
    "der": ("KrullNoFrameskip-v4", "der", (4, 84, 84), 18),
    "drq-epsilon": ("KrullNoFrameskip-v4", "drq-epsilon", (4, 84, 84), 18),
    "minatar": ("MinAtar/Breakout-v1", None, (4, 10, 10), 3),
    "cartpole": ("CartPole-v1", None, (4,), 2),
}


def build(name: str, backend: str, autocast: bool = False) -> tuple[Learner, Batch]:
    """``name``'s network and learner with ``backend``, seeded, and a batch for it."""
    env_id, config, shape, actions = NETS[name]
    cfg = load_config(env_id, config)
    torch.manual_seed(0)
    dtype = "uint8" if len(shape) == 3 and shape[-1] > 10 else "float32"
    net = build_q_network(cfg, shape, actions, torch.device("cpu"), dtype)
    learner = Learner(net, copy.deepcopy(net).requires_grad_(False),
                      **learner_settings(cfg, cfg.exploration == "noisy"), backend=backend,
                      announce=lambda line: print(f"  {name} {backend}: {line}"),
                      autocast=torch.bfloat16 if autocast else None)  # fmt: skip
    g = torch.Generator().manual_seed(0)
    b = cfg.batch_size

    def obs() -> torch.Tensor:
        if dtype == "uint8":
            return torch.randint(0, 256, (b, *shape), dtype=torch.uint8, generator=g)
        return torch.rand((b, *shape), generator=g)

    batch = Batch(obs(), torch.randint(0, actions, (b,), generator=g), torch.randn(b, generator=g),
                  obs(), torch.zeros(b), torch.full((b,), cfg.gamma**cfg.n_step), None,
                  torch.rand(b, generator=g) + 0.5 if cfg.prioritized_replay else None)  # fmt: skip
    return learner, batch


def median_ms(learner: Learner, batch: Batch, calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        learner.update(batch)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def measure(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"machine": machine(), "nets": {}}
    print(out["machine"])
    for name in args.nets.split(","):
        variants: dict[str, tuple[Learner, Batch]] = {}
        for label, backend, autocast in (("numpy", "numpy", False), ("torch", "torch", False),
                                         ("compile", "compile", False),
                                         ("compile bf16", "compile", True)):  # fmt: skip
            if autocast and not args.bf16:
                continue
            learner, batch = build(name, backend, autocast)
            learner.update(batch)  # compiles the compiled ones, which say how long it took
            for _ in range(10):
                learner.update(batch)
            variants[label] = (learner, batch)
        times: dict[str, list[float]] = {label: [] for label in variants}
        for _ in range(args.repeats):
            for label, (learner, batch) in variants.items():
                times[label].append(median_ms(learner, batch, args.calls))
        row = {label: round(statistics.median(t), 2) for label, t in times.items()}
        out["nets"][name] = row
        base = row["numpy"]
        print(f"{name}: " + ", ".join(f"{label} {ms:.2f} ms ({base / ms:.2f}x numpy)"
                                      for label, ms in row.items()))  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nets", default=",".join(NETS), help=f"of {', '.join(NETS)}")
    parser.add_argument("--calls", type=int, default=50, help="timed updates per repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bf16", action="store_true", help="add the compiled bf16 update")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    with contextlib.ExitStack() as cleanup:
        limit_cpu_threads(1, cleanup)  # as training on a CPU
        out = measure(args)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
