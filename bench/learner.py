"""Benchmark: what one learner update costs, by backend, and where the time goes.

    python -m bench.learner                      # the CartPole config: 4-128-128-2, batch 32
    python -m bench.learner --noisy-layers all   # every layer noisy
    python -m bench.learner --device cuda        # on the GPU, plus the update as a CUDA graph

Times, as medians of single calls (repeats interleaved, so drift hits every variant):

* ``Learner.update``: the whole gradient step training runs (noise resets, online
  and target forward, double-DQN target, Huber loss, backward, clip, Adam), with
  each backend: ``numpy`` (agent/numpy_backend/, what training on a CPU uses; CPU only)
  and ``torch`` (autograd);
* the autograd update's phases, each timed alone;
* the optimizer part two ways, each with the same forward and backward:
  ``torch.optim.Adam(fused=True)`` + ``clip_grad_norm_`` + ``zero_grad(set_to_none)``,
  against ``agent.optim.Adam`` (one fused kernel call, one flat gradient buffer);
* on CUDA only: the whole ``Learner.update`` captured once as a CUDA graph and
  replayed, then checked (parameters move and stay finite, gradients land in the
  optimizer's flat buffer, replays match eager updates from the same state and seed).

One torch thread, one BLAS thread and denormals flushed, as training runs on CPU. On
CUDA every timed call is bracketed by ``torch.cuda.synchronize()``: a call returns
once its kernels are queued, so the clock alone would time the launches only.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

from agent.acting.graph import CaptureFn, CapturedGraph, capture_cuda_graph
from agent.learner import Learner
from agent.networks import QNetwork
from agent.optim import Adam
from agent.replay import Batch
from agent.setup import limit_cpu_threads
from bench.acting import machine, time_calls

LR = 1e-4
GRAPH = "Learner.update captured in a CUDA graph (replay)"
EAGER_TORCH = "Learner.update, torch backend (all of it)"
EAGER_NUMPY = "Learner.update, numpy backend (all of it)"


def make_batch(batch: int, device: torch.device) -> Batch:
    g = torch.Generator().manual_seed(0)
    return Batch(
        obs=torch.randn(batch, 4, generator=g).to(device),
        actions=torch.randint(0, 2, (batch,), generator=g).to(device),
        rewards=torch.ones(batch).to(device),
        next_obs=torch.randn(batch, 4, generator=g).to(device),
        dones=(torch.rand(batch, generator=g) < 0.05).float().to(device),
        discounts=torch.full((batch,), 0.99**3).to(device),
    )


def capture_update(
    learner: Learner, batch: Batch, capture: CaptureFn = capture_cuda_graph
) -> CapturedGraph:
    """``learner.update(batch)`` captured as one graph; ``graph.output`` is its static loss.

    ``capture`` is the acting path's capture seam (:mod:`agent.acting.graph`): the
    standard recipe of warm-up calls on a side stream, then one capture, and
    ``capture_eager`` stands in for it without a GPU. The batch is static; its ``obs``
    is passed only to name the device. The optimizer's gradients need no set-up:
    agent.optim.Adam points every ``.grad`` at a view of one flat buffer from its
    constructor on, and autograd accumulates into an existing ``.grad`` in place, so the
    captured backward writes to those fixed addresses (checked after capture by
    :func:`grads_in_flat_buffer`).
    """
    return capture(lambda _obs: learner.update(batch), (batch.obs,))


def grads_in_flat_buffer(optimizer: Adam) -> bool:
    """True when every parameter's ``.grad`` is still its view of the optimizer's flat buffer.

    A capture that allocated new ``.grad`` tensors would replay a backward into them while
    the captured clip and Adam step read the flat buffer: zero gradients, silently.
    """
    return all(
        p.grad is not None and p.grad.data_ptr() == g.data_ptr()
        for p, g in zip(optimizer.params, optimizer.grads, strict=True)
    )


def check_graph(learner: Learner, graph: CapturedGraph) -> None:
    """Replay a few times and print what moved: the honest checks that need no eager twin."""
    replays = 5
    opt = learner.optimizer
    params_before = [p.detach().clone() for p in opt.params]
    steps_before = opt.device_counts.clone()
    sums_before = learner.running.sums.clone()
    host_before = (learner.updates, learner.running.count, opt.step_count)
    for _ in range(replays):
        graph.replay()
    torch.cuda.synchronize()
    moved = max(
        float((p.detach() - b).abs().max()) for p, b in zip(opt.params, params_before, strict=True)
    )
    finite = all(bool(torch.isfinite(p).all()) for p in opt.params)
    steps_advanced = sorted({float(s) for s in (opt.device_counts - steps_before).tolist()})
    grad_norm = float(torch.linalg.vector_norm(opt.flat_grad))
    sums_moved = bool((learner.running.sums != sums_before).any())
    host_after = (learner.updates, learner.running.count, opt.step_count)
    errors = graph.output  # the per-sample errors of the last replay
    ok = moved > 0 and finite and bool(torch.isfinite(errors).all()) and grad_norm > 0
    print(f"\nCUDA graph check after {replays} replays: {'OK' if ok else 'FAILED'}")
    print(f"- parameters changed (max |change| {moved:.3g}) and all finite: {moved > 0 and finite}")
    print(f"- static per-sample errors {tuple(errors.shape)}, mean {float(errors.mean()):.4g}, "
          f"finite: {bool(torch.isfinite(errors).all())}")
    print(f"- gradients land in the optimizer's flat buffer (norm after replay {grad_norm:.3g}, "
          f"every .grad still a view of it: {grads_in_flat_buffer(opt)})")
    print(f"- Adam's device step counts advanced by {steps_advanced} (expected [{replays}.0])")
    print(f"- metric sums (learner.running.sums, on the device) advanced: {sums_moved}")
    print(f"- not done by replay: the host-side counters stay put (learner.updates, "
          f"learner.running.count, optimizer.step_count: {host_before} before, "
          f"{host_after} after), "
          "so learner.metrics() divides the replayed sums by a stale count, and "
          "optimizer.state_dict() (host step counts) disagrees with the device counts")


def compare_with_eager(learner: Learner, graph: CapturedGraph, batch: Batch) -> None:
    """N eager updates on an exact copy against N replays, from the same CUDA seed.

    Replays draw their noise from the default CUDA generator's state at replay time, as
    eager calls do, so the two should agree up to float rounding; a large difference
    means the graph does not compute what eager updates compute.
    """
    updates, seed = 5, 1234
    twin = Learner(copy.deepcopy(learner.q_network), copy.deepcopy(learner.target_network),
                   lr=LR, backend="torch")
    # Adam's state, device step counts included (private: the graph never updated the
    # host counts that state_dict() would carry).
    for name in ("exp_avg", "exp_avg_sq", "_steps"):
        getattr(twin.optimizer, name).copy_(getattr(learner.optimizer, name))
    torch.cuda.synchronize()
    torch.cuda.manual_seed(seed)
    for _ in range(updates):
        eager_errors = twin.update(batch)
    torch.cuda.manual_seed(seed)
    for _ in range(updates):
        graph.replay()
    torch.cuda.synchronize()
    diff = max(
        float((a.detach() - b.detach()).abs().max())
        for a, b in zip(twin.optimizer.params, learner.optimizer.params, strict=True)
    )
    loss_diff = float((eager_errors - graph.output).abs().max())
    verdict = "match up to float rounding" if diff <= 1e-5 and loss_diff <= 1e-5 else "DIFFER"
    print(f"- {updates} replays against {updates} eager updates from the same state and CUDA "
          f"seed: max |parameter difference| {diff:.3g}, |error difference| {loss_diff:.3g} "
          f"({verdict})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--hidden", type=int, nargs="+", default=[128, 128])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--noisy-layers", choices=["all", "last"], default="last")
    p.add_argument("--sigma0", type=float, default=0.5)
    p.add_argument("--calls", type=int, default=2000, help="timed calls per repeat")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where the network, batch and learners live (default cpu)")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: CUDA is not available here (torch.cuda.is_available() is False)")
    with contextlib.ExitStack() as cleanup:
        limit_cpu_threads(1, cleanup)  # as training on a CPU (the CUDA runs: one thread too)
        return measure(args)


def measure(args: argparse.Namespace) -> int:
    """Time every variant of the update that ``args`` describe, and print the table."""
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    net = QNetwork(
        (4,), 2, args.hidden, noisy_layers=args.noisy_layers, sigma0=args.sigma0, device=device
    )
    learner = Learner(net, copy.deepcopy(net), lr=LR, backend="torch")
    learner_np = None
    if not cuda:  # the numpy backend computes on the host: CPU tensors only
        net_np = copy.deepcopy(net)
        learner_np = Learner(net_np, copy.deepcopy(net_np), lr=LR, backend="numpy")
    batch = make_batch(args.batch, device)
    both = torch.cat([batch.obs, batch.next_obs])

    def loss_of(network: QNetwork) -> torch.Tensor:
        q = network(both)[: args.batch].gather(1, batch.actions.unsqueeze(1)).squeeze(1)
        return F.huber_loss(q, batch.rewards)

    # The optimizer part, two ways, on separate copies of the network.
    net_torch, net_ours = copy.deepcopy(net), copy.deepcopy(net)
    torch_adam = torch.optim.Adam(net_torch.parameters(), lr=LR, eps=1.5e-4, fused=True)
    params_torch = list(net_torch.parameters())
    our_adam = Adam(net_ours.parameters(), lr=LR, eps=1.5e-4)

    def torch_optim_step() -> None:
        torch_adam.zero_grad(set_to_none=True)
        loss_of(net_torch).backward()
        torch.nn.utils.clip_grad_norm_(params_torch, 10.0)
        torch_adam.step()

    def our_optim_step() -> None:
        our_adam.zero_grad()
        loss_of(net_ours).backward()
        our_adam.clip_grad_norm_(10.0)
        our_adam.step()

    def forward_backward() -> None:
        learner.optimizer.zero_grad()
        loss_of(net).backward()

    def online_forward() -> None:
        net(both)

    @torch.no_grad()
    def target_forward() -> None:
        learner.target_network(batch.next_obs)

    def noise_resets() -> None:
        net.reset_noise()
        learner.target_network.reset_noise()

    variants: dict[str, Callable[[], object]] = {}
    if learner_np is not None:
        variants[EAGER_NUMPY] = lambda: learner_np.update(batch)
    variants.update({
        EAGER_TORCH: lambda: learner.update(batch),
        "  noise resets (online + target)": noise_resets,
        "  online forward (2B rows)": online_forward,
        "  target forward (B rows, no grad)": target_forward,
        "  online forward + backward": forward_backward,
        "  clip_grad_norm_ (ours)": lambda: learner.optimizer.clip_grad_norm_(10.0),
        "  Adam step (ours)": learner.optimizer.step,
        "fwd+bwd+clip+step, torch.optim.Adam(fused)": torch_optim_step,
        "fwd+bwd+clip+step, agent.optim.Adam": our_optim_step,
    })

    # The graph gets a network and a learner of its own, so that its warm-up and replays
    # leave every other variant's state alone. Captured before the timing so that its
    # replays are interleaved with the other variants like any of them.
    graph_parts: tuple[Learner, CapturedGraph] | None = None
    if cuda:
        net_g = copy.deepcopy(net)
        learner_g = Learner(net_g, copy.deepcopy(net_g), lr=LR, backend="torch")
        try:
            graph = capture_update(learner_g, batch)
            torch.cuda.synchronize()
            if not grads_in_flat_buffer(learner_g.optimizer):
                raise RuntimeError("the capture replaced .grad tensors (see grads_in_flat_buffer)")
            graph_parts = (learner_g, graph)
            variants[GRAPH] = graph.replay
        except Exception as e:
            print(f"graph capture failed: {type(e).__name__}: {e}", flush=True)

    for fn in variants.values():  # warm-up
        for _ in range(200):
            fn()
    results: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, fn in variants.items():
            results[name].append(time_calls(fn, args.calls, cuda_sync=cuda))
    medians = {name: statistics.median(times) for name, times in results.items()}

    sizes = "-".join(str(s) for s in [4, *args.hidden, 2])
    print(
        f"\nLearner update{' on cuda' if cuda else ''}, {sizes} MLP "
        f"(noisy_layers={args.noisy_layers}), "
        f"batch {args.batch}; {machine()}"
    )
    synced = ", each call synchronised before and after" if cuda else ""
    print(f"median of {args.repeats} repeats x {args.calls} calls{synced}\n")
    print("| what | us per call |")
    print("|---|---|")
    for name, value in medians.items():
        label = "- " + name.strip() if name.startswith("  ") else name
        print(f"| {label} | {value:.0f} |")
    old = medians["fwd+bwd+clip+step, torch.optim.Adam(fused)"]
    new = medians["fwd+bwd+clip+step, agent.optim.Adam"]
    print(f"\nagent.optim.Adam saves {old - new:.0f} us per update ({old / new:.2f}x on that part)")
    autograd = medians[EAGER_TORCH]
    if EAGER_NUMPY in medians:
        ours = medians[EAGER_NUMPY]
        print(f"the numpy backend takes {ours:.0f} us per update against autograd's "
              f"{autograd:.0f} ({autograd / ours:.2f}x faster)")
    if GRAPH in medians:
        replay = medians[GRAPH]
        print(f"the CUDA graph takes {replay:.0f} us per update against eager torch's "
              f"{autograd:.0f} ({autograd / replay:.2f}x faster)")
    if graph_parts is not None:
        learner_g, graph = graph_parts
        checks: dict[str, Callable[[], None]] = {
            "graph check": lambda: check_graph(learner_g, graph),
            "eager comparison": lambda: compare_with_eager(learner_g, graph, batch),
        }
        for what, run_check in checks.items():  # one failing says why; the next still runs
            try:
                run_check()
            except Exception as e:
                print(f"{what} failed: {type(e).__name__}: {e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
