"""Learner: TD target semantics, double DQN, target sync, noise resets, metrics, devices."""

from __future__ import annotations

import copy
import warnings
import io
import re
import pytest
import numpy as np
import torch
from conftest import DEVICES

from agent.learner import Learner, NonFiniteError
from agent.objectives import td_target
from agent.networks import QNetwork
from agent.noisy import noisy_layers
from agent.replay import Batch

BACKENDS = ["torch", "numpy"]


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
    # The autograd path, through its loss seam; the numpy path is held equal to it below.
    learner = _learner(lr=1e-12, backend="torch")
    online, target = learner.q_network, learner.target_network
    # Make the two networks disagree strongly about the best next action.
    with torch.no_grad():
        for p in target.parameters():
            p.mul_(-1.0)
    batch = _batch(b=64)
    captured: dict[str, torch.Tensor] = {}
    original = learner.objective.loss.torch

    def spy(q_taken: torch.Tensor, target_values: torch.Tensor) -> torch.Tensor:
        captured["target"] = target_values
        return original(q_taken, target_values)

    learner.objective.loss.torch = spy  # type: ignore[method-assign]
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


@pytest.mark.parametrize("backend", BACKENDS)
def test_update_reduces_loss_on_a_fixed_batch_and_touches_mu_and_sigma(backend: str) -> None:
    learner = _learner(lr=3e-3, max_grad_norm=None, backend=backend)
    assert learner.backend == backend
    batch = _batch(b=32)
    before = [p.detach().clone() for p in learner.q_network.parameters()]
    losses = []
    for _ in range(200):
        learner.update(batch)
        metrics = learner.metrics()
        assert metrics is not None
        losses.append(metrics.td_loss)
    assert sum(losses[-20:]) / 20 < 0.7 * sum(losses[:20]) / 20
    for b, p in zip(before, learner.q_network.parameters(), strict=True):
        assert not torch.equal(b, p)
    assert learner.updates == 200


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_clipping_bounds_the_step(backend: str) -> None:
    learner = _learner(lr=1.0, max_grad_norm=1e-3, backend=backend)
    batch = _batch()
    big = Batch(*batch[:2], batch.rewards * 1e6, *batch[3:])
    learner.update(big)
    # Adam normalises the step anyway; check the gradient norm itself was clipped.
    total = torch.sqrt(sum(p.grad.pow(2).sum() for p in learner.q_network.parameters()))
    assert total <= 1e-3 * 1.01


def test_update_uses_fresh_noise_and_leaves_the_acting_noise_in_place() -> None:
    # Forward hooks see the autograd path's noise; the numpy path draws the same (below).
    learner = _learner(backend="torch")
    online, target = (noisy_layers(n)[0] for n in (learner.q_network, learner.target_network))
    seen: dict[str, torch.Tensor] = {}
    online.register_forward_hook(lambda m, i, o: seen.update(online=m.weight_epsilon.clone()))
    target.register_forward_hook(lambda m, i, o: seen.update(target=m.weight_epsilon.clone()))
    buffers = [b for layer in noisy_layers(learner.q_network) for b in layer.buffers()]
    acting = [b.clone() for b in buffers]
    pointers = [b.data_ptr() for b in buffers]
    target_before = target.weight_epsilon.clone()
    learner.update(_batch())
    # The update ran on noise of its own, independent for the two networks ...
    assert not torch.equal(seen["online"], acting[1])
    assert not torch.equal(seen["target"], target_before)
    assert not torch.equal(seen["online"], seen["target"])
    # ... and left the acting noise as it was, in place (a captured graph reads those
    # addresses).
    after = [b for layer in noisy_layers(learner.q_network) for b in layer.buffers()]
    assert all(torch.equal(a, b) for a, b in zip(acting, after, strict=True))
    assert [b.data_ptr() for b in after] == pointers


@pytest.mark.parametrize("backend", BACKENDS)
def test_with_update_noise_0_a_step_is_the_mean_network_s_step(backend: str) -> None:
    """update_noise=0: the same step as a noise-free learner, no noise drawn, sigmas
    unchanged, and the acting noise (switch and buffers) as it was."""
    torch.manual_seed(0)
    net = QNetwork((4,), 2, (16, 16), noisy_layers="all", dtype=torch.float64)
    acting = Learner(net, copy.deepcopy(net), lr=1e-2, update_noise=0.0, backend=backend)
    plain_net = copy.deepcopy(net)
    plain = Learner(plain_net, copy.deepcopy(net), lr=1e-2, noise=False, backend=backend)
    sigmas = {k: v.clone() for k, v in net.state_dict().items() if "sigma" in k}
    noise = [b.clone() for b in net.buffers()]
    for i in range(5):
        rng = torch.get_rng_state()
        acting.update(_batch(dtype=torch.float64, seed=i))
        assert torch.equal(torch.get_rng_state(), rng)  # no noise was drawn
        plain.update(_batch(dtype=torch.float64, seed=i))
    torch.testing.assert_close(net.state_dict(), plain_net.state_dict(), rtol=0, atol=0)
    assert all(torch.equal(net.state_dict()[k], v) for k, v in sigmas.items())
    assert all(layer.noise_enabled for layer in noisy_layers(net))  # it still acts noisily
    assert all(torch.equal(a, b) for a, b in zip(noise, net.buffers(), strict=True))
    # The learner switches noise off for its updates only, never in the networks it got.
    assert all(layer.noise_enabled for layer in noisy_layers(acting.target_network))
    assert all(layer.noise_enabled for layer in noisy_layers(plain_net))


@pytest.mark.parametrize("double_dqn", [True, False])
def test_the_backward_runs_over_the_batch_rows_it_learns_from_only(double_dqn: bool) -> None:
    # The online network runs with autograd on obs alone; next_obs's values (double DQN's
    # chooser) without it, and not at all without double DQN: no backward over a zero half.
    learner = _learner(backend="torch", double_dqn=double_dqn)
    calls: list[tuple[int, bool]] = []
    learner.q_network.register_forward_hook(
        lambda m, i, o: calls.append((i[0].shape[0], o.requires_grad))
    )
    learner.update(_batch(b=16))
    assert calls == [(16, True)] + ([(16, False)] if double_dqn else [])


def test_negative_update_noise_is_refused() -> None:
    with pytest.raises(ValueError, match="update_noise must be >= 0"):
        _learner(update_noise=-0.5)


def test_update_noise_scales_the_noise_the_update_runs_with() -> None:
    # Forward hooks see the noise of the update: half of what the same draws give at 1.
    seen: dict[float, list[torch.Tensor]] = {}
    for scale in (1.0, 0.5):
        learner = _learner(backend="torch", update_noise=scale)
        layers = [noisy_layers(learner.q_network)[0], noisy_layers(learner.target_network)[0]]
        for layer in layers:
            layer.register_forward_hook(
                lambda m, i, o, s=scale: seen.setdefault(s, []).append(
                    torch.cat([m.weight_epsilon.flatten(), m.bias_epsilon])
                )
            )
        torch.manual_seed(7)
        learner.update(_batch())
    # online (obs), target, online again (next_obs: double DQN's chooser)
    assert len(seen[1.0]) == len(seen[0.5]) == 3
    for full, half in zip(seen[1.0], seen[0.5], strict=True):
        torch.testing.assert_close(half, 0.5 * full)


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


@pytest.mark.filterwarnings("error")  # divergence is reported by metrics(), not by warnings
@pytest.mark.parametrize("backend", BACKENDS)
def test_metrics_are_means_since_last_call_and_detect_divergence(backend: str) -> None:
    learner = _learner(backend=backend)
    assert learner.metrics() is None
    # The update returns |TD errors|; the Huber loss (delta 1) is their mean under huber.
    errors = [learner.update(_batch(seed=i)) for i in range(4)]
    losses = [torch.where(e <= 1, 0.5 * e * e, e - 0.5).mean().item() for e in errors]
    m = learner.metrics()
    assert m is not None and m.updates == 4
    assert m.td_loss == pytest.approx(sum(losses) / 4, rel=1e-5)
    assert learner.metrics() is None
    bad = _batch()
    learner.update(Batch(*bad[:2], bad.rewards * float("nan"), *bad[3:]))
    with pytest.raises(NonFiniteError, match="non-finite"):
        learner.metrics()
    assert not learner.parameters_finite()


@pytest.mark.parametrize("backend", BACKENDS)
def test_optimizer_state_round_trip(backend: str) -> None:
    a, b = _learner(backend=backend), _learner(backend=backend)
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


@pytest.mark.parametrize("update_noise", [1.0, 0.5, 0.0])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_update_keeps_device_and_dtype(
    device: str, dtype: torch.dtype, update_noise: float
) -> None:
    learner = _learner(device, dtype, update_noise=update_noise)
    errors = learner.update(_batch(device=device, dtype=dtype))
    assert errors.device.type == device and errors.dtype == dtype and errors.shape == (16,)
    for p in learner.q_network.parameters():
        assert p.device.type == device and p.dtype == dtype


@pytest.mark.parametrize("update_noise", [1.0, 0.5, 0.0])
def test_update_on_meta_creates_nothing_elsewhere(update_noise: float) -> None:
    learner = _learner("meta", update_noise=update_noise)
    errors = learner.update(_batch(device="meta"))
    assert errors.device.type == "meta"
    learner.sync_target()
    assert all(p.device.type == "meta" for p in learner.target_network.parameters())


# --------------------------------------------------------------------------- #
# The numpy path computes the autograd path's update                          #
# --------------------------------------------------------------------------- #


def _twin_learners(net: torch.nn.Module, **kw) -> tuple[Learner, Learner]:
    """Two learners on identical copies of ``net``: autograd and numpy."""
    learners = []
    for backend in BACKENDS:
        online = copy.deepcopy(net)
        learners.append(Learner(online, copy.deepcopy(online), backend=backend, **kw))
    return learners[0], learners[1]


def _assert_same_learners(a: Learner, b: Learner) -> None:
    tol = {"rtol": 1e-9, "atol": 1e-11}
    for pa, pb in zip(a.q_network.parameters(), b.q_network.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, **tol)
    for ba, bb in zip(a.q_network.buffers(), b.q_network.buffers(), strict=True):
        assert torch.equal(ba, bb)  # the same acting noise, put back
    sa, sb = a.optimizer.state_dict(), b.optimizer.state_dict()
    torch.testing.assert_close(sa["exp_avg"], sb["exp_avg"], **tol)
    torch.testing.assert_close(sa["exp_avg_sq"], sb["exp_avg_sq"], **tol)
    assert torch.equal(sa["steps"], sb["steps"]) and a.updates == b.updates


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"double_dqn": False},
        {"loss": "mse", "max_grad_norm": None},
        {"huber_delta": 0.05, "max_grad_norm": 0.5},  # the Huber's linear part and clipping
        {"noise": False},
        {"update_noise": 0.0},
        {"update_noise": 0.5},
        {"tau": 0.1},
    ],
    ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "defaults",
)
@pytest.mark.parametrize("dueling", [False, True])
@pytest.mark.parametrize("noisy", ["all", "last", "none"])
def test_numpy_updates_equal_autograd_updates(noisy: str, dueling: bool, kw: dict) -> None:
    """Float64, 12 updates and target syncs: same parameters, moments, noise, metrics."""
    _numpy_equals_autograd(noisy, dueling, kw)


@pytest.mark.parametrize("weighted", [False, True], ids=["uniform", "importance-weights"])
@pytest.mark.parametrize("kw", [{}, {"double_dqn": False, "max_grad_norm": 0.5}], ids=str)
@pytest.mark.parametrize("dueling", [False, True, "linear"])
@pytest.mark.parametrize("num_atoms", [1, 7], ids=["values", "c51"])
def test_numpy_updates_equal_autograd_updates_for_every_head_and_weights(
    num_atoms: int, dueling: bool | str, kw: dict, weighted: bool
) -> None:
    """The C51 head's numpy gradient (and the importance weights of prioritized replay)
    against autograd, to 1e-10 in float64."""
    _numpy_equals_autograd("all", dueling, kw, num_atoms=num_atoms, weighted=weighted)


def _numpy_equals_autograd(
    noisy: str, dueling: bool | str, kw: dict, num_atoms: int = 1, weighted: bool = False
) -> None:
    """``dueling``: False, True (a hidden layer per stream) or ``"linear"`` (linear streams)."""
    torch.manual_seed(0)
    streams = "linear" if dueling == "linear" else "hidden"
    net = QNetwork((4,), 3, (16, 8), noisy_layers=noisy, dueling=bool(dueling),
                   dueling_streams=streams, dtype=torch.float64, num_atoms=num_atoms,
                   v_min=-3.0, v_max=3.0)  # fmt: skip
    a, b = _twin_learners(net, lr=1e-2, **kw)
    assert (a.backend, b.backend) == ("torch", "numpy")
    with torch.no_grad():  # make the online and target nets disagree (double DQN matters)
        for learner in (a, b):
            for p in learner.target_network.parameters():
                p.mul_(-1.0)
    for i in range(12):
        batch = _batch(b=32, dtype=torch.float64, seed=i)
        weights = torch.rand(32, dtype=torch.float64) + 0.1 if weighted else None
        batch = batch._replace(actions=batch.actions % 3, weights=weights)
        errors = []
        for learner in (a, b):
            torch.manual_seed(100 + i)  # both draw their update noise from here
            errors.append(learner.update(batch))
            assert errors[-1].dtype == torch.float64 and errors[-1].shape == (32,)
        torch.testing.assert_close(errors[0], errors[1], rtol=1e-9, atol=1e-12)
        if i % 4 == 3:
            a.sync_target()
            b.sync_target()
    _assert_same_learners(a, b)
    ma, mb = a.metrics(), b.metrics()
    assert ma is not None and mb is not None
    assert ma.td_loss == pytest.approx(mb.td_loss, rel=1e-9)
    assert ma.q_values == pytest.approx(mb.q_values, rel=1e-9)


@pytest.mark.parametrize("noisy", ["all", "none"])
def test_numpy_updates_equal_autograd_updates_for_the_der_network(noisy: str) -> None:
    """Data-efficient Rainbow (convolutions over uint8 frames, noisy dueling C51 heads,
    importance weights): the numpy update against autograd to 1e-10 in float64."""
    torch.manual_seed(0)
    net = QNetwork((4, 30, 30), 3, (16,), torso="der", dueling=True, noisy_layers=noisy,
                   num_atoms=11, v_min=-3.0, v_max=3.0, input_scale=255.0,
                   dtype=torch.float64)  # fmt: skip
    a, b = _twin_learners(net, lr=1e-3, noise=noisy == "all")
    assert (a.backend, b.backend) == ("torch", "numpy")
    for i in range(6):
        g = torch.Generator().manual_seed(i)
        batch = _batch(b=8, dtype=torch.float64, seed=i)._replace(
            obs=torch.randint(0, 256, (8, 4, 30, 30), dtype=torch.uint8, generator=g),
            next_obs=torch.randint(0, 256, (8, 4, 30, 30), dtype=torch.uint8, generator=g),
            actions=torch.randint(0, 3, (8,), generator=g),
            weights=torch.rand(8, dtype=torch.float64, generator=g) + 0.1,
        )
        _step_twins(a, b, batch, i)
    _assert_same_learners(a, b)


def _step_twins(a: Learner, b: Learner, batch: Batch, i: int) -> None:
    """Update step ``i`` of two twin learners on ``batch`` under the same noise: the same
    per-sample errors to 1e-9 (float64); the targets synced after step 3."""
    errors = []
    for learner in (a, b):
        torch.manual_seed(100 + i)  # both draw their update noise from here
        errors.append(learner.update(batch))
    torch.testing.assert_close(errors[0], errors[1], rtol=1e-9, atol=1e-12)
    if i == 3:
        a.sync_target()
        b.sync_target()


def test_numpy_updates_leave_frozen_parameters_alone_as_autograd_does() -> None:
    torch.manual_seed(0)
    net = QNetwork((4,), 2, (16, 16), dtype=torch.float64)
    net.head[0].weight_mu.requires_grad_(False)  # a frozen first layer (no bias frozen)
    a, b = _twin_learners(net, lr=1e-2)
    frozen = b.q_network.head[0].weight_mu.clone()
    for i in range(3):
        for learner in (a, b):
            torch.manual_seed(i)
            learner.update(_batch(dtype=torch.float64, seed=i))
    assert torch.equal(b.q_network.head[0].weight_mu, frozen)
    _assert_same_learners(a, b)


def test_numpy_update_leaves_the_acting_noise_in_place() -> None:
    learner = _learner(backend="numpy")
    buffers = [b for layer in noisy_layers(learner.q_network) for b in layer.buffers()]
    acting = [b.clone() for b in buffers]
    pointers = [b.data_ptr() for b in buffers]
    learner.update(_batch())
    assert all(torch.equal(a, b) for a, b in zip(acting, buffers, strict=True))
    assert [b.data_ptr() for b in learner.q_network.buffers()] == pointers


class OptsOut(torch.nn.Module):
    """A user's network that asks to stay in PyTorch."""

    numpy_backend_opt_out = "it says so"

    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l1(x)


def test_auto_backend_is_numpy_for_cpu_networks_and_autograd_elsewhere() -> None:
    torch.manual_seed(0)
    cnn = QNetwork((4, 84, 84), 3, (32,), input_scale=255.0)  # the Nature CNN
    out = OptsOut()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the expected fallbacks are silent
        assert _learner().backend == "numpy"
        assert Learner(cnn, copy.deepcopy(cnn), lr=1e-3).backend == "numpy"
        assert _learner("meta").backend == "torch"
        assert _learner(dtype=torch.bfloat16).backend == "torch"
        assert Learner(out, copy.deepcopy(out), lr=1e-3).backend == "torch"
        assert _learner(backend="torch").backend == "torch"
    with pytest.raises(ValueError, match=r"numpy learner backend cannot run OptsOut \(OptsOut"):
        Learner(out, copy.deepcopy(out), lr=1e-3, backend="numpy")
    with pytest.raises(ValueError, match="backend must be"):
        _learner(backend="jax")


class LayerNormed(torch.nn.Module):
    """A user's network with a layer the numpy backend does not compile."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(4, 16), torch.nn.LayerNorm(16), torch.nn.ReLU(), torch.nn.Linear(16, 2)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def test_auto_backend_names_what_did_not_compile_once_and_learns_with_autograd() -> None:
    reason = "LayerNormed (module LayerNorm at body.1)"
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")  # the once is the learner's own, not the filter's
        learners = []
        for _ in range(2):
            torch.manual_seed(0)
            net = LayerNormed()
            learners.append(Learner(net, copy.deepcopy(net), lr=1e-2))
    assert [str(w.message) for w in said if w.category is RuntimeWarning] == [
        f"the numpy backend cannot compile {reason}; autograd computes the updates instead "
        "(backend='torch', --set learner_backend=torch in a run, chooses it without this warning)"
    ]
    assert [learner.backend for learner in learners] == ["torch", "torch"]
    before = [p.detach().clone() for p in learners[0].q_network.parameters()]
    learners[0].update(_batch())
    after = list(learners[0].q_network.parameters())
    assert all(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    with pytest.raises(ValueError, match=re.escape(f"numpy learner backend cannot run {reason}")):
        Learner(net, copy.deepcopy(net), lr=1e-2, backend="numpy")


def test_a_compiler_bug_is_not_hidden_by_the_auto_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    # A bug would otherwise move the run to autograd silently and change its trajectory.
    from agent.numpy_backend import program

    def broken(*args: object, **kwargs: object) -> None:
        raise IndexError("list index out of range")

    monkeypatch.setattr(program, "Linear", broken)  # the layer builder the compiler calls
    with pytest.raises(IndexError, match="out of range"):
        _learner()
    assert _learner(backend="torch").backend == "torch"  # it never calls the compiler


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_update_never_writes_the_acting_noise(backend: str) -> None:
    # The online network's own noise buffers belong to the selector: an update draws its
    # noise into buffers of its own, so nothing is saved and put back (an in-place write
    # would bump a buffer's version counter, even if it restored the values).
    from agent.noisy import noisy_layers

    learner = _learner(backend=backend)
    acting = [b for layer in noisy_layers(learner.q_network) for b in layer.buffers()]
    versions = [b._version for b in acting]
    for seed in range(3):
        learner.update(_batch(seed=seed))
    assert [b._version for b in acting] == versions


@pytest.mark.parametrize("kind", ["huber", "mse"])
def test_the_td_loss_is_one_definition_for_both_backends(kind: str) -> None:
    from agent.objectives import TDLoss

    loss = TDLoss(kind, delta=1.0)  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(0)
    q = (torch.randn(64, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    target = torch.randn(64, generator=g, dtype=torch.float64) * 3  # inside and outside delta
    value = loss.torch(q, target)
    value.backward()
    value_np, grad_np = loss.numpy(q.detach().numpy(), target.numpy())
    assert value_np == pytest.approx(value.detach().item(), rel=1e-12)
    np.testing.assert_allclose(grad_np, q.grad.numpy(), rtol=1e-12, atol=1e-15)


def test_a_capture_that_fails_warns_once_and_leaves_eager_updates_unchanged() -> None:
    from agent.learner import CapturedUpdate

    def refuse(fn, static_inputs, generators=()):  # type: ignore[no-untyped-def]
        fn(*static_inputs)  # a warm-up ran before the capture failed
        raise RuntimeError("operation not permitted when stream is capturing")

    eager, graphed = _learner(backend="torch"), _learner(backend="torch")
    update = CapturedUpdate(graphed, refuse)
    with pytest.warns(RuntimeWarning, match="could not be captured.*capture_graph=false"):
        torch.manual_seed(3)
        update(_batch(seed=0))
    torch.manual_seed(3)
    eager.update(_batch(seed=0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second attempt, no second warning
        for seed in (1, 2):
            torch.manual_seed(seed)
            update(_batch(seed=seed))
            torch.manual_seed(seed)
            eager.update(_batch(seed=seed))
    _assert_same_learners(eager, graphed)


# --------------------------------------------------------------------------- #
# The compiled update (torch.compile) computes the same update                #
# --------------------------------------------------------------------------- #


def _image_batch(i: int, shape: tuple[int, ...], n: int, dtype: torch.dtype) -> Batch:
    """A batch of ``n`` random uint8 frames of ``shape`` (binary planes for MinAtar's)."""
    g = torch.Generator().manual_seed(i)

    def frames() -> torch.Tensor:
        if shape[-1] > 10:
            return torch.randint(0, 256, (n, *shape), dtype=torch.uint8, generator=g)
        return (torch.rand((n, *shape), generator=g) < 0.1).to(dtype)

    return Batch(frames(), torch.randint(0, 3, (n,), generator=g),
                 torch.randn(n, generator=g, dtype=dtype), frames(),
                 (torch.rand(n, generator=g) < 0.2).to(dtype), torch.full((n,), 0.97, dtype=dtype),
                 None, torch.rand(n, generator=g, dtype=dtype) + 0.1)  # fmt: skip


def test_compiled_updates_equal_the_numpy_engines_for_the_der_network() -> None:
    """The DER network (its convolutions, noisy dueling C51 heads, importance weights),
    float64: six compiled updates and a target sync equal the numpy engine's to 1e-9, and
    the run is told in one line how long compiling took."""
    torch.manual_seed(0)
    net = QNetwork((4, 30, 30), 3, (16,), torso="der", dueling=True, noisy_layers="all",
                   num_atoms=11, v_min=-3.0, v_max=3.0, input_scale=255.0,
                   dtype=torch.float64)  # fmt: skip
    lines: list[str] = []
    a = Learner(copy.deepcopy(net), copy.deepcopy(net), lr=1e-3, backend="numpy")
    b = Learner(copy.deepcopy(net), copy.deepcopy(net), lr=1e-3, backend="compile",
                announce=lines.append)  # fmt: skip
    for i in range(6):
        _step_twins(a, b, _image_batch(i, (4, 30, 30), 8, torch.float64), i)
    _assert_same_learners(a, b)
    assert b.backend == "compile" and len(lines) == 1 and "compiled the update in" in lines[0]


def test_where_compiling_fails_the_run_is_told_once_and_the_update_runs_eagerly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No C++ compiler (inductor's is named but not there): one line that says why, then
    the same updates as the autograd backend's, to the bit."""
    import torch._inductor.config as inductor

    monkeypatch.setattr(inductor.cpp, "cxx", (None, "/nonexistent/bin/g++"))
    torch._dynamo.reset()  # nothing compiled earlier in this process is reused
    torch.manual_seed(0)
    net = QNetwork((4, 10, 10), 3, (16,), torso="minatar", dueling=True, noisy_layers="all")
    lines: list[str] = []
    a = Learner(copy.deepcopy(net), copy.deepcopy(net), lr=1e-3, backend="torch")
    b = Learner(copy.deepcopy(net), copy.deepcopy(net), lr=1e-3, backend="compile",
                announce=lines.append)  # fmt: skip
    for i in range(3):
        batch = _image_batch(i, (4, 10, 10), 8, torch.float32)
        for learner in (a, b):
            torch.manual_seed(100 + i)
            learner.update(batch)
    assert len(lines) == 1 and "could not be compiled" in lines[0]
    assert "C++ compiler" in lines[0] and "\n" not in lines[0]
    assert b.backend == "torch"
    for pa, pb in zip(a.q_network.parameters(), b.q_network.parameters(), strict=True):
        assert torch.equal(pa, pb)


def test_the_compile_backend_runs_on_a_cpu_only() -> None:
    net = QNetwork((4,), 2, (8,), device="meta")
    with pytest.raises(ValueError, match="runs on a CPU"):
        Learner(net, copy.deepcopy(net), lr=1e-3, backend="compile")



def test_an_autocast_update_computes_its_loss_in_bfloat16_and_steps_in_float32() -> None:
    """autocast=bfloat16: the loss's products run in bfloat16 (so its errors differ from
    the float32 update's, a little), the parameters, gradients and Adam stay float32."""
    torch.manual_seed(0)
    net = QNetwork((4, 10, 10), 3, (16,), torso="minatar", dueling=True, noisy_layers="all")
    a = Learner(copy.deepcopy(net), copy.deepcopy(net), lr=1e-3, backend="torch")
    b = Learner(copy.deepcopy(net), copy.deepcopy(net), lr=1e-3, backend="torch",
                autocast=torch.bfloat16)  # fmt: skip
    batch = _image_batch(0, (4, 10, 10), 8, torch.float32)
    errors = []
    for learner in (a, b):
        torch.manual_seed(100)
        errors.append(learner.update(batch))
    assert not torch.equal(errors[0], errors[1])
    torch.testing.assert_close(errors[1].float(), errors[0], rtol=0.05, atol=0.05)
    assert all(p.dtype == torch.float32 for p in b.q_network.parameters())
    assert b.optimizer.flat_grad.dtype == torch.float32
    with pytest.raises(ValueError, match="autocast applies to the torch and compile"):
        Learner(copy.deepcopy(net), copy.deepcopy(net), lr=1e-3, backend="numpy",
                autocast=torch.bfloat16)  # fmt: skip
    # auto has no numpy engine to take under autocast: the compiled update on a CPU, and
    # autograd on any other device.
    auto = Learner(copy.deepcopy(net), copy.deepcopy(net), lr=1e-3, autocast=torch.bfloat16)
    assert auto.backend == "compile"
    meta = QNetwork((4,), 2, (8,), device="meta")
    elsewhere = Learner(meta, copy.deepcopy(meta), lr=1e-3, autocast=torch.bfloat16)
    assert elsewhere.backend == "torch"


class _QPenaltyLearner(Learner):
    """A loss term of one's own, in one place: the TD loss plus a penalty on the taken
    actions' Q values (an auxiliary term, as a researcher would add one)."""

    def loss(self, batch):  # type: ignore[no-untyped-def]
        loss, errors, q_taken = super().loss(batch)
        return loss + 0.5 * (q_taken**2).mean(), errors, q_taken


@pytest.mark.parametrize("backend", ["auto", "torch", "compile"])
def test_an_auxiliary_term_written_once_is_learned_by_every_update(backend: str) -> None:
    """The term, added in one method, reaches the gradient whichever update runs: the
    step equals an eager step on the TD loss plus the term (autograd of the whole); auto
    never picks the numpy engine, whose gradient would leave the term out."""
    torch.manual_seed(0)
    net = QNetwork((4, 10, 10), 3, (16,), torso="minatar", noisy_layers="all",
                   dtype=torch.float64)  # fmt: skip
    aux = _QPenaltyLearner(copy.deepcopy(net), copy.deepcopy(net), lr=1e-2, backend=backend,
                           announce=lambda _: None)  # fmt: skip
    plain = Learner(copy.deepcopy(net), copy.deepcopy(net), lr=1e-2, backend="torch")
    assert aux.backend == ("compile" if backend == "compile" else "torch")
    batch = _image_batch(0, (4, 10, 10), 8, torch.float64)
    torch.manual_seed(100)
    aux.update(batch)
    # By hand: the same noise, the whole loss's gradient, one Adam step on it.
    torch.manual_seed(100)
    plain.draw_update_noise()
    plain.optimizer.zero_grad()
    loss, _, q_taken = plain.loss(batch)
    (loss + 0.5 * (q_taken**2).mean()).backward()
    plain.optimizer.clip_grad_norm_(10.0)
    plain.optimizer.step()
    for pa, pb in zip(aux.q_network.parameters(), plain.q_network.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="cannot run _QPenaltyLearner's own loss"):
        _QPenaltyLearner(copy.deepcopy(net), copy.deepcopy(net), lr=1e-2, backend="numpy")

@pytest.mark.slow
@pytest.mark.parametrize(("torso", "shape"), [("der", (4, 84, 84)), ("minatar", (4, 10, 10))])
def test_a_compiled_float32_update_is_within_1e_4_of_the_numpy_engines(torso, shape) -> None:
    """The networks as `der` and the MinAtar config build them, float32, batch 32: from
    the same state, batch and noise, each parameter's change differs from the numpy
    engine's by under 1e-4 of its norm (measured: under 2e-5, AMD EPYC), at ten states
    along a run of the numpy engine."""
    torch.manual_seed(0)
    der = torso == "der"
    net = QNetwork(shape, 3, (256,) if der else (128,), torso=torso, dueling=True,
                   noisy_layers="all", sigma0=0.1, num_atoms=51 if der else 1, v_min=-10.0,
                   v_max=10.0, input_scale=255.0 if der else 1.0)  # fmt: skip
    a = Learner(copy.deepcopy(net), copy.deepcopy(net), lr=1e-4, backend="numpy")
    b = Learner(copy.deepcopy(net), copy.deepcopy(net), lr=1e-4, backend="compile",
                announce=lambda _: None)  # fmt: skip
    for i in range(10):
        b.q_network.load_state_dict(a.q_network.state_dict())
        b.target_network.load_state_dict(a.target_network.state_dict())
        b.optimizer.load_state_dict(a.optimizer.state_dict())
        before = [p.detach().clone() for p in a.q_network.parameters()]
        batch = _image_batch(i, shape, 32, torch.float32)
        for learner in (a, b):
            torch.manual_seed(100 + i)
            learner.update(batch)
        for pa, pb, p0 in zip(a.q_network.parameters(), b.q_network.parameters(), before,
                              strict=True):  # fmt: skip
            assert ((pa - pb).norm() <= 1e-4 * (pa - p0).norm()).item()
    assert b.backend == "compile"
