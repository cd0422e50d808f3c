"""Benchmark: Atari (ALE/Pong-v5) training SPS with 1 and 8 envs, and replay memory per transition.

    python -m bench.atari                  # Pong, 1 and 8 sync envs (about a minute on 2 cores)
    python -m bench.atari --async          # also async (subprocess) envs, for each num_envs > 1
    python -m bench.atari --ale            # also ale-py's AtariVectorEnv (vector: ale)
    python -m bench.atari --quick          # shorter runs
    python -m bench.atari --device cuda    # the same runs with the learner and acting on the GPU
    python -m bench.atari --envs 1,4,16    # other num_envs values
    python -m bench.atari --breakdown      # then: where the time of one env step goes
    python -m bench.atari --breakdown --no-sps   # the breakdown alone (seconds)
    python -m bench.atari --env KrullNoFrameskip-v4 --config der --envs 1 --breakdown
                                           # a preset's runs and breakdown (run.py --config)
    python -m bench.atari --device cuda --set replay_storage=device   # and config values

Needs the atari extra (``pip install -e ".[atari]"``). SPS is measured as in
``bench/vector.py``: short ``train`` runs with the ``configs/atari.yaml`` settings
(Nature CNN, hidden [512], batch 32, train_freq 4, n_step 3), or ``--config``'s, on
``--device`` (CPU by default, with one torch thread), except that learning starts after
a few thousand steps instead of 80k and the buffer is small; *acting* is the SPS before
learning starts, *learning* after.
Memory: bytes of storage per transition of the frame replay (one 84x84 frame plus
indices and scalars) and of the full-observation ReplayBuffer (obs and next_obs
stacks), and what a 1M-transition buffer costs with each.

``--breakdown`` times the parts of one training step alone, with the agent that
``train`` builds for the config (``build_agent``): one step of the sync vector env
(random actions), one ``ActionSelector`` call, one replay add, one ``replay.sample(32)``
and one update as training runs it (``agent.update``: on CUDA a graph, with the eager
``learner.update`` timed beside it) (medians of single calls, each synchronised on
CUDA), and what each costs per env step: the first three serve ``num_envs`` env steps,
the last two ``train_freq`` env steps (updates are due per env step summed over sub-envs).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import numpy as np
import torch

from agent.config_files import load_config, parse_set
from agent.errors import UserError
from agent.learner import CapturedUpdate
from agent.setup import limit_cpu_threads
from agent.replay.frames import FrameReplayBuffer
from agent.replay import ReplayBuffer
from bench.acting import machine
from bench.vector import measure_sps

T = TypeVar("T")


def memory_table() -> None:
    shape = (4, 84, 84)
    frame = FrameReplayBuffer(10_000, shape, np.uint8, device="cpu", n_step=3)
    full = ReplayBuffer(10_000, shape, np.uint8, device="cpu", n_step=3)
    print("| replay | bytes / transition | 1M transitions |")
    print("|---|---|---|")
    for name, buf in (("FrameReplayBuffer (frame_replay: true)", frame), ("ReplayBuffer", full)):
        b = buf.bytes_per_transition
        print(f"| {name} | {b:,} | {b * 1_000_000 / 2**30:.1f} GiB |")


class Clock:
    """Times single calls in microseconds; on CUDA each call is synchronised before and after.

    A CUDA call returns once its kernels are queued: without the synchronisations a
    call would be charged for the previous one's kernels and not for its own.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.times: dict[str, list[float]] = {}

    def __call__(self, name: str | None, fn: Callable[[], T]) -> T:
        """``fn()``, its time recorded under ``name`` (``None``: a warm-up call, not recorded)."""
        if self.cuda:
            torch.cuda.synchronize()
        start = time.perf_counter_ns()
        out = fn()
        if self.cuda:
            torch.cuda.synchronize()
        if name is not None:
            self.times.setdefault(name, []).append((time.perf_counter_ns() - start) / 1000.0)
        return out

    def median(self, name: str) -> float:
        return statistics.median(self.times[name])


def breakdown(
    env_id: str,
    num_envs: int,
    device: str,
    quick: bool,
    config: str | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """Print where the time of one env step goes, part by part (see the module docstring)."""
    # Imported here: the SPS runs do not need them, and an env problem then fails this only.
    from agent.train import build_agent, resolve_device
    from envs import inspect_env, make_vector_env

    steps, samples, updates, warmup = (30, 20, 3, 3) if quick else (400, 300, 200, 20)
    # A small buffer: the frames' pages are only committed as they are written anyway, but
    # the index arrays of a 1M buffer are allocated whole (and a sample's cost does not
    # depend on the capacity, only on what is stored).
    cfg = load_config(env_id, config, overrides={
        "buffer_size": 50_000, **(extra or {}),
        "device": device, "num_envs": num_envs, "torch_threads": 1,
    })  # fmt: skip
    spec = inspect_env(env_id, cfg.env_kwargs, cfg.wrappers)
    dev = resolve_device(cfg.device)
    agent = build_agent(cfg, spec, dev, eval_envs=1)
    replay, selector, learner = agent.replay, agent.selector, agent.learner
    generator = torch.Generator(device=replay.generator_device).manual_seed(0)
    clock = Clock(dev)
    rng = np.random.default_rng(0)
    envs = make_vector_env(env_id, num_envs, "sync", cfg.env_kwargs, cfg.wrappers)
    try:
        obs, _ = envs.reset(seed=0)
        step = 0
        # Acting: env step, selector call and replay add, each timed alone, as the loop
        # calls them; warm-up steps first (the selector's CUDA graph is captured at its
        # first call), and more untimed steps if the replay cannot give a batch yet.
        while step < warmup + steps or len(replay) < cfg.batch_size:
            timed = warmup <= step < warmup + steps

            def tag(part: str, timed: bool = timed) -> str | None:
                return part if timed else None

            actions = rng.integers(spec.n_actions, size=num_envs)
            next_obs, rewards, terminated, truncated, _ = clock(
                tag("env"), partial(envs.step, actions)
            )
            clock(tag("select"), partial(selector, obs))
            # (the loop clips the rewards before the add too)
            clock(tag("add"), partial(replay.add, obs, actions, np.sign(rewards), next_obs,
                                      terminated, truncated))
            obs = envs.reset()[0] if (terminated | truncated).any() else next_obs
            step += 1
    finally:
        envs.close()
    # Learning: samples, then updates on a few of the sampled batches, cycled.
    batches = []
    for i in range(warmup + samples):
        batch = clock("sample" if i >= warmup else None,
                      partial(replay.sample, cfg.batch_size, generator))
        if len(batches) < 8:
            batches.append(batch)
    # The update as training calls it (``agent.update``: on CUDA a graph captured at its
    # first call), and beside it, where that differs, the eager ``learner.update``.
    captured = isinstance(agent.update, CapturedUpdate)
    for i in range(warmup + updates):
        clock("update" if i >= warmup else None, partial(agent.update, batches[i % len(batches)]))
        if captured:
            clock("eager" if i >= warmup else None,
                  partial(learner.update, batches[i % len(batches)]))
    captured = captured and agent.update.graph is not None
    if not learner.parameters_finite():
        print(f"warning: num_envs={num_envs}: non-finite parameters after the timed updates")

    n, k = num_envs, cfg.train_freq
    backend = f"{selector.backend}{' (captured)' if selector.captured else ''}"
    parts: list[tuple[str, float, float]] = [  # (what, us per call, calls per env step)
        (f"(a) vector env step: {n} env(s), random actions", clock.median("env"), 1 / n),
        (f"(b) ActionSelector call: {n} obs, {backend}", clock.median("select"), 1 / n),
        (f"(c) replay add: {n} transition(s)", clock.median("add"), 1 / n),
        (f"(c) replay.sample({cfg.batch_size})", clock.median("sample"), 1 / k),
        (f"(d) update, batch {cfg.batch_size}{', a CUDA graph' if captured else ''}",
         clock.median("update"), 1 / k),
    ]
    total = sum(us * per for _, us, per in parts)
    print(f"\n## num_envs={n} on {dev}: where the time goes per env step "
          f"(train_freq {k}; medians of {steps} env steps, {samples} samples, "
          f"{updates} updates)\n")
    print("| part | us per call | calls per env step | us per env step | share |")
    print("|---|---|---|---|---|")
    for what, us, per in parts:
        print(f"| {what} | {us:,.0f} | 1/{round(1 / per)} | {us * per:,.1f} | "
              f"{100 * us * per / total:.0f}% |")
    print(f"| total | | | {total:,.1f} | 100% |")
    if captured:
        print(f"| (the same update eager, not counted) | {clock.median('eager'):,.0f} | | | |")
    print(f"\nthese parts alone allow {1e6 / total:,.0f} env steps per second "
          "(the loop adds its bookkeeping: episodes, logging, target syncs)", flush=True)


def sps_runs(env_id: str, env_counts: list[int], use_async: bool, device: str,
             quick: bool, config: str | None = None,
             extra: dict[str, Any] | None = None, use_ale: bool = False) -> None:
    """The memory table, then the acting and learning SPS of one short run per num_envs."""
    memory_table()
    print()
    print("| num_envs | vector | SPS acting | SPS learning (train_freq 4, batch 32) |")
    print("|---|---|---|---|")
    runs = [(n, "sync") for n in env_counts]
    if use_async:
        runs += [(n, "async") for n in env_counts if n > 1]
    if use_ale:
        runs += [(n, "ale") for n in env_counts]
    for n, kind in runs:
        log = 160 if n == 1 else 320
        acting = (800 if quick else 2_400) * (2 if n > 1 else 1)
        learning = log * (3 if quick else 4)
        overrides: dict[str, Any] = {
            "buffer_size": 20_000,
            "target_update_interval": 32_000,
            **(extra or {}),
            "device": device,  # measure_sps pins "cpu"; overrides are applied after it
        }
        try:
            sps = measure_sps(env_id, n, acting, learning, log, kind, overrides, config)
        except Exception as e:
            print(f"| {n} | {kind} | failed: {type(e).__name__}: {e} | |", flush=True)
            continue
        print(f"| {n} | {kind} | {sps['acting']:,.0f} | {sps['learning']:,.0f} |", flush=True)


def parse_envs(text: str) -> list[int]:
    """``"1,8"`` -> ``[1, 8]``; ValueError on anything else."""
    values = [int(x) for x in text.split(",") if x.strip()]
    if not values or min(values) < 1:
        raise ValueError(text)
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="ALE/Pong-v5")
    parser.add_argument("--async", dest="use_async", action="store_true")
    parser.add_argument("--ale", dest="use_ale", action="store_true",
                        help="also ale-py's AtariVectorEnv (vector: ale), for each num_envs")
    parser.add_argument("--quick", action="store_true", help="shorter runs, fewer timed calls")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where the networks and the learner live (default cpu)")
    parser.add_argument("--envs", default="1,8", help="comma-separated num_envs values")
    parser.add_argument("--config", help="a preset (der, rainbow) or a YAML, as run.py --config")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config value, as run.py --set (e.g. replay_storage=device)")
    parser.add_argument("--breakdown", action="store_true",
                        help="after the training runs, time the parts of a training step")
    parser.add_argument("--no-sps", action="store_true",
                        help="skip the memory table and the training runs")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available here "
                     "(torch.cuda.is_available() is False)")
    try:
        env_counts = parse_envs(args.envs)
    except ValueError:
        parser.error(f"--envs {args.envs!r}: give positive integers separated by commas, e.g. 1,8")
    try:
        args.extra = parse_set(args.set)
        load_config(args.env, args.config, args.extra)
    except UserError as e:  # an unknown preset or key, a value that does not validate
        parser.error(str(e))
    with contextlib.ExitStack() as cleanup:
        # One torch thread, and on the CPU training's settings (numpy's BLAS, denormals):
        # the breakdown times the parts as training runs them.
        if args.device == "cpu":
            limit_cpu_threads(1, cleanup)
        else:
            torch.set_num_threads(1)
        measure(args, env_counts)


def measure(args: argparse.Namespace, env_counts: list[int]) -> None:
    """The header, then the SPS runs and the breakdown that ``args`` ask for."""
    on = " on cuda" if args.device == "cuda" else ""  # the CPU header as it always was
    preset = f" --config {args.config}" if args.config else ""
    preset += "".join(f" --set {item}" for item in args.set)
    print(f"# {args.env}{preset}{on}: {machine()}")
    if not args.no_sps:
        sps_runs(args.env, env_counts, args.use_async, args.device, args.quick, args.config,
                 args.extra, args.use_ale)
    if args.breakdown:
        for n in env_counts:
            try:
                breakdown(args.env, n, args.device, args.quick, args.config, args.extra)
            except Exception as e:  # one failing size says why; the others still run
                print(f"breakdown for num_envs={n} failed: {type(e).__name__}: {e}", flush=True)


if __name__ == "__main__":
    main()
