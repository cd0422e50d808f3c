"""The learner: the update (its loss from agent/objectives.py), Adam, the target network."""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple, Protocol

import numpy as np
import torch
from torch import nn

from agent.acting.graph import CaptureFn
from agent.noisy import NoiseBuffers, noise_switched, noisy_layers
from agent.numpy_backend import GradientSink, NumpyProgram, Unsupported, compiled_or_none
from agent.objectives import BatchLike, make_objective, td_loss, td_loss_numpy
from agent.optim import Adam
from agent.replay.base import Batch
from agent.values import support_of

__all__ = [
    "CapturedUpdate",
    "Learner",
    "Metrics",
    "NonFiniteError",
    "RunningMetrics",
    "sync_parameters",
]


class NonFiniteError(RuntimeError):
    """A loss or a Q value became NaN or infinite."""


class Metrics(NamedTuple):
    td_loss: float
    q_values: float
    updates: int


@torch.no_grad()
def sync_parameters(target: list[torch.Tensor], online: list[torch.Tensor], tau: float) -> None:
    """Target network sync: a hard copy (``tau`` >= 1) or a Polyak average, in place."""
    if tau >= 1.0:
        torch._foreach_copy_(target, online)
    else:
        torch._foreach_lerp_(target, online, tau)


class RunningMetrics:
    """Sums of (TD loss, mean Q of the taken actions) since the last read, kept on the
    device (a tensor; its numpy view for the numpy backend) and read at log time;
    ``rows``: one pair per stacked seed, ``sums`` of shape ``(rows, 2)``."""

    def __init__(self, device: torch.device, dtype: torch.dtype, rows: int | None = None) -> None:
        self.sums = torch.zeros(2 if rows is None else (rows, 2), device=device, dtype=dtype)
        self.count = 0

    def read(self) -> Metrics | None:
        """Means since the last read (one host read), or None without updates."""
        if self.count == 0:
            return None
        loss_sum, q_sum = self.sums.tolist()
        count = self.count
        self.sums.zero_()
        self.count = 0
        return Metrics(loss_sum / count, q_sum / count, count)


class Learner:
    """Updates ``q_network`` from replay batches; owns the optimizer and the target sync.

    Before every update the noise of both networks is resampled (independent
    noise for the online and the target network, as in the NoisyNet paper).
    With ``noise=False`` (epsilon-greedy runs) both networks learn on their mean
    weights, as they act, and the sigma parameters receive no gradient and stay as
    initialised. The learner never changes the networks' own noise switches.
    ``update_noise`` scales the update noise (1: as drawn, as in the paper). With 0 the
    noise is for acting only: updates run on the mean weights of both networks (no
    noise is drawn for them), so the sigmas receive no gradient and the acting noise
    keeps the scale it was initialised with.
    The online network's own noise buffers are never written by an update: the noise
    there is the acting noise, which belongs to the action selector (held for
    ``noise_interval`` steps or a whole episode); updates draw theirs into buffers of
    their own (:class:`~agent.noisy.NoiseBuffers`).
    Metrics are summed on the device and only turned into floats by
    :meth:`metrics`, at the log interval.

    ``backend``: how the gradients are computed. ``"auto"`` (default) uses the numpy
    program of :mod:`agent.numpy_backend` where it applies (both networks on the CPU in
    float32/float64, made of the ops it knows: every network ``QNetwork`` builds) and
    PyTorch's autograd otherwise: silently where that is expected (CUDA, other dtypes, a
    module that opts out), after one warning naming what did not compile otherwise.
    ``"torch"`` or ``"numpy"`` force one (``"numpy"`` raises ``ValueError``, naming what
    did not compile, where it does not apply). Both compute the same update,
    up to float rounding; the numpy one is several times cheaper on small networks
    (docs/research/log.md). ``"compile"`` runs the autograd update with its loss (both
    networks' forwards, the target, the loss, and so their backward) compiled by
    ``torch.compile`` on a CPU: compiled at the first update, whose time ``announce`` is
    told in one line; where compiling fails (no C++ compiler, an unsupported platform)
    ``announce`` says so in one line and the same update runs eagerly.
    :attr:`backend` says which runs. ``autocast`` (``torch.bfloat16``, say) runs the
    torch and compiled updates' loss under autocast to that dtype (parameters, gradients
    and Adam stay in theirs): with ``"auto"`` it takes ``"compile"`` on a CPU and
    ``"torch"`` elsewhere, and ``"numpy"`` is refused; None (default) does not.
    The networks' parameters must stay where they are (``load_state_dict`` copies
    in place; moving a network needs a new learner, as the optimizer does).

    A new loss term is written once, in :meth:`loss` (or an override of it in a
    subclass, which then never runs on the numpy engine): the torch, compiled and
    captured updates all learn from it.

    The head decides the objective: a network with a ``support``
    (:func:`~agent.values.support_of`, a C51 head) learns by the cross entropy to the
    projected target distribution (:class:`~agent.distributional.CategoricalObjective`),
    any other by the TD loss (``loss``, ``huber_delta``;
    :class:`~agent.objectives.ValueObjective`). A batch with importance ``weights``
    (prioritized replay) weights each sample's loss.
    :meth:`update` returns the per-sample errors that prioritized replay keeps: ``|TD
    error|``, or the cross entropy; a tensor on the networks' device (no host read).
    """

    def __init__(
        self,
        q_network: nn.Module,
        target_network: nn.Module,
        *,
        lr: float,
        adam_eps: float = 1.5e-4,
        double_dqn: bool = True,
        loss: Literal["huber", "mse"] = "huber",
        huber_delta: float = 1.0,
        max_grad_norm: float | None = 10.0,
        tau: float = 1.0,
        noise: bool = True,
        update_noise: float = 1.0,
        backend: Literal["auto", "torch", "numpy", "compile"] = "auto",
        announce: Callable[[str], None] | None = None,
        autocast: torch.dtype | None = None,
    ) -> None:
        if backend not in ("auto", "torch", "numpy", "compile"):
            raise ValueError(f"backend must be auto, torch, numpy or compile, got {backend!r}")
        params = list(q_network.parameters())
        if autocast is not None and backend == "numpy":
            raise ValueError("autocast applies to the torch and compile learner backends")
        if autocast is not None and backend == "auto":
            # The numpy engine has no autocast: autograd, compiled where it runs (a CPU).
            backend = "compile" if params[0].device.type == "cpu" else "torch"
        if update_noise < 0:
            raise ValueError(f"update_noise must be >= 0, got {update_noise}")
        self.q_network = q_network
        self.target_network = target_network
        self.double_dqn = double_dqn
        self.support = support_of(q_network)
        self.objective = make_objective(self.support, loss, huber_delta)
        self.max_grad_norm = max_grad_norm
        self.tau = tau
        draws = noise and update_noise > 0  # the updates run on noise of their own
        self.update_noise = update_noise
        # The online network's own noise buffers hold the acting noise (the selector's):
        # its updates draw into buffers of their own instead. The target never acts.
        self.update_noise_buffers = NoiseBuffers(
            q_network, noisy_layers(q_network) if draws else []
        )
        self._target_noisy = noisy_layers(target_network) if draws else []
        # Without update noise both networks are switched to their mean weights for each
        # update and back after: the networks' own switches (acting) are left alone.
        self._mean_for_update = (
            [] if draws else [*noisy_layers(q_network), *noisy_layers(target_network)]
        )
        # One fused kernel per step and one flat gradient buffer (agent/optim.py).
        self.optimizer = Adam(params, lr=lr, eps=adam_eps)
        self._online = params
        self._target = list(target_network.parameters())
        self.running = RunningMetrics(params[0].device, params[0].dtype)
        self.updates = 0
        self._numpy: _NumpyUpdate | None = None
        # The numpy engine derives the built-in loss's gradient by hand: a learner whose
        # loss adds a term of its own (an auxiliary head, say) learns through autograd.
        own_loss = type(self).loss is not Learner.loss
        if backend == "numpy" and own_loss:
            raise ValueError(f"the numpy learner backend cannot run {type(self).__name__}'s "
                             "own loss (its gradients are derived by hand for Learner.loss): "
                             "backend torch or compile")  # fmt: skip
        if backend == "numpy":
            try:
                self._numpy = _NumpyUpdate.build(self)
            except Unsupported as e:  # NotApplicable too: the backend was asked for
                raise ValueError(f"the numpy learner backend cannot run {e}") from None
        elif backend == "auto" and not own_loss:
            self._numpy = compiled_or_none(
                lambda: _NumpyUpdate.build(self),
                "autograd computes the updates instead (backend='torch', "
                "--set learner_backend=torch in a run, chooses it without this warning)",
            )
        self.backend: Literal["torch", "numpy", "compile"] = "numpy" if self._numpy else "torch"
        # The autograd update's loss, eager or compiled (compiled at its first call).
        self._loss: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = self.loss
        self._announce = announce or (lambda line: warnings.warn(line, RuntimeWarning,
                                                                 stacklevel=4))  # fmt: skip
        self._compiling = False
        self.autocast = autocast
        if backend == "compile":
            if params[0].device.type != "cpu":
                raise ValueError("the compile learner backend runs on a CPU (on CUDA the "
                                 "update is captured as a CUDA graph)")  # fmt: skip
            self._loss = torch.compile(self.loss, dynamic=False)
            self.backend, self._compiling = "compile", True

    def update(self, batch: BatchLike) -> torch.Tensor:
        """One gradient step on ``batch`` (tensors on the networks' device); returns the
        per-sample errors ``(B,)``, detached, on the networks' device."""
        if not self._mean_for_update:
            return self._update(batch)
        with noise_switched(self._mean_for_update, False):
            return self._update(batch)

    def loss(self, batch: BatchLike) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The update's loss on ``batch`` under the drawn update noise: (the loss, the
        per-sample errors ``(B,)``, the Q values of the taken actions ``(B,)``). Written
        once: eager, compiled and captured updates all run it."""
        if self.autocast is not None:
            # No cache of cast weights: a CUDA graph's capture must not keep them past it.
            with torch.autocast(batch.obs.device.type, dtype=self.autocast, cache_enabled=False):
                return self._loss_of(batch)
        return self._loss_of(batch)

    def _loss_of(self, batch: BatchLike) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        forward = self.update_noise_buffers.forward  # the online network, update noise
        out = forward(batch.obs)  # (B, A) or (B, A, N)
        # next_obs's online values (double DQN's chooser, the same noise as out, as in
        # Rainbow) in a forward of their own without autograd: in one forward with obs
        # the backward would run every layer over both halves, one of them all zeros.
        with torch.no_grad():
            out_next_target = self.target_network(batch.next_obs)
            chooser = forward(batch.next_obs) if self.double_dqn else out_next_target
        return td_loss(self.objective, out, chooser, out_next_target, batch)

    def _update(self, batch: BatchLike) -> torch.Tensor:
        if self._numpy is not None:
            return self._numpy.update(batch)
        self.draw_update_noise()
        if self._compiling:
            loss, errors, q_taken = self._first_compiled(batch)
        else:
            loss, errors, q_taken = self._gradients(self._loss, batch)
        if self.max_grad_norm is not None:
            self.optimizer.clip_grad_norm_(self.max_grad_norm)
        self.optimizer.step()

        self.running.sums += torch.stack([loss.detach(), q_taken.mean()])
        self.running.count += 1
        self.updates += 1
        return errors

    def _gradients(
        self, loss_fn: Callable[..., tuple[torch.Tensor, ...]], batch: BatchLike
    ) -> tuple[torch.Tensor, ...]:
        """``loss_fn(batch)`` (the loss, errors, Q taken) with the loss's gradients in the
        optimizer's flat buffer."""
        self.optimizer.zero_grad()
        loss, errors, q_taken = loss_fn(batch)
        loss.backward()
        return loss, errors, q_taken

    def _first_compiled(self, batch: BatchLike) -> tuple[torch.Tensor, ...]:
        """The first compiled loss and its backward (both compiled here), timed and
        announced; where compiling fails, the same loss eagerly (nothing has changed
        the networks yet: the step comes after)."""
        self._compiling = False
        start = time.perf_counter()
        try:
            out = self._gradients(self._loss, batch)
        except Exception as e:  # no C++ compiler, an unsupported platform or op
            self._loss, self.backend = self.loss, "torch"
            # The first line names the cause (InvalidCxxCompiler: No working C++ compiler
            # found ...); the rest is dynamo's advice on verbose logs.
            text = str(e).strip()
            reason = text.splitlines()[0][:200] if text else type(e).__name__
            self._announce(f"the update could not be compiled ({reason}): it runs eagerly "
                           "(--set learner_backend=torch skips the attempt)")  # fmt: skip
            return self._gradients(self.loss, batch)
        self._announce(f"compiled the update in {time.perf_counter() - start:.1f} s "
                       "(torch.compile)")  # fmt: skip
        return out

    def draw_update_noise(self) -> None:
        """Fresh noise for an update: the online network's (into buffers of its own),
        then the target's; independent draws, as in the NoisyNet paper."""
        self.update_noise_buffers.draw(scale=self.update_noise)
        for layer in self._target_noisy:
            layer.reset_noise(scale=self.update_noise)

    def sync_target(self) -> None:
        """Hard copy (tau = 1) or Polyak average of the online parameters into the target."""
        sync_parameters(self._target, self._online, self.tau)

    def metrics(self) -> Metrics | None:
        """Means since the last call (one host read), or None without updates.

        Raises :class:`NonFiniteError` if the loss or the Q values stopped being finite.
        """
        metrics = self.running.read()
        if metrics is not None and not math.isfinite(metrics.td_loss + metrics.q_values):
            raise NonFiniteError(
                f"non-finite TD loss ({metrics.td_loss}) or Q ({metrics.q_values})"
            )
        return metrics

    @torch.no_grad()
    def parameters_finite(self) -> bool:
        """True when every online parameter is finite (one host read; checkpoint time only)."""
        return bool(torch.stack([p.isfinite().all() for p in self._online]).all())

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])


class _NumpyUpdate:
    """:meth:`Learner.update` computed by numpy programs (:mod:`agent.numpy_backend`).

    The same steps in the same order as the autograd path: fresh noise for both
    networks (drawn by the layers themselves, so both paths see the same noise),
    the double-DQN target from the target network, the loss's gradient by hand, then
    the learner's own optimizer (clipping and Adam in PyTorch, on the same flat
    buffers that the gradients were written into).
    """

    def __init__(self, learner: Learner, online: NumpyProgram, target: NumpyProgram) -> None:
        self.learner = learner
        self.online = online
        self.target = target
        self._sums = learner.running.sums.numpy()  # the running metric sums, a view
        self._flat_grad = learner.optimizer.flat_grad.numpy()  # every gradient, a view

    @classmethod
    def build(cls, learner: Learner) -> _NumpyUpdate:
        """Compile both networks; raises as :meth:`NumpyProgram.build` does."""
        optimizer = learner.optimizer
        # The target first (same device and dtype as the online network): NotApplicable
        # off the CPU or in bfloat16, before the gradients are read as numpy arrays.
        target = NumpyProgram.build(learner.target_network)
        views = [g.detach().numpy() for g in optimizer.grads]
        sink = GradientSink(optimizer.params, views)
        noise = learner.update_noise_buffers.tensors
        online = NumpyProgram.build(learner.q_network, sink, noise)
        return cls(learner, online, target)

    def update(self, batch: BatchLike) -> torch.Tensor:
        # A diverging run gets NaN and inf here as in torch, silently: metrics() reports it.
        with np.errstate(all="ignore"):
            return self._update(batch)

    def _update(self, batch: BatchLike) -> torch.Tensor:
        learner = self.learner
        learner.draw_update_noise()  # the same draws as the autograd path
        obs, next_obs = batch.obs.numpy(), batch.next_obs.numpy()
        batch_size = len(obs)

        # One online forward over obs and next_obs together (the same noise for both, as
        # the autograd path); backward reads only obs's rows of it.
        out_both = self.online.forward(np.concatenate([obs, next_obs]), tape=True)  # (2B, A[, N])
        out, out_next_online = out_both[:batch_size], out_both[batch_size:]
        out_next_target = self.target.forward(next_obs)
        chooser = out_next_online if learner.double_dqn else out_next_target
        loss, grad_out, errors, q_taken = td_loss_numpy(
            learner.objective, out, chooser, out_next_target, batch
        )

        sink = self.online.sink
        sink.clear()
        self.online.backward(grad_out)  # each gradient it writes, written whole
        learner.optimizer.set_grads(sink.written)  # the rest zeroed; the step takes these
        if learner.max_grad_norm is not None:
            # clip_grad_norm_'s rule on the flat buffer, without its torch ops' fixed cost
            flat = self._flat_grad
            scale = learner.max_grad_norm / (np.sqrt(np.dot(flat, flat)) + 1e-6)
            if scale < 1.0:
                flat *= scale
        learner.optimizer.step()

        self._sums[0] += loss
        self._sums[1] += q_taken
        learner.running.count += 1
        learner.updates += 1
        return torch.from_numpy(errors.astype(out.dtype, copy=False))


class _Updater(Protocol):
    """What :class:`CapturedUpdate` captures: a :class:`Learner`, or the seeds' stacked
    :class:`~agent.seeds.SeedLearner`."""

    q_network: nn.Module
    target_network: nn.Module
    optimizer: Adam
    running: RunningMetrics
    updates: int

    def update(self, batch: BatchLike) -> torch.Tensor: ...


class CapturedUpdate:
    """``learner.update`` captured once and replayed for every batch (a CUDA graph on
    CUDA; ``capture`` is the acting path's seam, :mod:`agent.acting.graph`).

    Captured at the first call, with that batch's shapes: its tensors are copied into
    static buffers before every replay, and the host-side counters (updates, the
    metrics' count, the optimizer's step counts) advance as an eager update's would.
    Capture leaves no trace: its warm-up updates are undone (networks, optimizer,
    metrics and the random streams put back as they were), so a run takes the same
    steps as with eager updates. The target sync (an in-place copy) and
    ``load_state_dict`` (in place) are seen by the graph without re-capture.

    ``learner``: a :class:`Learner` or a :class:`~agent.seeds.SeedLearner` (the seeds'
    stacked update: batches ``(S, B, ...)``, errors ``(S, B)``). ``generators``: the CUDA
    generators its update draws from besides the default one (a seed group's own noise
    streams), registered with the graph so that each replay advances them as an eager
    update would: a checkpoint saves the states an eager run's would hold.
    """

    def __init__(
        self,
        learner: _Updater,
        capture: CaptureFn | None,
        generators: Sequence[torch.Generator] = (),
    ) -> None:
        self.learner, self.capture = learner, capture
        self.generators = list(generators)
        self.graph: Any = None
        self.static: Batch | None = None
        self._stepped: frozenset[int] = frozenset()

    def __call__(self, batch: Batch) -> torch.Tensor:
        """As :meth:`Learner.update`: the per-sample errors (the graph's static output,
        overwritten by the next replay: copy it, or use it before the next call)."""
        if self.graph is None and self.capture is not None:
            self._capture(batch)
        if self.graph is None:  # capture failed: eager updates, the same steps
            return self.learner.update(batch)
        assert self.static is not None
        for static, value in zip(self.static.learned, batch.learned, strict=True):
            static.copy_(value, non_blocking=True)
        learner = self.learner
        updates, count = learner.updates, learner.running.count
        steps, counts = learner.optimizer.host_counts
        self.graph.replay()
        # A graph replays device work only: the host's counts advance here, as one eager
        # update would advance them (the CPU stand-in, which re-runs Python, included).
        learner.updates, learner.running.count = updates + 1, count + 1
        learner.optimizer.set_host_counts(
            steps + 1, [c + (i in self._stepped) for i, c in enumerate(counts)]
        )
        return self.graph.output

    def _capture(self, batch: BatchLike) -> None:
        learner = self.learner
        fields = [torch.empty_like(t).copy_(t) for t in batch.learned]
        self.static = Batch(*fields[:6], None, fields[6] if len(fields) > 6 else None)
        saved = _learner_state(learner, self.generators)
        try:
            graph = self.capture(lambda _obs: learner.update(self.static),
                                 (self.static.obs,), generators=self.generators)  # fmt: skip
        except Exception as e:  # an op that cannot be captured: say so, and go on eagerly
            _restore_learner_state(learner, saved, self.generators)
            self.capture = None
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            warnings.warn(f"the learner update could not be captured as a CUDA graph "
                          f"({reason}); it runs eagerly (--set capture_graph=false to "
                          "skip the attempt)", RuntimeWarning, stacklevel=3)  # fmt: skip
            return
        # The capture's own update set which parameters get a gradient (frozen sigmas
        # of a noise-free update get none): each replay steps exactly those.
        self._stepped = frozenset(i for i, has in enumerate(learner.optimizer.has_grad) if has)
        _restore_learner_state(learner, saved, self.generators)
        self.graph = graph


def _learner_state(learner: _Updater, generators: Sequence[torch.Generator]) -> dict[str, Any]:
    """Everything an update changes, copied: networks, optimizer, metrics, RNG streams."""
    nets = [learner.q_network, learner.target_network]
    device = learner.running.sums.device
    return {
        "tensors": [t.detach().clone() for net in nets for t in (*net.parameters(),
                                                                  *net.buffers())],
        "optimizer": learner.optimizer.state_dict(),
        "sums": learner.running.sums.clone(),
        "counts": (learner.updates, learner.running.count),
        "cpu_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "generators": [g.get_state() for g in generators],
    }


@torch.no_grad()
def _restore_learner_state(
    learner: _Updater, saved: dict[str, Any], generators: Sequence[torch.Generator]
) -> None:
    """Put :func:`_learner_state` back, in place (a captured graph reads these addresses;
    a generator's state is set in place, so a graph it is registered with keeps it)."""
    nets = [learner.q_network, learner.target_network]
    live = [t for net in nets for t in (*net.parameters(), *net.buffers())]
    for tensor, value in zip(live, saved["tensors"], strict=True):
        tensor.copy_(value)
    learner.optimizer.load_state_dict(saved["optimizer"])
    learner.running.sums.copy_(saved["sums"])
    learner.updates, learner.running.count = saved["counts"]
    torch.set_rng_state(saved["cpu_rng"])
    if saved["cuda_rng"] is not None:
        torch.cuda.set_rng_state(saved["cuda_rng"], learner.running.sums.device)
    for generator, state in zip(generators, saved["generators"], strict=True):
        generator.set_state(state)
