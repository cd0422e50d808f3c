"""Learner: TD target semantics, double DQN, target sync, noise resets, metrics, devices."""

from __future__ import annotations

import copy
import io
import pytest
import torch
from conftest import DEVICES

from agent.learner import Learner, NonFiniteError, td_target
from agent.networks import QNetwork
from agent.replay import Batch


def _batch(
    b: int = 16, device: str = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0
) -> Batch:
    g = torch.Generator().manual_seed(seed)
    return Batch(
        obs=torch.randn(b, 4, generator=g, dtype=dtype).to(device),
        actions=torch.randint(0, 2, (b,), generator=g).to(device),
        rewards=torch.randn(b, generator=g, dtype=dtype).to(device),
        next_obs=torch.randn(b, 4, generator=g, dtype=dtype).to(device),
        dones=(torch.rand(b, generator=g) < 0.3).to(dtype).to(device),
        discounts=torch.full((b,), 0.99**3, dtype=dtype).to(device),
    )


def _learner(device: str = "cpu", dtype: torch.dtype = torch.float32, **kw) -> Learner:
    torch.manual_seed(0)
    net = QNetwork((4,), 2, (16, 16), device=device, dtype=dtype)
    return Learner(net, copy.deepcopy(net), lr=kw.pop("lr", 1e-2), **kw)


def test_terminal_transitions_bootstrap_nothing_and_truncated_ones_do() -> None:
    rewards = torch.tensor([1.0, 1.0, 2.0])
    discounts = torch.tensor([0.9, 0.9, 0.81])  # gamma^k for the k steps actually taken
    dones = torch.tensor([1.0, 0.0, 0.0])  # terminated / truncated (not done) / ongoing
    next_q = torch.tensor([100.0, 100.0, 10.0])
    torch.testing.assert_close(
        td_target(rewards, discounts, dones, next_q), torch.tensor([1.0, 91.0, 10.1])
    )


def test_double_dqn_values_the_online_argmax_with_the_target_net() -> None:
    learner = _learner(lr=1e-12)
    online, target = learner.q_network, learner.target_network
    # Make the two networks disagree strongly about the best next action.
    with torch.no_grad():
        for p in target.parameters():
            p.mul_(-1.0)
    batch = _batch(b=64)
    captured: dict[str, torch.Tensor] = {}
    original = learner.loss_fn

    def spy(q_taken: torch.Tensor, target_values: torch.Tensor) -> torch.Tensor:
        captured["target"] = target_values
        return original(q_taken, target_values)

    learner.loss_fn = spy  # type: ignore[method-assign]
    torch.manual_seed(5)
    learner.update(batch)
    # Recompute with the same noise draws: reset order is online then target.
    torch.manual_seed(5)
    online.reset_noise()
    target.reset_noise()
    with torch.no_grad():
        a_star = online(batch.next_obs).argmax(1, keepdim=True)
        next_q = target(batch.next_obs).gather(1, a_star).squeeze(1)
        plain_q = target(batch.next_obs).max(1).values
    expected = batch.rewards + batch.discounts * (1 - batch.dones) * next_q
    torch.testing.assert_close(captured["target"], expected)
    assert not torch.allclose(next_q, plain_q), "the test needs the nets to disagree"


def test_update_reduces_loss_on_a_fixed_batch_and_touches_mu_and_sigma() -> None:
    learner = _learner(lr=3e-3, max_grad_norm=None)
    batch = _batch(b=32)
    before = [p.detach().clone() for p in learner.q_network.parameters()]
    losses = [learner.update(batch).item() for _ in range(200)]
    assert sum(losses[-20:]) / 20 < 0.7 * sum(losses[:20]) / 20
    for b, p in zip(before, learner.q_network.parameters(), strict=True):
        assert not torch.equal(b, p)
    assert learner.updates == 200


def test_gradient_clipping_bounds_the_step() -> None:
    learner = _learner(lr=1.0, max_grad_norm=1e-3)
    batch = _batch()
    big = Batch(*batch[:2], batch.rewards * 1e6, *batch[3:])
    learner.update(big)
    # Adam normalises the step anyway; check the gradient norm itself was clipped.
    total = torch.sqrt(sum(p.grad.pow(2).sum() for p in learner.q_network.parameters()))
    assert total <= 1e-3 * 1.01


def test_update_uses_fresh_noise_and_leaves_the_acting_noise_in_place() -> None:
    learner = _learner()
    online, target = learner.q_network._noisy[0], learner.target_network._noisy[0]
    seen: dict[str, torch.Tensor] = {}
    online.register_forward_hook(lambda m, i, o: seen.update(online=m.weight_epsilon.clone()))
    target.register_forward_hook(lambda m, i, o: seen.update(target=m.weight_epsilon.clone()))
    acting = [b.clone() for layer in learner.q_network._noisy for b in layer.buffers()]
    pointers = [b.data_ptr() for layer in learner.q_network._noisy for b in layer.buffers()]
    target_before = target.weight_epsilon.clone()
    learner.update(_batch())
    # The update ran on noise of its own, independent for the two networks ...
    assert not torch.equal(seen["online"], acting[1])
    assert not torch.equal(seen["target"], target_before)
    assert not torch.equal(seen["online"], seen["target"])
    # ... and put the acting noise back, in place (a captured graph reads those addresses).
    after = [b for layer in learner.q_network._noisy for b in layer.buffers()]
    assert all(torch.equal(a, b) for a, b in zip(acting, after, strict=True))
    assert [b.data_ptr() for b in after] == pointers


def test_hard_and_polyak_target_sync() -> None:
    learner = _learner()
    for _ in range(3):
        learner.update(_batch())
    target_before = [p.clone() for p in learner.target_network.parameters()]
    online = list(learner.q_network.parameters())
    assert not all(torch.equal(a, b) for a, b in zip(target_before, online, strict=True))
    learner.tau = 0.25
    learner.sync_target()
    for t0, t, o in zip(target_before, learner.target_network.parameters(), online, strict=True):
        torch.testing.assert_close(t, t0 + 0.25 * (o - t0))
    learner.tau = 1.0
    learner.sync_target()
    for t, o in zip(learner.target_network.parameters(), online, strict=True):
        assert torch.equal(t, o)
    assert all(not p.requires_grad for p in learner.target_network.parameters())


def test_metrics_are_means_since_last_call_and_detect_divergence() -> None:
    learner = _learner()
    assert learner.metrics() is None
    losses = [learner.update(_batch(seed=i)).item() for i in range(4)]
    m = learner.metrics()
    assert m is not None and m.updates == 4
    assert m.td_loss == pytest.approx(sum(losses) / 4, rel=1e-5)
    assert learner.metrics() is None
    bad = _batch()
    learner.update(Batch(*bad[:2], bad.rewards * float("nan"), *bad[3:]))
    with pytest.raises(NonFiniteError, match="non-finite"):
        learner.metrics()
    assert not learner.parameters_finite()


def test_optimizer_state_round_trip() -> None:
    a, b = _learner(), _learner()
    for i in range(3):
        a.update(_batch(seed=i))
    b.q_network.load_state_dict(a.q_network.state_dict())
    b.target_network.load_state_dict(a.target_network.state_dict())
    # Through bytes, as in a checkpoint: an in-memory state dict shares Adam's moment tensors.
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b.load_state_dict(torch.load(buf, weights_only=True))
    torch.manual_seed(9)
    a.update(_batch(seed=7))
    torch.manual_seed(9)
    b.update(_batch(seed=7))
    for pa, pb in zip(a.q_network.parameters(), b.q_network.parameters(), strict=True):
        assert torch.equal(pa, pb)
    assert b.updates == 4


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_update_keeps_device_and_dtype(device: str, dtype: torch.dtype) -> None:
    learner = _learner(device, dtype)
    loss = learner.update(_batch(device=device, dtype=dtype))
    assert loss.device.type == device and loss.dtype == dtype
    for p in learner.q_network.parameters():
        assert p.device.type == device and p.dtype == dtype


def test_update_on_meta_creates_nothing_elsewhere() -> None:
    learner = _learner("meta")
    loss = learner.update(_batch(device="meta"))
    assert loss.device.type == "meta"
    learner.sync_target()
    assert all(p.device.type == "meta" for p in learner.target_network.parameters())
