"""ActionSelector: actions, noise, weight updates, device moves, and the capture seam.

The CUDA-graph orchestration is tested on the CPU through the capture seam with a
stand-in graph that re-runs the function on replay over the same static buffers;
the function that gets captured is checked for host syncs under an op recorder and
on the ``meta`` device. Tests marked ``gpu`` capture real CUDA graphs.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Sequence

import numpy as np
import pytest
import torch
from torch import nn

from agent.acting import ActionSelector, capture_cuda_graph, make_act_fn
from agent.networks import QNetwork
from agent.noisy import NoisyLinear, noise_disabled, noisy_layers

N_ACTIONS = 3

NETWORKS: dict[str, Callable[[], QNetwork]] = {
    "plain": lambda: QNetwork((4,), N_ACTIONS, noisy_layers="none"),
    "noisy": lambda: QNetwork((4,), N_ACTIONS),
    "noisy_last": lambda: QNetwork((4,), N_ACTIONS, noisy_layers="last"),
    "dueling": lambda: QNetwork((4,), N_ACTIONS, dueling=True),
    "dueling_one_hidden": lambda: QNetwork((4,), N_ACTIONS, hidden_sizes=(16,), dueling=True),
    "float64": lambda: QNetwork((4,), N_ACTIONS, dtype=torch.float64),
    "bfloat16": lambda: QNetwork((4,), N_ACTIONS, dtype=torch.bfloat16),
    "cnn": lambda: QNetwork((4, 36, 36), N_ACTIONS, hidden_sizes=(32,), input_scale=255.0),
    "minatar": lambda: QNetwork((4, 10, 10), N_ACTIONS, hidden_sizes=(32,), noisy_layers="all"),
}
# What "auto" picks on the CPU: the numpy forward where it reproduces the network.
AUTO_BACKEND = {
    "plain": "numpy",
    "noisy": "numpy",
    "noisy_last": "numpy",
    "dueling": "numpy",
    "dueling_one_hidden": "numpy",
    "float64": "numpy",
    "bfloat16": "eager",
    "cnn": "numpy",  # the Nature CNN compiles too
    "minatar": "numpy",
}


class StandInGraph:
    """CPU stand-in for a CUDA graph: replay re-runs ``fn`` over the same static inputs."""

    def __init__(self, fn, static_inputs: Sequence[torch.Tensor], recorder: StandInCapture):
        self.fn = fn
        self.static_inputs = tuple(static_inputs)
        self.recorder = recorder
        self.output = fn(*self.static_inputs)

    def replay(self) -> None:
        self.recorder.replays += 1
        # In place, like a graph: a selector that keeps `output` would see it change.
        self.output.copy_(self.fn(*self.static_inputs))


class StandInCapture:
    """A ``capture_fn`` that records every capture and counts replays."""

    def __init__(self) -> None:
        self.graphs: list[StandInGraph] = []
        self.replays = 0

    def __call__(self, fn, static_inputs):
        graph = StandInGraph(fn, static_inputs, self)
        self.graphs.append(graph)
        return graph


def make_selector(kind: str, net: nn.Module, num_envs: int, **kwargs) -> ActionSelector:
    """kind: "auto", "eager", or "standin" (graph orchestration with the CPU stand-in)."""
    shape = net.obs_shape
    if kind == "standin":
        return ActionSelector(net, shape, num_envs, "cpu", capture_fn=StandInCapture(), **kwargs)
    return ActionSelector(net, shape, num_envs, "cpu", backend=kind, **kwargs)


def observations(shape: Sequence[int], num_envs: int, rng: np.random.Generator) -> np.ndarray:
    if len(shape) == 3 and shape[1] < 36:  # bool grids, as MinAtar gives them
        return rng.random((num_envs, *shape)) < 0.2
    if len(shape) == 3:  # frames, as an Atari env gives them
        return rng.integers(0, 256, size=(num_envs, *shape), dtype=np.uint8)
    return (3.0 * rng.standard_normal((num_envs, *shape))).astype(np.float32)


def greedy(net: nn.Module, obs: np.ndarray, device: str | torch.device = "cpu") -> np.ndarray:
    """Argmax of the network with the noise now in its buffers (or mean weights if switched off)."""
    with torch.no_grad():
        return net(torch.from_numpy(obs).to(device)).argmax(dim=1).cpu().numpy()


NOISE_BUFFERS = ("epsilon_in", "epsilon_out", "weight_epsilon", "bias_epsilon")


def noise_snapshot(net: nn.Module) -> list[torch.Tensor]:
    return [
        getattr(layer, name).detach().clone()
        for layer in noisy_layers(net)
        for name in NOISE_BUFFERS
    ]


def same_noise(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def all_noise_changed(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    """Every noise buffer of every layer was redrawn (not just some of them)."""
    return not any(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def last_bias(net: QNetwork) -> nn.Parameter:
    layer = net.head[-1]
    return layer.bias_mu if hasattr(layer, "bias_mu") else layer.bias


KINDS = ["auto", "eager", "standin"]


# --------------------------------------------------------------------------- #
# Actions                                                                     #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", list(NETWORKS))
@pytest.mark.parametrize("num_envs", [1, 8])
def test_actions_are_argmax_under_the_same_noise(kind: str, name: str, num_envs: int) -> None:
    torch.manual_seed(0)
    net = NETWORKS[name]()
    selector = make_selector(kind, net, num_envs)
    rng = np.random.default_rng(1)
    for _ in range(5):
        obs = observations(net.obs_shape, num_envs, rng)
        actions = selector(obs)
        assert isinstance(actions, np.ndarray)
        assert actions.dtype == np.int64
        assert actions.shape == (num_envs,)
        assert ((actions >= 0) & (actions < N_ACTIONS)).all()
        # The noise the action used is left in the buffers: the network reproduces it.
        np.testing.assert_array_equal(actions, greedy(net, obs))
    if kind == "auto":
        assert selector.backend == AUTO_BACKEND[name]
    if kind == "standin":
        assert selector.backend == "graph" and selector.captured  # the stand-in counts
    else:
        assert not selector.captured


@pytest.mark.parametrize("kind", KINDS)
def test_float64_observations_for_a_float32_network(kind: str) -> None:
    net = NETWORKS["noisy"]()
    selector = make_selector(kind, net, 4)
    obs = np.random.default_rng(2).standard_normal((4, 4))  # float64, as some envs give
    np.testing.assert_array_equal(selector(obs), greedy(net, obs.astype(np.float32)))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["noisy", "dueling", "cnn"])
def test_fresh_noise_every_call_when_on(kind: str, name: str) -> None:
    net = NETWORKS[name]()
    selector = make_selector(kind, net, 2)
    obs = observations(net.obs_shape, 2, np.random.default_rng(3))
    before = noise_snapshot(net)
    for _ in range(3):
        selector(obs)
        after = noise_snapshot(net)
        assert all_noise_changed(before, after)
        before = after


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["noisy", "dueling", "float64"])
def test_noise_is_factorised_gaussian(kind: str, name: str) -> None:
    """eps_W = f(eps_out) f(eps_in)^T, eps_b = f(eps_out), f(x) = sgn(x) sqrt(|x|), x ~ N(0, 1)."""
    torch.manual_seed(0)  # fixes torch's generator and the numpy one seeded from it
    net = NETWORKS[name]()
    selector = make_selector(kind, net, 1)
    obs = observations((4,), 1, np.random.default_rng(18))
    factors = []
    for _ in range(100):
        selector(obs)
        for layer in noisy_layers(net):
            torch.testing.assert_close(
                layer.weight_epsilon, torch.outer(layer.epsilon_out, layer.epsilon_in)
            )
            assert torch.equal(layer.bias_epsilon, layer.epsilon_out)
            factors += [layer.epsilon_in.clone(), layer.epsilon_out.clone()]
    f = torch.cat(factors).double()  # 25k-50k samples
    # E[f] = 0, E[f^2] = E|x| = sqrt(2/pi), E[f^4] = E[x^2] = 1.
    assert abs(f.mean().item()) < 0.03
    assert abs(f.pow(2).mean().item() - (2 / np.pi) ** 0.5) < 0.02
    assert abs(f.pow(4).mean().item() - 1.0) < 0.05


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["noisy", "dueling", "cnn"])
def test_no_noise_when_off(kind: str, name: str) -> None:
    net = NETWORKS[name]()
    selector = make_selector(kind, net, 8, noise=False)
    assert selector.noise is False
    rng = np.random.default_rng(4)
    before = noise_snapshot(net)
    for _ in range(3):
        obs = observations(net.obs_shape, 8, rng)
        actions = selector(obs)
        assert same_noise(before, noise_snapshot(net))
        with noise_disabled(net):
            np.testing.assert_array_equal(actions, greedy(net, obs))
    # The layers' own switches are left as they were.
    assert all(layer.noise_enabled for layer in noisy_layers(net))


@pytest.mark.parametrize("kind", KINDS)
def test_noise_switch(kind: str) -> None:
    net = NETWORKS["noisy"]()
    selector = make_selector(kind, net, 8, noise=False)
    obs = observations((4,), 8, np.random.default_rng(5))
    selector(obs)
    before = noise_snapshot(net)
    selector.noise = True
    np.testing.assert_array_equal(selector(obs), greedy(net, obs))
    assert not same_noise(before, noise_snapshot(net))
    selector.noise = False
    before = noise_snapshot(net)
    actions = selector(obs)
    assert same_noise(before, noise_snapshot(net))
    with noise_disabled(net):
        np.testing.assert_array_equal(actions, greedy(net, obs))


@pytest.mark.parametrize("kind", KINDS)
def test_noise_is_drawn_exactly_at_the_calls_that_ask(kind: str) -> None:
    net = NETWORKS["noisy"]()
    selector = make_selector(kind, net, 8)
    rng = np.random.default_rng(6)
    asked = [True, False, False, True, False, True, True]
    changed = []
    before = noise_snapshot(net)
    for fresh in asked:
        obs = observations((4,), 8, rng)
        actions = selector(obs, fresh_noise=fresh)
        after = noise_snapshot(net)
        changed.append(all_noise_changed(before, after))
        assert changed[-1] or same_noise(before, after)  # all of the noise or none of it
        before = after
        np.testing.assert_array_equal(actions, greedy(net, obs))
    assert changed == asked


@pytest.mark.parametrize("kind", KINDS)
def test_held_noise_repeats_the_actions_and_fresh_noise_changes_them(kind: str) -> None:
    torch.manual_seed(0)
    net = NETWORKS["noisy"]()
    selector = make_selector(kind, net, 64)
    obs = observations((4,), 64, np.random.default_rng(9))
    first = selector(obs)
    for _ in range(3):  # the same observations under the same noise: the same actions
        np.testing.assert_array_equal(selector(obs, fresh_noise=False), first)
    # 64 envs whose greedy actions all survive three new noise samples: practically never
    assert any(not np.array_equal(selector(obs), first) for _ in range(3))


@pytest.mark.parametrize("kind", KINDS)
def test_held_noise_survives_learner_updates(kind: str) -> None:
    """Calls that hold the noise act on the last sample drawn, even when the learner
    updates (and draws noise of its own for the online net) in between."""
    from agent.learner import Learner
    from agent.replay import Batch

    torch.manual_seed(0)
    net = NETWORKS["noisy"]()
    learner = Learner(net, QNetwork((4,), N_ACTIONS), lr=1e-2)
    selector = make_selector(kind, net, 8)
    rng = np.random.default_rng(8)
    g = torch.Generator().manual_seed(0)
    batch = Batch(
        obs=torch.randn(16, 4, generator=g),
        actions=torch.randint(0, N_ACTIONS, (16,), generator=g),
        rewards=torch.randn(16, generator=g),
        next_obs=torch.randn(16, 4, generator=g),
        dones=torch.zeros(16),
        discounts=torch.full((16,), 0.99),
    )
    held = []
    for step in range(6):
        obs = observations((4,), 8, rng)
        actions = selector(obs, fresh_noise=step % 3 == 0)
        held.append(noise_snapshot(net))
        np.testing.assert_array_equal(actions, greedy(net, obs))
        learner.update(batch)
    assert same_noise(held[0], held[1]) and same_noise(held[1], held[2])
    assert all_noise_changed(held[2], held[3])
    assert same_noise(held[3], held[4]) and same_noise(held[4], held[5])


@pytest.mark.parametrize("kind", KINDS)
def test_switching_noise_on_acts_on_fresh_or_held_noise_as_the_call_says(kind: str) -> None:
    net = NETWORKS["noisy"]()
    selector = make_selector(kind, net, 8)
    obs = observations((4,), 8, np.random.default_rng(10))
    selector(obs)
    drawn = noise_snapshot(net)
    selector.noise = False
    selector(obs)
    selector.noise = True
    np.testing.assert_array_equal(selector(obs, fresh_noise=False), greedy(net, obs))
    assert same_noise(drawn, noise_snapshot(net))  # still the sample drawn before
    selector.noise = False
    selector.noise = True
    selector(obs)
    assert all_noise_changed(drawn, noise_snapshot(net))


def test_seeded_noise_is_reproducible() -> None:
    torch.manual_seed(0)
    net_a = NETWORKS["noisy"]()
    net_b = NETWORKS["noisy"]()
    net_b.load_state_dict(net_a.state_dict())
    sel_a = ActionSelector(net_a, (4,), 8, seed=123)
    sel_b = ActionSelector(net_b, (4,), 8, seed=123)
    obs = observations((4,), 8, np.random.default_rng(7))
    for _ in range(3):
        np.testing.assert_array_equal(sel_a(obs), sel_b(obs))
        assert same_noise(noise_snapshot(net_a), noise_snapshot(net_b))
    # Without a seed, torch.manual_seed fixes it.
    torch.manual_seed(5)
    sel_a = ActionSelector(net_a, (4,), 8)
    sel_a(obs)
    torch.manual_seed(5)
    sel_b = ActionSelector(net_b, (4,), 8)
    sel_b(obs)
    assert same_noise(noise_snapshot(net_a), noise_snapshot(net_b))


@pytest.mark.parametrize("kind", KINDS)
def test_state_dict_resumes_the_noise_stream(kind: str, tmp_path) -> None:
    torch.manual_seed(0)
    net = NETWORKS["noisy"]()
    selector = make_selector(kind, net, 8, seed=1)
    obs = observations((4,), 8, np.random.default_rng(19))
    for step in range(3):
        selector(obs, fresh_noise=step % 2 == 0)
    state = {
        "selector": selector.state_dict(),
        "torch": torch.get_rng_state(),
        "net": net.state_dict(),  # holds the current noise (persistent buffers)
    }
    torch.save(state, tmp_path / "s")
    expected = []
    for step in range(3, 6):
        selector(obs, fresh_noise=step % 2 == 0)
        expected.append(noise_snapshot(net))
    saved = torch.load(tmp_path / "s", weights_only=True)  # plain values only
    net.load_state_dict(saved["net"])
    resumed = make_selector(kind, net, 8, seed=2)
    resumed.load_state_dict(saved["selector"])
    torch.set_rng_state(saved["torch"])
    for step, snapshot in enumerate(expected, start=3):
        resumed(obs, fresh_noise=step % 2 == 0)
        assert same_noise(snapshot, noise_snapshot(net))


@pytest.mark.parametrize("kind", KINDS)
def test_a_state_saved_with_a_call_counter_resumes_the_same_noise_stream(kind: str) -> None:
    """Checkpoints written before the selector left the noise schedule to its callers
    hold its call counter (``step``) next to the generator: they resume exactly."""
    torch.manual_seed(0)
    net = NETWORKS["noisy"]()
    selector = make_selector(kind, net, 8, seed=1)
    obs = observations((4,), 8, np.random.default_rng(20))
    for _ in range(3):
        selector(obs)
    old_state = {"step": 3, **selector.state_dict()}  # its counter after three calls
    torch_state, net_state = torch.get_rng_state(), copy.deepcopy(net.state_dict())
    expected = []
    for _ in range(3):
        selector(obs)
        expected.append(noise_snapshot(net))
    net.load_state_dict(net_state)
    resumed = make_selector(kind, net, 8, seed=2)
    resumed.load_state_dict(old_state)
    torch.set_rng_state(torch_state)
    for snapshot in expected:
        resumed(obs)
        assert same_noise(snapshot, noise_snapshot(net))


# --------------------------------------------------------------------------- #
# Bad input                                                                   #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", [(8, 5), (4,), (7, 4), (8, 4, 1), (1, 8, 4)])
def test_wrong_observation_shape_raises(kind: str, shape: tuple[int, ...]) -> None:
    selector = make_selector(kind, NETWORKS["noisy"](), 8)
    with pytest.raises(ValueError, match="shape"):
        selector(np.zeros(shape, dtype=np.float32))


def test_uncastable_observation_dtype_raises() -> None:
    net = NETWORKS["cnn"]()
    selector = make_selector("standin", net, 1)
    selector(np.zeros((1, 4, 36, 36), dtype=np.uint8))  # fixes the staging dtype
    with pytest.raises(ValueError, match="dtype"):
        selector(np.zeros((1, 4, 36, 36), dtype=np.float32))


@pytest.mark.parametrize("kind", KINDS)
def test_a_diverged_network_acts_silently(kind: str) -> None:
    """inf/nan weights: actions still come back, without numpy warnings (torch is silent too)."""
    net = NETWORKS["noisy"]()
    with torch.no_grad():
        net.head[0].weight_mu.fill_(1e38)
        last_bias(net).fill_(float("nan"))
    selector = make_selector(kind, net, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        actions = selector(observations((4,), 8, np.random.default_rng(30)))
    assert actions.shape == (8,) and ((actions >= 0) & (actions < N_ACTIONS)).all()


class Net(nn.Module):
    """A user's network with a layer the numpy backend does not compile."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def test_bad_arguments_raise() -> None:
    net = NETWORKS["noisy"]()
    with pytest.raises(ValueError, match="num_envs"):
        ActionSelector(net, (4,), 0)
    with pytest.raises(ValueError, match="obs_shape"):
        ActionSelector(net, (5,), 1)
    with pytest.raises(ValueError, match="move the network"):
        ActionSelector(net, (4,), 1, "cuda")
    with pytest.raises(ValueError, match=r"backend='numpy' cannot run Net \(module LayerNorm"):
        ActionSelector(Net(), (4,), 1, backend="numpy")(np.zeros((1, 4), np.float32))


# --------------------------------------------------------------------------- #
# Weight updates and moves                                                    #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["plain", "noisy"])
def test_actions_follow_an_optimizer_step(kind: str, name: str) -> None:
    net = NETWORKS[name]()
    selector = make_selector(kind, net, 8, noise=False)
    optimizer = torch.optim.SGD(net.parameters(), lr=1.0)
    obs = observations((4,), 8, np.random.default_rng(8))
    selector(obs)
    for step, favourite in enumerate((2, 0, 1)):
        # A gradient that moves the output bias towards `favourite`, ten times harder
        # than all earlier steps together.
        optimizer.zero_grad(set_to_none=True)
        grad = torch.full((N_ACTIONS,), 100.0 * 10**step)
        grad[favourite] *= -1
        last_bias(net).grad = grad
        optimizer.step()
        np.testing.assert_array_equal(selector(obs), np.full(8, favourite))


@pytest.mark.parametrize("kind", KINDS)
def test_actions_follow_load_state_dict(kind: str) -> None:
    net = NETWORKS["noisy"]()
    selector = make_selector(kind, net, 8, noise=False)
    obs = observations((4,), 8, np.random.default_rng(9))
    selector(obs)
    other = NETWORKS["noisy"]()
    with torch.no_grad():
        last_bias(other).copy_(torch.tensor([0.0, 100.0, 0.0]))
    net.load_state_dict(other.state_dict())
    np.testing.assert_array_equal(selector(obs), np.full(8, 1))
    with noise_disabled(net):
        np.testing.assert_array_equal(selector(obs), greedy(net, obs))


@pytest.mark.parametrize("kind", KINDS)
def test_follows_a_dtype_change(kind: str) -> None:
    net = NETWORKS["noisy"]()
    selector = make_selector(kind, net, 8)
    rng = np.random.default_rng(10)
    selector(observations((4,), 8, rng))
    for dtype in (torch.float64, torch.bfloat16, torch.float32):
        net.to(dtype)
        for _ in range(2):
            obs = observations((4,), 8, rng)
            np.testing.assert_array_equal(selector(obs), greedy(net, obs))
        if kind == "auto":
            assert selector.backend == ("eager" if dtype == torch.bfloat16 else "numpy")


@pytest.mark.parametrize("kind", KINDS)
def test_buffers_keep_their_addresses(kind: str) -> None:
    net = NETWORKS["dueling"]()
    selector = make_selector(kind, net, 8)
    tensors = [*net.parameters(), *net.buffers()]
    pointers = [t.data_ptr() for t in tensors]
    rng = np.random.default_rng(11)
    for _ in range(4):
        selector(observations((4,), 8, rng))
    assert [t.data_ptr() for t in tensors] == pointers


# --------------------------------------------------------------------------- #
# The captured function: no host syncs, device-agnostic                       #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("name", ["noisy", "dueling", "cnn", "float64"])
@pytest.mark.parametrize(("resample", "noise"), [(True, True), (False, True), (False, False)])
def test_captured_function_has_no_syncing_ops(
    name: str, resample: bool, noise: bool, op_recorder
) -> None:
    net = NETWORKS[name]()
    act = make_act_fn(net, resample=resample, noise=noise)
    obs = torch.from_numpy(observations(net.obs_shape, 4, np.random.default_rng(12)))
    with op_recorder() as recorder:
        actions = act(obs)
    assert recorder.ops, "the recorder saw nothing"
    assert recorder.syncing_ops() == set()
    assert recorder.ops_leaving("cpu") == []
    assert actions.dtype == torch.int64 and actions.shape == (4,)
    if resample:
        assert "aten.normal_" in recorder.ops


@pytest.mark.parametrize("name", ["noisy", "dueling", "cnn"])
def test_captured_function_stays_on_meta(name: str, op_recorder) -> None:
    net = NETWORKS[name]().to(torch.device("meta"))
    dtype = torch.uint8 if name == "cnn" else torch.float32
    obs = torch.zeros((4, *net.obs_shape), dtype=dtype, device="meta")
    for resample, noise in [(True, True), (False, False)]:
        with op_recorder() as recorder:
            actions = make_act_fn(net, resample=resample, noise=noise)(obs)
        assert actions.device.type == "meta"
        assert actions.shape == (4,) and actions.dtype == torch.int64
        assert recorder.ops_leaving("meta") == []
        assert all(t.device.type == "meta" for t in [*net.parameters(), *net.buffers()])


# --------------------------------------------------------------------------- #
# The capture seam, with a CPU stand-in graph                                 #
# --------------------------------------------------------------------------- #


def split_decision(net: QNetwork, obs_a: np.ndarray, obs_b: np.ndarray) -> None:
    """Shift the output bias so that env 0's greedy action differs between two inputs.

    (A freshly initialised CNN picks the same action for almost any frame.)
    """
    with torch.no_grad(), noise_disabled(net):
        q_a = net(torch.from_numpy(obs_a[:1]))[0]
        q_b = net(torch.from_numpy(obs_b[:1]))[0]
        bias = last_bias(net)
        bias[0] -= 100.0
        # Q2 - Q1 ends up (d_a - d_b) / 2 for input a and the opposite for input b.
        bias[1] += ((q_a[2] - q_a[1]) + (q_b[2] - q_b[1])) / 2


def standin_selector(
    net: nn.Module, num_envs: int, **kwargs
) -> tuple[ActionSelector, StandInCapture]:
    capture = StandInCapture()
    selector = ActionSelector(net, net.obs_shape, num_envs, "cpu", capture_fn=capture, **kwargs)
    return selector, capture


@pytest.mark.parametrize("name", ["noisy", "cnn"])
def test_seam_reads_only_the_static_input(name: str) -> None:
    torch.manual_seed(0)
    net = NETWORKS[name]()
    selector, capture = standin_selector(net, 8, noise=False)
    rng = np.random.default_rng(13)
    obs_a, obs_b = observations(net.obs_shape, 8, rng), observations(net.obs_shape, 8, rng)
    split_decision(net, obs_a, obs_b)
    with noise_disabled(net):
        ref_a, ref_b = greedy(net, obs_a), greedy(net, obs_b)
    assert not np.array_equal(ref_a, ref_b)  # else a stale output would go unnoticed
    np.testing.assert_array_equal(selector(obs_a), ref_a)
    (graph,) = capture.graphs
    (static_obs,) = graph.static_inputs
    pointer = static_obs.data_ptr()
    np.testing.assert_array_equal(selector(obs_b), ref_b)
    np.testing.assert_array_equal(selector(obs_a), ref_a)
    # One capture, one replay per call, the same static buffer holding the last input.
    assert len(capture.graphs) == 1 and capture.replays == 3
    assert static_obs.data_ptr() == pointer
    np.testing.assert_array_equal(static_obs.numpy(), obs_a)
    assert selector.captured and selector.backend == "graph"


def test_seam_returns_fresh_output_each_call() -> None:
    net = NETWORKS["noisy"]()
    selector, capture = standin_selector(net, 8)
    rng = np.random.default_rng(14)
    first = selector(observations((4,), 8, rng))
    kept = first.copy()
    second = selector(observations((4,), 8, rng))
    np.testing.assert_array_equal(first, kept)  # not overwritten by the next call
    assert not np.shares_memory(first, second)
    assert not np.shares_memory(second, capture.graphs[0].output.numpy())


def test_seam_recaptures_after_a_dtype_change() -> None:
    net = NETWORKS["noisy"]()
    selector, capture = standin_selector(net, 8)
    rng = np.random.default_rng(15)
    selector(observations((4,), 8, rng))
    selector(observations((4,), 8, rng))
    assert len(capture.graphs) == 1
    net.to(torch.float64)
    obs = observations((4,), 8, rng)
    np.testing.assert_array_equal(selector(obs), greedy(net, obs))
    assert len(capture.graphs) == 2
    assert capture.graphs[-1].output.dtype == torch.int64
    selector(obs)
    assert len(capture.graphs) == 2  # in-place updates never re-capture
    selector.refresh()
    selector(obs)
    assert len(capture.graphs) == 3


def test_seam_two_graphs_for_fresh_and_held_noise() -> None:
    net = NETWORKS["noisy"]()
    selector, capture = standin_selector(net, 8)
    rng = np.random.default_rng(16)
    for step in range(6):
        obs = observations((4,), 8, rng)
        actions = selector(obs, fresh_noise=step % 2 == 0)
        np.testing.assert_array_equal(actions, greedy(net, obs))
    assert len(capture.graphs) == 2  # with and without the resampling, each captured once
    assert capture.replays == 6


def test_seam_capture_failure_falls_back_with_one_warning() -> None:
    def failing_capture(fn, static_inputs):
        raise RuntimeError("operation not permitted when stream is capturing")

    net = NETWORKS["noisy"]()
    selector = ActionSelector(net, (4,), 8, "cpu", capture_fn=failing_capture)
    rng = np.random.default_rng(17)
    with pytest.warns(RuntimeWarning, match="not permitted when stream is capturing"):
        obs = observations((4,), 8, rng)
        np.testing.assert_array_equal(selector(obs), greedy(net, obs))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the held-noise graph falls back silently
        for step in range(4):
            obs = observations((4,), 8, rng)
            actions = selector(obs, fresh_noise=step % 2 == 0)
            np.testing.assert_array_equal(actions, greedy(net, obs))
    assert selector.backend == "graph" and not selector.captured


# --------------------------------------------------------------------------- #
# CUDA graphs (skipped without a GPU)                                         #
# --------------------------------------------------------------------------- #


class CountingCapture:
    """Real CUDA-graph capture, counted."""

    def __init__(self) -> None:
        self.graphs: list = []

    def __call__(self, fn, static_inputs):
        graph = capture_cuda_graph(fn, static_inputs)
        self.graphs.append(graph)
        return graph


def cuda_selector(
    net: nn.Module, num_envs: int, **kwargs
) -> tuple[ActionSelector, CountingCapture]:
    capture = CountingCapture()
    selector = ActionSelector(net, net.obs_shape, num_envs, "cuda", capture_fn=capture, **kwargs)
    return selector, capture


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["noisy", "dueling", "cnn", "plain"])
def test_cuda_capture_and_replay(name: str) -> None:
    net = NETWORKS[name]().to("cuda")
    selector = ActionSelector(net, net.obs_shape, 8, "cuda")
    rng = np.random.default_rng(20)
    for _ in range(4):
        obs = observations(net.obs_shape, 8, rng)
        actions = selector(obs)
        assert actions.dtype == np.int64 and actions.shape == (8,)
        np.testing.assert_array_equal(actions, greedy(net, obs, "cuda"))
    assert selector.backend == "graph" and selector.captured


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["noisy", "dueling"])
def test_cuda_graphed_equals_eager_for_the_same_rng_state(name: str) -> None:
    net = NETWORKS[name]().to("cuda")
    selector = ActionSelector(net, (4,), 8, "cuda")
    obs = observations((4,), 8, np.random.default_rng(21))
    # The first call captures: its warm-up draws are undone, so it counts too.
    for seed in (1234, 1234, 99):
        torch.cuda.manual_seed(seed)
        graphed = selector(obs)
        graphed_noise = noise_snapshot(net)
        graphed_state = torch.cuda.get_rng_state()
        torch.cuda.manual_seed(seed)
        net.reset_noise()
        eager = greedy(net, obs, "cuda")
        assert same_noise(graphed_noise, noise_snapshot(net))  # bit-identical noise
        assert torch.equal(graphed_state, torch.cuda.get_rng_state())  # same offset after
        np.testing.assert_array_equal(graphed, eager)
    assert selector.captured


@pytest.mark.gpu
def test_cuda_fresh_noise_on_every_replay() -> None:
    net = NETWORKS["noisy"]().to("cuda")
    selector = ActionSelector(net, (4,), 8, "cuda")
    obs = observations((4,), 8, np.random.default_rng(22))
    selector(obs)
    before = noise_snapshot(net)
    for _ in range(3):
        selector(obs)
        after = noise_snapshot(net)
        assert not same_noise(before, after)
        before = after
    assert selector.captured


@pytest.mark.gpu
def test_cuda_noise_off_and_held() -> None:
    net = NETWORKS["noisy"]().to("cuda")
    mean_selector = ActionSelector(net, (4,), 8, "cuda", noise=False)
    held_selector, capture = cuda_selector(net, 8)
    rng = np.random.default_rng(23)
    changed = []
    before = noise_snapshot(net)
    for step in range(4):
        obs = observations((4,), 8, rng)
        actions = held_selector(obs, fresh_noise=step % 2 == 0)
        np.testing.assert_array_equal(actions, greedy(net, obs, "cuda"))
        after = noise_snapshot(net)
        changed.append(not same_noise(before, after))
        actions = mean_selector(obs)
        assert same_noise(after, noise_snapshot(net))
        with noise_disabled(net):
            np.testing.assert_array_equal(actions, greedy(net, obs, "cuda"))
        before = after
    assert changed == [True, False, True, False]
    assert len(capture.graphs) == 2
    assert mean_selector.captured and held_selector.captured


@pytest.mark.gpu
def test_cuda_no_hidden_sync() -> None:
    net = NETWORKS["noisy"]().to("cuda")
    selector, capture = cuda_selector(net, 8)
    obs = observations((4,), 8, np.random.default_rng(24))
    selector(obs)  # capture outside the check (capture itself synchronises)
    graph = capture.graphs[0]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError):  # the check is live: a real sync is caught
            torch.zeros(1, device="cuda").item()
        graph.replay()
        # The whole step: pinned copy-in, replay, copy-out; its one wait is an event
        # synchronize, which the sync debug mode does not count.
        selector(obs)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
def test_cuda_graph_sees_optimizer_steps_without_recapture() -> None:
    net = NETWORKS["noisy"]().to("cuda")
    selector, capture = cuda_selector(net, 8, noise=False)
    optimizer = torch.optim.SGD(net.parameters(), lr=1.0)
    obs = observations((4,), 8, np.random.default_rng(25))
    selector(obs)
    for step, favourite in enumerate((2, 0, 1)):
        optimizer.zero_grad(set_to_none=True)
        grad = torch.full((N_ACTIONS,), 100.0 * 10**step, device="cuda")
        grad[favourite] *= -1
        last_bias(net).grad = grad
        optimizer.step()
        np.testing.assert_array_equal(selector(obs), np.full(8, favourite))
    other = NETWORKS["noisy"]()
    with torch.no_grad():
        last_bias(other).copy_(torch.tensor([0.0, 0.0, 100.0]))
    net.load_state_dict(other.state_dict())
    np.testing.assert_array_equal(selector(obs), np.full(8, 2))
    assert len(capture.graphs) == 1


@pytest.mark.gpu
def test_cuda_recaptures_after_to() -> None:
    net = NETWORKS["noisy"]().to("cuda")
    selector, capture = cuda_selector(net, 8)
    rng = np.random.default_rng(26)
    selector(observations((4,), 8, rng))
    assert len(capture.graphs) == 1
    net.to(torch.float64)
    obs = observations((4,), 8, rng)
    np.testing.assert_array_equal(selector(obs), greedy(net, obs, "cuda"))
    assert len(capture.graphs) == 2 and selector.captured
    selector(obs)
    assert len(capture.graphs) == 2


@pytest.mark.gpu
def test_cuda_auto_follows_a_move_to_the_cpu() -> None:
    net = NETWORKS["noisy"]().to("cuda")
    selector = ActionSelector(net, (4,), 8)
    rng = np.random.default_rng(27)
    selector(observations((4,), 8, rng))
    assert selector.backend == "graph" and selector.captured
    net.to("cpu")
    obs = observations((4,), 8, rng)
    np.testing.assert_array_equal(selector(obs), greedy(net, obs))
    assert selector.backend == "numpy"
    net.to("cuda")
    obs = observations((4,), 8, rng)
    np.testing.assert_array_equal(selector(obs), greedy(net, obs, "cuda"))
    assert selector.backend == "graph" and selector.captured


# --------------------------------------------------------------------------- #
# The numpy forward's contract with the module's forward                      #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("dueling", [False, True])
@pytest.mark.parametrize("noisy", ["all", "last", "none"])
@pytest.mark.parametrize("hidden", [(16,), (32, 16)])
def test_numpy_forward_equals_qnetwork_forward(
    hidden: tuple[int, ...], noisy: str, dueling: bool, dtype: torch.dtype
) -> None:
    """For every vector-input network QNetwork builds: same Q values, noise on and off."""
    from agent.numpy_backend import NumpyForward

    torch.manual_seed(0)
    net = QNetwork((5,), 4, hidden, noisy_layers=noisy, dueling=dueling, dtype=dtype)
    forward = NumpyForward.build(net, np.random.default_rng(0))
    assert forward is not None
    obs = observations((5,), 7, np.random.default_rng(1))
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-12}
    for _ in range(3):
        forward.resample()  # writes the noise into the layers' buffers
        with torch.no_grad():
            noisy_q = net(torch.from_numpy(obs)).numpy()
            with noise_disabled(net):
                mean_q = net(torch.from_numpy(obs)).numpy()
        np.testing.assert_allclose(forward.q_values(obs, noise=True), noisy_q, **tol)
        np.testing.assert_allclose(forward.q_values(obs, noise=False), mean_q, **tol)


class UserNoisyMLP(nn.Module):
    """A network written the way users write them: attributes and a functional forward."""

    def __init__(self) -> None:
        super().__init__()
        self.obs_shape = (4,)
        self.l1 = NoisyLinear(4, 64)
        self.l2 = NoisyLinear(64, 64)
        self.out = NoisyLinear(64, N_ACTIONS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.relu(self.l1(x))
        h = torch.tanh(self.l2(h)) + h  # a residual, an elementwise activation
        return self.out(h)


USER_NETWORKS: dict[str, Callable[[], nn.Module]] = {
    "functional_residual": UserNoisyMLP,
    "sequential_activations": lambda: nn.Sequential(
        NoisyLinear(4, 32),
        nn.LeakyReLU(0.1),
        nn.Linear(32, 32),
        nn.ELU(),
        nn.Linear(32, 32),
        nn.SiLU(),
        NoisyLinear(32, N_ACTIONS),
        nn.Sigmoid(),
    ),
}


@pytest.mark.parametrize("name", list(USER_NETWORKS))
def test_users_own_noisy_modules_get_the_numpy_path_with_fresh_noise(name: str) -> None:
    torch.manual_seed(0)
    net = USER_NETWORKS[name]()
    selector = ActionSelector(net, (4,), 8, "cpu")
    rng = np.random.default_rng(0)
    before = noise_snapshot(net)
    for _ in range(5):
        obs = observations((4,), 8, rng)
        actions = selector(obs)
        assert selector.backend == "numpy"
        # Same actions as the module itself under the noise this step used.
        np.testing.assert_array_equal(actions, greedy(net, obs))
        after = noise_snapshot(net)
        assert all_noise_changed(before, after)  # fresh noise every step
        before = after


def test_modules_with_ops_the_numpy_path_cannot_reproduce_act_eagerly() -> None:
    class SortedActions(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l1 = nn.Linear(4, N_ACTIONS)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sort(self.l1(x), dim=1).values  # not an op the numpy path knows

    class BranchingActions(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l1 = nn.Linear(4, N_ACTIONS)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.l1(x)
            return y if y.sum() > 0 else -y  # control flow on values: cannot be traced

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")  # the once is the backend's own, not the filter's
        for net in (SortedActions(), BranchingActions(), SortedActions()):
            selector = ActionSelector(net, (4,), 2, "cpu")
            obs = observations((4,), 2, np.random.default_rng(0))
            np.testing.assert_array_equal(selector(obs), greedy(net, obs))
            assert selector.backend == "eager"
    # Each reason once: what did not compile, where, and what runs instead.
    messages = [str(w.message) for w in said if w.category is RuntimeWarning]
    assert [m.split(" (")[0] for m in messages] == [
        "the numpy backend cannot compile SortedActions",
        "the numpy backend cannot compile BranchingActions",
    ]
    assert "(call_function sort at node sort); acting runs eagerly instead" in messages[0]
    assert "torch.fx cannot trace its forward" in messages[1]
    assert all("backend='eager' chooses it" in m for m in messages)


def test_a_compiler_bug_is_not_hidden_by_the_auto_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.numpy_backend import program

    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("slot 3")

    monkeypatch.setattr(program, "Linear", broken)  # the layer builder the compiler calls
    selector = ActionSelector(NETWORKS["noisy"](), (4,), 2, "cpu")
    with pytest.raises(KeyError, match="slot 3"):
        selector(observations((4,), 2, np.random.default_rng(0)))


@pytest.mark.gpu
def test_cuda_capture_graph_false_acts_eagerly() -> None:
    net = NETWORKS["noisy"]().cuda()
    selector = ActionSelector(net, (4,), 2, "cuda", capture_graph=False)
    obs = observations((4,), 2, np.random.default_rng(0))
    selector(obs)
    assert selector.backend == "eager" and not selector.captured
