"""Benchmark: what a learner update and an action cost per seed, S seeds stacked against one.

    python -m bench.seeds                 # S = 1, 4, 16, 64 (about two minutes on CPU)
    python -m bench.seeds --seeds 16 --quick
    python -m bench.seeds --net der --seeds 8 32 --device cuda   # image seeds, on a GPU

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
single-seed CPU figures. ``--net der`` times the ``der`` preset's update instead: one
seed as a run makes it on the device, and S seeds stacked with a convolution call per
seed and with one grouped call (``stack_networks(grouped_conv=...)``); on CUDA also the
grouped update captured as one CUDA graph, as a group's training runs it (its eager
row says what the graph gains); then a step's action with fresh noise, one seed's
selector against the stack's, as a group acts.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
from collections.abc import Callable

import numpy as np
import torch

from agent.acting import ActionSelector, capture_cuda_graph
from agent.config_files import load_config
from agent.learner import CapturedUpdate, Learner
from agent.networks import QNetwork
from agent.replay import Batch
from agent.seeds import NoiseDraw, SeedLearner, stack_networks, stacked_noisy_layers
from agent.seeds.group import stacked_greedy
from agent.setup import build_q_network, learner_settings, limit_cpu_threads, update_capture
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

    def act_stacked() -> np.ndarray:  # the acting noise held, as within an episode
        return stacked_greedy(stacked, stacked_obs, device)

    return {
        f"update, one seed ({learner.backend})": (lambda: learner.update(batch), 1),
        f"update, {seeds} stacked": (lambda: seed_learner.update(stacked_batch), seeds),
        f"act, one seed ({selector.backend})": (lambda: selector(obs, fresh_noise=False), 1),
        f"act, {seeds} stacked": (act_stacked, seeds),
    }


def der_variants(seeds: int, device: torch.device) -> dict[str, tuple[object, int]]:
    """The ``der`` preset's network (Krull's 18 actions): one seed's update as a run makes it
    on ``device`` (the numpy engine on a CPU, a CUDA graph on a GPU), and S seeds' stacked
    update with a convolution call per seed and with one grouped call; on a GPU, the
    grouped update also captured as a CUDA graph, and the lone and the grouped update also
    with their loss in bfloat16."""
    cfg = load_config("KrullNoFrameskip-v4", "der")
    settings = learner_settings(cfg, noise=True)

    def network(seed: int) -> QNetwork:
        torch.manual_seed(seed)
        return build_q_network(cfg, (4, 84, 84), 18, device, "uint8")

    g = torch.Generator().manual_seed(0)

    def batch(shape: tuple[int, ...]) -> Batch:
        def frames() -> torch.Tensor:
            return torch.randint(0, 256, (*shape, 4, 84, 84), generator=g, dtype=torch.uint8)

        return Batch(frames(), torch.randint(0, 18, shape, generator=g),
                     torch.randn(shape, generator=g), frames(), torch.zeros(shape),
                     torch.full(shape, cfg.gamma**cfg.n_step), None,
                     torch.rand(shape, generator=g) + 0.5).to(device)  # fmt: skip

    # On a GPU, each also with its loss in bfloat16 (learner_autocast): on a CPU that
    # would be the compiled update, timed by bench.compiled_update.
    precisions = [None, torch.bfloat16] if device.type == "cuda" else [None]
    one = batch((cfg.batch_size,))
    out: dict[str, tuple[object, int]] = {}
    for autocast in precisions:
        single = network(0)
        learner = Learner(single, copy.deepcopy(single), **settings, autocast=autocast)
        capture = update_capture(device, cfg.capture_graph)
        update = learner.update if capture is None else CapturedUpdate(learner, capture)
        label = ("a CUDA graph" if capture is not None else learner.backend) + (
            ", bf16" if autocast else "")
        out[f"update, one seed ({label})"] = (lambda u=update: u(one), 1)
    stacked_batch = batch((seeds, cfg.batch_size))
    for grouped, autocast in [(False, None), (True, None)] + [(True, a) for a in precisions[1:]]:
        nets = [network(i) for i in range(seeds)]
        stacked = stack_networks(nets, grouped_conv=grouped)
        target = stack_networks(nets, grouped_conv=grouped).requires_grad_(False)
        generators = [torch.Generator(device=device).manual_seed(i) for i in range(seeds)]
        stacked_learner = SeedLearner(stacked, target, generators, **settings, autocast=autocast)
        label = ("grouped conv" if grouped else "a conv call per seed") + (
            ", bf16" if autocast else "")
        out[f"update, {seeds} stacked, {label}"] = (
            lambda sl=stacked_learner: sl.update(stacked_batch), seeds)  # fmt: skip
        if device.type == "cuda" and grouped:
            # What a group runs on CUDA: the grouped update as one CUDA graph, each seed's
            # noise stream registered with it (CapturedUpdate, as SeedStack makes it).
            captured = CapturedUpdate(stacked_learner, capture_cuda_graph, generators=generators)
            captured(stacked_batch)  # captured here; a capture that fails warns and runs eagerly
            if captured.graph is not None:
                out[f"update, {seeds} stacked, {label}, a CUDA graph"] = (
                    lambda c=captured: c(stacked_batch), seeds)  # fmt: skip
    out.update(der_acting(seeds, device, network))
    return out


def der_acting(seeds: int, device: torch.device,
               network: Callable[[int], QNetwork]) -> dict[str, tuple[object, int]]:
    """A step's action with fresh noise: one seed's ``ActionSelector`` as a run makes it (a
    CUDA graph on a GPU), and S stacked seeds as a group acts (``SeedStack.act``: each
    seed's noise drawn from its own generator, then one eager forward and argmax)."""
    selector = ActionSelector(network(0), (4, 84, 84), 1, device)
    frame = np.zeros((1, 4, 84, 84), dtype=np.uint8)
    selector(frame)  # picks its backend (captures its graph on a GPU)
    stacked = stack_networks([network(i) for i in range(seeds)],
                             grouped_conv=device.type == "cuda")  # fmt: skip
    draw = NoiseDraw(stacked_noisy_layers(stacked))
    generators = [torch.Generator(device=device).manual_seed(i) for i in range(seeds)]
    frames = np.zeros((seeds, 1, 4, 84, 84), dtype=np.uint8)

    def act_stacked() -> np.ndarray:
        draw(generators)
        return stacked_greedy(stacked, frames, device)

    return {
        f"act, one seed ({selector.backend})": (lambda: selector(frame), 1),
        f"act, {seeds} stacked (eager)": (act_stacked, seeds),
    }


def rows(seeds: int, runs: dict[str, tuple[object, int]], calls: int, repeats: int,
         device: torch.device, net: str) -> list[str]:
    """The table's rows for S = ``seeds``: each variant timed, repeats interleaved."""
    sync = device.type == "cuda"
    times: dict[str, list[float]] = {name: [] for name in runs}
    for fn, _ in runs.values():
        time_calls(fn, 20 if net == "cartpole" else 3, sync)  # warm-up, compiles
    for _ in range(repeats):
        for name, (fn, _) in runs.items():
            on_device = net == "der" or "stacked" in name  # else a CPU call
            times[name].append(time_calls(fn, calls, sync and on_device))
    per_seed = {name: statistics.median(times[name]) / n for name, (_, n) in runs.items()}
    names, out = list(runs), []
    for name in names:
        call = statistics.median(times[name])
        # updates against the lone update, actions against the lone action
        verb = name.split(",")[0]
        single = per_seed[next(n for n in names if n.startswith(verb))]
        ratio = f"{single / per_seed[name]:.2f}x" if "stacked" in name else ""
        out.append(f"| {seeds} | {name} | {call:.0f} | {per_seed[name]:.1f} | {ratio} |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--quick", action="store_true", help="fewer calls and repeats")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--net", default="cartpole", choices=["cartpole", "der"],
                        help="der: the der preset's updates, a conv call per seed or grouped, "
                        "and its actions")
    args = parser.parse_args()
    device = torch.device(args.device)
    calls, repeats = (100, 3) if args.quick else (400, 5)
    with contextlib.ExitStack() as cleanup:
        limit_cpu_threads(1, cleanup)  # one torch thread, as many for numpy's BLAS
        if args.net == "der":
            calls //= 10
            print(f"der preset (Krull), batch 32 a seed, on {device}; {machine()}")
        else:
            print(f"4-128-128-2 MLP, noisy last layer, batch {BATCH}; stacked on {device}; "
                  f"{machine()}")  # fmt: skip
        print("\n| seeds | variant | µs per call | µs per seed | stacked speed-up per seed |")
        print("|---|---|---|---|---|")
        for seeds in args.seeds:
            runs = der_variants(seeds, device) if args.net == "der" else variants(seeds, device)
            print("\n".join(rows(seeds, runs, calls, repeats, device, args.net)), flush=True)


if __name__ == "__main__":
    main()
