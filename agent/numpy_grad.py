"""Gradients of a module's forward in numpy: the learner's CPU fast path.

On a CPU, a DQN update of a small network costs mostly PyTorch's fixed cost per op
and the autograd engine's per-node bookkeeping, not arithmetic (``bench/learner.py``;
figures in docs/research/log.md). :class:`NumpyGrad` compiles a module's ``forward``
once (traced with ``torch.fx``, the same tracer as the acting path's
:class:`~agent.acting.numpy_forward.NumpyForward`, and the same op table,
:mod:`agent.numpy_ops`) into a numpy program that keeps what the backward pass needs,
and computes the parameters' gradients with one hand-written vector-Jacobian product
per op, in reverse order (convolutions: PyTorch's own kernels,
:class:`~agent.acting.numpy_forward.TorchConv2d`).
Parameters, noise buffers and gradients are zero-copy numpy views of the live tensors,
so optimizer steps, ``load_state_dict`` and ``reset_noise`` are seen with no copying,
and the gradients land where the optimizer reads them.

The contract, held by tests for every network ``QNetwork`` builds and for users'
own modules: for the same parameters and noise, :meth:`NumpyGrad.forward` equals
``module(x)`` and :meth:`NumpyGrad.backward` equals autograd's gradients, up to
float rounding. A NoisyLinear uses its noise while its ``noise_enabled`` is True,
as its own ``forward`` does. Whatever the tracer cannot reproduce (control flow on
values, other ops, parameters on another device) makes
:meth:`NumpyGrad.build` return ``None``; the learner then keeps PyTorch's autograd.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.fx as fx
from torch import nn

from agent.acting.numpy_forward import (
    TorchConv2d,
    cast_target,
    constant,
    cpu_float_dtype,
    trace_leaves,
)
from agent.noisy import NoisyLinear
from agent.numpy_ops import (
    ACTIVATION_FUNCTIONS,
    ACTIVATION_METHODS,
    ACTIVATION_MODULES,
    ACTIVATIONS,
    ARITHMETIC,
    activation_of_module,
    relu_,
)

__all__ = ["GradientSink", "NumpyGrad"]

Array = np.ndarray


class GradientSink:
    """Where gradients go: a numpy view per trainable parameter, and which were written.

    ``views[i]`` is the gradient buffer of ``params[i]``; ``written[i]`` turns True
    at the first write (later writes add to it, for a layer used twice). The caller
    zeroes the buffers and calls :meth:`clear` before each backward pass.
    """

    def __init__(self, params: Sequence[torch.Tensor], views: Sequence[Array]) -> None:
        self.index = {id(p): i for i, p in enumerate(params) if p.requires_grad}
        self.views = list(views)
        self.written = [False] * len(self.views)

    def clear(self) -> None:
        """Forget what the last backward wrote (before the next one)."""
        for i in range(len(self.written)):
            self.written[i] = False

    def slot(self, param: torch.Tensor) -> int | None:
        """The index of ``param``'s gradient buffer, None for a frozen or foreign tensor."""
        return self.index.get(id(param))

    def add(self, i: int | None, value: Array) -> None:
        if i is None:
            return
        if self.written[i]:
            self.views[i] += value
        else:
            self.views[i][...] = value
            self.written[i] = True

    def add_matmul(self, i: int | None, a: Array, b: Array) -> None:
        """``a @ b`` into buffer ``i`` (written in place when it is the first write)."""
        if i is None:
            return
        if self.written[i]:
            self.views[i] += a @ b
        else:
            np.matmul(a, b, out=self.views[i])
            self.written[i] = True


def _view(t: torch.Tensor) -> Array:
    return t.detach().numpy()


class _Linear:
    """``nn.Linear`` or ``NoisyLinear``: y = x W^T + b, W = mu + sigma * eps when noisy."""

    def __init__(
        self,
        layer: nn.Module,
        sink: GradientSink | None,
        noise: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        self.layer = layer
        self.noisy = isinstance(layer, NoisyLinear)
        slot = sink.slot if sink is not None else (lambda p: None)
        if self.noisy:
            self.weight, self.bias = _view(layer.weight_mu), _view(layer.bias_mu)
            self.weight_sigma, self.bias_sigma = _view(layer.weight_sigma), _view(layer.bias_sigma)
            # The layer's own noise, or buffers read in their place (NoiseBuffers).
            epsilon, weight_epsilon = noise or (layer.epsilon, layer.weight_epsilon)
            self.weight_epsilon = _view(weight_epsilon)
            self.bias_epsilon = _view(epsilon[layer.in_features :])
            self.grad_slots = [
                slot(p)
                for p in (layer.weight_mu, layer.weight_sigma, layer.bias_mu, layer.bias_sigma)
            ]
            self._noisy_weight = np.empty_like(self.weight)
        else:
            self.weight = _view(layer.weight)
            self.bias = None if layer.bias is None else _view(layer.bias)
            self.grad_slots = [slot(layer.weight), None if layer.bias is None else slot(layer.bias)]
        self._weight_used = self.weight  # the weight of the last forward (noisy or mean)
        self._noise_used = False

    def forward(self, x: Array) -> Array:
        noise = self.noisy and self.layer.noise_enabled
        if noise:
            weight = np.multiply(self.weight_sigma, self.weight_epsilon, out=self._noisy_weight)
            weight += self.weight
            bias = self.bias_sigma * self.bias_epsilon
            bias += self.bias
        else:
            weight, bias = self.weight, self.bias
        self._weight_used, self._noise_used = weight, noise
        y = x @ weight.T
        if bias is not None:
            y += bias
        return y

    def backward(self, g: Array, x: Array, need_input: bool, sink: GradientSink) -> Array | None:
        """Parameter gradients into ``sink``; the gradient of ``x`` when ``need_input``."""
        # g: (B, out), x: (B, in). Computed before the weight's buffers change: a later
        # forward would rewrite the noisy weight scratch this reads.
        grad_input = g @ self._weight_used if need_input else None
        if self.noisy:
            i_mu, i_sigma, i_bias_mu, i_bias_sigma = self.grad_slots
            if not self._noise_used:  # mean weights only: the sigmas got no gradient
                i_sigma = i_bias_sigma = None
        else:
            i_mu, i_bias_mu = self.grad_slots
            i_sigma = i_bias_sigma = None
        if i_sigma is not None:
            grad_weight = g.T @ x  # (out, in): d/d mu; times eps: d/d sigma
            sink.add(i_mu, grad_weight)
            sink.add(i_sigma, np.multiply(grad_weight, self.weight_epsilon, out=grad_weight))
        else:
            sink.add_matmul(i_mu, g.T, x)
        if i_bias_mu is not None or i_bias_sigma is not None:
            grad_bias = g.sum(axis=0)
            sink.add(i_bias_mu, grad_bias)
            if i_bias_sigma is not None:
                sink.add(i_bias_sigma, grad_bias * self.bias_epsilon)
        return grad_input


def _unbroadcast(g: Array, shape: tuple[int, ...]) -> Array:
    """Sum ``g`` over the axes that broadcasting added or stretched to reach its shape."""
    if g.shape == shape:
        return g
    g = g.sum(axis=tuple(range(g.ndim - len(shape)))) if g.ndim > len(shape) else g
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


class _Unsupported(Exception):
    """A node this backend does not differentiate exactly."""


class _Node:
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


class NumpyGrad:
    """A module's forward as a numpy program with a tape, and its parameter gradients.

    Build with :meth:`build`. :meth:`forward` with ``tape=True`` keeps the values the
    next :meth:`backward` needs; ``backward(grad_output)`` adds the gradient of
    ``sum(grad_output * output)`` with respect to every trainable parameter into the
    sink's buffers.
    """

    def __init__(
        self,
        dtype: np.dtype,
        nodes: list[_Node],
        n_slots: int,
        output: int,
        sink: GradientSink | None,
    ) -> None:
        self.dtype = dtype
        self._nodes = nodes
        self._forward = [(node.out, _reader(node.forward, node.args)) for node in nodes]
        self._output = output
        self._tape: list[Any] = [None] * n_slots
        self._scratch: list[Any] = [None] * n_slots
        self.sink = sink

    @classmethod
    def build(
        cls,
        module: nn.Module,
        sink: GradientSink | None = None,
        noise: Mapping[nn.Module, tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> NumpyGrad | None:
        """Trace and compile ``module``; ``None`` if any part is outside what compiles.

        ``sink``: where :meth:`backward` writes; ``None`` for a forward-only program
        (a target network). ``noise``: ``(epsilon, weight_epsilon)`` to read instead of a
        NoisyLinear's own buffers (:class:`~agent.noisy.NoiseBuffers`).
        """
        dtype = cpu_float_dtype(module)
        if dtype is None:
            return None
        try:
            graph = trace_leaves(module)
            return cls._compile(module, graph, dtype, sink, noise or {})
        except Exception:  # a trace error, an unsupported node: autograd does it instead
            return None

    @classmethod
    def _compile(
        cls,
        module: nn.Module,
        graph: fx.Graph,
        dtype: np.dtype,
        sink: GradientSink | None,
        noise: Mapping[nn.Module, tuple[torch.Tensor, torch.Tensor]],
    ) -> NumpyGrad:
        slot: dict[fx.Node, int] = {}
        needs_grad: dict[int, bool] = {0: False}  # slot -> depends on a trainable parameter
        nodes: list[_Node] = []
        linears: dict[str, _Linear] = {}
        output: int | None = None
        for node in graph.nodes:
            if node.op == "placeholder":
                if slot:
                    raise _Unsupported("more than one input")
                slot[node] = 0
                continue
            if node.op == "output":
                if not isinstance(node.args[0], fx.Node):
                    raise _Unsupported("output is not one tensor")
                output = slot[node.args[0]]
                continue
            if any(isinstance(v, fx.Node) for v in node.kwargs.values()):
                raise _Unsupported("tensor keyword argument")
            args = [slot[a] if isinstance(a, fx.Node) else constant(a) for a in node.args]
            tensor_args = [a for a in args if isinstance(a, int)]
            out = len(nodes) + 1
            if node.op == "call_module":
                sub = module.get_submodule(node.target)
                kind = type(sub)
                if kind is nn.Identity or (kind is nn.Flatten and _flattens_rows(sub)):
                    if kind is nn.Identity:
                        slot[node] = args[0]
                        continue
                    nodes.append(_reshape_node(out, args, needs_grad))
                elif kind is nn.Conv2d:
                    node_, trainable = _conv_node(out, args, sub, needs_grad, sink)
                    nodes.append(node_)
                    needs_grad[out] = trainable or needs_grad[args[0]]
                    slot[node] = out
                    continue
                elif kind in (nn.Linear, NoisyLinear):
                    layer = linears.setdefault(node.target, _Linear(sub, sink, noise.get(sub)))
                    trainable = any(i is not None for i in layer.grad_slots)
                    nodes.append(_linear_node(out, args, layer, needs_grad, sink))
                    needs_grad[out] = trainable or needs_grad[args[0]]
                    slot[node] = out
                    continue
                elif kind in ACTIVATION_MODULES:
                    owned = _fresh_linear_output(module, node.args[0])
                    name, value = activation_of_module(sub)
                    nodes.append(_activation_node(out, args, name, value, needs_grad, owned))
                else:
                    raise _Unsupported(f"module {kind.__name__}")
            elif node.op == "call_function" and node.target in ACTIVATION_FUNCTIONS:
                name, value = _activation_call(node, args)
                owned = _fresh_linear_output(module, node.args[0])
                nodes.append(_activation_node(out, args[:1], name, value, needs_grad, owned))
            elif node.op == "call_method" and node.target in ACTIVATION_METHODS and len(args) == 1:
                name = ACTIVATION_METHODS[node.target]
                nodes.append(_activation_node(out, args, name, None, needs_grad))
            elif (node.op == "call_function" and node.target in ARITHMETIC) or (
                node.op == "call_method" and node.target in ("add", "sub", "mul")
            ):
                name = ARITHMETIC.get(node.target, node.target)
                if node.kwargs:
                    raise _Unsupported(f"{name} with {node.kwargs}")
                nodes.append(_arithmetic_node(out, name, args, needs_grad))
            elif node.op == "call_method" and node.target == "mean":
                nodes.append(_mean_node(out, args, dict(node.kwargs), needs_grad))
            elif node.op == "call_method" and node.target in ("to", "float", "double"):
                target = cast_target(node)
                if target == dtype:
                    slot[node] = args[0]  # already in the parameters' dtype: nothing to do
                    continue
                if needs_grad[args[0]]:
                    raise _Unsupported("a cast between parameters")
                nodes.append(
                    _Node(
                        out,
                        args,
                        lambda x, t=target: np.asarray(x, dtype=t),
                        lambda g, vals, y: [None],
                        [False],
                    )
                )
            else:
                raise _Unsupported(f"{node.op} {node.target}")
            needs_grad[out] = any(needs_grad[a] for a in tensor_args)
            slot[node] = out
        if output is None:
            raise _Unsupported("no output")
        return cls(dtype, nodes, len(nodes) + 1, output, sink)

    def forward(self, x: Array, *, tape: bool = False) -> Array:
        """The module's output for ``x`` (cast to the parameters' dtype, as QNetwork does).

        ``tape=True`` keeps the intermediate values for :meth:`backward`; without it,
        scratch room is used and the tape of an earlier call stays intact.
        """
        slots = self._tape if tape else self._scratch
        slots[0] = np.asarray(x, dtype=self.dtype)
        for out, run in self._forward:
            slots[out] = run(slots)
        return slots[self._output]

    def backward(self, grad_output: Array) -> None:
        """Add d(sum(grad_output * output))/d(param) into the sink, for the last taped forward.

        ``grad_output`` may cover only the first rows of that forward: the other rows'
        output gradients are zero, and every op here maps rows to rows, so backward
        reads only as many rows of the tape (the learner tapes obs and next_obs in one
        forward, and only obs's rows carry a gradient).
        """
        if self.sink is None:
            raise RuntimeError("this NumpyGrad was built without a gradient sink")
        slots = self._tape
        rows = len(grad_output)
        if rows != len(slots[0]):
            slots = [None if v is None else v[:rows] for v in slots]
        grads: dict[int, Array] = {self._output: grad_output}
        for node in reversed(self._nodes):
            g = grads.pop(node.out, None)
            if g is None:
                continue
            values = [slots[a] if type(a) is int else a.value for a in node.args]
            input_grads = node.backward(g, values, slots[node.out])
            for arg, need, grad in zip(node.args, node.grad_args, input_grads, strict=True):
                if need and grad is not None:
                    grads[arg] = grads[arg] + grad if arg in grads else grad


def _reader(fn: Callable[..., Array], args: list[Any]) -> Callable[[list[Any]], Array]:
    """``fn`` applied to its arguments read from the slots, specialised for the common shapes."""
    if len(args) == 1 and type(args[0]) is int:
        (a,) = args
        return lambda slots: fn(slots[a])
    if len(args) == 2 and type(args[0]) is int and type(args[1]) is int:
        a, b = args
        return lambda slots: fn(slots[a], slots[b])
    return lambda slots: fn(*[slots[x] if type(x) is int else x.value for x in args])


def _grad_flags(args: list[Any], needs_grad: dict[int, bool]) -> list[bool]:
    return [type(a) is int and needs_grad[a] for a in args]


def _linear_node(
    out: int,
    args: list[Any],
    layer: _Linear,
    needs_grad: dict[int, bool],
    sink: GradientSink | None,
) -> _Node:
    (a,) = args
    need_input = needs_grad[a]

    def backward(g: Array, values: list[Array], y: Array) -> list[Array | None]:
        assert sink is not None
        return [layer.backward(g, values[0], need_input, sink)]

    return _Node(out, args, layer.forward, backward, [need_input])


def _conv_node(
    out: int,
    args: list[Any],
    layer: nn.Conv2d,
    needs_grad: dict[int, bool],
    sink: GradientSink | None,
) -> tuple[_Node, bool]:
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
    return _Node(out, args, conv, backward, [need_input]), trainable


def _activation_call(node: fx.Node, args: list[Any]) -> tuple[str, float | None]:
    """(name, parameter or None) of an activation called as a function, e.g.
    ``F.leaky_relu(x, 0.2)`` or ``F.elu(x, alpha=0.5)``."""
    name = ACTIVATION_FUNCTIONS[node.target]
    param = ACTIVATIONS[name].param
    kwargs = {k: v for k, v in node.kwargs.items() if k != "inplace"}
    value = args[1] if len(args) > 1 else kwargs.pop(param, None) if param else None
    if kwargs or len(args) > (1 if param is None else 2) or not (
        value is None or isinstance(value, int | float)
    ):
        raise _Unsupported(f"{node.target} with {node.kwargs}")
    return name, value


def _activation_node(
    out: int,
    args: list[Any],
    name: str,
    value: float | None,
    needs_grad: dict[int, bool],
    owned: bool = False,
) -> _Node:
    forward, grad = ACTIVATIONS[name].bound(None if value is None else float(value))
    if name == "relu" and owned:
        # In place: nothing else reads the input, and ReLU's backward needs only its output.
        forward = relu_
    if len(args) != 1 or type(args[0]) is not int:
        raise _Unsupported("an activation of more than one tensor")
    return _Node(
        out,
        args,
        forward,
        lambda g, values, y: [grad(g, values[0], y)],
        _grad_flags(args, needs_grad),
    )


def _reshape_node(out: int, args: list[Any], needs_grad: dict[int, bool]) -> _Node:
    return _Node(
        out,
        args,
        lambda x: x.reshape(x.shape[0], -1),
        lambda g, values, y: [g.reshape(values[0].shape)],
        _grad_flags(args, needs_grad),
    )


def _shape(value: Any) -> tuple[int, ...]:
    return np.shape(value)


def _arithmetic_node(out: int, name: str, args: list[Any], needs_grad: dict[int, bool]) -> _Node:
    if name == "neg":
        return _Node(
            out, args, operator.neg, lambda g, values, y: [-g], _grad_flags(args, needs_grad)
        )
    if len(args) != 2:
        raise _Unsupported(f"{name} of {len(args)} arguments")
    forward = {
        "add": operator.add,
        "sub": operator.sub,
        "mul": operator.mul,
        "div": operator.truediv,
    }[name]

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
        return [_unbroadcast(da, _shape(a)), _unbroadcast(db, _shape(b))]

    return _Node(out, args, forward, backward, _grad_flags(args, needs_grad))


def _mean_node(
    out: int, args: list[Any], kwargs: dict[str, Any], needs_grad: dict[int, bool]
) -> _Node:
    dim = kwargs.pop("dim", args[1].value if len(args) > 1 else None)
    keepdim = bool(kwargs.pop("keepdim", args[2].value if len(args) > 2 else False))
    if kwargs or not isinstance(dim, int) or dim == 0 or dim <= -2:
        # Over the batch (dim 0, or -2 of a matrix) or everything would mix rows, which
        # backward over the first rows of a forward (the learner's obs) assumes never happens.
        raise _Unsupported(f"mean over dim={dim}")
    source = args[:1]

    def backward(g: Array, values: list[Array], y: Array) -> list[Array | None]:
        x = values[0]
        axis = dim % x.ndim
        if not keepdim:
            g = np.expand_dims(g, axis)
        return [np.broadcast_to(g / x.shape[axis], x.shape)]

    return _Node(
        out,
        source,
        lambda x: x.mean(axis=dim, keepdims=keepdim),
        backward,
        _grad_flags(source, needs_grad),
    )


def _fresh_linear_output(module: nn.Module, arg: Any) -> bool:
    """True for a linear layer's or convolution's output that nothing else reads (safe to
    overwrite)."""
    return (
        isinstance(arg, fx.Node)
        and arg.op == "call_module"
        and type(module.get_submodule(arg.target))  # type: ignore[arg-type]
        in (nn.Linear, NoisyLinear, nn.Conv2d)
        and len(arg.users) == 1
    )


def _flattens_rows(m: nn.Flatten) -> bool:
    return m.start_dim == 1 and m.end_dim == -1
