"""Adam (agent/optim.py): the same updates as torch.optim.Adam, flat gradients, state, devices."""

from __future__ import annotations

import io

import pytest
import torch
from conftest import DEVICES, OpRecorder, SYNCING_OPS
from torch import nn

from agent.optim import Adam



def _net(device: str = "cpu", dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(3, 8, device=device, dtype=dtype),
        nn.ReLU(),
        nn.Linear(8, 2, device=device, dtype=dtype),
    )


def _loss(net: nn.Module, step: int, device: str, dtype: torch.dtype, scale: float = 1.0):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(16, 3, generator=g, dtype=dtype).to(device)
    return (net(x) ** 2).sum() * scale


def _train_ours(net, opt: Adam, steps: range, device, dtype, clip: float | None, scale=1.0):
    for step in steps:
        opt.zero_grad()
        _loss(net, step, device, dtype, scale).backward()
        if clip is not None:
            opt.clip_grad_norm_(clip)
        opt.step()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("clip", [None, 0.5])
@pytest.mark.parametrize("fused", [True, False])
def test_matches_torch_adam_with_and_without_clipping(
    device: str, dtype: torch.dtype, clip: float | None, fused: bool
) -> None:
    ours, ref = _net(device, dtype), _net(device, dtype)
    opt = Adam(ours.parameters(), lr=1e-2, eps=1e-6, fused=fused)
    assert opt.fused is fused
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2, eps=1e-6)
    for step in range(20):
        ref_opt.zero_grad()
        _loss(ref, step, device, dtype).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(ref.parameters(), clip)
        ref_opt.step()
    _train_ours(ours, opt, range(20), device, dtype, clip)
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-14}
    for p, r in zip(ours.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, r, **tol)
    assert opt.step_count == 20


def test_gradients_are_views_of_one_flat_buffer_across_backward_passes() -> None:
    net = _net()
    opt = Adam(net.parameters(), lr=1e-3)
    storage = opt.flat_grad.untyped_storage().data_ptr()
    for step in range(3):
        opt.zero_grad()
        _loss(net, step, "cpu", torch.float32).backward()
        for p in net.parameters():
            assert p.grad.untyped_storage().data_ptr() == storage
        expected = torch.cat([p.grad.flatten() for p in net.parameters()])
        assert torch.equal(opt.flat_grad, expected)
        assert opt.flat_grad.abs().sum() > 0
        opt.step()
    opt.zero_grad()
    assert torch.count_nonzero(opt.flat_grad) == 0


def test_zero_grad_reattaches_a_replaced_gradient() -> None:
    net = _net()
    opt = Adam(net.parameters(), lr=1e-3)
    first = next(net.parameters())
    first.grad = None  # e.g. someone called module.zero_grad(set_to_none=True)
    opt.zero_grad()
    _loss(net, 0, "cpu", torch.float32).backward()
    assert first.grad.untyped_storage().data_ptr() == opt.flat_grad.untyped_storage().data_ptr()


def test_clipping_scales_to_the_max_norm_and_leaves_small_gradients_alone() -> None:
    net = _net()
    opt = Adam(net.parameters(), lr=1e-3)
    _loss(net, 0, "cpu", torch.float32, scale=100.0).backward()
    before = opt.flat_grad.clone()
    norm = opt.clip_grad_norm_(1.0)
    torch.testing.assert_close(norm, torch.linalg.vector_norm(before))
    torch.testing.assert_close(torch.linalg.vector_norm(opt.flat_grad), torch.tensor(1.0))
    torch.testing.assert_close(opt.flat_grad, before / norm, rtol=1e-5, atol=1e-7)
    small = opt.flat_grad.clone()
    opt.clip_grad_norm_(10.0)
    torch.testing.assert_close(opt.flat_grad, small)


def test_rows_are_clipped_each_by_its_own_norm_as_alone() -> None:
    # Two stacked learners (rows=2): each row clipped as an Adam over that row alone.
    gen = torch.Generator().manual_seed(0)
    weight = nn.Parameter(torch.zeros(2, 3, 4))
    bias = nn.Parameter(torch.zeros(2, 3))
    stacked = Adam([weight, bias], lr=1e-3, rows=2)
    stacked.flat_grad.copy_(torch.randn(stacked.flat_grad.shape, generator=gen))
    stacked.grads[0][1].mul_(100.0)  # row 1 far above the bound, row 0 below it
    rows_before = [[g[r].clone() for g in stacked.grads] for r in range(2)]

    norms = stacked.clip_grad_norm_(5.0)

    for r, before in enumerate(rows_before):
        alone = Adam([nn.Parameter(g.clone()) for g in before], lr=1e-3)
        torch.cat([g.reshape(-1) for g in before], out=alone.flat_grad)
        norm = alone.clip_grad_norm_(5.0)
        torch.testing.assert_close(norms[r], norm)
        for got, want in zip([g[r] for g in stacked.grads], alone.grads, strict=True):
            torch.testing.assert_close(got, want)
    assert norms[0] < 5.0 < norms[1]


def test_step_and_clip_never_wait_for_the_device() -> None:
    net = _net()
    opt = Adam(net.parameters(), lr=1e-3)
    _loss(net, 0, "cpu", torch.float32).backward()
    with OpRecorder() as rec:
        opt.clip_grad_norm_(1.0)
        opt.step()
        opt.zero_grad()
    assert not SYNCING_OPS.intersection(rec.ops)


def _through_bytes(state: dict) -> dict:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize("fused", [True, False])
def test_state_round_trip_continues_exactly(fused: bool) -> None:
    a, b = _net(), _net()
    opt_a = Adam(a.parameters(), lr=1e-2, fused=fused)
    _train_ours(a, opt_a, range(5), "cpu", torch.float32, 1.0)
    b.load_state_dict(a.state_dict())
    opt_b = Adam(b.parameters(), lr=1e-2, fused=fused)
    opt_b.load_state_dict(_through_bytes(opt_a.state_dict()))
    assert opt_b.step_count == 5
    _train_ours(a, opt_a, range(5, 10), "cpu", torch.float32, 1.0)
    _train_ours(b, opt_b, range(5, 10), "cpu", torch.float32, 1.0)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)


def test_device_counts_are_the_host_counts_on_the_device() -> None:
    net = _net()
    opt = Adam(net.parameters(), lr=1e-2)
    _train_ours(net, opt, range(3), "cpu", torch.float32, None)
    step_count, counts = opt.host_counts
    assert step_count == 3 and opt.device_counts.tolist() == [float(c) for c in counts]
    assert opt.device_counts.device == opt.params[0].device


def test_state_of_another_network_is_rejected() -> None:
    opt = Adam(_net().parameters(), lr=1e-3)
    other = Adam([nn.Parameter(torch.zeros(5))], lr=1e-3)
    with pytest.raises(ValueError, match="5 values per moment"):
        opt.load_state_dict(other.state_dict())


def test_invalid_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="at least one parameter"):
        Adam([], lr=1e-3)
    with pytest.raises(ValueError, match="one device with one dtype"):
        mixed = [nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(2, dtype=torch.float64))]
        Adam(mixed, lr=1e-3)
    with pytest.raises(ValueError, match="invalid Adam settings"):
        Adam(_net().parameters(), lr=0.0)


@pytest.mark.parametrize("fused", [True, False])
def test_meta_device_creates_nothing_elsewhere(fused: bool) -> None:
    net = _net("meta")
    opt = Adam(net.parameters(), lr=1e-3, fused=fused)
    _train_ours(net, opt, range(2), "meta", torch.float32, 1.0)
    tensors = [opt.flat_grad, opt.exp_avg, opt.exp_avg_sq, *net.parameters()]
    assert all(t.device.type == "meta" for t in tensors)


@pytest.mark.parametrize("fused", [True, False])
def test_parameters_without_a_gradient_are_left_alone_like_torch_adam(fused: bool) -> None:
    # torch.optim.Adam skips a parameter whose .grad is None (set_to_none): no update, no
    # moment decay, no step count. Ours must too, for a parameter the loss did not use
    # and for one frozen with requires_grad_(False), also after it took part before.
    ours, ref = _net(), _net()
    opt = Adam(ours.parameters(), lr=1e-2, eps=1e-6, fused=fused)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2, eps=1e-6)

    def loss(net: nn.Module, step: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(step)
        x = torch.randn(16, 3, generator=g)
        if step % 3 == 2:  # the output layer's bias takes no part in this loss
            return (torch.nn.functional.linear(net[1](net[0](x)), net[2].weight) ** 2).sum()
        return (net(x) ** 2).sum()

    for step in range(12):
        if step == 6:  # freeze the first layer's weight half-way
            ours[0].weight.requires_grad_(False)
            ref[0].weight.requires_grad_(False)
        ref_opt.zero_grad(set_to_none=True)
        loss(ref, step).backward()
        ref_opt.step()
        opt.zero_grad()
        loss(ours, step).backward()
        opt.step()
        for a, b in zip(ours.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    steps = _through_bytes(opt.state_dict())["steps"].tolist()
    ref_steps = [int(ref_opt.state[p]["step"]) for p in ref.parameters()]
    assert steps == ref_steps and steps[0] == 6 and steps[3] == 8


def test_a_parameter_frozen_before_construction_is_accepted_and_left_alone() -> None:
    # torch.optim.Adam accepts it, though no gradient hook can be registered on it.
    ours, ref = _net(), _net()
    for net in (ours, ref):
        net[0].weight.requires_grad_(False)
    opt = Adam(ours.parameters(), lr=1e-2, eps=1e-6)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2, eps=1e-6)
    x = torch.randn(16, 3, generator=torch.Generator().manual_seed(0))
    for net, optimizer in ((ref, ref_opt), (ours, opt)):
        optimizer.zero_grad()
        (net(x) ** 2).sum().backward()
        optimizer.step()
    for a, b in zip(ours.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
