"""Benchmark: microseconds per action at batch 1 on CPU, exported policies vs ActionSelector.

    python -m bench.export            # full run (a few minutes on 2 cores)
    python -m bench.export --quick    # short run

For the CartPole network (``configs/CartPole-v1.yaml``: 4-64-64-2, noise on the output
layer) and the Atari Nature CNN (4x84x84 uint8 -> 6 actions, noisy 512-unit head), it
times single calls, one observation each, returning the action as a numpy value:

* selector: ``ActionSelector(q, ..., noise=False)(obs)``, our own noise-free acting
  path (the numpy forward for the MLP, eager torch for the CNN);
* onnxruntime: ``session.run(None, {"obs": obs})`` on the file ``run.py --export``
  writes (``agent.export.export_policy``), one intra-op thread, CPU provider;
* torch.export: the ``.pt2`` program loaded with ``torch.export.load(...).module()``,
  called under ``torch.inference_mode()``.

Each figure is the median of many single calls, then the median over several
repeats, the three runners' repeats interleaved so that load on the shared machine
hits all of them. One torch thread, as on CPU in training and evaluation.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from agent.acting import ActionSelector
from agent.config_files import load_config
from agent.export import export_policy
from agent.train import build_q_network
from bench.acting import machine, make_obs, time_calls

CASES = {  # name: (config of, observation shape, actions)
    "CartPole MLP 4-64-64-2": ("CartPole-v1", (4,), 2),
    "Nature CNN 4x84x84 -> 6": ("ALE/Pong-v5", (4, 84, 84), 6),
}


def runners(config_of: str, shape: tuple[int, ...], n_actions: int, tmp: Path) -> dict:
    """The three ways to get one greedy action, for a freshly initialised network."""
    torch.manual_seed(0)
    cfg = load_config(config_of, overrides={"device": "cpu"})
    dtype = "uint8" if len(shape) == 3 else "float32"  # what make_obs gives
    q_network = build_q_network(cfg, shape, n_actions, torch.device("cpu"), dtype)
    pool = make_obs(shape, 1, np.random.default_rng(0))
    selector = ActionSelector(q_network, shape, 1, torch.device("cpu"), noise=False)

    export_policy(q_network, pool[0], tmp / "policy.onnx", "onnx")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(
        str(tmp / "policy.onnx"), options, providers=["CPUExecutionProvider"]
    )
    export_policy(q_network, pool[0], tmp / "policy.pt2", "torch")
    program = torch.export.load(str(tmp / "policy.pt2")).module()

    def onnx_action(obs: np.ndarray) -> np.ndarray:
        return session.run(None, {"obs": obs})[1]

    def torch_export_action(obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return program(torch.from_numpy(obs))[1].numpy()

    # The three agree on these observations (run.py --export verifies much more).
    for obs in pool:
        assert selector(obs)[0] == onnx_action(obs)[0] == torch_export_action(obs)[0]
    fns: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        "selector": selector,
        "onnxruntime": onnx_action,
        "torch.export": torch_export_action,
    }
    counter = [0]

    def cycling(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[], object]:
        def call() -> object:
            counter[0] += 1
            return fn(pool[counter[0] % len(pool)])

        return call

    return {name: cycling(fn) for name, fn in fns.items()} | {"backend": selector.backend}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls and repeats")
    args = parser.parse_args()
    torch.set_num_threads(1)
    repeats = 3 if args.quick else 7
    names = ["selector", "onnxruntime", "torch.export"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case, (config_of, shape, n_actions) in CASES.items():
            run = runners(config_of, shape, n_actions, Path(tmp))
            cnn = len(shape) == 3
            calls = (50 if cnn else 300) if args.quick else (300 if cnn else 3000)
            for name in names:  # warm-up
                time_calls(run[name], calls // 10)
            medians: dict[str, list[float]] = {name: [] for name in names}
            for _ in range(repeats):
                for name in names:
                    medians[name].append(time_calls(run[name], calls))
            row = {name: statistics.median(medians[name]) for name in names}
            spread = " / ".join(f"{min(medians[n]):.0f}-{max(medians[n]):.0f}" for n in names)
            rows.append((case, run["backend"], row, spread))
            print(f"  {case}: " + ", ".join(f"{n} {row[n]:.1f} us" for n in names), file=sys.stderr)
    print(f"Machine: {machine()}; onnxruntime {ort.__version__}")
    mlp_calls, cnn_calls = (300, 50) if args.quick else (3000, 300)
    print(
        f"Calls: median of {mlp_calls} (MLP) or {cnn_calls} (CNN) single calls, median over "
        f"{repeats} interleaved repeats\n"
    )
    print(
        "| network | selector (µs) | onnxruntime (µs) | torch.export (µs) | selector / onnxruntime "
        "| spread of repeat medians (selector / onnxruntime / torch.export) |"
    )
    print("|---|---|---|---|---|---|")
    for case, backend, row, spread in rows:
        print(
            f"| {case} | {row['selector']:.1f} ({backend}) | {row['onnxruntime']:.1f} "
            f"| {row['torch.export']:.1f} | {row['selector'] / row['onnxruntime']:.2f}x "
            f"| {spread} |"
        )


if __name__ == "__main__":
    main()
