"""The compiler: a module's forward, traced with ``torch.fx``, as a numpy program with a tape.

On a CPU at the sizes of DQN (a batch of one to act, a few hundred rows to learn, layers
of a few hundred units), PyTorch's fixed cost per op and autograd's bookkeeping per node
cost more than the arithmetic (``bench/acting.py``, ``bench/learner.py``; figures in
docs/research/log.md). :meth:`NumpyProgram.build` compiles a module once into a list
of numpy calls over zero-copy views of its live parameters and noise buffers (optimizer
steps, ``load_state_dict`` and ``reset_noise`` are seen with no copying), with one
hand-written vector-Jacobian product per op for :meth:`NumpyProgram.backward`, whose
gradients land in views of the buffers the optimizer reads.

The contract, held by tests for every network ``QNetwork`` builds and for users' own
modules: for the same parameters and noise, :meth:`NumpyProgram.forward` equals
``module(x)`` and :meth:`NumpyProgram.backward` equals autograd's gradients, up to float
rounding. What compiles: ``nn.Linear``, :class:`~agent.noisy.NoisyLinear`,
``nn.Conv2d`` (zero padding), the elementwise activations of the op table
(:mod:`agent.numpy_backend.ops`, as modules, functions or methods),
``Identity``/``Flatten``, ``unflatten`` of the last dimension, ``+ - * /``, ``mean`` over
a dimension that cannot be the batch, and a cast to float32 or float64, with float32 or
float64 parameters on the CPU.

What does not compile is said, never hidden: ``build`` raises :class:`NotApplicable`
for a module the backend does not run on (another device, another dtype, a module that
opts out with a ``numpy_backend_opt_out`` class attribute) and
:class:`Unsupported` for a part outside the list above (control flow on values, another
op), naming the module and the node; any other exception is a bug of the compiler and
propagates. :func:`compiled_or_none` is how a caller falls back to PyTorch: silently
where the backend does not apply, after one warning per process and reason where it
does not compile.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np
import torch
import torch.fx as fx
from torch import nn

from agent.noisy import NoisyLinear
from agent.numpy_backend.layers import GradientSink, Linear, Unsupported
from agent.numpy_backend.nodes import (
    Node,
    activation_call,
    activation_node,
    arithmetic_node,
    cast_target,
    constant,
    conv_node,
    fresh_layer_output,
    linear_node,
    mean_node,
    reader,
    reshape_node,
    unflatten_node,
)
from agent.numpy_backend.ops import (
    ACTIVATION_FUNCTIONS,
    ACTIVATION_METHODS,
    ACTIVATION_MODULES,
    ARITHMETIC,
    activation_of_module,
)

__all__ = ["NotApplicable", "NumpyProgram", "Unsupported", "compiled_or_none", "cpu_float_dtype"]

Array = np.ndarray
T = TypeVar("T")


class NotApplicable(Unsupported):
    """A module the numpy backend does not run on: another device or dtype, or a module
    that opts out. Expected: PyTorch runs it without a warning."""


class _Tracer(fx.Tracer):
    """Keeps layers and activations as single nodes (leaves)."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        leaves = (nn.Linear, NoisyLinear, nn.Conv2d, nn.Identity, nn.Flatten, *ACTIVATION_MODULES)
        return type(m) in leaves or super().is_leaf_module(m, module_qualified_name)


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


def _tensors_of(module: nn.Module) -> str:
    """Where and in what dtype a module's tensors are, for a module the backend does not
    run on."""
    tensors = [*module.parameters(), *module.buffers()]
    if not tensors:
        return "no parameters or buffers"
    devices = sorted({str(t.device) for t in tensors})
    dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in tensors})
    where = f"on {' and '.join(devices)} in {' and '.join(dtypes)}"
    return f"its tensors are {where}, not all on the CPU in one of float32 and float64"


_SAID: set[str] = set()  # the reasons already said in this process


def compiled_or_none(build: Callable[[], T], instead: str) -> T | None:
    """``build()``, or None where it raises :class:`Unsupported`: a caller's fallback to PyTorch.

    An :class:`Unsupported` is said once per process and reason, as a ``RuntimeWarning``
    naming what did not compile, followed by ``instead`` (what runs in its place and how
    to choose it without the warning); a :class:`NotApplicable` falls back silently. Any
    other exception is a bug of the compiler, and propagates.
    """
    try:
        return build()
    except NotApplicable:
        return None
    except Unsupported as e:
        reason = str(e)
        if reason not in _SAID:
            _SAID.add(reason)
            message = f"the numpy backend cannot compile {reason}; {instead}"
            warnings.warn(message, RuntimeWarning, stacklevel=3)
        return None


class NumpyProgram:
    """A module's forward as a numpy program with a tape, and its parameter gradients.

    Build with :meth:`build`. :meth:`forward` with ``tape=True`` keeps the values the
    next :meth:`backward` needs; ``backward(grad_output)`` adds the gradient of
    ``sum(grad_output * output)`` with respect to every trainable parameter into the
    sink's buffers. ``noisy_linears``: its compiled noisy layers, in order, with
    ``epsilon`` and ``weight_epsilon`` views of the noise they read.
    """

    def __init__(
        self,
        dtype: np.dtype,
        nodes: list[Node],
        output: int,
        sink: GradientSink | None,
        linears: list[Linear],
        switch: list[bool | None],
    ) -> None:
        self.dtype = dtype
        self._nodes = nodes
        self._forward = [(node.out, reader(node.forward, node.args)) for node in nodes]
        self._output = output
        self._tape: list[Any] = [None] * (len(nodes) + 1)
        self._scratch: list[Any] = [None] * (len(nodes) + 1)
        self._switch = switch
        self.sink = sink
        self.noisy_linears = [layer for layer in linears if layer.noisy]

    @classmethod
    def build(
        cls,
        module: nn.Module,
        sink: GradientSink | None = None,
        noise: Mapping[nn.Module, tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> NumpyProgram:
        """Trace and compile ``module``.

        ``sink``: where :meth:`backward` writes; ``None`` for a forward-only program.
        ``noise``: ``(epsilon, weight_epsilon)`` to read instead of a NoisyLinear's own
        buffers (:class:`~agent.noisy.NoiseBuffers`).
        Raises :class:`NotApplicable` or :class:`Unsupported`, whose message names the
        module and what does not compile; any other exception is a bug and propagates.
        """
        name = type(module).__name__
        dtype = cpu_float_dtype(module)
        if dtype is None:
            raise NotApplicable(f"{name} ({_tensors_of(module)})")
        for path, sub in module.named_modules():
            why = getattr(type(sub), "numpy_backend_opt_out", None)
            if why:
                at = f" at {path}" if path else ""
                raise NotApplicable(f"{name} ({type(sub).__name__}{at} opts out: {why})")
        try:
            graph = _Tracer().trace(module)
        except Exception as e:  # the module's own forward, run on proxies, failed
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise Unsupported(
                f"{name} (torch.fx cannot trace its forward: {type(e).__name__}: {first})"
            ) from None
        try:
            return _compile(module, graph, dtype, sink, noise or {})
        except Unsupported as e:
            raise Unsupported(f"{name} ({e})") from None

    def forward(
        self,
        x: Array,
        *,
        tape: bool = False,
        noise: bool | None = None,
    ) -> Array:
        """The module's output for ``x`` (cast to the parameters' dtype, as QNetwork does).

        ``noise``: None uses each NoisyLinear's noise where its ``noise_enabled`` says (as
        its own forward does); True or False turns it on or off in every layer.
        ``tape=True`` keeps the intermediate values for :meth:`backward`; without it,
        scratch room is used and the tape of an earlier call stays intact (as long as the
        noise and parameters do).
        """
        self._switch[0] = noise
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
            raise RuntimeError("this NumpyProgram was built without a gradient sink")
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


def _compile(
    module: nn.Module,
    graph: fx.Graph,
    dtype: np.dtype,
    sink: GradientSink | None,
    noise: Mapping[nn.Module, tuple[torch.Tensor, torch.Tensor]],
) -> NumpyProgram:
    return _Compiler(module, dtype, sink, noise).compile(graph)


class _Compiler:
    """One compilation: the traced graph's nodes, in order, into the program's nodes."""

    def __init__(
        self,
        module: nn.Module,
        dtype: np.dtype,
        sink: GradientSink | None,
        noise: Mapping[nn.Module, tuple[torch.Tensor, torch.Tensor]],
    ) -> None:
        self.module, self.dtype, self.sink, self.noise = module, dtype, sink, noise
        self.slot: dict[fx.Node, int] = {}
        self.needs_grad: dict[int, bool] = {0: False}  # slot -> depends on a trainable parameter
        # slot -> the fewest dimensions its value can have: the input has a batch axis and
        # at least one more, so a dimension counted from the end is provably not the batch.
        self.rank: dict[int, int] = {0: 2}
        self.nodes: list[Node] = []
        self.linears: dict[str, Linear] = {}
        self.switch: list[bool | None] = [None]

    def compile(self, graph: fx.Graph) -> NumpyProgram:
        output: int | None = None
        for node in graph.nodes:
            try:
                if node.op == "placeholder":
                    if self.slot:
                        raise Unsupported("more than one input")
                    self.slot[node] = 0
                elif node.op == "output":
                    if not isinstance(node.args[0], fx.Node):
                        raise Unsupported("output is not one tensor")
                    output = self.slot[node.args[0]]
                elif any(isinstance(v, fx.Node) for v in node.kwargs.values()):
                    raise Unsupported("tensor keyword argument")
                else:
                    self.slot[node] = self.op(node)
            except Unsupported as e:
                where = node.target if node.op == "call_module" else f"node {node.name}"
                raise Unsupported(f"{e} at {where}") from None
        if output is None:
            raise Unsupported("no output")
        return NumpyProgram(self.dtype, self.nodes, output, self.sink,
                            list(self.linears.values()), self.switch)  # fmt: skip

    def op(self, node: fx.Node) -> int:
        """The slot of one traced op: new nodes for it, or the slot it passes on."""
        module, needs_grad, rank = self.module, self.needs_grad, self.rank
        sub = module.get_submodule(node.target) if node.op == "call_module" else None
        kind = type(sub)
        cast = node.op == "call_method" and node.target in ("to", "float", "double")
        # A cast's dtype argument is read by cast_target, not as a number.
        read = node.args[:1] if cast else node.args
        args = [self.slot[a] if isinstance(a, fx.Node) else constant(a) for a in read]
        flatten = kind is nn.Flatten and sub.start_dim == 1 and sub.end_dim == -1
        out = len(self.nodes) + 1
        trainable = False  # the node's own parameters need a gradient
        if node.op == "call_module":
            if kind is nn.Identity:
                return args[0]
            if flatten:
                new = reshape_node(out, args, needs_grad)
                rank[out] = 2
            elif kind is nn.Conv2d:
                new, trainable = conv_node(out, args, sub, needs_grad, self.sink)
            elif kind in (nn.Linear, NoisyLinear):
                layer = self.linears.setdefault(
                    node.target, Linear(sub, self.sink, self.switch, self.noise.get(sub))
                )
                trainable = any(i is not None for i in layer.grad_slots)
                new = linear_node(out, args, layer, needs_grad, self.sink)
            elif kind in ACTIVATION_MODULES:
                owned = fresh_layer_output(module, node.args[0])
                name, value = activation_of_module(sub)
                new = activation_node(out, args, name, value, needs_grad, owned)
            else:
                raise Unsupported(f"module {kind.__name__}")
        elif node.op == "call_function" and node.target in ACTIVATION_FUNCTIONS:
            name, value = activation_call(node, args)
            owned = fresh_layer_output(module, node.args[0])
            new = activation_node(out, args[:1], name, value, needs_grad, owned)
        elif node.op == "call_method" and node.target in ACTIVATION_METHODS and len(args) == 1:
            new = activation_node(out, args, ACTIVATION_METHODS[node.target], None, needs_grad)
        elif (node.op == "call_function" and node.target in ARITHMETIC) or (
            node.op == "call_method" and node.target in ("add", "sub", "mul")
        ):
            name = ARITHMETIC.get(node.target, node.target)
            if node.kwargs:
                raise Unsupported(f"{name} with {node.kwargs}")
            new = arithmetic_node(out, name, args, needs_grad)
        elif node.op == "call_method" and node.target == "mean":
            new, rank[out] = mean_node(out, args, dict(node.kwargs), needs_grad, rank[args[0]])
        elif node.op == "call_method" and node.target == "unflatten":
            new, rank[out] = unflatten_node(out, args, dict(node.kwargs), needs_grad, rank)
        elif cast:
            target = cast_target(node)
            if target == self.dtype:
                return args[0]  # already in the parameters' dtype: nothing to do
            if needs_grad[args[0]]:
                raise Unsupported("a cast between parameters")
            new = Node(out, args[:1], lambda x, t=target: np.asarray(x, dtype=t),
                       lambda g, values, y: [None], [False])  # fmt: skip
        else:
            target = getattr(node.target, "__name__", node.target)
            raise Unsupported(f"{node.op} {target}")
        self.nodes.append(new)
        needs_grad[out] = trainable or any(needs_grad[a] for a in args if type(a) is int)
        # Elementwise ops and layers keep (broadcast) the dimensions of their inputs.
        rank.setdefault(out, max([rank[a] for a in args if type(a) is int], default=0))
        return out
