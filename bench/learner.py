"""Benchmark: what one learner update costs, by backend, and where the time goes.

    python bench/learner.py                      # the CartPole config: 4-128-128-2, batch 32
    python bench/learner.py --noisy-layers all   # every layer noisy

Times, as medians of single calls (repeats interleaved, so drift hits every variant):

* ``Learner.update``: the whole gradient step training runs (noise resets, online
  and target forward, double-DQN target, Huber loss, backward, clip, Adam), with
  each backend: ``numpy`` (agent/numpy_grad.py, what training on a CPU uses) and
  ``torch`` (autograd);
* the autograd update's phases, each timed alone;
* the optimizer part two ways, each with the same forward and backward:
  ``torch.optim.Adam(fused=True)`` + ``clip_grad_norm_`` + ``zero_grad(set_to_none)``,
  against ``agent.optim.Adam`` (one fused kernel call, one flat gradient buffer).

One torch thread, one BLAS thread and denormals flushed, as training runs on CPU.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a bare checkout too
sys.path.insert(0, str(Path(__file__).resolve().parent))

from acting import machine, time_calls

from agent.learner import Learner
from agent.networks import QNetwork
from agent.optim import Adam
from agent.replay import Batch


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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--hidden", type=int, nargs="+", default=[128, 128])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--noisy-layers", choices=["all", "last"], default="last")
    p.add_argument("--sigma0", type=float, default=0.5)
    p.add_argument("--calls", type=int, default=2000, help="timed calls per repeat")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(1)
    threadpool_limits(1, user_api="blas")
    torch.set_flush_denormal(True)
    device = torch.device("cpu")
    torch.manual_seed(0)
    net = QNetwork(
        (4,), 2, args.hidden, noisy_layers=args.noisy_layers, sigma0=args.sigma0, device=device
    )
    learner = Learner(net, copy.deepcopy(net), lr=1e-4, backend="torch")
    net_np = copy.deepcopy(net)
    learner_np = Learner(net_np, copy.deepcopy(net_np), lr=1e-4, backend="numpy")
    batch = make_batch(args.batch, device)
    both = torch.cat([batch.obs, batch.next_obs])

    def loss_of(network: QNetwork) -> torch.Tensor:
        q = network(both)[: args.batch].gather(1, batch.actions.unsqueeze(1)).squeeze(1)
        return F.huber_loss(q, batch.rewards)

    # The optimizer part, two ways, on separate copies of the network.
    net_torch, net_ours = copy.deepcopy(net), copy.deepcopy(net)
    torch_adam = torch.optim.Adam(net_torch.parameters(), lr=1e-4, eps=1.5e-4, fused=True)
    params_torch = list(net_torch.parameters())
    our_adam = Adam(net_ours.parameters(), lr=1e-4, eps=1.5e-4)

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

    variants = {
        "Learner.update, numpy backend (all of it)": lambda: learner_np.update(batch),
        "Learner.update, torch backend (all of it)": lambda: learner.update(batch),
        "  noise resets (online + target)": noise_resets,
        "  online forward (2B rows)": online_forward,
        "  target forward (B rows, no grad)": target_forward,
        "  online forward + backward": forward_backward,
        "  clip_grad_norm_ (ours)": lambda: learner.optimizer.clip_grad_norm_(10.0),
        "  Adam step (ours)": learner.optimizer.step,
        "fwd+bwd+clip+step, torch.optim.Adam(fused)": torch_optim_step,
        "fwd+bwd+clip+step, agent.optim.Adam": our_optim_step,
    }
    for fn in variants.values():  # warm-up
        for _ in range(200):
            fn()
    results: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, fn in variants.items():
            results[name].append(time_calls(fn, args.calls))
    medians = {name: statistics.median(times) for name, times in results.items()}

    sizes = "-".join(str(s) for s in [4, *args.hidden, 2])
    print(
        f"\nLearner update, {sizes} MLP (noisy_layers={args.noisy_layers}), "
        f"batch {args.batch}; {machine()}"
    )
    print(f"median of {args.repeats} repeats x {args.calls} calls\n")
    print("| what | us per call |")
    print("|---|---|")
    for name, value in medians.items():
        label = "- " + name.strip() if name.startswith("  ") else name
        print(f"| {label} | {value:.0f} |")
    old = medians["fwd+bwd+clip+step, torch.optim.Adam(fused)"]
    new = medians["fwd+bwd+clip+step, agent.optim.Adam"]
    print(f"\nagent.optim.Adam saves {old - new:.0f} us per update ({old / new:.2f}x on that part)")
    autograd = medians["Learner.update, torch backend (all of it)"]
    ours = medians["Learner.update, numpy backend (all of it)"]
    print(f"the numpy backend takes {ours:.0f} us per update against autograd's {autograd:.0f} "
          f"({autograd / ours:.2f}x faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
