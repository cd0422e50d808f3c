"""The CUDA-graph backend: the action function that gets captured, and the capture seam.

[resample noise -> Q forward -> argmax] is captured once as a CUDA graph. The
selector copies each observation into a static device buffer (from a pinned host
buffer, non-blocking), replays the graph and reads the actions back through a pinned
host buffer: one host synchronisation per step, nothing else. Noise is drawn inside
the graph (graph-safe Philox), so every replay gets fresh noise, bit-identical to
eager with the same generator state. The graph reads the parameters by address, so
optimizer steps and ``load_state_dict`` (in-place copies) are seen without re-capture.

Capture sits behind a small seam, ``graph = capture_fn(fn, static_inputs,
generators=())`` with ``graph.replay()`` and ``graph.output``, so that
:func:`capture_eager` (a stand-in that re-runs ``fn`` over the same static buffers on
replay) can test the graph orchestration on a machine without a GPU. The eager backend
runs the same function as the graph, under ``torch.inference_mode()``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from torch import nn

from agent.noisy import noise_switched, noisy_layers
from agent.values import greedy_actions, support_of

__all__ = ["CaptureFn", "CapturedGraph", "capture_cuda_graph", "capture_eager", "make_act_fn"]


# --------------------------------------------------------------------------- #
# The function that gets captured                                             #
# --------------------------------------------------------------------------- #


def make_act_fn(
    q_network: nn.Module, *, resample: bool, noise: bool
) -> Callable[[torch.Tensor], torch.Tensor]:
    """The action function: ``obs -> argmax_a Q(obs, a)`` as a device tensor of int64
    (:func:`agent.values.greedy_actions`: a C51 head's by its expected values).

    Args:
        q_network: the online network (any module; its NoisyLinear layers are found by type).
        resample: draw fresh noise into the layers' buffers (in place) before the forward.
        noise: forward with noisy weights (True) or the mean weights only (False). The
            layers' ``noise_enabled`` switches are set for the forward and restored after.

    The function has no host synchronisation and no data-dependent control flow, and
    creates every tensor on the device of its input and the parameters, so it can be
    captured as a CUDA graph (and is tested for this on the CPU and on ``meta``).
    """
    layers = noisy_layers(q_network)
    support = support_of(q_network)

    def act(obs: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            if resample:
                for layer in layers:
                    layer.reset_noise()
            # The selector, not the layers' switches, decides noisy vs mean weights.
            with noise_switched(layers, noise):
                return greedy_actions(q_network(obs), support)

    return act


# --------------------------------------------------------------------------- #
# The capture seam                                                            #
# --------------------------------------------------------------------------- #


class CapturedGraph(Protocol):
    """What a capture returns: ``replay()`` rewrites ``output`` from the static inputs."""

    output: torch.Tensor

    def replay(self) -> None: ...


class CaptureFn(Protocol):
    """The seam: ``capture(fn, static_inputs, generators=...)``; ``generators``: CUDA
    generators ``fn`` draws from besides the default one (a seed group's own streams)."""

    def __call__(
        self,
        fn: Callable[..., torch.Tensor],
        static_inputs: Sequence[torch.Tensor],
        generators: Sequence[torch.Generator] = (),
    ) -> CapturedGraph: ...


class _EagerReplay:
    """Stand-in for a CUDA graph: ``replay()`` re-runs ``fn`` over the same static inputs.

    Like a graph, it owns one static output tensor that every replay overwrites in
    place; a caller that reads its input from anywhere but the static buffers, or keeps
    a reference to ``output`` instead of copying it out, gets caught in tests.
    """

    def __init__(self, fn: Callable[..., torch.Tensor], static_inputs: Sequence[torch.Tensor]):
        self._fn = fn
        self._inputs = tuple(static_inputs)
        # A real capture learns the output's shape by tracing fn once; so do we.
        self.output = fn(*self._inputs)

    def replay(self) -> None:
        self.output.copy_(self._fn(*self._inputs))


def capture_eager(
    fn: Callable[..., torch.Tensor],
    static_inputs: Sequence[torch.Tensor],
    generators: Sequence[torch.Generator] = (),
) -> CapturedGraph:
    """Capture seam without a GPU: replays re-run ``fn`` eagerly (also the fallback on CUDA);
    ``generators`` need no registration there (each re-run draws from them itself)."""
    return _EagerReplay(fn, static_inputs)


class _CudaGraph:
    """``fn`` over static CUDA inputs, captured with ``torch.cuda.graph``."""

    def __init__(
        self,
        fn: Callable[..., torch.Tensor],
        static_inputs: Sequence[torch.Tensor],
        warmup: int = 3,
        generators: Sequence[torch.Generator] = (),
    ) -> None:
        inputs = tuple(static_inputs)
        device = inputs[0].device
        with torch.cuda.device(device):
            self._graph = torch.cuda.CUDAGraph()
            # Generators of fn's own, registered before the warm-up (a torch that refuses
            # them fails before any work): each replay advances them as an eager call would.
            for generator in generators:
                self._graph.register_generator_state(generator)
            # Warm-up on a side stream (as the PyTorch docs prescribe): lazy
            # initialisation (cuBLAS handles, workspaces) must not happen in capture.
            current = torch.cuda.current_stream(device)
            side = torch.cuda.Stream(device)
            side.wait_stream(current)
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    fn(*inputs)
            current.wait_stream(side)
            # torch.cuda.graph registers the default CUDA generator: random ops in
            # the graph read seed/offset at replay, so each replay draws fresh noise.
            with torch.cuda.graph(self._graph):
                self.output = fn(*inputs)

    def replay(self) -> None:
        self._graph.replay()


def capture_cuda_graph(
    fn: Callable[..., torch.Tensor],
    static_inputs: Sequence[torch.Tensor],
    generators: Sequence[torch.Generator] = (),
) -> CapturedGraph:
    """Capture ``fn(*static_inputs)`` as a CUDA graph (raises if an op cannot be captured);
    ``generators``: CUDA generators ``fn`` draws from besides the default one."""
    return _CudaGraph(fn, static_inputs, generators=generators)
