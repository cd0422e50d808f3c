"""Seeds stacked in one module: each seed computes what its own network and learner would."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
import torch
from torch import nn

from agent.learner import Learner
from agent.networks import QNetwork
from agent.noisy import noise_disabled, noisy_layers
from agent.replay import Batch
from agent.seeds import (
    NoiseDraw,
    SeedLearner,
    seed_state_dict,
    stack_networks,
    stacked_noisy_layers,
)

S = 3


def _nets(seeds: int = S, dtype: torch.dtype = torch.float64, hidden=(8, 8), **kw):  # type: ignore[no-untyped-def]
    nets = []
    for i in range(seeds):
        torch.manual_seed(100 + i)
        nets.append(QNetwork((5,), 3, hidden, dtype=dtype, **kw))
    return nets


def _generators(seeds: int = S, base: int = 0) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(base + i) for i in range(seeds)]


def _copy_noise(stacked: torch.nn.Module, nets: list[QNetwork]) -> None:
    """Each single network gets its seed's acting noise from the stacked module."""
    per_seed = [noisy_layers(n) for n in nets]
    for k, layer in enumerate(stacked_noisy_layers(stacked)):
        singles = [layers[k] for layers in per_seed]
        for i, single in enumerate(singles):
            single.epsilon.copy_(layer.epsilon[i])
            single.weight_epsilon.copy_(layer.weight_epsilon[i])


CONFIGS = [
    {"noisy_layers": noisy, "dueling": dueling, "hidden": hidden}
    for noisy, dueling, hidden in itertools.product(
        ["all", "last", "none"], [False, True], [(8,), (8, 6)]
    )
] + [{"noisy_layers": noisy, "dueling": True, "dueling_streams": "linear", "hidden": (8, 6)}
     for noisy in ("all", "last")]  # fmt: skip


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_a_stacked_forward_is_every_seeds_own_forward(cfg: dict) -> None:
    nets = _nets(**cfg)
    stacked = stack_networks(nets)
    NoiseDraw(stacked_noisy_layers(stacked))(_generators())
    _copy_noise(stacked, nets)
    x = torch.randn(S, 7, 5, dtype=torch.float64)
    with torch.no_grad():
        q = stacked(x)
        assert q.shape == (S, 7, 3)
        for i, net in enumerate(nets):
            torch.testing.assert_close(q[i], net(x[i]), rtol=1e-12, atol=1e-12)


def test_a_stack_without_noise_computes_every_seeds_mean_weights() -> None:
    # Epsilon-greedy on noisy layers acts on the mean weights: the stack built for it must
    # ignore whatever noise its layers hold.
    nets = _nets(noisy_layers="all")
    stacked = stack_networks(nets, noise=False)
    NoiseDraw(stacked_noisy_layers(stacked))(_generators())
    x = torch.randn(S, 7, 5, dtype=torch.float64)
    with torch.no_grad():
        q = stacked(x)
        for i, net in enumerate(nets):
            with noise_disabled(net):
                torch.testing.assert_close(q[i], net(x[i]), rtol=1e-12, atol=1e-12)
    noisy = stack_networks(nets)
    NoiseDraw(stacked_noisy_layers(noisy))(_generators())
    with torch.no_grad():
        assert not torch.allclose(noisy(x), q)


def test_a_seeds_state_dict_loads_into_its_own_network() -> None:
    nets = _nets(noisy_layers="all", dueling=True)
    stacked = stack_networks(nets)
    for i, net in enumerate(nets):
        fresh = QNetwork((5,), 3, (8, 8), noisy_layers="all", dueling=True, dtype=torch.float64)
        fresh.load_state_dict(seed_state_dict(stacked, i))
        for (name, a), (_, b) in zip(fresh.state_dict().items(), net.state_dict().items(),
                                     strict=True):  # fmt: skip
            assert torch.equal(a, b), name


def test_a_seeds_noise_comes_from_its_own_generator_only() -> None:
    stacked = stack_networks(_nets(noisy_layers="all"))
    layers = stacked_noisy_layers(stacked)
    draw = NoiseDraw(layers)
    draw(_generators())
    first = [layer.epsilon.clone() for layer in layers]
    # Seed 1 gets another generator: seeds 0 and 2 draw exactly what they drew before.
    others = _generators()
    others[1] = torch.Generator().manual_seed(999)
    draw(others)
    for layer, before in zip(layers, first, strict=True):
        assert torch.equal(layer.epsilon[[0, 2]], before[[0, 2]])
        assert not torch.equal(layer.epsilon[1], before[1])
        # Factorised: the weight noise is the outer product of the two factors.
        n_in = layer.in_features
        eps_in, eps_out = layer.epsilon[:, :n_in], layer.epsilon[:, n_in:]
        torch.testing.assert_close(layer.weight_epsilon, eps_out[:, :, None] * eps_in[:, None, :])
    # A draw for some seeds leaves the others' noise as it was.
    kept = [layer.epsilon.clone() for layer in layers]
    draw(_generators(base=50), seeds=[2])
    for layer, before in zip(layers, kept, strict=True):
        assert torch.equal(layer.epsilon[:2], before[:2])
        assert not torch.equal(layer.epsilon[2], before[2])


def test_what_does_not_stack_is_refused() -> None:
    # Convolutional torsos stack (tests/test_seeds_images.py); a layer with parameters of
    # another kind does not.
    normed = [nn.Sequential(nn.Linear(5, 4), nn.LayerNorm(4)) for _ in range(2)]
    with pytest.raises(ValueError, match="linear and Conv2d layers only"):
        stack_networks(normed)
    with pytest.raises(ValueError, match="one architecture"):
        stack_networks([QNetwork((5,), 3, (8,)), QNetwork((5,), 3, (8, 8))])


def _batches(seeds: int, b: int, seed: int) -> list[Batch]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(seeds):
        out.append(Batch(
            obs=torch.randn(b, 5, generator=g, dtype=torch.float64),
            actions=torch.randint(0, 3, (b,), generator=g),
            rewards=torch.randn(b, generator=g, dtype=torch.float64),
            next_obs=torch.randn(b, 5, generator=g, dtype=torch.float64),
            dones=(torch.rand(b, generator=g) < 0.3).double(),
            discounts=torch.full((b,), 0.99**3, dtype=torch.float64),
        ))  # fmt: skip
    return out


def _stack(batches: list[Batch]) -> Batch:
    return Batch.stack(batches)


def _same_noise_as(seed_learner: SeedLearner, learner: Learner, i: int) -> None:
    """``learner`` draws, for each update, seed ``i``'s update noise of ``seed_learner``
    (drawn just before by its update)."""

    def draw() -> None:
        if not seed_learner.draws:  # both learn on their mean weights
            return
        stacked = stacked_noisy_layers(seed_learner.online_for_update)
        for layer, (eps, weps) in zip(stacked, learner.update_noise_buffers.tensors.values(),
                                      strict=True):  # fmt: skip
            eps.copy_(layer.epsilon[i])
            weps.copy_(layer.weight_epsilon[i])
        targets = stacked_noisy_layers(seed_learner.target_for_update)
        for layer, single in zip(targets, noisy_layers(learner.target_network), strict=True):
            single.epsilon.copy_(layer.epsilon[i])
            single.weight_epsilon.copy_(layer.weight_epsilon[i])

    learner.draw_update_noise = draw  # type: ignore[method-assign]


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"double_dqn": False, "loss": "mse"},
        {"huber_delta": 0.05, "max_grad_norm": 0.05},  # clipping engages, seed by seed
        {"update_noise": 0.0, "tau": 0.1},
    ],
    ids=str,
)
@pytest.mark.parametrize("backend", ["torch", "numpy"])
@pytest.mark.parametrize("noisy", ["all", "none"])
def test_a_stacked_update_is_every_seeds_own_update(kw: dict, backend: str, noisy: str) -> None:
    _stacked_equals_singles(kw, backend, noisy)


@pytest.mark.parametrize("backend", ["torch", "numpy"])
@pytest.mark.parametrize("weighted", [False, True], ids=["uniform", "importance-weights"])
def test_a_stacked_c51_update_is_every_seeds_own_update(backend: str, weighted: bool) -> None:
    _stacked_equals_singles({}, backend, "all", num_atoms=7, weighted=weighted)


def _stacked_equals_singles(
    kw: dict, backend: str, noisy: str, num_atoms: int = 1, weighted: bool = False
) -> None:
    nets = _nets(noisy_layers=noisy, dueling=True, num_atoms=num_atoms)
    stacked = stack_networks(nets)
    seeds = SeedLearner(stacked, copy.deepcopy(stacked), _generators(), lr=1e-2, **kw)
    singles = [Learner(net, copy.deepcopy(net), lr=1e-2, backend=backend, **kw) for net in nets]
    for i, single in enumerate(singles):
        _same_noise_as(seeds, single, i)
    for step in range(4):
        batches = _batches(S, 16, seed=step)
        if weighted:
            g = torch.Generator().manual_seed(step)
            batches = [b._replace(weights=torch.rand(16, generator=g, dtype=torch.float64))
                       for b in batches]  # fmt: skip
        errors = seeds.update(_stack(batches))
        for i, single in enumerate(singles):
            torch.testing.assert_close(errors[i], single.update(batches[i]), rtol=1e-10, atol=1e-12)
        if step == 1:
            seeds.sync_target()
            for single in singles:
                single.sync_target()
    for i, single in enumerate(singles):
        state = seed_state_dict(stacked, i)
        for name, value in single.q_network.state_dict().items():
            torch.testing.assert_close(state[name], value, rtol=1e-9, atol=1e-11)
        target = seed_state_dict(seeds.target_network, i)
        for name, value in single.target_network.state_dict().items():
            if "epsilon" not in name:  # the target's own noise buffers are the single's to draw
                torch.testing.assert_close(target[name], value, rtol=1e-9, atol=1e-11)
    # The optimizer's state, seed by seed, is each single learner's.
    for state, single in zip(seeds.seed_states(), singles, strict=True):
        expected = single.state_dict()
        assert state["updates"] == expected["updates"]
        assert state["optimizer"]["step"] == expected["optimizer"]["step"]
        assert torch.equal(state["optimizer"]["steps"], expected["optimizer"]["steps"])
        for name in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(state["optimizer"][name], expected["optimizer"][name],
                                       rtol=1e-9, atol=1e-14)  # fmt: skip
    per_seed = seeds.metrics()
    assert per_seed is not None and len(per_seed) == S
    for (loss, q, _), single in zip(per_seed, singles, strict=True):
        expected = single.metrics()
        assert expected is not None
        np.testing.assert_allclose([loss, q], [expected.td_loss, expected.q_values], rtol=1e-9)


def test_the_learner_changes_neither_networks_noise() -> None:
    stacked = stack_networks(_nets(noisy_layers="all"))
    target = copy.deepcopy(stacked)
    before = [b.clone() for b in [*stacked.buffers(), *target.buffers()]]
    learner = SeedLearner(stacked, target, _generators(), lr=1e-2)
    learner.update(_stack(_batches(S, 8, seed=0)))
    after = list(stacked.buffers()) + list(target.buffers())
    assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True))
    assert all(layer.noise_enabled for layer in stacked_noisy_layers(stacked))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_meta_and_dtype_stay_where_they_are(dtype: torch.dtype) -> None:
    nets = [
        QNetwork((5,), 3, (8,), noisy_layers="all", device="meta", dtype=dtype) for _ in range(S)
    ]
    stacked = stack_networks(nets)
    learner = SeedLearner(stacked, copy.deepcopy(stacked), _generators(), lr=1e-3)
    batch = Batch(
        obs=torch.empty(S, 4, 5, device="meta", dtype=dtype),
        actions=torch.zeros(S, 4, device="meta", dtype=torch.long),
        rewards=torch.empty(S, 4, device="meta", dtype=dtype),
        next_obs=torch.empty(S, 4, 5, device="meta", dtype=dtype),
        dones=torch.empty(S, 4, device="meta", dtype=dtype),
        discounts=torch.empty(S, 4, device="meta", dtype=dtype),
    )
    errors = learner.update(batch)
    assert errors.device.type == "meta" and errors.dtype == dtype and errors.shape == (S, 4)
    assert all(t.device.type == "meta" for t in [*stacked.parameters(), *stacked.buffers()])


def test_the_benchmark_times_what_it_names() -> None:
    from bench.seeds import BATCH, variants

    runs = variants(2, torch.device("cpu"))
    for fn, seeds in runs.values():
        out = fn()
        if isinstance(out, torch.Tensor):  # per-sample errors: a batch per seed
            assert out.shape in ((seeds, BATCH), (BATCH,))
        if isinstance(out, np.ndarray):  # actions: one per seed's observation
            assert out.shape in ((seeds, 1), (1,))


def test_the_image_benchmark_times_der_updates_both_ways() -> None:
    """bench.seeds --net der: the lone der update and S stacked ones, a convolution call per
    seed and grouped, each returning per-sample errors of a batch of 32 a seed; and a
    step's action of one seed and of the stack, a valid action for each seed."""
    from bench.seeds import der_variants

    runs = der_variants(2, torch.device("cpu"))
    updates = {name: run for name, run in runs.items() if name.startswith("update")}
    assert len(updates) == 3 and sum("grouped" in name for name in updates) == 1
    for fn, seeds in updates.values():
        out = fn()
        assert out.shape == ((seeds, 32) if seeds > 1 else (32,))
        assert torch.isfinite(out).all()
    acts = {name: run for name, run in runs.items() if name.startswith("act")}
    assert len(acts) == 2
    for fn, seeds in acts.values():
        actions = fn()
        assert actions.shape == ((seeds, 1) if seeds > 1 else (1,))
        assert ((actions >= 0) & (actions < 18)).all()  # Krull's 18 actions


@pytest.mark.gpu
def test_the_image_benchmark_captures_the_stacked_update_on_cuda() -> None:
    """On CUDA, bench.seeds --net der also times the grouped stacked update as one CUDA
    graph (fp32 and bf16), the seeds' generators registered with it, as a group trains:
    the capture succeeds and each replay gives finite errors for every seed (a capture
    that failed would drop the row)."""
    from bench.seeds import der_variants

    runs = der_variants(2, torch.device("cuda"))
    names = [name for name in runs if "CUDA graph" in name and "stacked" in name]
    assert len(names) == 2, names
    for name in names:
        replay, seeds = runs[name]
        first = replay().clone()
        second = replay()
        assert first.shape == second.shape == (seeds, 32)
        assert torch.isfinite(first).all() and torch.isfinite(second).all()
        assert not torch.equal(first, second)  # the parameters moved between the replays


def test_seed_states_load_back_into_a_stack_of_any_order() -> None:
    """seed_states() of a stack, loaded into a stack of the same seeds reversed, gives
    each seed its own optimizer state again, so its next update is the same."""
    nets = _nets()
    stacked = stack_networks(nets)
    first = SeedLearner(stacked, copy.deepcopy(stacked), _generators(), lr=1e-2)
    for step in range(3):
        first.update(_stack(_batches(S, 16, seed=step)))
    order = list(reversed(range(S)))
    states = first.seed_states()
    rebuilt = stack_networks([_with_state(nets[i], seed_state_dict(stacked, i)) for i in order])
    second = SeedLearner(rebuilt, copy.deepcopy(rebuilt), [_generators()[i] for i in order],
                         lr=1e-2)  # fmt: skip
    second.load_seed_states([states[i] for i in order])
    again = second.seed_states()
    for j, i in enumerate(order):
        for name in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(again[j]["optimizer"][name], states[i]["optimizer"][name])
    with pytest.raises(ValueError, match="same updates"):
        second.load_seed_states([{**states[0], "updates": 7}, *states[1:]])


def _with_state(net: nn.Module, state: dict[str, torch.Tensor]) -> nn.Module:
    copied = copy.deepcopy(net)
    copied.load_state_dict(state)
    return copied
