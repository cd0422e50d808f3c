"""Benchmark: seeds trained together in one process against seeds trained alone.

    python -m bench.seed_group speed --seeds 4 16 64 --steps 20000 --core 1
    python -m bench.seed_group speed --seeds 16 64 256 --device cuda   # a GPU machine
    python -m bench.seed_group agree --seeds 101-120

``speed``: each variant is the command a user types, timed from start to exit on one
core (``taskset``, one torch thread): ``run.py --seed 1`` (one seed, the single-run
fast paths) and ``run.py --seeds 1-S`` (S seeds stacked in one process, no Ray), both
with ``early_stop=false`` so every seed runs every step, evaluation and logging
included; ``--processes`` adds S lone runs started at once on the same core, the
alternative to stacking a user has without it; ``--also 'KEY=VALUE ...'`` adds each
group again with those settings, e.g. ``vector=async`` (its seeds' envs in worker
processes, stepped at once while the group waits: host time that a GPU group may be
bound by) or ``replay_storage=device``. The single run is timed before and
after the groups, so drift shows. Prints, per variant as it finishes, the wall time, env
steps per second summed over seeds, and the per-seed throughput against the first lone
run.

``--config`` and ``--set`` pass a preset and overrides to every command (an Atari 100k
group: ``--env KrullNoFrameskip-v4 --config der``). ``--window A B`` adds, per variant,
the env steps per second between steps A and B of seed 1's run, read from the wall
times of its ``charts/episodes`` scalar (logged every ``log_interval`` steps): the steady
state, without the start-up, learning's warm-up, compiling or the final evaluation.

``agree``: the same seeds as one group and each alone (the env's own config, early
stop on), then solve rate, median steps to solve and the final return's IQM of both,
with 95% bootstrap CIs of the differences (seeds resampled in each arm). A group's
seed draws its noise from streams of its own, so the runs differ seed by seed; over
many seeds the two must agree.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.acting import machine

ROOT = Path(__file__).resolve().parents[1]


def timed(args: list[str], core: int | None) -> float:
    """Wall seconds of ``run.py args`` as a process of its own."""
    prefix = ["taskset", "-c", str(core)] if core is not None and shutil.which("taskset") else []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    start = time.perf_counter()
    out = subprocess.run([*prefix, sys.executable, str(ROOT / "run.py"), *args], env=env,
                         capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    wall = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"run.py {' '.join(args)} failed:\n{out.stderr[-2000:]}")
    return wall


def timed_together(runs: list[list[str]], core: int | None) -> float:
    """Wall seconds of several ``run.py`` processes started at once, until the last exits."""
    prefix = ["taskset", "-c", str(core)] if core is not None and shutil.which("taskset") else []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    start = time.perf_counter()
    procs = [
        subprocess.Popen([*prefix, sys.executable, str(ROOT / "run.py"), *args], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        for args in runs
    ]  # fmt: skip
    errors = [(args, proc.communicate()[1]) for args, proc in zip(runs, procs, strict=True)]
    wall = time.perf_counter() - start
    for (args, stderr), proc in zip(errors, procs, strict=True):
        if proc.returncode != 0:
            raise SystemExit(f"run.py {' '.join(args)} failed:\n{stderr[-2000:]}")
    return wall


def window_seconds(run_dir: Path, first: int, last: int) -> float:
    """Wall seconds between the run's first logged step at or past ``first`` and its first
    at or past ``last`` (the ``charts/episodes`` scalar, logged every ``log_interval``)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    events = acc.Scalars("charts/episodes")
    at = {}
    for bound in (first, last):
        hits = [e.wall_time for e in events if e.step >= bound]
        if not hits:
            raise SystemExit(f"{run_dir} logged nothing at step {bound} or later: "
                             "--steps must reach the window's end")  # fmt: skip
        at[bound] = min(hits)
    return at[last] - at[first]


def speed(args: argparse.Namespace) -> None:
    common = ["--env", args.env, "--total-steps", str(args.steps), "--no-progress", "--device",
              args.device, "--set", "early_stop=false", "--set", "torch_threads=1"]  # fmt: skip
    if args.config:
        common += ["--config", args.config]
    for setting in args.set or []:
        common += ["--set", setting]
    print(f"{args.env}, {args.steps:,} steps per seed, one core, --device {args.device}; "
          f"{machine()}")  # fmt: skip
    # Each row is printed as it lands, against the first lone run, so that a command cut
    # off by its time limit still reports the rows it finished.
    window = f", steps {args.window[0]:,}-{args.window[1]:,}" if args.window else ""
    print("\n| variant | wall s | env steps/s, all seeds | per-seed throughput vs alone |"
          + (f" steps/s, all seeds{window} | per-seed time vs alone{window} |" if window else ""))
    print("|---|---|---|---|" + ("---|---|" if window else ""), flush=True)
    alone: list[float] = []
    alone_window: list[float] = []

    def row(name: str, s: int, wall: float, run_dir: Path) -> None:
        sps = s * args.steps / wall
        line = f"| {name} | {wall:.1f} | {sps:,.0f} | {alone[0] * s / wall:.2f}x |"
        if args.window:
            first, last = args.window
            seconds = window_seconds(run_dir, first, last)
            if not alone_window:
                alone_window.append(seconds)
            # the time a seed-step takes in the group, against one seed's alone
            line += f" {s * (last - first) / seconds:,.0f} | {seconds / s / alone_window[0]:.2f}x |"
        print(line, flush=True)

    with tempfile.TemporaryDirectory() as tmp:

        def single(tag: str) -> None:
            wall = timed([*common, "--seed", "1", "--run-dir", f"{tmp}/single{tag}"], args.core)
            alone.append(wall)
            row(f"one seed alone (run.py --seed 1){tag}", 1, wall, Path(f"{tmp}/single{tag}"))

        single("")
        for s in args.seeds:
            wall = timed([*common, "--seeds", f"1-{s}", "--run-dir", f"{tmp}/group{s}"], args.core)
            row(f"{s} seeds in one process (run.py --seeds 1-{s})", s, wall,
                Path(f"{tmp}/group{s}/seed_1"))  # fmt: skip
            for k, also in enumerate(args.also or []):
                name = f"{s} seeds in one process, {also}"
                sets = [a for setting in also.split() for a in ("--set", setting)]
                try:
                    wall = timed([*common, "--seeds", f"1-{s}", *sets,
                                  "--run-dir", f"{tmp}/also{k}_{s}"], args.core)  # fmt: skip
                except SystemExit as e:  # a row of its own; the other variants go on
                    print(f"| {name} | failed: {str(e).splitlines()[-1]} |", flush=True)
                else:
                    row(name, s, wall, Path(f"{tmp}/also{k}_{s}/seed_1"))
            if args.processes:
                runs = [[*common, "--seed", str(i), "--run-dir", f"{tmp}/procs{s}/seed_{i}"]
                        for i in range(1, s + 1)]  # fmt: skip
                wall = timed_together(runs, args.core)
                row(f"{s} processes at once (run.py --seed i, each)", s, wall,
                    Path(f"{tmp}/procs{s}/seed_1"))  # fmt: skip
        single(", again")
    if len(alone) == 2:
        print(f"\n(lone runs: {alone[0]:.1f} s and {alone[1]:.1f} s; the ratios use the first)")


def agree(args: argparse.Namespace) -> None:
    from agent.sweep import parse_seeds
    from agent.sweep.stats import bootstrap_ci, difference_ci, iqm, steps_to_solve

    seeds = parse_seeds(args.seeds)
    common = ["--env", args.env, "--no-progress", "--device", "cpu", "--set", "torch_threads=1"]
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.keep or scratch
        group_wall = timed([*common, "--seeds", args.seeds, "--run-dir", f"{tmp}/group"], args.core)
        alone_wall = sum(
            timed([*common, "--seed", str(s), "--run-dir", f"{tmp}/alone/seed_{s}"], args.core)
            for s in seeds
        )
        arms = {
            "together": [_result(Path(tmp, "group", f"seed_{s}")) for s in seeds],
            "alone": [_result(Path(tmp, "alone", f"seed_{s}")) for s in seeds],
        }
    print(f"{args.env}, its own config, seeds {args.seeds}; {machine()}")
    print(f"wall: together {group_wall:.0f} s, alone {alone_wall:.0f} s (one after another)\n")
    print("| arm | solved | median steps to solve [q25, q75] | final return IQM [95% CI] |")
    print("|---|---|---|---|")
    solved, to_solve, finals = {}, {}, {}
    for arm, results in arms.items():
        steps = [steps_to_solve(r) for r in results]
        solved[arm] = np.array([s is not None for s in steps], dtype=np.float64)
        done = [s for s in steps if s is not None]
        to_solve[arm] = np.array(done, dtype=np.float64)
        q = np.percentile(done, [25, 50, 75]) if done else [np.nan] * 3
        finals[arm] = np.array([r["final_eval_return"] for r in results], dtype=np.float64)
        lo, hi = bootstrap_ci(finals[arm])
        print(f"| {arm} | {len(done)}/{len(results)} | {q[1]:.0f} [{q[0]:.0f}, {q[2]:.0f}] | "
              f"{iqm(finals[arm]):.1f} [{lo:.1f}, {hi:.1f}] |")  # fmt: skip
    print()
    for name, values, stat in (
        ("solve rate", solved, "mean"),
        ("median steps to solve", to_solve, "median"),
        ("final return IQM", finals, "iqm"),
    ):
        a, b = values["together"], values["alone"]
        if not (a.size and b.size):
            continue
        # Two arms of different runs: each resampled alone (not paired by seed).
        point, lo, hi = difference_ci(a, b, stat)
        print(f"{name}, together - alone: {point:+.3f} [{lo:+.3f}, {hi:+.3f}]")


def _result(run_dir: Path) -> dict:
    return json.loads((run_dir / "result.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    fast = sub.add_parser("speed", help="per-seed throughput, whole processes")
    fast.add_argument("--seeds", type=int, nargs="+", default=[16], help="group sizes")
    fast.add_argument("--steps", type=int, default=20_000, help="env steps per seed")
    fast.add_argument("--device", default="cpu", help="cpu, or cuda: the groups on the GPU")
    fast.add_argument("--config", help="a preset or YAML for every command (e.g. der)")
    fast.add_argument("--set", action="append", help="KEY=VALUE for every command")
    fast.add_argument("--processes", action="store_true",
                      help="also run S lone processes at once on the same core(s), per group")
    fast.add_argument("--also", action="append", metavar="'KEY=VALUE ...'",
                      help="also each group with these settings, e.g. 'vector=async' (its "
                      "seeds' envs in worker processes, stepped at once); repeatable")
    fast.add_argument("--window", type=int, nargs=2, metavar=("A", "B"),
                      help="also the steps/s between env steps A and B (e.g. 2000 10000)")
    same = sub.add_parser("agree", help="the same seeds together and alone: the statistics")
    same.add_argument("--seeds", default="101-120", help="a range (101-120) or a list")
    same.add_argument("--keep", help="write the runs here (kept) instead of a temporary directory")
    for p in (fast, same):
        p.add_argument("--env", default="CartPole-v1")
        p.add_argument("--core", type=int, default=None, help="pin every process to this core")
    args = parser.parse_args()
    (speed if args.command == "speed" else agree)(args)


if __name__ == "__main__":
    main()
