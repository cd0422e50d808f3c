"""Action selection: greedy actions of a (noisy) Q-network, one call per environment step.

Acting runs once per environment step, so its fixed cost per call decides rollout
speed. :class:`ActionSelector` picks the fastest correct path for where the network
lives, and re-picks it when the network moves:

``"graph"`` (CUDA)
    [resample noise -> Q forward -> argmax] is captured once as a CUDA graph. Each
    call copies the observation into a static device buffer (from a pinned host
    buffer, non-blocking), replays the graph and reads the actions back through a
    pinned host buffer: one host synchronisation per step, nothing else. Noise is
    drawn inside the graph (graph-safe Philox), so every replay gets fresh noise,
    bit-identical to eager with the same generator state. The graph reads the
    parameters by address, so optimizer steps and ``load_state_dict`` (in-place
    copies) are seen without re-capture. If capture fails, the same orchestration
    runs the function eagerly, after one warning that says why.

``"numpy"`` (CPU, float32/float64 MLP heads, optionally dueling)
    A numpy forward over zero-copy views of the parameters. ``param.detach().numpy()``
    shares the parameter's storage, so every in-place optimizer step and
    ``load_state_dict`` is seen with no copying. Noise is drawn with a numpy
    generator and written into the layers' noise buffers (also views), so
    ``q_network(obs)`` afterwards reproduces exactly the noise the action used.
    Measured on a 2-core Xeon at batch 1 (4-64-64-2 noisy MLP): ~25 us per noisy
    action, against ~115 us for an eager torch noisy forward and ~36 us for a plain
    eager forward (see bench/acting.py and docs/benchmarks.md).

``"eager"`` (anything else: CNN torsos, bfloat16, other devices)
    The same function the graph captures, run under ``torch.inference_mode()``.

Capture sits behind a small seam, ``graph = capture_fn(fn, static_inputs)`` with
``graph.replay()`` and ``graph.output``, so that :func:`capture_eager` (a stand-in
that re-runs ``fn`` over the same static buffers on replay) can test the graph
orchestration on a machine without a GPU.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

import numpy as np
import torch
from torch import nn

from agent.noisy import NoisyLinear, noisy_layers

__all__ = [
    "ActionSelector",
    "CapturedGraph",
    "capture_cuda_graph",
    "capture_eager",
    "make_act_fn",
]

Backend = Literal["auto", "graph", "numpy", "eager"]


# --------------------------------------------------------------------------- #
# The function that gets captured                                             #
# --------------------------------------------------------------------------- #


def make_act_fn(
    q_network: nn.Module, *, resample: bool, noise: bool
) -> Callable[[torch.Tensor], torch.Tensor]:
    """The action function: ``obs -> argmax_a Q(obs, a)`` as a device tensor of int64.

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

    def act(obs: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            if resample:
                for layer in layers:
                    layer.reset_noise()
            # The selector, not the layers' switches, decides noisy vs mean weights.
            # Plain attribute writes (no context manager): this runs every step on CPU.
            previous = [layer.noise_enabled for layer in layers]
            for layer in layers:
                layer.noise_enabled = noise
            try:
                return q_network(obs).argmax(dim=1)
            finally:
                for layer, was in zip(layers, previous, strict=True):
                    layer.noise_enabled = was

    return act


# --------------------------------------------------------------------------- #
# The capture seam                                                            #
# --------------------------------------------------------------------------- #


class CapturedGraph(Protocol):
    """What a capture returns: ``replay()`` rewrites ``output`` from the static inputs."""

    output: torch.Tensor

    def replay(self) -> None: ...


CaptureFn = Callable[[Callable[..., torch.Tensor], Sequence[torch.Tensor]], CapturedGraph]


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
    fn: Callable[..., torch.Tensor], static_inputs: Sequence[torch.Tensor]
) -> CapturedGraph:
    """Capture seam without a GPU: replays re-run ``fn`` eagerly (also the fallback on CUDA)."""
    return _EagerReplay(fn, static_inputs)


class _CudaGraph:
    """``fn`` over static CUDA inputs, captured with ``torch.cuda.graph``."""

    def __init__(
        self,
        fn: Callable[..., torch.Tensor],
        static_inputs: Sequence[torch.Tensor],
        warmup: int = 3,
    ) -> None:
        inputs = tuple(static_inputs)
        device = inputs[0].device
        with torch.cuda.device(device):
            # Warm-up on a side stream (as the PyTorch docs prescribe): lazy
            # initialisation (cuBLAS handles, workspaces) must not happen in capture.
            current = torch.cuda.current_stream(device)
            side = torch.cuda.Stream(device)
            side.wait_stream(current)
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    fn(*inputs)
            current.wait_stream(side)
            self._graph = torch.cuda.CUDAGraph()
            # torch.cuda.graph registers the default CUDA generator: random ops in
            # the graph read seed/offset at replay, so each replay draws fresh noise.
            with torch.cuda.graph(self._graph):
                self.output = fn(*inputs)

    def replay(self) -> None:
        self._graph.replay()


def capture_cuda_graph(
    fn: Callable[..., torch.Tensor], static_inputs: Sequence[torch.Tensor]
) -> CapturedGraph:
    """Capture ``fn(*static_inputs)`` as a CUDA graph (raises if an op cannot be captured)."""
    return _CudaGraph(fn, static_inputs)


# --------------------------------------------------------------------------- #
# The numpy forward (CPU fast path)                                           #
# --------------------------------------------------------------------------- #


class _NumpyLinear:
    """One linear layer over zero-copy numpy views of a Linear or NoisyLinear."""

    def __init__(self, layer: nn.Module, relu: bool) -> None:
        self.relu = relu
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
            # Same formula as NoisyLinear.forward: W = mu + sigma * eps (materialised:
            # measured faster than the factorised form at these sizes).
            weight = np.multiply(self.weight_sigma, self.weight_epsilon, out=self._noisy_weight)
            weight += self.weight
            y = x @ weight.T
            bias = self.bias_sigma * self.bias_epsilon
            bias += self.bias
            y += bias
        else:
            y = x @ self.weight.T
            if self.bias is not None:
                y += self.bias
        if self.relu:
            np.maximum(y, 0, out=y)  # y is ours (fresh from the matmul)
        return y


_NUMPY_LAYERS = (nn.Linear, NoisyLinear)


def _numpy_stream(seq: nn.Module) -> list[_NumpyLinear] | None:
    """Layers of a Sequential of Linear/NoisyLinear/ReLU, or None if it has anything else."""
    if type(seq) is not nn.Sequential:
        return None
    out: list[_NumpyLinear] = []
    modules = list(seq)
    for i, module in enumerate(modules):
        if type(module) is nn.ReLU:
            if i == 0 or type(modules[i - 1]) not in _NUMPY_LAYERS:
                return None  # only a ReLU right after a linear layer is folded into it
            continue
        if type(module) not in _NUMPY_LAYERS:
            return None
        relu_next = i + 1 < len(modules) and type(modules[i + 1]) is nn.ReLU
        out.append(_NumpyLinear(module, relu_next))
    return out


class _NumpyPolicy:
    """A numpy forward of a QNetwork with an identity torso (MLP head, optionally dueling).

    Built from views of the live parameters and buffers; ``None`` from :meth:`build`
    when the network is not one this path reproduces exactly (CNN torso, other dtypes
    or devices, subclassed forward, unknown layers).
    """

    def __init__(
        self,
        dtype: np.dtype,
        head: list[_NumpyLinear],
        value: list[_NumpyLinear] | None,
        advantage: list[_NumpyLinear] | None,
        noise_layers: list[_NumpyLinear],
        rng: np.random.Generator,
    ) -> None:
        self.dtype = dtype
        self.head, self.value, self.advantage = head, value, advantage
        self.rng = rng
        self.noise_layers = noise_layers
        # All noise factors are drawn by one generator call into one buffer, then
        # scattered into the layers' epsilon_in / epsilon_out views: one call instead
        # of two per layer (measured ~12 us vs ~17 us for three layers).
        sizes = [(len(lay.epsilon_in), len(lay.epsilon_out)) for lay in noise_layers]
        total = sum(a + b for a, b in sizes)
        self._draw = np.empty(total, dtype=dtype)
        self._scratch = np.empty(total, dtype=dtype)
        self._segments: list[tuple[int, int, int]] = []
        start = 0
        for n_in, n_out in sizes:
            self._segments.append((start, start + n_in, start + n_in + n_out))
            start += n_in + n_out

    @classmethod
    def build(cls, q_network: nn.Module, rng: np.random.Generator) -> _NumpyPolicy | None:
        from agent.networks import QNetwork  # local: networks imports nothing from here

        if not isinstance(q_network, QNetwork) or type(q_network).forward is not QNetwork.forward:
            return None
        if type(q_network.torso) is not nn.Identity:
            return None
        tensors = [*q_network.parameters(), *q_network.buffers()]
        dtypes = {t.dtype for t in tensors}
        if len(dtypes) != 1 or dtypes.pop() not in (torch.float32, torch.float64):
            return None
        if any(t.device.type != "cpu" for t in tensors):
            return None
        head = _numpy_stream(q_network.head)
        value = advantage = None
        if q_network.dueling:
            value = _numpy_stream(q_network.value)
            advantage = _numpy_stream(q_network.advantage)
            if value is None or advantage is None:
                return None
        if head is None:
            return None
        layers = [*head, *(value or []), *(advantage or [])]
        noise_layers = [layer for layer in layers if layer.noisy]
        dtype = np.dtype(np.float32 if tensors[0].dtype == torch.float32 else np.float64)
        return cls(dtype, head, value, advantage, noise_layers, rng)

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
        # QNetwork.forward converts the input to the parameters' dtype first; so do we.
        x = np.asarray(obs, dtype=self.dtype)
        for layer in self.head:
            x = layer(x, noise)
        if self.value is None or self.advantage is None:
            return x
        v = x
        for layer in self.value:
            v = layer(v, noise)
        a = x
        for layer in self.advantage:
            a = layer(a, noise)
        # Full Q (not argmax of A alone), so near-ties round exactly like the network.
        return v + a - a.mean(axis=-1, keepdims=True)


# --------------------------------------------------------------------------- #
# The selector                                                                #
# --------------------------------------------------------------------------- #


def _first_parameter(module: nn.Module) -> tuple[dict, str]:
    """(owner's parameter dict, name) of the first parameter, re-read on every call."""
    for sub in module.modules():
        for name in sub._parameters:
            if sub._parameters[name] is not None:
                return sub._parameters, name
    raise ValueError("ActionSelector needs a network with at least one parameter")


class ActionSelector:
    """Greedy actions of a Q-network for a batch of environments, one call per step.

    Args:
        q_network: the online network. The selector never moves or copies it: it reads
            the live parameters (by address on CUDA, through zero-copy views on CPU),
            so learner updates and ``load_state_dict`` are seen at the next call.
        obs_shape: shape of one observation, e.g. ``(4,)`` or ``(4, 84, 84)``.
        num_envs: batch size of every call.
        device: where the network lives (checked against its parameters); ``None``
            takes the parameters' device. If the network later moves, the selector
            follows it.
        noise: act with noisy weights, resampled every ``noise_interval`` calls (True;
            the paper resamples every step), or with the mean weights only (False, for
            deterministic evaluation). The selector resamples the *online* network's
            noise buffers in place, as the paper's acting step does; the learner puts
            them back after each update, so the noise stays held between resamples.
        noise_interval: resample the noise every this many calls (1 = every step), or
            ``None``: only at the first call and after :meth:`new_noise` (the training
            loop calls it at every episode end, for noise held for a whole episode).
        seed: seed of the numpy generator used for noise on the CPU fast path; ``None``
            draws one from torch's default CPU generator, so ``torch.manual_seed``
            makes acting reproducible. (The torch paths use torch's default generator.)
        backend: ``"auto"`` (CUDA graph on CUDA, numpy forward on CPU where it applies,
            eager otherwise), or force ``"graph"``, ``"numpy"`` or ``"eager"``.
        capture_fn: the capture seam, ``capture_fn(fn, static_inputs) -> graph`` with
            ``graph.replay()`` and ``graph.output``; given, it implies ``"graph"`` on any
            device (tests pass :func:`capture_eager` or a recording stand-in on the CPU).

    Call ``selector(obs)`` with a numpy batch ``(num_envs, *obs_shape)`` in the env's
    dtype (float32 vectors, uint8 frames, ...) to get int64 actions ``(num_envs,)``.
    Nothing needs calling after a learner update. A move of the network to another
    device or dtype (``.to()``) is detected at the next call by comparing one
    parameter's address and dtype, and the selector rebuilds (re-captures); after
    replacing individual parameter or buffer tensors by hand, call :meth:`refresh`.
    """

    def __init__(
        self,
        q_network: nn.Module,
        obs_shape: Sequence[int],
        num_envs: int,
        device: torch.device | str | None = None,
        *,
        noise: bool = True,
        noise_interval: int | None = 1,
        seed: int | None = None,
        backend: Backend = "auto",
        capture_fn: CaptureFn | None = None,
    ) -> None:
        obs_shape = tuple(int(s) for s in obs_shape)
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if noise_interval is not None and (
            int(noise_interval) != noise_interval or noise_interval < 1
        ):
            raise ValueError(
                f"noise_interval must be a positive integer or None, got {noise_interval}"
            )
        if backend not in ("auto", "graph", "numpy", "eager"):
            raise ValueError(f"backend must be auto, graph, numpy or eager, got {backend!r}")
        if capture_fn is not None and backend not in ("auto", "graph"):
            raise ValueError(f"capture_fn implies backend='graph', got backend={backend!r}")
        net_shape = getattr(q_network, "obs_shape", None)
        if net_shape is not None and tuple(net_shape) != obs_shape:
            raise ValueError(
                f"obs_shape {obs_shape} does not match the network's obs_shape {tuple(net_shape)}"
            )
        self.q_network = q_network
        self.obs_shape = obs_shape
        self.num_envs = int(num_envs)
        self._batch_shape = (self.num_envs, *obs_shape)
        self._noise = bool(noise)
        self.noise_interval = None if noise_interval is None else int(noise_interval)
        self._backend_request: Backend = "graph" if capture_fn is not None else backend
        self._capture_fn = capture_fn
        self._probe_dict, self._probe_name = _first_parameter(q_network)
        if device is not None:
            device = torch.device(device)
            actual = self.device
            if device.type != actual.type or (
                device.index is not None and device.index != actual.index
            ):
                raise ValueError(
                    f"ActionSelector(device={str(device)!r}) but the network's parameters are "
                    f"on {actual}; move the network first (q_network.to(device))"
                )
        if seed is None:
            # From torch's CPU generator, so torch.manual_seed(s) fixes acting too.
            seed = int(torch.randint(0, 2**62, (), dtype=torch.int64))
        self._rng = np.random.default_rng(seed)
        self._is_noisy = bool(noisy_layers(q_network))
        self._step = 0
        self._warned = False
        self._backend: str | None = None  # set by _build at the first call
        self._obs_dtype: np.dtype | None = None

    # -- public state -------------------------------------------------------- #

    @property
    def device(self) -> torch.device:
        """The device of the network's parameters now."""
        return self._probe_dict[self._probe_name].device

    @property
    def noise(self) -> bool:
        """Act with noisy weights (True) or the mean weights (False). Settable."""
        return self._noise

    @noise.setter
    def noise(self, enabled: bool) -> None:
        enabled = bool(enabled)
        if enabled and not self._noise:
            self._step = 0  # switching noise on draws fresh noise at the next call
        self._noise = enabled

    @property
    def backend(self) -> str | None:
        """``"graph"``, ``"numpy"`` or ``"eager"``; ``None`` until the first call."""
        return self._backend

    @property
    def captured(self) -> bool:
        """True when actions come from a captured graph: a CUDA graph, or the ``capture_fn``
        stand-in given by a test; False on the numpy and eager paths and after a failed
        capture fell back to eager replays."""
        return self._backend == "graph" and self._captured

    def new_noise(self) -> None:
        """Draw fresh noise at the next call, whatever ``noise_interval`` says."""
        self._step = 0

    def refresh(self) -> None:
        """Drop graphs, buffers and views; the next call rebuilds (re-captures) them."""
        self._backend = None

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to continue the same noise stream (plain Python values).

        The call counter (for ``noise_interval``) and the numpy generator of the CPU
        path; the torch paths draw from torch's generators, saved with torch's RNG state.
        """
        return {"step": self._step, "rng": self._rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`: the next call continues where the saved selector stopped."""
        self._step = int(state["step"])
        self._rng.bit_generator.state = state["rng"]

    # -- the hot path -------------------------------------------------------- #

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """Actions ``(num_envs,)`` int64 for a batch of observations ``(num_envs, *obs_shape)``."""
        obs = np.asarray(obs)
        if obs.shape != self._batch_shape:
            raise ValueError(
                f"expected observations of shape {self._batch_shape} "
                f"(num_envs, *obs_shape), got {obs.shape}"
            )
        # A .to(device/dtype) gives the parameters new storage. We hold a reference to
        # the storage we built against, so a new one can never reuse its address.
        probe = self._probe_dict[self._probe_name]
        if (
            self._backend is None
            or probe.data_ptr() != self._probe_ptr
            or probe.dtype != self._probe_dtype
        ):
            self._build(obs.dtype)
        interval = self.noise_interval
        resample = self._noise and (
            self._step == 0 if interval is None else self._step % interval == 0
        )
        self._step += 1
        if self._backend == "numpy":
            policy = self._numpy
            if resample:
                policy.resample()
            # Silent on inf/nan like torch (a diverged network is the learner's to report).
            with np.errstate(over="ignore", invalid="ignore"):
                q_values = policy.q_values(obs, self._noise)
            return q_values.argmax(axis=1).astype(np.int64, copy=False)
        if self._backend == "graph":
            return self._call_graph(obs, resample)
        return self._call_eager(obs, resample)

    # -- building ------------------------------------------------------------ #

    def _build(self, obs_dtype: np.dtype) -> None:
        """(Re)build for where the network is now: pick a backend and make its buffers."""
        self._probe_dict, self._probe_name = _first_parameter(self.q_network)
        probe = self._probe_dict[self._probe_name]
        self._probe_ref = probe.detach()  # keeps the old address taken (see __call__)
        self._probe_ptr = probe.data_ptr()
        self._probe_dtype = probe.dtype
        self._is_noisy = bool(noisy_layers(self.q_network))
        if self._obs_dtype is None:
            self._obs_dtype = np.dtype(obs_dtype)
        self._graphs: dict[str, CapturedGraph] = {}
        self._numpy: _NumpyPolicy | None = None
        device = probe.device
        request = self._backend_request

        if request in ("auto", "numpy") and device.type == "cpu":
            self._numpy = _NumpyPolicy.build(self.q_network, self._rng)
            if self._numpy is not None:
                self._backend = "numpy"
                return
        if request == "numpy":
            raise ValueError(
                "backend='numpy' needs a CPU float32/float64 QNetwork with an MLP head; "
                "use backend='auto'"
            )
        if request == "graph" or (request == "auto" and device.type == "cuda"):
            self._build_graph(device)
            self._backend = "graph"
            return
        self._backend = "eager"
        self._act_fns = {
            resample: make_act_fn(self.q_network, resample=resample, noise=True)
            for resample in (False, True)
        }
        self._act_mean = make_act_fn(self.q_network, resample=False, noise=False)

    def _build_graph(self, device: torch.device) -> None:
        cuda = device.type == "cuda"
        obs_dtype = torch.from_numpy(np.empty(0, dtype=self._obs_dtype)).dtype
        # Static buffers: the graph reads the input and writes the output at these
        # addresses on every replay. Pinned host buffers make the copies asynchronous
        # (pinning needs a CUDA runtime, so only on CUDA).
        self._static_obs = torch.zeros(self._batch_shape, dtype=obs_dtype, device=device)
        self._host_obs = torch.zeros(self._batch_shape, dtype=obs_dtype, pin_memory=cuda)
        self._host_obs_np = self._host_obs.numpy()
        self._host_actions = torch.zeros(self.num_envs, dtype=torch.int64, pin_memory=cuda)
        self._host_actions_np = self._host_actions.numpy()
        self._event = torch.cuda.Event() if cuda else None
        self._captured = True
        if self._capture_fn is not None:
            self._capture = self._capture_fn
        elif cuda:
            self._capture = capture_cuda_graph
        else:
            # Forced "graph" without a GPU: same orchestration, eager replays.
            self._capture = capture_eager
            self._captured = False

    def _graph_for(self, mode: str) -> CapturedGraph:
        """The graph for ``mode`` ("resample", "noisy" or "mean"), captured on first use.

        With noise_interval > 1 two graphs exist, with and without the resampling,
        and the host picks one per call; that is host-side control, not in the graph.
        """
        graph = self._graphs.get(mode)
        if graph is not None:
            return graph
        fn = make_act_fn(self.q_network, resample=mode == "resample", noise=mode != "mean")
        device = self._static_obs.device
        try:
            # Warm-up (and a stand-in's trace) draw noise; restoring the generators
            # after capture leaves the noise stream exactly as eager acting would
            # (graphed == eager for the same RNG state, and resumed runs continue it).
            with torch.random.fork_rng(
                devices=[device] if device.type == "cuda" else [], device_type="cuda"
            ):
                graph = self._capture(fn, (self._static_obs,))
        except Exception as exc:  # any failure: correct eager results beat none
            if not self._warned:
                warnings.warn(
                    f"ActionSelector: CUDA graph capture failed ({type(exc).__name__}: {exc}); "
                    "acting eagerly instead (same results, slower)",
                    RuntimeWarning,
                    stacklevel=4,
                )
                self._warned = True
            self._capture = capture_eager
            self._captured = False
            self._graphs.clear()  # never mix captured and eager graphs
            graph = capture_eager(fn, (self._static_obs,))
        self._graphs[mode] = graph
        return graph

    # -- the two torch paths ------------------------------------------------- #

    def _call_graph(self, obs: np.ndarray, resample: bool) -> np.ndarray:
        if not self._noise or not self._is_noisy:
            mode = "mean"
        else:
            mode = "resample" if resample else "noisy"
        graph = self._graph_for(mode)
        # The pinned buffer is free to overwrite: the previous call waited for the
        # actions, which come after its copy-in on the same stream.
        try:
            np.copyto(self._host_obs_np, obs, casting="same_kind")
        except TypeError as exc:
            raise ValueError(
                f"observations of dtype {obs.dtype} cannot be cast to this selector's "
                f"{self._obs_dtype} (set by the first call)"
            ) from exc
        self._static_obs.copy_(self._host_obs, non_blocking=True)
        graph.replay()
        self._host_actions.copy_(graph.output, non_blocking=True)
        if self._event is not None:
            # The one synchronisation per step: wait for the actions to reach the host.
            self._event.record(torch.cuda.current_stream(self._static_obs.device))
            self._event.synchronize()
        return self._host_actions_np.copy()  # fresh: the buffer is reused next call

    def _call_eager(self, obs: np.ndarray, resample: bool) -> np.ndarray:
        if not (obs.flags.c_contiguous and obs.flags.writeable):
            obs = np.array(obs, order="C")  # torch.from_numpy wants writeable, no neg. strides
        if self._noise and self._is_noisy:
            act = self._act_fns[resample]
        else:
            act = self._act_mean
        with torch.inference_mode():
            x = torch.from_numpy(obs).to(self.device)
            return act(x).cpu().numpy()
