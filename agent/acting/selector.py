"""Action selection: greedy actions of a (noisy) Q-network, one call per environment step.

Acting runs once per environment step, so its fixed cost per call decides rollout
speed. :class:`ActionSelector` picks the fastest correct backend for where the
network lives, and re-picks it when the network moves. When the acting noise is drawn
is the caller's choice, call by call (``fresh_noise``): the training loops ask their
exploration policy (:class:`agent.exploration.Exploration`), so the selector keeps no
schedule of its own. Each backend has a file:

``"graph"`` (CUDA; ``agent/acting/graph.py``)
    [resample noise -> Q forward -> argmax] captured once as a CUDA graph, replayed
    per step with one host synchronisation (the actions); a second graph without the
    resampling serves the calls that hold the noise. If capture fails, the same
    orchestration runs the function eagerly, after one warning that says why.

``"numpy"`` (CPU, float32/float64; ``agent/numpy_backend/``)
    A numpy program compiled from the network's forward (``torch.fx``) over zero-copy
    views of the parameters: any module built from ``nn.Linear``, ``NoisyLinear``,
    ``nn.Conv2d`` and elementwise activations, this project's ``QNetwork`` and users'
    own modules alike.

``"eager"`` (anything else: bfloat16, other devices, unsupported ops)
    The function the graph captures, run under ``torch.inference_mode()``. A CPU
    network that does not compile is named in one warning (docs/design.md).

Speeds of each are in docs/research/log.md (``bench/acting.py``).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from agent.acting.graph import (
    CaptureFn,
    CapturedGraph,
    capture_cuda_graph,
    capture_eager,
    make_act_fn,
)
from agent.numpy_backend import NumpyForward, Unsupported, compiled_or_none
from agent.noisy import noisy_layers
from agent.values import greedy_actions, support_of

__all__ = ["ActionSelector", "Backend"]

Backend = Literal["auto", "graph", "numpy", "eager"]


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
        noise: act with noisy weights (True), drawn afresh at every call that asks for
            it (``fresh_noise``, by default every call: the paper resamples every step),
            or with the mean weights only (False, for deterministic evaluation). The
            selector resamples the *online* network's noise buffers in place, as the
            paper's acting step does; the learner never writes them (its update noise has
            buffers of its own, :class:`~agent.noisy.NoiseBuffers`), so a call with
            ``fresh_noise=False`` acts on the noise the last draw left there.
        seed: seed of the numpy generator used for noise on the CPU fast path; ``None``
            draws one from torch's default CPU generator, so ``torch.manual_seed``
            makes acting reproducible. (The torch paths use torch's default generator.)
        backend: ``"auto"`` (CUDA graph on CUDA, numpy forward on CPU where it applies,
            eager otherwise), or force ``"graph"``, ``"numpy"`` or ``"eager"``.
        capture_fn: the capture seam, ``capture_fn(fn, static_inputs) -> graph`` with
            ``graph.replay()`` and ``graph.output``; given, it implies ``"graph"`` on any
            device (tests pass :func:`capture_eager` or a recording stand-in on the CPU).
        capture_graph: with ``backend="auto"`` on CUDA, capture a CUDA graph (True) or
            act eagerly (False: the switch for a GPU where capture misbehaves).

    Call ``selector(obs)`` with a numpy batch ``(num_envs, *obs_shape)`` in the env's
    dtype (float32 vectors, uint8 frames, ...) to get int64 actions ``(num_envs,)``;
    ``selector(obs, fresh_noise=False)`` acts on the noise held since the last draw.
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
        seed: int | None = None,
        backend: Backend = "auto",
        capture_fn: CaptureFn | None = None,
        capture_graph: bool = True,
    ) -> None:
        obs_shape = tuple(int(s) for s in obs_shape)
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
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
        self._backend_request: Backend = "graph" if capture_fn is not None else backend
        self._capture_fn = capture_fn
        self.capture_graph = bool(capture_graph)
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
        self._noise = bool(enabled)

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

    def refresh(self) -> None:
        """Drop graphs, buffers and views; the next call rebuilds (re-captures) them."""
        self._backend = None

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to continue the same noise stream (plain Python values).

        The numpy generator of the CPU path; the torch paths draw from torch's
        generators, saved with torch's RNG state.
        """
        return {"rng": self._rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`: the next call continues where the saved selector stopped.

        A state saved by an older selector also holds its call counter (``"step"``),
        which no longer decides anything: it is ignored."""
        self._rng.bit_generator.state = state["rng"]

    # -- the hot path -------------------------------------------------------- #

    def __call__(self, obs: np.ndarray, fresh_noise: bool = True) -> np.ndarray:
        """Actions ``(num_envs,)`` int64 for a batch of observations ``(num_envs, *obs_shape)``.

        ``fresh_noise``: draw the acting noise afresh before acting (True, every call by
        default), or act on the noise held since the last draw (False; the training loops
        ask their exploration policy, :meth:`agent.exploration.Exploration.fresh_noise`).
        Without noise (``noise`` False) nothing is drawn either way."""
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
        resample = self._noise and bool(fresh_noise)
        if self._backend == "numpy":
            policy = self._numpy
            if resample:
                policy.resample()
            # Silent on inf/nan like torch (a diverged network is the learner's to report).
            with np.errstate(over="ignore", invalid="ignore"):
                output = policy.q_values(obs, self._noise)
                actions = greedy_actions(output, self._support)
            return actions.astype(np.int64, copy=False)
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
        self._numpy: NumpyForward | None = None
        device = probe.device
        request = self._backend_request

        if request == "numpy":
            try:
                self._numpy = NumpyForward.build(self.q_network, self._rng)
            except Unsupported as e:  # NotApplicable too: the backend was asked for
                raise ValueError(f"backend='numpy' cannot run {e}; use backend='auto'") from None
        elif request == "auto" and device.type == "cpu":
            self._numpy = compiled_or_none(
                lambda: NumpyForward.build(self.q_network, self._rng),
                "acting runs eagerly instead (backend='eager' chooses it without this warning)",
            )
        if self._numpy is not None:
            support = support_of(self.q_network)
            self._support = None if support is None else support.numpy()
            self._backend = "numpy"
            return
        if request == "graph" or (
            request == "auto" and device.type == "cuda" and self.capture_graph
        ):
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

        Calls that hold the noise and calls that draw it replay two graphs, without and
        with the resampling: the host picks one per call (``fresh_noise``), not the graph.
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
