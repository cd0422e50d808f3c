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

import operator
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np
import torch
import torch.fx as fx
from torch import nn

from agent.noisy import NoisyLinear
from agent.numpy_backend.layers import GradientSink, Linear, PatchConv2d, TorchConv2d, Unsupported
from agent.numpy_backend.patches import InputChain, patch_conv_geometry, patches, unpatch
from agent.numpy_backend.ops import (
    ACTIVATION_FUNCTIONS,
    ACTIVATION_METHODS,
    ACTIVATION_MODULES,
    ACTIVATIONS,
    ARITHMETIC,
    activation_of_module,
    relu_,
)

__all__ = ["NotApplicable", "NumpyProgram", "Unsupported", "compiled_or_none", "cpu_float_dtype"]

Array = np.ndarray
T = TypeVar("T")


class NotApplicable(Unsupported):
    """A module the numpy backend does not run on: another device or dtype, or a module
    that opts out. Expected: PyTorch runs it without a warning."""


class Const:
    """A constant argument of a traced call (a Python number)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class _Node:
    """One traced op: reads ``args`` (slot numbers, or constants), writes slot ``out``."""

    __slots__ = ("args", "backward", "forward", "grad_args", "input_key", "out")

    def __init__(
        self,
        out: int,
        args: list[Any],
        forward: Callable[..., Array],
        backward: Callable[..., list[Array | None]],
        grad_args: list[bool],
        input_key: tuple | None = None,
    ) -> None:
        self.out, self.args, self.forward, self.backward = out, args, forward, backward
        self.grad_args = grad_args  # which arguments (slots) need a gradient
        # For a step of the input stage (a function of the input alone: no parameters),
        # what it computes; None for every other node.
        self.input_key = input_key


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
        nodes: list[_Node],
        output: int,
        sink: GradientSink | None,
        linears: list[Linear],
        switch: list[bool | None],
        cast_input: bool = True,
    ) -> None:
        self.dtype = dtype
        # False where every reader of the input casts it itself (patches cut from raw
        # frames, :mod:`agent.numpy_backend.patches`).
        self._cast_input = cast_input
        self._nodes = nodes
        self._forward = [(node.out, _reader(node.forward, node.args)) for node in nodes]
        # The input stage (patches cut from the input): what another program with the
        # same stage can take instead of computing it again (:meth:`input_stage`).
        self.input_key = tuple(node.input_key for node in nodes if node.input_key is not None)
        self._stage_slots = [node.out for node in nodes if node.input_key is not None]
        self._after_stage = [
            (out, run) for (out, run), node in zip(self._forward, nodes, strict=True)
            if node.input_key is None
        ]  # fmt: skip
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
        stage: Mapping[int, Array] | None = None,
    ) -> Array:
        """The module's output for ``x`` (cast to the parameters' dtype, as QNetwork does).

        ``noise``: None uses each NoisyLinear's noise where its ``noise_enabled`` says (as
        its own forward does); True or False turns it on or off in every layer.
        ``tape=True`` keeps the intermediate values for :meth:`backward`; without it,
        scratch room is used and the tape of an earlier call stays intact (as long as the
        noise and parameters do). ``stage``: the input stage for ``x``, already computed
        by a program with the same :attr:`input_key` (:meth:`input_stage`).
        """
        self._switch[0] = noise
        slots = self._tape if tape else self._scratch
        slots[0] = np.asarray(x, dtype=self.dtype) if self._cast_input else np.asarray(x)
        steps = self._forward
        if stage is not None:
            for out in self._stage_slots:
                slots[out] = stage[out]
            steps = self._after_stage
        for out, run in steps:
            slots[out] = run(slots)
        return slots[self._output]

    def input_stage(self, rows: slice) -> dict[int, Array]:
        """The input stage of the last taped forward, for ``rows`` of its input: what
        :meth:`forward` takes as ``stage`` in a program with the same :attr:`input_key`
        (the learner's target network reads next_obs's patches from the online one's)."""
        return {out: self._tape[out][rows] for out in self._stage_slots}

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
    slot: dict[fx.Node, int] = {}
    needs_grad: dict[int, bool] = {0: False}  # slot -> depends on a trainable parameter
    # slot -> the fewest dimensions its value can have: the input has a batch axis and at
    # least one more, so a dimension counted from the end is provably not the batch.
    rank: dict[int, int] = {0: 2}
    # Slots holding channels-last images (B, H, W, C): the outputs of patch convolutions
    # and of elementwise ops on them; any other reader gets them channels-first.
    channels_last: set[int] = set()
    nodes: list[_Node] = []
    linears: dict[str, Linear] = {}
    switch: list[bool | None] = [None]
    output: int | None = None
    chains = _input_chains(module, graph, dtype)
    in_chains = {n for chain in chains.values() for n in chain}

    def channels_first(arg: Any) -> Any:
        """``arg`` as a (B, C, H, W) slot: a transpose node for a channels-last one."""
        if type(arg) is not int or arg not in channels_last:
            return arg
        out = len(nodes) + 1
        nodes.append(_channels_first_node(out, arg, needs_grad))
        needs_grad[out], rank[out] = needs_grad[arg], rank[arg]
        return out

    for node in graph.nodes:
        try:
            if node.op == "placeholder":
                if slot:
                    raise Unsupported("more than one input")
                slot[node] = 0
                continue
            if node in in_chains:  # applied to the patches instead (_input_chains)
                continue
            if node.op == "output":
                if not isinstance(node.args[0], fx.Node):
                    raise Unsupported("output is not one tensor")
                output = channels_first(slot[node.args[0]])
                continue
            if any(isinstance(v, fx.Node) for v in node.kwargs.values()):
                raise Unsupported("tensor keyword argument")
            sub = module.get_submodule(node.target) if node.op == "call_module" else None
            kind = type(sub)
            if node.op == "call_module" and patch_conv_geometry(sub) is not None:
                source = 0 if node in chains else slot[node.args[0]]
                last = source in channels_last
                nodes.append(_patches_node(len(nodes) + 1, source, sub, last, needs_grad,
                                           chains.get(node)))  # fmt: skip
                p = len(nodes)
                needs_grad[p], rank[p] = needs_grad[source], 4
                layer = PatchConv2d(sub, sink, last)
                out = len(nodes) + 1
                nodes.append(_patch_conv_node(out, p, layer, needs_grad, sink))
                needs_grad[out] = any(i is not None for i in layer.grad_slots) or needs_grad[p]
                rank[out] = 4
                channels_last.add(out)
                slot[node] = out
                continue
            args = [slot[a] if isinstance(a, fx.Node) else _constant(a) for a in node.args]
            keeps_layout = kind in ACTIVATION_MODULES or (
                node.op == "call_function" and node.target in ACTIVATION_FUNCTIONS
            ) or (node.op == "call_method" and node.target in ACTIVATION_METHODS)
            flatten = kind is nn.Flatten and sub.start_dim == 1 and sub.end_dim == -1
            if not keeps_layout and not flatten:
                args = [channels_first(a) for a in args]
            out = len(nodes) + 1
            trainable = False  # the node's own parameters need a gradient
            if node.op == "call_module":
                if kind is nn.Identity:
                    slot[node] = args[0]
                    continue
                if flatten:
                    last = args[0] in channels_last
                    nodes.append(_reshape_node(out, args, needs_grad, last))
                    rank[out] = 2
                elif kind is nn.Conv2d:
                    new, trainable = _conv_node(out, args, sub, needs_grad, sink)
                    nodes.append(new)
                elif kind in (nn.Linear, NoisyLinear):
                    layer = linears.setdefault(
                        node.target, Linear(sub, sink, switch, noise.get(sub))
                    )
                    trainable = any(i is not None for i in layer.grad_slots)
                    nodes.append(_linear_node(out, args, layer, needs_grad, sink))
                elif kind in ACTIVATION_MODULES:
                    owned = _fresh_layer_output(module, node.args[0])
                    name, value = activation_of_module(sub)
                    nodes.append(_activation_node(out, args, name, value, needs_grad, owned))
                else:
                    raise Unsupported(f"module {kind.__name__}")
            elif node.op == "call_function" and node.target in ACTIVATION_FUNCTIONS:
                name, value = _activation_call(node, args)
                owned = _fresh_layer_output(module, node.args[0])
                nodes.append(_activation_node(out, args[:1], name, value, needs_grad, owned))
            elif node.op == "call_method" and node.target in ACTIVATION_METHODS and len(args) == 1:
                name = ACTIVATION_METHODS[node.target]
                nodes.append(_activation_node(out, args, name, None, needs_grad))
            elif (node.op == "call_function" and node.target in ARITHMETIC) or (
                node.op == "call_method" and node.target in ("add", "sub", "mul")
            ):
                name = ARITHMETIC.get(node.target, node.target)
                if node.kwargs:
                    raise Unsupported(f"{name} with {node.kwargs}")
                nodes.append(_arithmetic_node(out, name, args, needs_grad))
            elif node.op == "call_method" and node.target == "mean":
                new, rank[out] = _mean_node(out, args, dict(node.kwargs), needs_grad, rank[args[0]])
                nodes.append(new)
            elif node.op == "call_method" and node.target == "unflatten":
                new, rank[out] = _unflatten_node(out, args, dict(node.kwargs), needs_grad, rank)
                nodes.append(new)
            elif node.op == "call_method" and node.target in ("to", "float", "double"):
                target = _cast_target(node)
                if target == dtype:
                    slot[node] = args[0]  # already in the parameters' dtype: nothing to do
                    continue
                if needs_grad[args[0]]:
                    raise Unsupported("a cast between parameters")
                cast = _Node(out, args[:1], lambda x, t=target: np.asarray(x, dtype=t),
                             lambda g, values, y: [None], [False])  # fmt: skip
                nodes.append(cast)
            else:
                target = getattr(node.target, "__name__", node.target)
                raise Unsupported(f"{node.op} {target}")
            needs_grad[out] = trainable or any(needs_grad[a] for a in args if type(a) is int)
            # Elementwise ops and layers keep (broadcast) the dimensions of their inputs.
            rank.setdefault(out, max([rank[a] for a in args if type(a) is int], default=0))
            if keeps_layout and args[0] in channels_last:
                channels_last.add(out)
            slot[node] = out
        except Unsupported as e:
            where = node.target if node.op == "call_module" else f"node {node.name}"
            raise Unsupported(f"{e} at {where}") from None
    if output is None:
        raise Unsupported("no output")
    return NumpyProgram(dtype, nodes, output, sink, list(linears.values()), switch,
                        cast_input=not chains)  # fmt: skip


def _input_chains(module: nn.Module, graph: fx.Graph, dtype: np.dtype) -> dict[fx.Node, list]:
    """The patch convolutions that read the input through a cast to floats and then
    divisions or products by numbers, each step read by nothing else: conv node -> those
    steps' nodes, in order. Only where every reader of the input starts such a chain (the
    input then stays as it comes, uint8 frames, until the patches are cut): else none."""
    (placeholder,) = [n for n in graph.nodes if n.op == "placeholder"] or [None]
    if placeholder is None or not placeholder.users:
        return {}
    chains: dict[fx.Node, list] = {}
    for head in placeholder.users:
        if not (head.op == "call_method" and head.target in ("to", "float", "double")):
            return {}
        try:
            _cast_target(head)
        except Unsupported:
            return {}
        chain, node = [head], head
        while len(node.users) == 1:
            (user,) = node.users
            if user.op == "call_module" and patch_conv_geometry(
                module.get_submodule(user.target)
            ) is not None:
                chains[user] = chain
                break
            scales = user.op == "call_function" and user.target in (
                operator.truediv, operator.mul
            )  # fmt: skip
            numbers = [a for a in user.args if a is not node]
            if not (scales and len(user.args) == 2 and not user.kwargs
                    and len(numbers) == 1 and isinstance(numbers[0], int | float)
                    and (user.target is operator.mul or user.args[0] is node)):  # fmt: skip
                return {}
            chain.append(user)
            node = user
        else:
            return {}
    return chains


def _chain_steps(chain: list[fx.Node]) -> InputChain:
    """The numpy steps of an input chain (:func:`_input_chains`): the cast, then each scaling."""
    steps: list[Callable[[Array], Array]] = []
    cast: np.dtype | None = None  # a pending cast, done by the next scaling in one pass
    for node in chain:
        if node.op == "call_method":
            if cast is not None:
                steps.append(lambda x, t=cast: np.asarray(x, dtype=t))
            cast = _cast_target(node)
            continue
        (number,) = [a for a in node.args if not isinstance(a, fx.Node)]
        ufunc = np.divide if node.target is operator.truediv else np.multiply
        # The cast's dtype for the arithmetic: as casting first, without its array.
        steps.append(lambda x, f=ufunc, c=number, t=cast: f(x, c, dtype=t))
        cast = None
    if cast is not None:
        steps.append(lambda x, t=cast: np.asarray(x, dtype=t))
    return InputChain(steps)


def _patches_node(
    out: int,
    source: int,
    layer: nn.Conv2d,
    channels_last: bool,
    needs_grad: dict[int, bool],
    chain: list[fx.Node] | None,
) -> _Node:
    """Cut a patch convolution's input into its patches (through an input chain's steps)."""
    k = patch_conv_geometry(layer)
    assert k is not None
    if layer.in_channels != layer.weight.shape[1] * layer.groups:
        raise Unsupported("a grouped convolution")
    steps = _chain_steps(chain) if chain else None

    def forward(x: Array) -> Array:
        p = patches(x, k, channels_last)
        return p if steps is None else steps(p)

    chain_key = None if chain is None else tuple(
        (n.op, str(n.target), tuple(a for a in n.args if not isinstance(a, fx.Node)),
         tuple(sorted((key, str(v)) for key, v in n.kwargs.items())))
        for n in chain
    )  # fmt: skip
    return _Node(
        out,
        [source],
        forward,
        lambda g, values, y: [unpatch(g, k, values[0].shape, channels_last)],
        _grad_flags([source], needs_grad),
        input_key=("patches", k, channels_last, chain_key) if source == 0 else None,
    )


def _patch_conv_node(
    out: int, source: int, layer: PatchConv2d, needs_grad: dict[int, bool],
    sink: GradientSink | None,
) -> _Node:  # fmt: skip
    need_input = needs_grad[source]

    def backward(g: Array, values: list[Array], y: Array) -> list[Array | None]:
        assert sink is not None
        return [layer.backward(g, values[0], need_input, sink)]

    return _Node(out, [source], layer.forward, backward, [need_input])


def _channels_first_node(out: int, source: int, needs_grad: dict[int, bool]) -> _Node:
    """(B, H, W, C) -> (B, C, H, W), for a reader that takes images channels-first."""
    return _Node(
        out,
        [source],
        lambda x: np.ascontiguousarray(x.transpose(0, 3, 1, 2)),
        lambda g, values, y: [g.transpose(0, 2, 3, 1)],
        _grad_flags([source], needs_grad),
    )


def _constant(arg: Any) -> Const:
    """A traced call's non-tensor argument, if it is a Python number or a tuple of ints;
    else unsupported."""
    if isinstance(arg, (int, float, bool)):
        return Const(arg)
    if isinstance(arg, tuple) and all(type(a) is int for a in arg):
        return Const(arg)
    raise Unsupported(f"argument {arg!r}")


def _cast_target(node: fx.Node) -> np.dtype:
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
    out: int, args: list[Any], layer: Linear, needs_grad: dict[int, bool], sink: GradientSink | None
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
    value = args[1].value if len(args) > 1 else kwargs.pop(param, None) if param else None
    if kwargs or len(args) > (1 if param is None else 2) or not (
        value is None or isinstance(value, int | float)
    ):
        raise Unsupported(f"{node.target} with {node.kwargs}")
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
        raise Unsupported("an activation of more than one tensor")
    return _Node(
        out,
        args,
        forward,
        lambda g, values, y: [grad(g, values[0], y)],
        _grad_flags(args, needs_grad),
    )


def _reshape_node(
    out: int, args: list[Any], needs_grad: dict[int, bool], channels_last: bool = False
) -> _Node:
    """Flatten to (B, -1); channels-last images in the channels-first order, as torch has them."""
    if not channels_last:
        return _Node(
            out,
            args,
            lambda x: x.reshape(x.shape[0], -1),
            lambda g, values, y: [g.reshape(values[0].shape)],
            _grad_flags(args, needs_grad),
        )

    def backward(g: Array, values: list[Array], y: Array) -> list[Array | None]:
        b, h, w, c = values[0].shape
        return [g.reshape(b, c, h, w).transpose(0, 2, 3, 1)]

    return _Node(
        out,
        args,
        lambda x: x.transpose(0, 3, 1, 2).reshape(x.shape[0], -1),
        backward,
        _grad_flags(args, needs_grad),
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


def _arithmetic_node(out: int, name: str, args: list[Any], needs_grad: dict[int, bool]) -> _Node:
    if name == "neg":
        return _Node(
            out, args, operator.neg, lambda g, values, y: [-g], _grad_flags(args, needs_grad)
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

    return _Node(out, args, _ARITHMETIC[name], backward, _grad_flags(args, needs_grad))


def _mean_node(
    out: int,
    args: list[Any],
    kwargs: dict[str, Any],
    needs_grad: dict[int, bool],
    rank: int,
) -> tuple[_Node, int]:
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

    node = _Node(
        out,
        source,
        lambda x: x.mean(axis=dim, keepdims=keepdim),
        backward,
        _grad_flags(source, needs_grad),
    )
    return node, rank if keepdim else rank - 1


def _unflatten_node(
    out: int,
    args: list[Any],
    kwargs: dict[str, Any],
    needs_grad: dict[int, bool],
    rank: dict[int, int],
) -> tuple[_Node, int]:
    """``x.unflatten(-1, sizes)`` (the last dimension only: rows stay rows), and the
    fewest dimensions of its output."""
    dim = kwargs.pop("dim", args[1].value if len(args) > 1 else None)
    sizes = kwargs.pop("sizes", args[2].value if len(args) > 2 else None)
    if kwargs or dim != -1 or not isinstance(sizes, tuple) or type(args[0]) is not int:
        raise Unsupported(f"unflatten({dim}, {sizes})")
    source = args[:1]
    node = _Node(
        out,
        source,
        lambda x: x.reshape(*x.shape[:-1], *sizes),
        lambda g, values, y: [g.reshape(values[0].shape)],
        _grad_flags(source, needs_grad),
    )
    return node, rank[args[0]] + len(sizes) - 1


def _fresh_layer_output(module: nn.Module, arg: Any) -> bool:
    """True for a linear layer's or convolution's output that nothing else reads (safe to
    overwrite)."""
    return (
        isinstance(arg, fx.Node)
        and arg.op == "call_module"
        and type(module.get_submodule(arg.target))  # type: ignore[arg-type]
        in (nn.Linear, NoisyLinear, nn.Conv2d)
        and len(arg.users) == 1
    )
