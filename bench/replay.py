"""Benchmark: transitions per second of ReplayBuffer.add / .sample, against a numpy ring.

    python -m bench.replay            # full run (about a minute on a 2-core CPU)
    python -m bench.replay --quick    # short run, smaller rings

Two observation kinds: CartPole-sized (4,) float32 and Atari-sized (4, 84, 84) uint8.
Then prioritized replay on a full CartPole-sized ring: a sample by priority (the sum
tree, importance weights) against a uniform one, a priority update and an add.
For each it reports

* add: transitions stored per second, one ``add`` per vector-env step (num_envs 1 and
  8; n_step 1 and 3 for ReplayBuffer);
* sample: transitions returned per second (batch 32 / 128 / 512, a full ring);
* bytes of ring storage per stored transition;

for ``ReplayBuffer`` (device cpu) and, in the same run, a plain numpy ring buffer with
the same n_step=1 semantics (uniform with replacement; its batch is turned into torch
tensors with ``torch.from_numpy``, zero-copy, since the learner consumes tensors).
Each number is the median over several repeats; ReplayBuffer and numpy repeats are
interleaved so that drift on a shared machine hits both. With CUDA present it also
times the pinned-staging path (CPU ring -> GPU) and the GPU-resident ring.
One torch thread, as training uses on CPU.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from agent.replay import ReplayBuffer
from agent.setup import cpu_name


class NumpyRing:
    """The baseline: a plain numpy ring buffer, n_step=1, uniform sampling with replacement."""

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], obs_dtype: np.dtype) -> None:
        self.capacity = capacity
        self.obs = np.empty((capacity, *obs_shape), dtype=obs_dtype)
        self.next_obs = np.empty((capacity, *obs_shape), dtype=obs_dtype)
        self.actions = np.empty(capacity, dtype=np.int64)
        self.rewards = np.empty(capacity, dtype=np.float32)
        self.dones = np.empty(capacity, dtype=np.float32)
        self.pos = 0
        self.size = 0
        self.rng = np.random.default_rng(0)

    @property
    def bytes_per_transition(self) -> int:
        arrays = (self.obs, self.next_obs, self.actions, self.rewards, self.dones)
        return sum(a[0].nbytes for a in arrays)

    def add(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        n = len(actions)
        if self.pos + n <= self.capacity:
            rows = slice(self.pos, self.pos + n)
        else:  # wraps around the end
            rows = np.arange(self.pos, self.pos + n) % self.capacity
        self.obs[rows] = obs
        self.next_obs[rows] = next_obs
        self.actions[rows] = actions
        self.rewards[rows] = rewards
        self.dones[rows] = terminated  # truncation still bootstraps
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        idx = self.rng.integers(0, self.size, batch_size)
        return tuple(
            torch.from_numpy(a[idx])
            for a in (self.obs, self.actions, self.rewards, self.next_obs, self.dones)
        )


def steps_pool(
    obs_shape: tuple[int, ...], num_envs: int, rng: np.random.Generator, size: int = 16
) -> list[tuple]:
    """A few vector-env steps to cycle through (making random frames would dominate)."""
    pool = []
    for i in range(size):
        if len(obs_shape) == 3:
            obs = rng.integers(0, 256, (num_envs, *obs_shape), dtype=np.uint8)
        else:
            obs = rng.standard_normal((num_envs, *obs_shape)).astype(np.float32)
        ended = np.zeros(num_envs, dtype=bool)
        ended[:] = i == size - 1  # one episode end (a truncation) per pool cycle
        pool.append(
            (
                obs,
                rng.integers(0, 2, num_envs),
                rng.standard_normal(num_envs),
                obs,
                np.zeros(num_envs, dtype=bool),
                ended,
            )
        )
    return pool


def seconds(fn: Callable[[], object], calls: int, sync: Callable[[], None]) -> float:
    """Seconds per call of ``fn``, over ``calls`` calls."""
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) / calls


def interleaved(
    fns: dict[str, Callable[[], object]], calls: int, repeats: int, sync: Callable[[], None]
) -> dict[str, float]:
    """Median seconds per call of each fn, their repeats interleaved."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():  # warm-up
        seconds(fn, max(1, calls // 10), sync)
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(seconds(fn, calls, sync))
    return {name: statistics.median(ts) for name, ts in times.items()}


def adder(buffer, pool: list[tuple]) -> Callable[[], None]:
    i = 0

    def add() -> None:
        nonlocal i
        buffer.add(*pool[i % len(pool)])
        i += 1

    return add


def sampler(
    buffer, batch: int, gen: torch.Generator | None = None, consume: bool = False
) -> Callable[[], object]:
    if isinstance(buffer, NumpyRing):
        return lambda: buffer.sample(batch)
    if consume:
        return lambda: buffer.sample(batch, generator=gen).obs.sum()
    return lambda: buffer.sample(batch, generator=gen)


def fill(buffer, pool: list[tuple]) -> None:
    add = adder(buffer, pool)
    while (buffer.size if isinstance(buffer, NumpyRing) else len(buffer)) < buffer.capacity:
        add()


def fmt_rate(transitions_per_s: float) -> str:
    if transitions_per_s >= 1e6:
        return f"{transitions_per_s / 1e6:.2f} M/s"
    return f"{transitions_per_s / 1e3:.0f} k/s"


def bench_kind(
    name: str,
    obs_shape: tuple[int, ...],
    obs_dtype: np.dtype,
    capacity: int,
    quick: bool,
    repeats: int,
) -> list[tuple[str, ...]]:
    """Rows (kind, operation, ours, numpy, ratio) for one observation kind on CPU."""
    rng = np.random.default_rng(0)
    cpu = torch.device("cpu")
    rows: list[tuple[str, ...]] = []
    big = len(obs_shape) == 3
    add_calls = (300 if big else 3000) if quick else (2000 if big else 30000)
    no_sync = lambda: None  # noqa: E731

    # add: small rings, filled once before timing (first-touch page faults excluded);
    # the timed adds wrap around the end of the ring.
    for num_envs in (1, 8):
        pool = steps_pool(obs_shape, num_envs, rng)
        ring_cap = 4096 if big else 65536
        fns = {
            f"n{n}": adder(
                ReplayBuffer(
                    ring_cap, obs_shape, obs_dtype, device=cpu, n_step=n, num_envs=num_envs
                ),
                pool,
            )
            for n in (1, 3)
        }
        fns["numpy"] = adder(NumpyRing(ring_cap, obs_shape, obs_dtype), pool)
        for add in fns.values():  # touch every page first: time the steady state
            for _ in range(ring_cap // num_envs + 1):
                add()
        calls = max(1, add_calls // num_envs)
        t = interleaved(fns, calls, repeats, no_sync)
        for n in (1, 3):
            rows.append(
                (
                    name,
                    f"add, num_envs={num_envs}, n_step={n}",
                    fmt_rate(num_envs / t[f"n{n}"]),
                    f"{t[f'n{n}'] * 1e6:.1f} µs",
                    fmt_rate(num_envs / t["numpy"]),
                    f"{t['numpy'] * 1e6:.1f} µs",
                    f"{t['numpy'] / t[f'n{n}']:.2f}",
                )
            )
        del fns
        gc.collect()

    # sample: one full ring each (built one after the other to bound peak memory).
    pool = steps_pool(obs_shape, 8, rng)
    ours = ReplayBuffer(capacity, obs_shape, obs_dtype, device=cpu, num_envs=8)
    fill(ours, pool)
    baseline = NumpyRing(capacity, obs_shape, obs_dtype)
    fill(baseline, pool)
    gen = torch.Generator().manual_seed(0)
    for batch in (32, 128, 512):
        calls = max(20, (2000 if quick else 20000) // batch) if big else (2000 if quick else 20000)
        t = interleaved(
            {
                "ours": sampler(ours, batch, gen),
                "numpy": sampler(baseline, batch),
            },
            calls,
            repeats,
            no_sync,
        )
        rows.append(
            (
                name,
                f"sample, batch={batch}",
                fmt_rate(batch / t["ours"]),
                f"{t['ours'] * 1e6:.1f} µs",
                fmt_rate(batch / t["numpy"]),
                f"{t['numpy'] * 1e6:.1f} µs",
                f"{t['numpy'] / t['ours']:.2f}",
            )
        )
    rows.append(
        (
            name,
            "bytes / transition",
            str(ours.bytes_per_transition),
            "",
            str(baseline.bytes_per_transition),
            "",
            "",
        )
    )
    del ours, baseline
    gc.collect()
    return rows


def bench_prioritized(capacity: int, quick: bool, repeats: int) -> list[tuple[str, ...]]:
    """Rows (operation, prioritized, uniform, ratio): a full CartPole-sized ring of
    ``capacity`` sampled by priority (sum tree, importance weights) and uniformly, and
    the priority update of a batch, in one interleaved run."""
    rng = np.random.default_rng(1)
    cpu = torch.device("cpu")
    pool = steps_pool((4,), 8, rng)
    uniform = ReplayBuffer(capacity, (4,), np.float32, device=cpu, num_envs=8)
    prioritized = ReplayBuffer(capacity, (4,), np.float32, device=cpu, num_envs=8, alpha=0.5)
    for buffer in (uniform, prioritized):
        fill(buffer, pool)
    # Priorities spread over five orders of magnitude, as after some learning.
    everything = torch.arange(capacity)
    prioritized.update_priorities(everything, torch.from_numpy(10 ** rng.uniform(-4, 1, capacity)))
    gen = torch.Generator().manual_seed(0)
    calls = 2000 if quick else 20000
    rows = []
    for batch in (32, 128):
        t = interleaved(
            {"prioritized": lambda b=batch: prioritized.sample(b, gen, beta=0.4),
             "uniform": sampler(uniform, batch, gen)},
            calls, repeats, lambda: None,
        )  # fmt: skip
        rows.append((f"sample, batch={batch}", f"{t['prioritized'] * 1e6:.1f} µs",
                     f"{t['uniform'] * 1e6:.1f} µs",
                     f"{t['prioritized'] / t['uniform']:.1f}x"))  # fmt: skip
        slots = torch.from_numpy(rng.integers(0, capacity, batch))
        errors = torch.rand(batch)
        t = interleaved(
            {"update": lambda s=slots, e=errors: prioritized.update_priorities(s, e)},
            calls, repeats, lambda: None,
        )  # fmt: skip
        rows.append((f"update_priorities, batch={batch}", f"{t['update'] * 1e6:.1f} µs", "", ""))
    # One env step's add, the new transitions entering the tree at the largest priority.
    step_pool = steps_pool((4,), 1, rng)
    adds = {
        "prioritized": adder(ReplayBuffer(capacity, (4,), np.float32, device=cpu, alpha=0.5),
                             step_pool),
        "uniform": adder(ReplayBuffer(capacity, (4,), np.float32, device=cpu), step_pool),
    }  # fmt: skip
    t = interleaved(adds, calls, repeats, lambda: None)
    rows.append(("add, num_envs=1", f"{t['prioritized'] * 1e6:.1f} µs",
                 f"{t['uniform'] * 1e6:.1f} µs", f"{t['prioritized'] / t['uniform']:.1f}x"))
    return rows


def bench_cuda(
    name: str,
    obs_shape: tuple[int, ...],
    obs_dtype: np.dtype,
    capacity: int,
    quick: bool,
    repeats: int,
) -> list[tuple[str, ...]]:
    """Rows (kind, path, batch, rate, time) for the pinned and the GPU-resident path."""
    device = torch.device("cuda")
    rng = np.random.default_rng(0)
    pool = steps_pool(obs_shape, 8, rng)
    rows: list[tuple[str, ...]] = []
    sync = torch.cuda.synchronize
    paths = (("pinned staging (CPU ring)", torch.device("cpu")), ("GPU-resident ring", device))
    for path, storage in paths:
        buf = ReplayBuffer(
            capacity, obs_shape, obs_dtype, device=device, storage_device=storage, num_envs=8
        )
        t_add = interleaved({"add": adder(buf, pool)}, 200 if quick else 2000, repeats, sync)
        rows.append(
            (name, path, "add (8 envs)", fmt_rate(8 / t_add["add"]), f"{t_add['add'] * 1e6:.1f} µs")
        )
        fill(buf, pool)
        gen = torch.Generator(device=buf.storage_device).manual_seed(0)
        for batch in (32, 128, 512):
            # The batch is consumed on the GPU, as a learner would, so the copy is waited for.
            calls = 200 if quick else 2000
            t = interleaved({"s": sampler(buf, batch, gen, consume=True)}, calls, repeats, sync)
            t = t["s"]
            rows.append(
                (name, path, f"sample, batch={batch}", fmt_rate(batch / t), f"{t * 1e6:.1f} µs")
            )
        del buf
        gc.collect()
        torch.cuda.empty_cache()
    return rows


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short run, smaller rings")
    parser.add_argument("--repeats", type=int, default=None, help="repeats per number (median)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    repeats = args.repeats or (3 if args.quick else 7)
    cartpole_cap = 100_000
    atari_cap = 5_000 if args.quick else 50_000

    print(
        f"# {cpu_name()} ({os.cpu_count()} cores), torch {torch.__version__}, "
        f"numpy {np.__version__}, 1 torch thread, repeats={repeats}, quick={args.quick}"
    )
    kinds = [
        ("CartPole (4,) float32", (4,), np.dtype(np.float32), cartpole_cap),
        ("Atari (4,84,84) uint8", (4, 84, 84), np.dtype(np.uint8), atari_cap),
    ]
    rows = []
    for name, shape, dtype, cap in kinds:
        rows += bench_kind(name, shape, dtype, cap, args.quick, repeats)
    header = ("obs", "operation", "ReplayBuffer", "per call", "numpy ring", "per call", "speed-up")
    print(f"\nCPU (capacity: CartPole {cartpole_cap}, Atari {atari_cap})\n")
    print(table(header, rows))

    print(f"\nPrioritized replay (alpha 0.5, sum tree) against uniform, CartPole-sized, "
          f"a full ring of {cartpole_cap}\n")
    print(table(("operation", "prioritized", "uniform", "cost"),
                bench_prioritized(cartpole_cap, args.quick, repeats)))  # fmt: skip

    if torch.cuda.is_available():
        cuda_rows = []
        for name, shape, dtype, cap in kinds:
            cuda_rows += bench_cuda(name, shape, dtype, cap, args.quick, repeats)
        print(f"\nCUDA ({torch.cuda.get_device_name()})\n")
        print(table(("obs", "path", "operation", "rate", "per call"), cuda_rows))


if __name__ == "__main__":
    main()
