"""The op table of the numpy backend: the elementwise activations and arithmetic that its
one compiler (:mod:`agent.numpy_backend.program`) reproduces, each activation's forward
and backward side by side, with the modules, functions and methods that reach it."""

from __future__ import annotations

import operator
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "ACTIVATIONS",
    "ACTIVATION_FUNCTIONS",
    "ACTIVATION_METHODS",
    "ACTIVATION_MODULES",
    "ARITHMETIC",
    "Activation",
    "activation_of_module",
    "relu",
    "relu_",
    "sigmoid",
]

Array = np.ndarray


def sigmoid(x: Array) -> Array:
    return 1.0 / (1.0 + np.exp(-x))


def relu(x: Array) -> Array:
    return np.maximum(x, 0)


def relu_(x: Array) -> Array:
    """In place, for an input that nothing else reads (fresh from a linear layer)."""
    return np.maximum(x, 0, out=x)


def leaky_relu(x: Array, negative_slope: float = 0.01) -> Array:
    return np.where(x > 0, x, x * negative_slope)


def elu(x: Array, alpha: float = 1.0) -> Array:
    return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


def silu(x: Array) -> Array:
    return x * sigmoid(x)


# Backwards: (output gradient g, input x, output y[, parameter]) -> input gradient.
def _relu_backward(g: Array, x: Array, y: Array) -> Array:
    return g * (y > 0)  # y, not x: a ReLU may have overwritten its input in place


def _leaky_relu_backward(g: Array, x: Array, y: Array, negative_slope: float = 0.01) -> Array:
    return np.where(x > 0, g, g * negative_slope)


def _elu_backward(g: Array, x: Array, y: Array, alpha: float = 1.0) -> Array:
    return np.where(x > 0, g, g * (y + alpha))


def _silu_backward(g: Array, x: Array, y: Array) -> Array:
    s = sigmoid(x)
    return g * s * (1.0 + x * (1.0 - s))


class Activation(NamedTuple):
    forward: Callable[..., Array]
    backward: Callable[..., Array]
    param: str | None = None
    """The name of its one parameter (``negative_slope``, ``alpha``), if it has one."""

    def bound(
        self, value: float | None = None
    ) -> tuple[Callable[..., Array], Callable[..., Array]]:
        """(forward(x), backward(g, x, y)) with the parameter, if any, set to ``value``."""
        if self.param is None or value is None:
            return self.forward, self.backward
        return partial(self.forward, **{self.param: value}), partial(
            self.backward, **{self.param: value}
        )


ACTIVATIONS: dict[str, Activation] = {
    "relu": Activation(relu, _relu_backward),
    "tanh": Activation(np.tanh, lambda g, x, y: g * (1.0 - y * y)),
    "sigmoid": Activation(sigmoid, lambda g, x, y: g * y * (1.0 - y)),
    "silu": Activation(silu, _silu_backward),
    "leaky_relu": Activation(leaky_relu, _leaky_relu_backward, "negative_slope"),
    "elu": Activation(elu, _elu_backward, "alpha"),
}
# As modules (their parameter read from the module) ...
ACTIVATION_MODULES: dict[type, str] = {
    nn.ReLU: "relu",
    nn.Tanh: "tanh",
    nn.Sigmoid: "sigmoid",
    nn.SiLU: "silu",
    nn.LeakyReLU: "leaky_relu",
    nn.ELU: "elu",
}
# ... as functions (a parameter, if any, as their second argument or by name) ...
ACTIVATION_FUNCTIONS: dict[Any, str] = {
    F.relu: "relu",
    torch.relu: "relu",
    torch.tanh: "tanh",
    F.tanh: "tanh",
    torch.sigmoid: "sigmoid",
    F.sigmoid: "sigmoid",
    F.silu: "silu",
    F.leaky_relu: "leaky_relu",
    F.elu: "elu",
}
# ... and as tensor methods.
ACTIVATION_METHODS: dict[str, str] = {"relu": "relu", "tanh": "tanh", "sigmoid": "sigmoid"}
# Elementwise arithmetic (functions; the methods add, sub and mul too), by name.
ARITHMETIC: dict[Any, str] = {
    operator.add: "add",
    torch.add: "add",
    operator.sub: "sub",
    torch.sub: "sub",
    operator.mul: "mul",
    torch.mul: "mul",
    operator.truediv: "div",
    operator.neg: "neg",
}


def activation_of_module(module: nn.Module) -> tuple[str, float | None]:
    """(the activation's name, its parameter's value or None) for an activation module."""
    name = ACTIVATION_MODULES[type(module)]
    param = ACTIVATIONS[name].param
    return name, None if param is None else float(getattr(module, param))
