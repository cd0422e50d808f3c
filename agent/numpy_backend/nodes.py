"""The nodes of a numpy program: one kind per op the compiler knows (linear layers,
convolutions, activations, arithmetic, means, reshapes, casts), each a forward and a
hand-written vector-Jacobian product over slots of the program's tape
(:mod:`agent.numpy_backend.program`)."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.fx as fx
from torch import nn

from agent.noisy import NoisyLinear
from agent.numpy_backend.layers import GradientSink, Linear, TorchConv2d, Unsupported
from agent.numpy_backend.ops import ACTIVATIONS, ACTIVATION_FUNCTIONS, relu_

__all__ = [
    "Const",
    "Node",
    "activation_call",
    "activation_node",
    "arithmetic_node",
    "cast_target",
    "constant",
    "conv_node",
    "fresh_layer_output",
    "grad_flags",
    "linear_node",
    "mean_node",
    "reader",
    "reshape_node",
    "unflatten_node",
]

Array = np.ndarray


class Const:
    """A constant argument of a traced call (a Python number)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class Node:
    """One traced op: reads ``args`` (slot numbers, or constants), writes slot ``out``."""

    __slots__ = ("args", "backward", "forward", "grad_args", "out")

    def __init__(
        self,
        out: int,
        args: list[Any],
        forward: Callable[..., Array],
        backward: Callable[..., list[Array | None]],
        grad_args: list[bool],
    ) -> None:
        self.out, self.args, self.forward, self.backward = out, args, forward, backward
        self.grad_args = grad_args  # which arguments (slots) need a gradient


def constant(arg: Any) -> Const:
    """A traced call's non-tensor argument, if it is a Python number or a tuple of ints;
    else unsupported."""
    if isinstance(arg, (int, float, bool)):
        return Const(arg)
    if isinstance(arg, tuple) and all(type(a) is int for a in arg):
        return Const(arg)
    raise Unsupported(f"argument {arg!r}")


def cast_target(node: fx.Node) -> np.dtype:
    """The dtype a traced ``.to(dtype)`` / ``.float()`` / ``.double()`` casts to (float32
    or float64 only; any other cast, or a ``.to`` that also moves, is unsupported)."""
    args, kwargs = list(node.args), dict(node.kwargs)
    target = {"float": torch.float32, "double": torch.float64}.get(str(node.target))
    if node.target == "to":
        target = kwargs.pop("dtype", None) or (args.pop(1) if len(args) > 1 else None)
        if kwargs or len(args) != 1:
            raise Unsupported(f"to({node.args}, {node.kwargs})")
    if target not in (torch.float32, torch.float64):
        raise Unsupported(f"cast to {target}")
    return np.dtype(np.float32 if target == torch.float32 else np.float64)


def reader(fn: Callable[..., Array], args: list[Any]) -> Callable[[list[Any]], Array]:
    """``fn`` applied to its arguments read from the slots, specialised for the common shapes."""
    if len(args) == 1 and type(args[0]) is int:
        (a,) = args
        return lambda slots: fn(slots[a])
    if len(args) == 2 and type(args[0]) is int and type(args[1]) is int:
        a, b = args
        return lambda slots: fn(slots[a], slots[b])
    return lambda slots: fn(*[slots[x] if type(x) is int else x.value for x in args])


def grad_flags(args: list[Any], needs_grad: dict[int, bool]) -> list[bool]:
    return [type(a) is int and needs_grad[a] for a in args]


def linear_node(
    out: int, args: list[Any], layer: Linear, needs_grad: dict[int, bool], sink: GradientSink | None
) -> Node:
    (a,) = args
    need_input = needs_grad[a]

    def backward(g: Array, values: list[Array], y: Array) -> list[Array | None]:
        assert sink is not None
        return [layer.backward(g, values[0], need_input, sink)]

    return Node(out, args, layer.forward, backward, [need_input])


def conv_node(
    out: int,
    args: list[Any],
    layer: nn.Conv2d,
    needs_grad: dict[int, bool],
    sink: GradientSink | None,
) -> tuple[Node, bool]:
    """A convolution node, and whether its own parameters are trainable."""
    (a,) = args
    conv = TorchConv2d(layer)
    slot = sink.slot if sink is not None else (lambda p: None)
    i_weight = slot(layer.weight)
    i_bias = None if layer.bias is None else slot(layer.bias)
    need_input = needs_grad[a]

    def backward(g: Array, values: list[Array], y: Array) -> list[Array | None]:
        assert sink is not None
        grad_input, grad_weight, grad_bias = conv.backward(
            g, values[0], need_input, i_weight is not None, i_bias is not None
        )
        if grad_weight is not None:
            sink.add(i_weight, grad_weight)
        if grad_bias is not None:
            sink.add(i_bias, grad_bias)
        return [grad_input]

    trainable = i_weight is not None or i_bias is not None
    return Node(out, args, conv, backward, [need_input]), trainable


def activation_call(node: fx.Node, args: list[Any]) -> tuple[str, float | None]:
    """(name, parameter or None) of an activation called as a function, e.g.
    ``F.leaky_relu(x, 0.2)`` or ``F.elu(x, alpha=0.5)``."""
    name = ACTIVATION_FUNCTIONS[node.target]
    param = ACTIVATIONS[name].param
    kwargs = {k: v for k, v in node.kwargs.items() if k != "inplace"}
    value = args[1].value if len(args) > 1 else kwargs.pop(param, None) if param else None
    if kwargs or len(args) > (1 if param is None else 2) or not (
        value is None or isinstance(value, int | float)
    ):
        raise Unsupported(f"{node.target} with {node.kwargs}")
    return name, value


def activation_node(
    out: int,
    args: list[Any],
    name: str,
    value: float | None,
    needs_grad: dict[int, bool],
    owned: bool = False,
) -> Node:
    forward, grad = ACTIVATIONS[name].bound(None if value is None else float(value))
    if name == "relu" and owned:
        # In place: nothing else reads the input, and ReLU's backward needs only its output.
        forward = relu_
    if len(args) != 1 or type(args[0]) is not int:
        raise Unsupported("an activation of more than one tensor")
    return Node(
        out,
        args,
        forward,
        lambda g, values, y: [grad(g, values[0], y)],
        grad_flags(args, needs_grad),
    )


def reshape_node(out: int, args: list[Any], needs_grad: dict[int, bool]) -> Node:
    """Flatten to (B, -1)."""
    return Node(
        out,
        args,
        lambda x: x.reshape(x.shape[0], -1),
        lambda g, values, y: [g.reshape(values[0].shape)],
        grad_flags(args, needs_grad),
    )


def _unbroadcast(g: Array, shape: tuple[int, ...]) -> Array:
    """Sum ``g`` over the axes that broadcasting added or stretched to reach its shape."""
    if g.shape == shape:
        return g
    g = g.sum(axis=tuple(range(g.ndim - len(shape)))) if g.ndim > len(shape) else g
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g

_ARITHMETIC = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
               "div": operator.truediv}  # fmt: skip


def arithmetic_node(out: int, name: str, args: list[Any], needs_grad: dict[int, bool]) -> Node:
    if name == "neg":
        return Node(
            out, args, operator.neg, lambda g, values, y: [-g], grad_flags(args, needs_grad)
        )
    if len(args) != 2:
        raise Unsupported(f"{name} of {len(args)} arguments")

    def backward(g: Array, values: list[Any], y: Array) -> list[Array | None]:
        a, b = values
        if name == "add":
            da, db = g, g
        elif name == "sub":
            da, db = g, -g
        elif name == "mul":
            da, db = g * b, g * a
        else:
            da, db = g / b, -g * a / (b * b)
        return [_unbroadcast(da, np.shape(a)), _unbroadcast(db, np.shape(b))]

    return Node(out, args, _ARITHMETIC[name], backward, grad_flags(args, needs_grad))


def mean_node(
    out: int,
    args: list[Any],
    kwargs: dict[str, Any],
    needs_grad: dict[int, bool],
    rank: int,
) -> tuple[Node, int]:
    """A mean over one dimension, and the fewest dimensions of its output."""
    dim = kwargs.pop("dim", args[1].value if len(args) > 1 else None)
    keepdim = bool(kwargs.pop("keepdim", args[2].value if len(args) > 2 else False))
    if kwargs or not isinstance(dim, int) or dim == 0 or dim <= -rank:
        # Over the batch (dim 0, or a dimension from the end that may be it) or everything
        # would mix rows, which backward over the first rows of a forward (the learner's
        # obs) assumes never happens.
        raise Unsupported(f"mean over dim={dim}")
    source = args[:1]

    def backward(g: Array, values: list[Array], y: Array) -> list[Array | None]:
        x = values[0]
        axis = dim % x.ndim
        if not keepdim:
            g = np.expand_dims(g, axis)
        return [np.broadcast_to(g / x.shape[axis], x.shape)]

    node = Node(
        out,
        source,
        lambda x: x.mean(axis=dim, keepdims=keepdim),
        backward,
        grad_flags(source, needs_grad),
    )
    return node, rank if keepdim else rank - 1


def unflatten_node(
    out: int,
    args: list[Any],
    kwargs: dict[str, Any],
    needs_grad: dict[int, bool],
    rank: dict[int, int],
) -> tuple[Node, int]:
    """``x.unflatten(-1, sizes)`` (the last dimension only: rows stay rows), and the
    fewest dimensions of its output."""
    dim = kwargs.pop("dim", args[1].value if len(args) > 1 else None)
    sizes = kwargs.pop("sizes", args[2].value if len(args) > 2 else None)
    if kwargs or dim != -1 or not isinstance(sizes, tuple) or type(args[0]) is not int:
        raise Unsupported(f"unflatten({dim}, {sizes})")
    source = args[:1]
    node = Node(
        out,
        source,
        lambda x: x.reshape(*x.shape[:-1], *sizes),
        lambda g, values, y: [g.reshape(values[0].shape)],
        grad_flags(source, needs_grad),
    )
    return node, rank[args[0]] + len(sizes) - 1


def fresh_layer_output(module: nn.Module, arg: Any) -> bool:
    """True for a linear layer's or convolution's output that nothing else reads (safe to
    overwrite)."""
    return (
        isinstance(arg, fx.Node)
        and arg.op == "call_module"
        and type(module.get_submodule(arg.target))  # type: ignore[arg-type]
        in (nn.Linear, NoisyLinear, nn.Conv2d)
        and len(arg.users) == 1
    )
