"""The numpy backend: a CPU forward at batch 1 without PyTorch's per-op overhead.

At the batch sizes of acting (one row per env), an eager torch forward is dominated
by the fixed cost of each op, not by arithmetic; numpy's is several times smaller
(docs/research/log.md). :class:`NumpyForward` compiles a module's ``forward`` into a
short numpy program once, by tracing it with ``torch.fx``, and runs that program on
zero-copy views of the live parameters (``param.detach().numpy()`` shares storage),
so every in-place optimizer step and ``load_state_dict`` is seen with no copying.

The contract with the module's own forward: for the same parameters and the same
noise in the layers' buffers, the numpy Q-values equal ``module(obs)`` up to float
rounding (the input is first cast to the parameters' dtype, as ``QNetwork.forward``
does). Tests hold the two equal for every network ``QNetwork`` can build and for
modules users write themselves. What compiles: any module whose traced forward uses
only ``nn.Linear``, :class:`~agent.noisy.NoisyLinear`, ``nn.Conv2d`` (zero padding),
elementwise activations (the op table :mod:`agent.numpy_ops`, shared with the gradient
compiler: ReLU, LeakyReLU, Tanh, Sigmoid, ELU, SiLU, as modules, functions or
methods), ``Identity``/``Flatten``, ``+ - * /``, ``mean`` over a dimension
and a cast to the parameters' dtype, with float32 or float64 parameters on the CPU.
Anything else (control flow on values, other ops) makes :meth:`NumpyForward.build`
return ``None``, and the selector acts eagerly instead. Convolutions run PyTorch's own
kernel on zero-copy tensors (:class:`TorchConv2d`): numpy has no convolution, and an
im2col in numpy is several times slower than that kernel (docs/research/log.md).

Noise: :meth:`NumpyForward.resample` draws fresh factorised noise with a numpy
generator and writes it into the layers' noise buffers (also views), so
``module(obs)`` afterwards reproduces exactly the noise the action used.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from agent.noisy import NoisyLinear
from agent.numpy_ops import (
    ACTIVATION_FUNCTIONS,
    ACTIVATION_METHODS,
    ACTIVATION_MODULES,
    ACTIVATIONS,
    ARITHMETIC,
    activation_of_module,
    relu,
    relu_,
)

__all__ = [
    "Const",
    "NumpyForward",
    "TorchConv2d",
    "cast_target",
    "constant",
    "cpu_float_dtype",
    "trace_leaves",
]


class _NumpyLinear:
    """One linear layer over zero-copy numpy views of a Linear or NoisyLinear."""

    def __init__(self, layer: nn.Module) -> None:
        self.noisy = isinstance(layer, NoisyLinear)
        if self.noisy:
            self.weight = layer.weight_mu.detach().numpy()
            self.bias = layer.bias_mu.detach().numpy()
            self.weight_sigma = layer.weight_sigma.detach().numpy()
            self.bias_sigma = layer.bias_sigma.detach().numpy()
            self.epsilon_in = layer.epsilon_in.detach().numpy()
            self.epsilon_out = layer.epsilon_out.detach().numpy()
            self.weight_epsilon = layer.weight_epsilon.detach().numpy()
            self.bias_epsilon = layer.bias_epsilon.detach().numpy()
            # Scratch for the noisy weight: reused, so no allocation per step.
            self._noisy_weight = np.empty_like(self.weight)
        else:
            self.weight = layer.weight.detach().numpy()
            self.bias = None if layer.bias is None else layer.bias.detach().numpy()

    def __call__(self, x: np.ndarray, noise: bool) -> np.ndarray:
        if self.noisy and noise:
            # NoisyLinear.forward's formula, W = mu + sigma * eps, materialised: at acting
            # sizes that is fewer numpy calls than the factorised form.
            weight = np.multiply(self.weight_sigma, self.weight_epsilon, out=self._noisy_weight)
            weight += self.weight
            y = x @ weight.T
            bias = self.bias_sigma * self.bias_epsilon
            bias += self.bias
            y += bias
            return y
        y = x @ self.weight.T
        if self.bias is not None:
            y += self.bias
        return y


class TorchConv2d:
    """An ``nn.Conv2d`` on numpy arrays: PyTorch's kernel on zero-copy tensors, live weights."""

    def __init__(self, layer: nn.Conv2d) -> None:
        if layer.padding_mode != "zeros" or isinstance(layer.padding, str):
            raise _Unsupported(f"Conv2d padding {layer.padding!r} ({layer.padding_mode})")
        self.layer = layer
        self.weight, self.bias = layer.weight, layer.bias
        self.options = (layer.stride, layer.padding, layer.dilation, layer.groups)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return F.conv2d(torch.from_numpy(x), self.weight, self.bias, *self.options).numpy()

    def backward(
        self, g: np.ndarray, x: np.ndarray, need_input: bool, need_weight: bool, need_bias: bool
    ) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
        """(grad of x, of the weight, of the bias), each None where not asked for."""
        stride, padding, dilation, groups = self.options
        bias_sizes = None if self.bias is None else list(self.bias.shape)
        # oneDNN's backward kernels are about twice as fast on channels-last tensors at
        # these sizes (docs/research/log.md), conversions included.
        channels_last = torch.channels_last
        grads = torch.ops.aten.convolution_backward(
            torch.from_numpy(g).contiguous(memory_format=channels_last),
            torch.from_numpy(x).contiguous(memory_format=channels_last),
            self.weight.detach().contiguous(memory_format=channels_last),
            bias_sizes,
            list(stride),
            list(padding),
            list(dilation),
            False,
            [0, 0],
            groups,
            [need_input, need_weight, need_bias and self.bias is not None],
        )
        return tuple(None if t is None else t.numpy() for t in grads)  # type: ignore[return-value]


def _mean(x: np.ndarray, dim: int, keepdim: bool = False) -> np.ndarray:
    return x.mean(axis=dim, keepdims=keepdim)


def _module_forward(module: nn.Module) -> Callable[..., np.ndarray]:
    name, value = activation_of_module(module)
    return ACTIVATIONS[name].bound(value)[0]


_ARITHMETIC = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
               "div": operator.truediv, "neg": operator.neg}  # fmt: skip
# The op table (agent/numpy_ops.py) as this compiler reads it: modules, functions, methods.
_MODULES: dict[type, Callable[[nn.Module], Callable[..., np.ndarray]]] = {
    **dict.fromkeys(ACTIVATION_MODULES, _module_forward),
    nn.Identity: lambda m: lambda x: x,
}
_FUNCTIONS: dict[Any, Callable[..., np.ndarray]] = {
    **{fn: ACTIVATIONS[name].forward for fn, name in ACTIVATION_FUNCTIONS.items()},
    **{fn: _ARITHMETIC[name] for fn, name in ARITHMETIC.items()},
}
_METHODS: dict[str, Callable[..., np.ndarray]] = {
    **{m: ACTIVATIONS[name].forward for m, name in ACTIVATION_METHODS.items()},
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "mean": _mean,
}


class _Unsupported(Exception):
    """A node this backend does not reproduce exactly."""


class _Tracer(fx.Tracer):
    """Keeps linear layers and supported activations as single nodes (leaves)."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return type(m) in (nn.Linear, NoisyLinear, *_MODULES) or super().is_leaf_module(
            m, module_qualified_name
        )


def cpu_float_dtype(module: nn.Module) -> np.dtype | None:
    """The numpy dtype of a module whose tensors are all on the CPU in one of float32 and
    float64 (what the numpy programs run on), else None."""
    tensors = [*module.parameters(), *module.buffers()]
    dtypes = {t.dtype for t in tensors}
    if not tensors or len(dtypes) != 1 or next(iter(dtypes)) not in (torch.float32, torch.float64):
        return None
    if any(t.device.type != "cpu" for t in tensors):
        return None
    return np.dtype(np.float32 if tensors[0].dtype == torch.float32 else np.float64)


def cast_target(node: fx.Node) -> np.dtype:
    """The dtype a traced ``.to(dtype)`` / ``.float()`` / ``.double()`` casts to (float32
    or float64 only; any other cast, or a ``.to`` that also moves, is unsupported)."""
    args, kwargs = list(node.args), dict(node.kwargs)
    target = {"float": torch.float32, "double": torch.float64}.get(str(node.target))
    if node.target == "to":
        target = kwargs.pop("dtype", None) or (args.pop(1) if len(args) > 1 else None)
        if kwargs or len(args) != 1:
            raise _Unsupported(f"to({node.args}, {node.kwargs})")
    if target not in (torch.float32, torch.float64):
        raise _Unsupported(f"cast to {target}")
    return np.dtype(np.float32 if target == torch.float32 else np.float64)


def trace_leaves(module: nn.Module) -> fx.Graph:
    """``module``'s forward as an fx graph whose linear layers and activations are single nodes."""
    return _Tracer().trace(module)


class NumpyForward:
    """Q-values of a module as a numpy program over views of its live parameters.

    Build it with :meth:`build` (``None`` when the module cannot be reproduced), then
    :meth:`q_values` per step and :meth:`resample` whenever fresh noise is due.
    """

    def __init__(
        self,
        dtype: np.dtype,
        program: list[tuple[int, Callable[[list[Any], bool], np.ndarray]]],
        output: int,
        noisy: list[_NumpyLinear],
        rng: np.random.Generator,
    ) -> None:
        self.dtype = dtype
        self._program = program
        self._output = output
        self._slots: list[Any] = [None] * (len(program) + 1)
        self.noise_layers = noisy
        self.rng = rng
        # All noise factors are drawn by one generator call into one buffer, then
        # scattered into the layers' epsilon_in / epsilon_out views.
        sizes = [(len(lay.epsilon_in), len(lay.epsilon_out)) for lay in noisy]
        total = sum(a + b for a, b in sizes)
        self._draw = np.empty(total, dtype=dtype)
        self._scratch = np.empty(total, dtype=dtype)
        self._segments: list[tuple[int, int, int]] = []
        start = 0
        for n_in, n_out in sizes:
            self._segments.append((start, start + n_in, start + n_in + n_out))
            start += n_in + n_out

    @classmethod
    def build(cls, module: nn.Module, rng: np.random.Generator) -> NumpyForward | None:
        """Trace and compile ``module``; ``None`` if any part is outside what compiles."""
        dtype = cpu_float_dtype(module)
        if dtype is None:
            return None
        try:
            graph = trace_leaves(module)
            return cls._compile(module, graph, dtype, rng)
        except Exception:  # a trace error, an unsupported node: the eager path reproduces it
            return None

    @classmethod
    def _compile(
        cls, module: nn.Module, graph: fx.Graph, dtype: np.dtype, rng: np.random.Generator
    ) -> NumpyForward:
        slot: dict[fx.Node, int] = {}
        program: list[tuple[int, Callable[[list[Any], bool], np.ndarray]]] = []
        linears: dict[str, _NumpyLinear] = {}
        output: int | None = None

        def ref(arg: Any) -> Any:
            if isinstance(arg, fx.Node):
                return slot[arg]
            return constant(arg)

        for node in graph.nodes:
            if node.op == "placeholder":
                if slot:
                    raise _Unsupported("more than one input")
                slot[node] = 0
                continue
            if node.op == "output":
                output = slot[node.args[0]] if isinstance(node.args[0], fx.Node) else None
                if output is None:
                    raise _Unsupported("output is not one tensor")
                continue
            kwargs = dict(node.kwargs)
            args = list(node.args)
            linear = False  # linear layers also take the noise switch
            identity = False
            cast: np.dtype | None = None
            if node.op == "call_module":
                sub = module.get_submodule(node.target)
                identity = type(sub) is nn.Identity
                if type(sub) in (nn.Linear, NoisyLinear):
                    layer = linears.setdefault(node.target, _NumpyLinear(sub))
                    fn: Callable[..., np.ndarray] = layer
                    linear = True
                elif type(sub) is nn.Conv2d:
                    fn = TorchConv2d(sub)
                elif type(sub) in _MODULES:
                    fn = _MODULES[type(sub)](sub)
                elif type(sub) is nn.Flatten and sub.start_dim == 1 and sub.end_dim == -1:
                    fn = _flatten
                else:
                    raise _Unsupported(f"module {type(sub).__name__}")
            elif node.op == "call_function" and node.target in _FUNCTIONS:
                fn = _FUNCTIONS[node.target]
                kwargs.pop("inplace", None)
            elif node.op == "call_method" and node.target in _METHODS:
                fn = _METHODS[node.target]
            elif node.op == "call_method" and node.target in ("to", "float", "double"):
                cast = cast_target(node)
                args, kwargs = args[:1], {}
                fn = _caster(cast)
            else:
                raise _Unsupported(f"{node.op} {node.target}")
            if identity or (cast is not None and cast == dtype):
                # Nothing to compute: the input is already in the parameters' dtype, and
                # every op keeps it. The node reads the same slot as its argument.
                slot[node] = slot[args[0]]
                continue
            if fn is relu and _owned_once(args[0]):
                fn = relu_
            if any(isinstance(v, fx.Node) for v in kwargs.values()):
                raise _Unsupported("tensor keyword argument")
            slot[node] = len(program) + 1  # slot 0 is the input
            program.append((slot[node], _step(_bind(fn, kwargs), [ref(a) for a in args], linear)))
        if output is None:
            raise _Unsupported("no output")
        noisy_layers = [layer for layer in linears.values() if layer.noisy]
        return cls(dtype, program, output, noisy_layers, rng)

    def resample(self) -> None:
        """Fresh factorised noise, f(x) = sgn(x) sqrt(|x|), written into the layers' buffers."""
        if not self.noise_layers:
            return
        draw, scratch = self._draw, self._scratch
        self.rng.standard_normal(out=draw, dtype=self.dtype)
        np.sqrt(np.abs(draw, out=scratch), out=scratch)
        np.copysign(scratch, draw, out=draw)
        for layer, (a, b, c) in zip(self.noise_layers, self._segments, strict=True):
            layer.epsilon_in[...] = draw[a:b]
            layer.epsilon_out[...] = draw[b:c]
            np.multiply.outer(layer.epsilon_out, layer.epsilon_in, out=layer.weight_epsilon)
            layer.bias_epsilon[...] = layer.epsilon_out

    def q_values(self, obs: np.ndarray, noise: bool) -> np.ndarray:
        """The module's output for ``obs``: noisy weights where ``noise``, else the means."""
        slots = self._slots
        # The parameters' dtype throughout, as QNetwork.forward casts its input.
        slots[0] = np.asarray(obs, dtype=self.dtype)
        for out, run in self._program:
            slots[out] = run(slots, noise)
        return slots[self._output]


class Const:
    """A constant argument of a traced call (a Python number)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def constant(arg: Any) -> Const:
    """A traced call's non-tensor argument, if it is a Python number; else unsupported."""
    if isinstance(arg, (int, float, bool)):
        return Const(arg)
    raise _Unsupported(f"argument {arg!r}")


def _step(
    fn: Callable[..., np.ndarray], refs: list[Any], linear: bool
) -> Callable[[list[Any], bool], np.ndarray]:
    """One node as ``run(slots, noise) -> value``, specialised for the common shapes."""
    if linear:
        (a,) = refs
        return lambda slots, noise: fn(slots[a], noise)
    if len(refs) == 1 and type(refs[0]) is not Const:
        (a,) = refs
        return lambda slots, noise: fn(slots[a])
    if len(refs) == 2 and not any(type(r) is Const for r in refs):
        a, b = refs
        return lambda slots, noise: fn(slots[a], slots[b])
    return lambda slots, noise: fn(*[r.value if type(r) is Const else slots[r] for r in refs])


def _bind(fn: Callable[..., np.ndarray], kwargs: dict[str, Any]) -> Callable[..., np.ndarray]:
    if not kwargs:
        return fn
    return lambda *args: fn(*args, **kwargs)


def _caster(dtype: np.dtype) -> Callable[[np.ndarray], np.ndarray]:
    return lambda x: np.asarray(x, dtype=dtype)


def _owned_once(arg: Any) -> bool:
    """True for a computed value (not the input) that only one node reads."""
    return isinstance(arg, fx.Node) and arg.op != "placeholder" and len(arg.users) == 1


def _flatten(x: np.ndarray) -> np.ndarray:
    return x.reshape(x.shape[0], -1)
