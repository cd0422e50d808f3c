"""Image seeds stacked in one module: convolutional torsos (DER, Nature, MinAtar) and their
updates, each seed computing what its own network and learner would."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from agent.learner import Learner
from agent.networks import QNetwork
from agent.replay import Batch
from agent.seeds import (
    NoiseDraw,
    SeedLearner,
    StackedConv2d,
    seed_state_dict,
    stack_networks,
    stacked_noisy_layers,
)
from conftest import DEVICES, OpRecorder
from test_seeds import _copy_noise, _generators, _same_noise_as

S = 3

# Each torso with the head it trains with: DER's noisy dueling C51 head of 256, the Nature
# CNN under a layer of 512 (DrQ(epsilon)'s, here not dueling), MinAtar's under 128.
NETWORKS = {
    "der": ((4, 84, 84), {"hidden_sizes": (256,), "dueling": True, "num_atoms": 51}),
    "der-q": ((4, 84, 84), {"hidden_sizes": (256,), "dueling": True}),
    "nature": ((4, 84, 84), {"hidden_sizes": (512,)}),
    "minatar": ((4, 10, 10), {"hidden_sizes": (128,)}),
}


def _image_nets(
    name: str, noisy: str, dtype: torch.dtype = torch.float32, device: str = "cpu",
    seeds: int = S,
) -> list[QNetwork]:
    shape, kw = NETWORKS[name]
    torso = name.split("-")[0]
    scale = None if torso == "minatar" else 255.0  # MinAtar's channels are 0/1 already
    nets = []
    for i in range(seeds):
        torch.manual_seed(200 + i)
        nets.append(QNetwork(shape, 6, torso=torso, noisy_layers=noisy, input_scale=scale,
                             dtype=dtype, device=device, **kw))  # type: ignore[arg-type]  # fmt: skip
    return nets


def _frames(name: str, rows: int, g: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    shape, _ = NETWORKS[name]
    if name == "minatar":
        return (torch.rand(rows, *shape, generator=g) < 0.3).to(dtype)
    return torch.randint(0, 256, (rows, *shape), generator=g, dtype=torch.uint8)


def _torso_features(net: nn.Module, obs: torch.Tensor) -> torch.Tensor:
    x = obs.to(next(net.parameters()).dtype)
    if net.input_scale is not None:  # type: ignore[union-attr]
        x = x / net.input_scale  # type: ignore[operator]
    return net.torso(x)  # type: ignore[operator]


CASES = [(name, noisy) for name in NETWORKS for noisy in ("all", "none")]


@pytest.mark.parametrize(("name", "noisy"), CASES, ids=[f"{n}-{k}" for n, k in CASES])
@pytest.mark.parametrize("rows", [1, 32], ids=["acting", "batch"])
def test_a_stacked_image_forward_is_every_seeds_own_forward(
    name: str, noisy: str, rows: int
) -> None:
    """fp32: the torso's features are the seed's own to the bit; the whole output is
    within fp32 rounding (the stacked noisy layers form the noisy weight in two roundings,
    NoisyLinear in one fused addcmul; the head's batched matmuls add their own last bits).
    float64: within 1e-12, as the MLP stacks are."""
    for dtype, tol in ((torch.float32, None), (torch.float64, 1e-12)):
        nets = _image_nets(name, noisy, dtype)
        stacked = stack_networks(nets)
        NoiseDraw(stacked_noisy_layers(stacked))(_generators())
        _copy_noise(stacked, nets)
        g = torch.Generator().manual_seed(rows)
        x = torch.stack([_frames(name, rows, g, dtype) for _ in range(S)])  # (S, B, C, H, W)
        with torch.no_grad():
            out = stacked(x)
            features = _torso_features(stacked, x)
            assert out.shape[:2] == (S, rows) and features.dim() == 3  # the seed axis kept
            for i, net in enumerate(nets):
                assert torch.equal(features[i], _torso_features(net, x[i]))
                if tol is None:
                    torch.testing.assert_close(out[i], net(x[i]), rtol=1e-5, atol=1e-6)
                else:
                    torch.testing.assert_close(out[i], net(x[i]), rtol=tol, atol=tol)


def test_an_image_seeds_state_dict_loads_into_its_own_network() -> None:
    nets = _image_nets("der", "all")
    stacked = stack_networks(nets)
    convs = [m for m in stacked.modules() if isinstance(m, StackedConv2d)]
    assert len(convs) == 2 and convs[0].weight.shape == (S, 32, 4, 5, 5)
    for i, net in enumerate(nets):
        fresh = _image_nets("der", "all", seeds=1)[0]
        fresh.load_state_dict(seed_state_dict(stacked, i))
        assert fresh.state_dict().keys() == net.state_dict().keys()
        for name, value in fresh.state_dict().items():
            assert torch.equal(value, net.state_dict()[name]), name


def _image_batches(name: str, b: int, seed: int, dtype: torch.dtype) -> list[Batch]:
    g = torch.Generator().manual_seed(seed)
    return [
        Batch(
            obs=_frames(name, b, g, dtype),
            actions=torch.randint(0, 6, (b,), generator=g),
            rewards=torch.randn(b, generator=g, dtype=dtype),
            next_obs=_frames(name, b, g, dtype),
            dones=(torch.rand(b, generator=g) < 0.3).to(dtype),
            discounts=torch.full((b,), 0.99**3, dtype=dtype),
            weights=torch.rand(b, generator=g, dtype=dtype),
        )
        for _ in range(S)
    ]


UPDATE_CASES = [("der", "all"), ("der", "none"), ("der-q", "all"), ("nature", "none"),
                ("nature", "all"), ("minatar", "all")]  # fmt: skip


@pytest.mark.parametrize(("name", "noisy"), UPDATE_CASES, ids=[f"{n}-{k}" for n, k in UPDATE_CASES])
def test_a_stacked_image_update_is_every_seeds_own_update(name: str, noisy: str) -> None:
    """Three updates and a target sync of S stacked image networks against S single
    torch learners fed the same batches and update noise (prioritized: weighted losses).

    fp32: DER without noise is the same to the bit (per-sample errors, parameters, Adam's
    moments). Elsewhere the convolutions are still each seed's own (forward and weight
    gradient: StackedConv2d), but the head's batched matmuls and the stacked noisy
    weights round otherwise than nn.Linear and NoisyLinear (the MLP stacks' own
    arithmetic): asserted within 2e-6 of each tensor's largest magnitude (3e-7 to 6e-7
    seen). float64: within 1e-10, as the MLP stacks are."""
    fp32 = _updates_apart(name, noisy, torch.float32)
    if (name, noisy) == ("der", "none"):
        assert fp32 == {"errors": 0.0, "params": 0.0, "moments": 0.0}
    assert max(fp32.values()) < 2e-6, fp32
    if name in ("der", "minatar"):  # float64 convolutions are slow: two torsos suffice
        fp64 = _updates_apart(name, noisy, torch.float64)
        assert max(fp64.values()) < 1e-10, fp64


def _updates_apart(name: str, noisy: str, dtype: torch.dtype) -> dict[str, float]:
    nets = _image_nets(name, noisy, dtype)
    stacked = stack_networks(nets)
    seeds = SeedLearner(stacked, copy.deepcopy(stacked), _generators(), lr=1e-3)
    singles = [Learner(n, copy.deepcopy(n), lr=1e-3, backend="torch") for n in nets]
    for i, single in enumerate(singles):
        _same_noise_as(seeds, single, i)
    worst = {"errors": 0.0, "params": 0.0, "moments": 0.0}
    for step in range(3):
        batches = _image_batches(name, 8, step, dtype)
        errors = seeds.update(Batch.stack(batches))
        for i, single in enumerate(singles):
            worst["errors"] = max(worst["errors"], _rel(errors[i], single.update(batches[i])))
        if step == 1:
            seeds.sync_target()
            for single in singles:
                single.sync_target()
    for i, single in enumerate(singles):
        state = seed_state_dict(stacked, i)
        for key, value in single.q_network.state_dict().items():
            worst["params"] = max(worst["params"], _rel(state[key], value))
    for state, single in zip(seeds.seed_states(), singles, strict=True):
        expected = single.state_dict()["optimizer"]
        for key in ("exp_avg", "exp_avg_sq"):
            worst["moments"] = max(worst["moments"], _rel(state["optimizer"][key], expected[key]))
    return worst


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["der", "nature", "minatar"])
def test_grouped_convolutions_compute_what_a_call_per_seed_does(
    name: str, device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One grouped convolution for all seeds (a GPU's choice) against a call per seed:
    the same forward and the same three updates, within fp32 rounding (the grouped weight
    gradient sums in another order) and within 1e-12 in float64."""
    # cuDNN's default TF32 convolutions round to 10 bits, whichever algorithm each call picks.
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    for dtype, tol in ((torch.float32, 2e-5), (torch.float64, 1e-12)):
        if device == "cuda" and dtype == torch.float64 and name == "nature":
            continue  # slow and adds nothing the others do not show
        worst = {"forward": 0.0, "errors": 0.0, "params": 0.0}
        stacks, learners = [], []
        for grouped in (False, True):
            stacked = stack_networks(_image_nets(name, "all", dtype, device), grouped_conv=grouped)
            generators = [torch.Generator(device=device).manual_seed(i) for i in range(S)]
            NoiseDraw(stacked_noisy_layers(stacked))(generators)
            stacks.append(stacked)
            learners.append(SeedLearner(stacked, copy.deepcopy(stacked), generators, lr=1e-3))
        g = torch.Generator().manual_seed(5)
        x = torch.stack([_frames(name, 4, g, dtype) for _ in range(S)]).to(device)
        with torch.no_grad():
            worst["forward"] = _rel(stacks[1](x), stacks[0](x))
            with OpRecorder() as recorder:
                stacks[1](x)
        convs = sum(isinstance(m, StackedConv2d) for m in stacks[1].modules())
        assert recorder.ops.count("aten.convolution") == convs  # one call a layer, not S
        for step in range(3):
            batch = Batch.stack(_image_batches(name, 8, step, dtype)).to(device)
            errors = [learner.update(batch) for learner in learners]
            worst["errors"] = max(worst["errors"], _rel(errors[1], errors[0]))
        for a, b in zip(stacks[1].parameters(), stacks[0].parameters(), strict=True):
            worst["params"] = max(worst["params"], _rel(a, b))
        assert max(worst.values()) < tol, (dtype, worst)


def test_a_stacked_update_under_autocast_computes_its_loss_in_bfloat16() -> None:
    """SeedLearner(autocast=bfloat16), as a group with learner_autocast runs it: the errors
    move a little from float32's, the parameters and Adam stay float32."""
    errors, learners = [], []
    for autocast in (None, torch.bfloat16):
        stacked = stack_networks(_image_nets("minatar", "all"))
        learner = SeedLearner(stacked, copy.deepcopy(stacked), _generators(), lr=1e-3,
                              autocast=autocast)  # fmt: skip
        errors.append(learner.update(Batch.stack(_image_batches("minatar", 8, 0, torch.float32))))
        learners.append(learner)
    assert not torch.equal(errors[0], errors[1])
    torch.testing.assert_close(errors[1], errors[0], rtol=0.05, atol=0.05)
    assert all(p.dtype == torch.float32 for p in learners[1].q_network.parameters())
    assert learners[1].optimizer.flat_grad.dtype == torch.float32


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest difference relative to the largest magnitude of ``b``."""
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / (scale if scale else 1.0)


@pytest.mark.parametrize("grouped", [False, True], ids=["per-seed", "grouped"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ["der", "nature", "minatar"])
def test_image_stacks_stay_on_meta_and_in_their_dtype(
    name: str, dtype: torch.dtype, grouped: bool
) -> None:
    """Every op of a stacked image network's forward and update runs on ``meta`` (nothing
    built on a hard-coded device) and in the networks' dtype, with either convolution."""
    nets = _image_nets(name, "all", dtype, device="meta")
    stacked = stack_networks(nets, grouped_conv=grouped)
    learner = SeedLearner(stacked, copy.deepcopy(stacked), _generators(), lr=1e-3)
    shape, _ = NETWORKS[name]
    frames = torch.uint8 if name != "minatar" else dtype
    batch = Batch(
        obs=torch.empty(S, 4, *shape, device="meta", dtype=frames),
        actions=torch.zeros(S, 4, device="meta", dtype=torch.long),
        rewards=torch.empty(S, 4, device="meta", dtype=dtype),
        next_obs=torch.empty(S, 4, *shape, device="meta", dtype=frames),
        dones=torch.empty(S, 4, device="meta", dtype=dtype),
        discounts=torch.empty(S, 4, device="meta", dtype=dtype),
    )
    errors = learner.update(batch)
    assert errors.device.type == "meta" and errors.dtype == dtype and errors.shape == (S, 4)
    out = stacked(batch.obs)
    assert out.device.type == "meta" and out.dtype == dtype and out.shape[:3] == (S, 4, 6)
    tensors = [*stacked.parameters(), *stacked.buffers()]
    assert all(t.device.type == "meta" and t.dtype in (dtype, torch.long) for t in tensors)
    assert [p.dtype for p in stacked.parameters()] == [dtype] * len(list(stacked.parameters()))


def test_a_conv_stacks_without_a_bias_and_refuses_what_it_cannot_stack() -> None:
    convs = [nn.Conv2d(2, 3, 3, stride=2, padding=1, bias=False, dtype=torch.float64)
             for _ in range(S)]  # fmt: skip
    stacked = StackedConv2d(convs)
    x = torch.randn(S, 5, 2, 9, 9, dtype=torch.float64)
    out = stacked(x)
    for i, conv in enumerate(convs):
        assert torch.equal(out[i], conv(x[i]))
    assert stacked.bias is None and "bias" not in stacked.state_dict()
    with pytest.raises(ValueError, match="zero padding"):
        StackedConv2d([nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect")] * 2)
    with pytest.raises(ValueError, match="linear and Conv2d layers only"):
        stack_networks([nn.Sequential(nn.Conv1d(2, 3, 3)) for _ in range(2)])
