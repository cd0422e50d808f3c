"""agent/numpy_backend/ops.py: every op in the one table is reproduced by the numpy
backend, acting and gradients, as PyTorch computes it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from agent.noisy import NoisyLinear
from agent.numpy_backend import GradientSink, NumpyForward, NumpyProgram
from agent.numpy_backend.ops import ACTIVATION_FUNCTIONS, ACTIVATION_MODULES, ACTIVATIONS


class _Through(nn.Module):
    """A noisy layer, then ``act`` (a module or a function with its arguments), then a head."""

    def __init__(self, act, *args) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.l1, self.out = NoisyLinear(4, 8), nn.Linear(8, 3)
        self.act = act if isinstance(act, nn.Module) else None
        self.fn, self.args = (None, ()) if self.act is not None else (act, args)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.l1(x)
        h = self.act(h) if self.act is not None else self.fn(h, *self.args)
        return self.out(h)


def _modules() -> list[nn.Module]:
    made = {"leaky_relu": nn.LeakyReLU(0.2), "elu": nn.ELU(0.5)}
    return [made.get(name, kind()) for kind, name in ACTIVATION_MODULES.items()]


def _functions() -> list[tuple]:
    params = {"leaky_relu": (0.2,), "elu": (0.5,)}
    return [(fn, *params.get(name, ())) for fn, name in ACTIVATION_FUNCTIONS.items()]


@pytest.mark.parametrize(
    "act", [*_modules(), *_functions()], ids=lambda a: getattr(a, "__name__", type(a).__name__)
)
def test_acting_and_gradients_reproduce_every_activation_in_the_table(act) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    net = (_Through(*act) if isinstance(act, tuple) else _Through(act)).double()
    x = np.random.default_rng(0).standard_normal((5, 4))
    expected = net(torch.from_numpy(x)).detach().numpy()
    acting = NumpyForward.build(net, np.random.default_rng(0))
    assert acting is not None
    np.testing.assert_allclose(acting.q_values(x, noise=True), expected, rtol=1e-12)
    params = list(net.parameters())
    grads = [torch.zeros_like(p) for p in params]
    program = NumpyProgram.build(net, GradientSink(params, [g.numpy() for g in grads]))
    assert program is not None
    np.testing.assert_allclose(program.forward(x, tape=True), expected, rtol=1e-12)
    program.backward(np.ones_like(expected))
    net(torch.from_numpy(x)).sum().backward()
    for p, g in zip(params, grads, strict=True):
        np.testing.assert_allclose(g.numpy(), p.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_every_named_activation_is_reachable_as_a_module_or_a_function() -> None:
    reachable = set(ACTIVATION_MODULES.values()) | set(ACTIVATION_FUNCTIONS.values())
    assert reachable == set(ACTIVATIONS)
