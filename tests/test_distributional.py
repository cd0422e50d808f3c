"""Tests of agent/distributional.py and agent/values.py: the support, the projection (a
case worked by hand), the C51 head of QNetwork, action values and greedy actions on every
backend, devices and dtypes."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from agent.acting import ActionSelector, capture_eager
from agent.distributional import CategoricalObjective, make_support, project
from agent.learner import Learner
from agent.networks import QNetwork
from agent.numpy_backend import NumpyProgram
from agent.replay import Batch
from agent.values import greedy_actions, q_values, softmax, support_of
from conftest import DEVICES


def test_the_support_is_checked() -> None:
    torch.testing.assert_close(make_support(-1.0, 1.0, 3), torch.tensor([-1.0, 0.0, 1.0]))
    with pytest.raises(ValueError, match="at least 2 atoms"):
        make_support(-1.0, 1.0, 1)
    with pytest.raises(ValueError, match="support is empty"):
        make_support(1.0, 1.0, 51)
    with pytest.raises(ValueError, match="num_atoms must be 1"):
        QNetwork((4,), 2, num_atoms=0)


@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_the_projection_of_a_case_worked_by_hand(kind: str) -> None:
    # Atoms -1, 0, 1; probabilities 0.2, 0.3, 0.5; r = 0.5, gamma^k = 1.
    # Shifted atoms -0.5, 0.5, 1.5 -> clipped to 1: positions 0.5, 1.5, 2.
    # -0.5 splits 0.2 evenly between atoms -1 and 0; 0.5 splits 0.3 evenly between 0 and
    # 1; 1.5 (clipped to 1) puts 0.5 on atom 1: m = (0.1, 0.25, 0.65).
    # A terminal transition (bootstrap 0) puts everything at r = 0.5: (0, 0.5, 0.5).
    probs = [[0.2, 0.3, 0.5], [0.2, 0.3, 0.5]]
    rewards, bootstrap = [0.5, 0.5], [1.0, 0.0]
    if kind == "torch":
        args = [torch.tensor(x, dtype=torch.float64) for x in (probs, rewards, bootstrap)]
        m = project(*args, torch.tensor([-1.0, 0.0, 1.0], dtype=torch.float64)).numpy()
    else:
        m = project(*(np.array(x) for x in (probs, rewards, bootstrap)), np.array([-1.0, 0.0, 1.0]))
    np.testing.assert_allclose(m, [[0.1, 0.25, 0.65], [0.0, 0.5, 0.5]], atol=1e-12)


def test_the_projection_keeps_all_the_mass_and_agrees_across_backends() -> None:
    g = torch.Generator().manual_seed(0)
    support = make_support(-10.0, 10.0, 51, dtype=torch.float64)
    probs = torch.rand(2, 64, 51, generator=g, dtype=torch.float64).softmax(-1)  # a seed axis
    rewards = torch.randn(2, 64, generator=g, dtype=torch.float64) * 8  # some beyond the support
    bootstrap = 0.99**3 * (torch.rand(2, 64, generator=g) > 0.2).double()
    m = project(probs, rewards, bootstrap, support)
    torch.testing.assert_close(m.sum(-1), torch.ones(2, 64, dtype=torch.float64))
    assert (m >= 0).all()
    m_np = project(probs.numpy(), rewards.numpy(), bootstrap.numpy(), support.numpy())
    np.testing.assert_allclose(m_np, m.numpy(), atol=1e-13)
    # An atom that lands exactly on another keeps its whole mass there.
    exact = project(torch.tensor([[0.0, 1.0, 0.0]]), torch.tensor([1.0]), torch.tensor([1.0]),
                    torch.tensor([-1.0, 0.0, 1.0]))  # fmt: skip
    torch.testing.assert_close(exact, torch.tensor([[0.0, 0.0, 1.0]]))


@pytest.mark.parametrize("dueling", [False, True])
@pytest.mark.parametrize("obs_shape", [(4,), (3, 10, 10)], ids=["mlp", "minatar-cnn"])
def test_a_c51_network_gives_logits_whose_expectations_are_its_action_values(
    obs_shape: tuple[int, ...], dueling: bool
) -> None:
    torch.manual_seed(0)
    net = QNetwork(obs_shape, 4, [16], num_atoms=11, v_min=-5, v_max=5, dueling=dueling)
    support = support_of(net)
    assert support is not None and support.shape == (11,)
    assert "support" not in net.state_dict()  # rebuilt from the arguments, never saved
    x = torch.rand(6, *obs_shape)
    logits = net(x)
    assert logits.shape == (6, 4, 11)
    q = q_values(logits, support)
    torch.testing.assert_close(q, (logits.softmax(-1) * support).sum(-1))
    assert torch.equal(greedy_actions(logits, support), q.argmax(-1))
    # numpy, through the compiled program, agrees
    program = NumpyProgram.build(net)
    assert program is not None
    out = program.forward(x.numpy())
    np.testing.assert_allclose(out, logits.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(q_values(out, support.numpy()), q.detach().numpy(), rtol=1e-5,
                               atol=1e-6)
    assert support_of(QNetwork((4,), 2)) is None


def test_an_expected_value_head_passes_through_and_ties_go_to_the_first_action() -> None:
    out = torch.tensor([[1.0, 3.0, 3.0], [2.0, 0.0, 2.0]])
    assert q_values(out) is out
    assert greedy_actions(out).tolist() == [1, 0]
    assert greedy_actions(out.numpy()).tolist() == [1, 0]
    np.testing.assert_allclose(softmax(np.array([[1000.0, 1000.0]])), [[0.5, 0.5]])


@pytest.mark.parametrize("device", [*DEVICES, "meta"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_c51_keeps_device_and_dtype(device: str, dtype: torch.dtype) -> None:
    net = QNetwork((4,), 3, [8], num_atoms=5, dueling=True, device=device, dtype=dtype)
    assert net.support.device.type == device and net.support.dtype == dtype
    learner = Learner(net, copy.deepcopy(net), lr=1e-3)
    b = 6
    batch = Batch(
        obs=torch.rand(b, 4, device=device, dtype=dtype),
        actions=torch.zeros(b, dtype=torch.long, device=device),
        rewards=torch.ones(b, device=device, dtype=dtype),
        next_obs=torch.rand(b, 4, device=device, dtype=dtype),
        dones=torch.zeros(b, device=device, dtype=dtype),
        discounts=torch.full((b,), 0.9, device=device, dtype=dtype),
        weights=torch.ones(b, device=device, dtype=dtype),
    )
    errors = learner.update(batch)
    assert errors.shape == (b,) and errors.device.type == device and errors.dtype == dtype
    assert all(p.device.type == device for p in net.parameters())


def test_the_cross_entropy_is_the_per_sample_error_and_weights_scale_each_loss() -> None:
    support = make_support(-2.0, 2.0, 5, dtype=torch.float64)
    objective = CategoricalObjective(support)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    actions = torch.randint(0, 3, (8,), generator=g)
    target = torch.rand(8, 5, generator=g, dtype=torch.float64).softmax(-1)
    weights = torch.rand(8, generator=g, dtype=torch.float64)
    loss, errors, _ = objective.loss_and_errors(logits, actions, target, weights)
    log_p = logits[torch.arange(8), actions].log_softmax(-1)
    expected = -(target * log_p).sum(-1)
    torch.testing.assert_close(errors, expected.detach())
    torch.testing.assert_close(loss, (weights * expected).mean())
    loss_np, grad_np, errors_np, _ = objective.loss_numpy(
        logits.detach().numpy(), actions.numpy(), target.numpy(), weights.numpy()
    )
    loss.backward()
    assert loss_np == pytest.approx(loss.item(), rel=1e-12)
    np.testing.assert_allclose(grad_np, logits.grad.numpy(), rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(errors_np, errors.numpy(), rtol=1e-12)


@pytest.mark.parametrize("backend", ["numpy", "eager", "graph"])
def test_every_acting_backend_acts_greedily_on_the_expectation(backend: str) -> None:
    torch.manual_seed(1)
    net = QNetwork((4,), 5, [16], num_atoms=9, v_min=-1, v_max=1, dueling=True)
    obs = np.random.default_rng(0).random((7, 4), dtype=np.float32)
    kwargs = {"capture_fn": capture_eager} if backend == "graph" else {"backend": backend}
    selector = ActionSelector(net, (4,), 7, noise=False, **kwargs)
    with torch.no_grad():
        expected = greedy_actions(net(torch.from_numpy(obs)), net.support)
        plain = net(torch.from_numpy(obs)).mean(-1).argmax(-1)  # what a head-blind argmax did
    actions = selector(obs)
    np.testing.assert_array_equal(actions, expected.numpy())
    assert selector.backend == ("graph" if backend == "graph" else backend)
    assert not torch.equal(plain, expected), "the test needs the two rules to disagree"


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_c51_learns_the_values_of_a_two_action_problem(backend: str) -> None:
    """Action 0 ends the episode with reward 1; action 1 gives 0 and the same state again:
    Q = (1, 0.9) at gamma 0.9. The expectation of the learned distribution gets there."""
    torch.manual_seed(0)
    net = QNetwork((2,), 2, [32], num_atoms=21, v_min=-2, v_max=2, noisy_layers="none",
                   dueling=True)  # fmt: skip
    learner = Learner(net, copy.deepcopy(net), lr=5e-3, noise=False, backend=backend)
    b = 64
    g = torch.Generator().manual_seed(0)
    obs = torch.tensor([[1.0, 0.0]]).repeat(b, 1)
    for i in range(800):
        actions = torch.randint(0, 2, (b,), generator=g)
        ended = (actions == 0).float()
        weights = torch.rand(b, generator=g) + 0.5  # as prioritized replay's, within (0, 1.5)
        learner.update(Batch(obs, actions, ended, obs, ended, torch.full((b,), 0.9), None, weights))
        if i % 50 == 49:
            learner.sync_target()
    with torch.no_grad():
        q = q_values(net(obs[:1]), net.support)[0]
    torch.testing.assert_close(q, torch.tensor([1.0, 0.9]), atol=0.02, rtol=0)
