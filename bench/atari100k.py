"""Atari 100k with data-efficient Rainbow (``--config der``) on a CPU: how fast, against
what floor and which peer.

    python -m bench.atari100k speed --peer PATH/TO/Kaixhin-Rainbow [--game krull]

times a learning step of ours and of Kaixhin/Rainbow's DER command (its README's
settings, run unmodified through ``--shim``, which maps its ``atari_py`` import onto
ale-py) in one invocation, one thread each, one process at a time. A learning step is an
agent step with its update: each command runs twice, to 1,600 + ``--short`` and to
1,600 + ``--long`` steps, and the difference of the two wall times over the difference
of the steps cancels start-up, the warm-up before learning and any evaluation. Beside
them: one update of ours alone, and the floor a core's matrix-product speed puts under
it (the multiply-adds of the three forward passes and the backward of an update).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
LEARN_START = 1600  # DER's, ours and the peer's
# Kaixhin/Rainbow's README command for data-efficient Rainbow.
PEER_ARGS = ["--target-update", "2000", "--learn-start", str(LEARN_START), "--memory-capacity",
             "100000", "--replay-frequency", "1", "--multi-step", "20", "--architecture",
             "data-efficient", "--hidden-size", "256", "--learning-rate", "0.0001"]  # fmt: skip
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def der_flops(n_actions: int, atoms: int = 51, batch: int = 32, hidden: int = 256) -> int:
    """Floating-point operations (2 per multiply-add) of the matrix products of one DER
    update: the online network over obs and next_obs, the target over next_obs, and the
    backward over obs (weight gradients everywhere, input gradients but the first layer's)."""
    conv1 = 16 * 16 * (4 * 25) * 32  # multiply-adds per image
    conv2 = 3 * 3 * (32 * 25) * 64
    heads = 2 * 576 * hidden + hidden * atoms + hidden * n_actions * atoms
    forward = conv1 + conv2 + heads
    backward = conv1 + 2 * (conv2 + heads)
    return 2 * (3 * batch * forward + batch * backward)


def core_gflops(size: int = 2048, repeats: int = 5) -> float:
    """One core's float32 matrix-product speed on a large square product (torch's BLAS)."""
    torch.set_num_threads(1)
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def update_ms(n_actions: int, updates: int = 200) -> float:
    """The median wall time of one DER update of ours (batch 32 of random frames, the
    numpy learner), one thread."""
    import copy

    from threadpoolctl import threadpool_limits

    from agent.learner import Learner
    from agent.networks import QNetwork
    from agent.replay import Batch

    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    torch.manual_seed(0)
    net = QNetwork((4, 84, 84), n_actions, (256,), torso="der", dueling=True,
                   noisy_layers="all", sigma0=0.1, num_atoms=51)  # fmt: skip
    learner = Learner(net, copy.deepcopy(net).requires_grad_(False), lr=1e-4)
    g = torch.Generator().manual_seed(0)

    def frames() -> torch.Tensor:
        return torch.randint(0, 256, (32, 4, 84, 84), dtype=torch.uint8, generator=g)

    batch = Batch(frames(), torch.randint(0, n_actions, (32,), generator=g), torch.rand(32),
                  frames(), torch.zeros(32), torch.full((32,), 0.99**20), torch.arange(32),
                  torch.rand(32) + 0.5)  # fmt: skip
    times = []
    with threadpool_limits(1, user_api="blas"):
        for i in range(updates + 10):
            start = time.perf_counter()
            learner.update(batch)
            if i >= 10:
                times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def _ours(game: str, steps: int, work: Path) -> float:
    """Wall seconds of ``run.py --config der`` for ``steps`` steps, less its final
    evaluation (one episode, played at random)."""
    run_dir = work / f"ours_{steps}"
    env_id = "".join(w.capitalize() for w in game.split("_")) + "NoFrameskip-v4"
    args = [sys.executable, "run.py", "--env", env_id, "--config", "der", "--total-steps",
            str(steps), "--set", "final_episodes=1", "--set", "eval_envs=1", "--set",
            "eval_epsilon=1.0", "--run-dir", str(run_dir), "--no-progress"]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(args, cwd=ROOT, env={**os.environ, **ONE_THREAD}, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    wall = time.perf_counter() - start
    result = json.loads((run_dir / "result.json").read_text())
    return wall - float(result["final_eval_wall_s"] or 0.0)


def _peer(peer: Path, shim: Path, game: str, steps: int, work: Path) -> float:
    """Wall seconds of Kaixhin/Rainbow's DER command for ``steps`` steps (no evaluation)."""
    args = [sys.executable, str(peer / "main.py"), "--disable-cuda", "--game", game, "--T-max",
            str(steps), "--evaluation-interval", str(10**9), "--id", f"bench_{steps}",
            *PEER_ARGS]  # fmt: skip
    env = {**os.environ, **ONE_THREAD, "PYTHONPATH": str(shim)}
    start = time.perf_counter()
    subprocess.run(args, cwd=work, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)  # fmt: skip
    return time.perf_counter() - start


def speed(args: argparse.Namespace) -> dict:
    """Per learning step of ours and the peer's, one update of ours, and the floor."""
    steps = (LEARN_START + args.short, LEARN_START + args.long)
    learning = args.long - args.short
    out: dict = {"game": args.game, "learning_steps": learning, "torch": torch.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ours = [_ours(args.game, n, work) for n in steps]
        out["ours_ms_per_learning_step"] = (ours[1] - ours[0]) / learning * 1e3
        if args.peer:
            peer = [_peer(Path(args.peer), Path(args.shim), args.game, n, work) for n in steps]
            out["peer_ms_per_learning_step"] = (peer[1] - peer[0]) / learning * 1e3
            out["peer_over_ours"] = out["peer_ms_per_learning_step"] / out[
                "ours_ms_per_learning_step"]  # fmt: skip
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    env_id = "".join(w.capitalize() for w in args.game.split("_")) + "NoFrameskip-v4"
    n_actions = int(gym.make(env_id).action_space.n)
    out["n_actions"] = n_actions
    out["update_ms"] = update_ms(n_actions)
    out["core_gflops"] = core_gflops()
    out["update_gflop"] = der_flops(n_actions) / 1e9
    out["floor_ms"] = out["update_gflop"] / out["core_gflops"] * 1e3
    steps_min = 100_000 * out["ours_ms_per_learning_step"] / 1e3 / 60
    print(f"{args.game} ({n_actions} actions), {learning} learning steps, one thread each:")
    print(f"  ours: {out['ours_ms_per_learning_step']:.1f} ms per learning step "
          f"(a 100k run: about {steps_min:.0f} min of learning)")  # fmt: skip
    if args.peer:
        print(f"  Kaixhin/Rainbow: {out['peer_ms_per_learning_step']:.1f} ms per learning step, "
              f"{out['peer_over_ours']:.2f}x ours")  # fmt: skip
    print(f"  one update of ours alone: {out['update_ms']:.1f} ms; its matrix products are "
          f"{out['update_gflop']:.2f} GFLOP, {out['floor_ms']:.1f} ms at this core's "
          f"{out['core_gflops']:.0f} GFLOP/s")  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("speed", help="a learning step of ours and of Kaixhin/Rainbow's")
    p.add_argument("--game", default="krull", help="an Atari game, as Kaixhin/Rainbow names it")
    p.add_argument("--peer", help="a checkout of Kaixhin/Rainbow (left out: ours alone)")
    p.add_argument("--shim", default=str(ROOT.parent / "shared" / "peers" / "atari_py_shim"),
                   help="the folder that maps atari_py onto ale-py")  # fmt: skip
    p.add_argument("--short", type=int, default=500, help="learning steps of the short runs")
    p.add_argument("--long", type=int, default=2500, help="learning steps of the long runs")
    p.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    out = speed(args)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
