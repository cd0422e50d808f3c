"""NumpyProgram: the numpy program's forward and gradients equal the module's and autograd's."""

from __future__ import annotations

import itertools
import re
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from agent.networks import QNetwork
from agent.noisy import NoisyLinear, reset_noise, set_noise
from agent.numpy_backend import (
    GradientSink,
    NotApplicable,
    NumpyForward,
    NumpyProgram,
    Unsupported,
    compiled_or_none,
    program,
)


Compiled = tuple[NumpyProgram, list[nn.Parameter], list[torch.Tensor], list[bool]]


def _compile(net: nn.Module) -> Compiled:
    params = list(net.parameters())
    grads = [torch.zeros_like(p) for p in params]
    sink = GradientSink(params, [g.numpy() for g in grads])
    program = NumpyProgram.build(net, sink)
    written = sink.written
    assert program is not None
    return program, params, grads, written


def _check_against_autograd(
    net: nn.Module, in_features: int | tuple[int, ...], rows: int = 7, frames: bool = False
) -> None:
    """Q values and d(sum(w * Q))/d(param) for random w: numpy == autograd (float64).
    ``frames``: uint8 observations of 0-255; the gradient covers the first rows only, as
    the learner's (obs, then next_obs)."""
    program, params, grads, written = _compile(net)
    rng = np.random.default_rng(1)
    shape = in_features if isinstance(in_features, tuple) else (in_features,)
    # float32 observations for a QNetwork (its forward casts them), else the parameters' dtype
    if frames:
        x = rng.integers(0, 256, (rows, *shape), dtype=np.uint8)
    else:
        x = rng.standard_normal((rows, *shape)).astype(
            np.float32 if isinstance(net, QNetwork) else np.float64
        )
    q = program.forward(x, tape=True)
    if frames:
        x, q = x[: rows - 2], q[: rows - 2]
    weights = rng.standard_normal(q.shape)
    program.backward(weights)
    for p in params:
        p.grad = None
    expected = net(torch.from_numpy(x))
    (expected * torch.from_numpy(weights)).sum().backward()
    np.testing.assert_allclose(q, expected.detach().numpy(), rtol=1e-12, atol=1e-12)
    for p, g, w in zip(params, grads, written, strict=True):
        if p.grad is None:  # not used by this forward (a sigma with the noise off), or frozen
            assert not w and not g.any()
        else:
            assert w
            np.testing.assert_allclose(g.numpy(), p.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("noise", [True, False])
@pytest.mark.parametrize("dueling", [False, True])
@pytest.mark.parametrize("noisy", ["all", "last", "none"])
@pytest.mark.parametrize("hidden", [(16,), (32, 16)])
def test_gradients_equal_autograd_for_every_qnetwork_mlp(
    hidden: tuple[int, ...], noisy: str, dueling: bool, noise: bool
) -> None:
    torch.manual_seed(0)
    net = QNetwork((5,), 4, hidden, noisy_layers=noisy, dueling=dueling, dtype=torch.float64)
    reset_noise(net)
    set_noise(net, noise)
    _check_against_autograd(net, 5)


@pytest.mark.parametrize("noise", [True, False])
@pytest.mark.parametrize("dueling", [False, True])
@pytest.mark.parametrize("noisy", ["all", "last", "none"])
def test_gradients_equal_autograd_for_the_minatar_cnn(
    noisy: str, dueling: bool, noise: bool
) -> None:
    torch.manual_seed(0)
    net = QNetwork((3, 6, 5), 4, (16,), noisy_layers=noisy, dueling=dueling, dtype=torch.float64)
    reset_noise(net)
    set_noise(net, noise)
    _check_against_autograd(net, (3, 6, 5))


class TwoConvs(nn.Module):
    """A convolution after a convolution (an input gradient), stride, padding, no bias."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(2, 5, kernel_size=3, padding=1)
        self.c2 = nn.Conv2d(5, 4, kernel_size=2, stride=2, bias=False)
        self.flatten = nn.Flatten()
        self.out = NoisyLinear(4 * 4 * 3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.c1(x))
        return self.out(self.flatten(torch.tanh(self.c2(h))))


def test_gradients_equal_autograd_through_stacked_convolutions() -> None:
    torch.manual_seed(0)
    _check_against_autograd(TwoConvs().double(), (2, 8, 6))


@pytest.mark.parametrize("noise", [True, False])
@pytest.mark.parametrize("noisy", ["all", "none"])
@pytest.mark.parametrize("num_atoms", [1, 51])
@pytest.mark.parametrize("shape", [(4, 84, 84), (3, 27, 31)], ids=["atari", "cropped"])
def test_gradients_equal_autograd_for_the_der_network(
    shape: tuple[int, ...], num_atoms: int, noisy: str, noise: bool
) -> None:
    """Data-efficient Rainbow's torso (convolutions whose stride is their kernel, over uint8
    frames cast and scaled) and its dueling heads, to 1e-10 in float64; trailing rows and
    columns dropped."""
    torch.manual_seed(0)
    net = QNetwork(shape, 5, (16,), torso="der", dueling=True, noisy_layers=noisy,
                   num_atoms=num_atoms, input_scale=255.0, dtype=torch.float64)  # fmt: skip
    reset_noise(net)
    set_noise(net, noise)
    _check_against_autograd(net, shape, frames=True)


class ConvolutionsBetweenLayers(nn.Module):
    """Convolutions, strided and padded, read by a convolution, a mean and a product, the
    first over an input scaled by a product."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(2, 6, kernel_size=2, stride=2)
        self.c2 = nn.Conv2d(6, 4, kernel_size=3, stride=1, padding=1)
        self.c3 = nn.Conv2d(4, 5, kernel_size=2, stride=2, bias=False)
        self.flat = nn.Flatten()
        self.out = nn.Linear(5 * 2 * 3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.c1(x.to(torch.float64) * 0.5))
        h = torch.tanh(self.c2(h)) * h.mean(dim=1, keepdim=True)
        return self.out(self.flat(torch.relu(self.c3(h))))


class InputReadTwice(nn.Module):
    """The input feeds a convolution and a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 3, kernel_size=3, stride=3)
        self.flat = nn.Flatten()
        self.skip = nn.Linear(36, 3)
        self.out = nn.Linear(12, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.flat(torch.relu(self.conv(x)))) + self.skip(self.flat(x))


@pytest.mark.parametrize("module", [ConvolutionsBetweenLayers, InputReadTwice])
def test_gradients_equal_autograd_around_convolutions(module: type) -> None:
    torch.manual_seed(0)
    net = module().double()
    shape = (2, 9, 13) if module is ConvolutionsBetweenLayers else (1, 6, 6)
    _check_against_autograd(net, shape)


class Residual(nn.Module):
    """Functional calls, a residual, a layer used twice, constants."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = NoisyLinear(4, 16)
        self.l2 = nn.Linear(16, 16)
        self.out = NoisyLinear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.l1(x))
        h = torch.tanh(self.l2(h)) + h
        h = torch.sigmoid(self.l2(h)) * 2.0 - h / 3.0  # l2 again: its gradients add up
        return -self.out(h).mul(0.5)


class Functional(Residual):
    """Residual's layers, with activations called as functions, with and without their
    parameters."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.leaky_relu(self.l1(x), 0.2)
        h = F.elu(self.l2(h), alpha=0.5) + F.leaky_relu(h)
        return self.out(F.silu(h))


USER_MODULES = {
    "residual": Residual,
    "functional": Functional,
    "activations": lambda: nn.Sequential(
        NoisyLinear(4, 16),
        nn.LeakyReLU(0.1),
        nn.Linear(16, 16),
        nn.ELU(0.7),
        nn.Linear(16, 16),
        nn.SiLU(),
        nn.Flatten(),
        NoisyLinear(16, 3),
        nn.Tanh(),
    ),
}


@pytest.mark.parametrize("name", list(USER_MODULES))
def test_gradients_equal_autograd_for_users_modules(name: str) -> None:
    torch.manual_seed(0)
    net = USER_MODULES[name]().double()
    _check_against_autograd(net, 4)


def test_frozen_parameters_get_no_gradient() -> None:
    torch.manual_seed(0)
    net = QNetwork((5,), 4, (16, 16), noisy_layers="all", dtype=torch.float64)
    net.head[0].weight_sigma.requires_grad_(False)
    net.head[2].requires_grad_(False)
    _check_against_autograd(net, 5)


def test_float32_gradients_are_close_to_autograd() -> None:
    torch.manual_seed(0)
    net = QNetwork((5,), 4, (32, 32), noisy_layers="all", dueling=True)
    program, params, grads, _ = _compile(net)
    x = np.random.default_rng(0).standard_normal((9, 5)).astype(np.float32)
    weights = np.random.default_rng(1).standard_normal((9, 4)).astype(np.float32)
    assert program.forward(x, tape=True).dtype == np.float32
    program.backward(weights)
    (net(torch.from_numpy(x)) * torch.from_numpy(weights)).sum().backward()
    for p, g in zip(params, grads, strict=True):
        np.testing.assert_allclose(g.numpy(), p.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_a_forward_without_tape_leaves_the_taped_one_for_backward() -> None:
    torch.manual_seed(0)
    net = QNetwork((5,), 4, (16,), noisy_layers="none", dtype=torch.float64)
    program, params, grads, _ = _compile(net)
    rng = np.random.default_rng(0)
    x, other = rng.standard_normal((6, 5)), rng.standard_normal((6, 5))
    program.forward(x, tape=True)
    program.forward(other)  # scratch room: the tape still holds x's values
    program.backward(np.ones((6, 4)))
    net(torch.from_numpy(x)).sum().backward()
    for p, g in zip(params, grads, strict=True):
        np.testing.assert_allclose(g.numpy(), p.grad.numpy(), rtol=1e-12)


def test_parameters_are_live_views() -> None:
    torch.manual_seed(0)
    net = QNetwork((5,), 4, (16,), dtype=torch.float64)
    program = NumpyProgram.build(net)
    assert program is not None
    x = np.ones((2, 5))
    other = QNetwork((5,), 4, (16,), dtype=torch.float64)
    net.load_state_dict(other.state_dict())  # in place: the program sees it
    with torch.no_grad():
        np.testing.assert_allclose(program.forward(x), net(torch.from_numpy(x)).numpy())
    with pytest.raises(RuntimeError, match="without a gradient sink"):
        program.backward(np.ones((2, 4)))


class OptsOut(nn.Module):
    """A module that asks to stay in PyTorch (``numpy_backend_opt_out``)."""

    numpy_backend_opt_out = "it says so"

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l1(x)


class MeanOverBatch(nn.Module):
    def __init__(self, dim: int = 0) -> None:
        super().__init__()
        self.l1 = nn.Linear(4, 3)
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.l1(x)
        return y - y.mean(dim=self.dim)  # mixes rows: not differentiated here


class Sorted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sort(self.l1(x), dim=1).values


class Normed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class Branching(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.l1(x)
        return y if y.sum() > 0 else -y  # control flow on values: cannot be traced


@pytest.mark.parametrize(
    ("make", "error", "reason"),
    [
        (OptsOut, NotApplicable, "OptsOut (OptsOut opts out: it says so)"),
        (MeanOverBatch, Unsupported, "MeanOverBatch (mean over dim=0 at node mean)"),
        (lambda: MeanOverBatch(-2), Unsupported, "MeanOverBatch (mean over dim=-2 at node mean)"),
        (Sorted, Unsupported, "Sorted (call_function sort at node sort)"),
        (Normed, Unsupported, "Normed (module LayerNorm at body.1)"),
        (Branching, Unsupported, "Branching (torch.fx cannot trace its forward"),
        (lambda: QNetwork((5,), 3, (8,)).to("meta"), NotApplicable,
         "QNetwork (its tensors are on meta in float32, not all on the CPU"),
        (lambda: QNetwork((5,), 3, (8,), dtype=torch.float16), NotApplicable,
         "QNetwork (its tensors are on cpu in float16, not all on the CPU"),
    ],
    ids=["nature_cnn", "mean_over_batch", "mean_over_dim_-2", "sort", "layer_norm", "branching",
         "meta", "float16"],
)  # fmt: skip
def test_what_it_cannot_compile_is_named(make, error: type, reason: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(Unsupported) as raised:
        NumpyProgram.build(make())
    assert raised.type is error and str(raised.value).startswith(reason), raised.value
    # Acting reads the same compiler: the same modules, the same reasons.
    with pytest.raises(error, match=re.escape(reason)):
        NumpyForward.build(make(), np.random.default_rng(0))


def test_a_compiler_bug_propagates(monkeypatch: pytest.MonkeyPatch) -> None:
    # A bug is not "outside what compiles": hiding it would move runs to PyTorch unseen.
    def broken(*args: object, **kwargs: object) -> None:
        raise TypeError("unsupported operand type(s) for +: 'int' and 'NoneType'")

    monkeypatch.setattr(program, "Linear", broken)  # the layer builder the compiler calls
    net = QNetwork((5,), 3, (8,))
    with pytest.raises(TypeError, match="unsupported operand"):
        NumpyProgram.build(net)
    with pytest.raises(TypeError, match="unsupported operand"):
        NumpyForward.build(net, np.random.default_rng(0))
    with pytest.raises(TypeError, match="unsupported operand"):
        compiled_or_none(lambda: NumpyProgram.build(net), "PyTorch runs it")


class NormedOnce(Normed):
    pass


def test_compiled_or_none_says_each_reason_once_and_expected_cases_never() -> None:
    def compiled(net: nn.Module) -> NumpyProgram | None:
        return compiled_or_none(lambda: NumpyProgram.build(net), "PyTorch runs it")

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")  # the once is the backend's own, not the filter's
        for _ in range(3):
            assert compiled(NormedOnce()) is None
        assert compiled(QNetwork((5,), 3, (8,)).to("meta")) is None
        assert compiled(OptsOut()) is None
        assert isinstance(compiled(QNetwork((5,), 3, (8,))), NumpyProgram)
        assert isinstance(compiled(QNetwork((4, 84, 84), 3, (32,), input_scale=255.0)),
                          NumpyProgram)  # the Nature CNN compiles  # fmt: skip
    reason = "NormedOnce (module LayerNorm at body.1)"
    assert [(w.category, str(w.message)) for w in said] == [
        (RuntimeWarning, f"the numpy backend cannot compile {reason}; PyTorch runs it")
    ]


def test_the_noise_switch_overrides_every_layer_for_one_forward() -> None:
    torch.manual_seed(0)
    net = QNetwork((5,), 4, (16,), noisy_layers="all", dtype=torch.float64)
    program, params, grads, _ = _compile(net)
    x = np.random.default_rng(0).standard_normal((3, 5))
    with torch.no_grad():
        noisy_q = net(torch.from_numpy(x)).numpy()
        set_noise(net, False)
        mean_q = net(torch.from_numpy(x)).numpy()
    # None follows each layer's noise_enabled (now off), True and False override it.
    np.testing.assert_allclose(program.forward(x), mean_q, rtol=1e-12)
    np.testing.assert_allclose(program.forward(x, noise=True), noisy_q, rtol=1e-12)
    set_noise(net, True)
    np.testing.assert_allclose(program.forward(x), noisy_q, rtol=1e-12)
    np.testing.assert_allclose(program.forward(x, noise=False), mean_q, rtol=1e-12)
    assert not np.allclose(mean_q, noisy_q)
    # A taped forward with the noise off differentiates the mean weights only.
    program.forward(x, tape=True, noise=False)
    program.backward(np.ones((3, 4)))
    set_noise(net, False)
    net(torch.from_numpy(x)).sum().backward()
    for p, g in zip(params, grads, strict=True):
        expected = np.zeros_like(g.numpy()) if p.grad is None else p.grad.numpy()
        np.testing.assert_allclose(g.numpy(), expected, rtol=1e-12)


def test_every_network_of_the_learner_tests_compiles() -> None:
    # The learner's auto backend relies on every MLP QNetwork compiling.
    for hidden, noisy, dueling in itertools.product([(), (8,), (8, 8, 8)], ["all", "last", "none"],
                                                    [False, True]):  # fmt: skip
        if dueling and not hidden:
            continue
        net = QNetwork((3,), 2, hidden, noisy_layers=noisy, dueling=dueling)
        assert NumpyProgram.build(net) is not None, (hidden, noisy, dueling)
