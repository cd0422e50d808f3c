"""Adam for the learner's hot loop: one fused kernel per step, gradients in one flat buffer.

The update is ``torch.optim.Adam``'s (no weight decay, no amsgrad), computed by the
same fused kernel that ``torch.optim.Adam(fused=True)`` calls. What differs is the
cost around it, which is what a tiny network on a CPU pays for (``bench/learner.py``
measures it; the figures are in docs/research/log.md):

* ``torch.optim.Adam.step`` runs a long Python prologue before its kernel on every
  call, and its first call imports ``torch._dynamo`` (seconds of every run's start-up);
* ``clip_grad_norm_`` and ``zero_grad`` walk the parameters one by one; here every
  parameter's ``.grad`` is a view of one flat buffer (autograd accumulates into
  an existing ``.grad`` in place), so zeroing and clipping are one op each.

``torch._fused_adam_`` is a private op (PyTorch >= 2.4 has it for CPU and CUDA).
Where it is missing, or on other devices, the same update runs as a few plain
tensor ops on the flat buffers.

A parameter that received no gradient since :meth:`Adam.zero_grad` (frozen with
``requires_grad_(False)``, or not used by the loss, like the sigmas of a noisy layer
whose noise is off) is left alone, as ``torch.optim.Adam`` leaves a parameter whose
``.grad`` is ``None``: no update, no moment decay, no step count. A hook on each
parameter notes which ones autograd wrote to.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
from torch import nn

__all__ = ["Adam"]


class Adam:
    """Adam over a fixed list of parameters, with global-norm gradient clipping.

    Args:
        params: the parameters to train (all on one device, one dtype).
        lr: learning rate.
        betas: decay rates of the first and second moment estimates.
        eps: added to the denominator (``sqrt(v_hat) + eps``), as in ``torch.optim.Adam``.
        fused: use PyTorch's fused Adam kernel; ``None`` (default) does where it exists
            (CPU, CUDA, meta).
        rows: the parameters are stacked learners' (the seed axis of stacked networks,
            :mod:`agent.seeds`), this many along their first axis; None (default): one
            learner's. The kernel takes each parameter as ``rows`` blocks: a block then
            steps the same to the bit whatever the number of blocks, where a whole
            parameter's last elements would go through the kernel's scalar remainder
            loop, which rounds otherwise than its vector loop. Clipping is per row.

    Call :meth:`zero_grad` before ``backward``: it also re-attaches the flat
    gradient views, should anything have replaced a ``.grad``.
    """

    def __init__(
        self,
        params: Iterable[nn.Parameter],
        *,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        fused: bool | None = None,
        rows: int | None = None,
    ) -> None:
        self.params = list(params)
        self.rows = rows
        if not self.params:
            raise ValueError("Adam needs at least one parameter")
        first = self.params[0]
        if any(p.device != first.device or p.dtype != first.dtype for p in self.params):
            raise ValueError("Adam needs all parameters on one device with one dtype")
        if not (lr > 0 and eps >= 0 and 0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"invalid Adam settings: lr={lr}, betas={betas}, eps={eps}")
        self.lr, self.betas, self.eps = float(lr), (float(betas[0]), float(betas[1])), float(eps)
        if fused is None:
            fused = hasattr(torch, "_fused_adam_") and first.device.type in ("cpu", "cuda", "meta")
        self.fused = fused
        factory = {"device": first.device, "dtype": first.dtype}
        total = sum(p.numel() for p in self.params)
        self.flat_grad = torch.zeros(total, **factory)
        self.exp_avg = torch.zeros(total, **factory)
        self.exp_avg_sq = torch.zeros(total, **factory)
        self._grads = self._views(self.flat_grad)
        self._exp_avgs = self._views(self.exp_avg)
        self._exp_avg_sqs = self._views(self.exp_avg_sq)
        # The kernel reads one step count per parameter (float32, on the device) and
        # leaves incrementing them to the caller: one flat tensor, one add per step.
        self._steps = torch.zeros(len(self.params), device=first.device, dtype=torch.float32)
        self._step_list = list(self._steps.unbind())
        self._kernel_lists = self._blocks(range(len(self.params)))
        self._counts = [0] * len(self.params)  # the same step counts, on the host
        self.step_count = 0
        # Which parameters autograd wrote a gradient to since zero_grad (a Python list,
        # so checking it never waits for the device).
        self._has_grad = [False] * len(self.params)
        flags = self._has_grad
        for i, p in enumerate(self.params):
            if p.requires_grad:  # (a frozen parameter takes no hook; it gets no gradient)
                p.register_post_accumulate_grad_hook(lambda _, i=i: flags.__setitem__(i, True))
        self.zero_grad()

    def _views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        views, offset = [], 0
        for p in self.params:
            views.append(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        return views

    @property
    def grads(self) -> list[torch.Tensor]:
        """Each parameter's gradient: views of the one flat buffer, in ``params`` order."""
        return self._grads

    @property
    def has_grad(self) -> list[bool]:
        """Which parameters received a gradient since :meth:`zero_grad` (a copy).

        Autograd's hooks record these; code that writes into :attr:`grads` without
        autograd (the learner's numpy path) says so with :meth:`set_grads`, or the
        step skips those parameters.
        """
        return list(self._has_grad)

    def zero_grad(self) -> None:
        """Zero the flat gradient buffer (one op) and point every ``.grad`` at its view."""
        self.flat_grad.zero_()
        for i, (p, g) in enumerate(zip(self.params, self._grads, strict=True)):
            self._has_grad[i] = False
            if p.grad is not g:
                p.grad = g

    def set_grads(self, written: Sequence[bool]) -> None:
        """Take gradients written into :attr:`grads` without autograd, in place of
        :meth:`zero_grad` before them: the parameters marked ``written`` have theirs
        (each buffer overwritten whole), the others are zeroed, and the step takes the
        former. Saves zeroing the whole buffer only to overwrite most of it."""
        for i, was in enumerate(written):
            self._has_grad[i] = bool(was)
            if not was:
                self._grads[i].zero_()

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Scale the gradients so that their global L2 norm is at most ``max_norm``.

        The same rule as ``torch.nn.utils.clip_grad_norm_``; returns the norm before
        clipping, as a tensor on the device (no host read). With ``rows``, each row (one
        stacked learner's parameters) is clipped by its own norm, ``(rows,)`` returned.
        """
        if self.rows is not None:
            return self._clip_by_row(max_norm)
        norm = torch.linalg.vector_norm(self.flat_grad)
        self.flat_grad.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))
        return norm

    def _clip_by_row(self, max_norm: float) -> torch.Tensor:
        rows = self.rows
        assert rows is not None
        per_param = [torch.linalg.vector_norm(g.reshape(rows, -1), dim=1) for g in self._grads]
        # Each row's norm over its own parameters (rows, P): a reduction along the
        # parameters axis of (P, rows) would sum in an order that depends on rows.
        norms = torch.linalg.vector_norm(torch.stack(per_param, dim=1), dim=1)  # (rows,)
        scale = torch.clamp(max_norm / (norms + 1e-6), max=1.0)
        for g in self._grads:
            g.mul_(scale.view(-1, *([1] * (g.dim() - 1))))
        return norms

    @torch.no_grad()
    def step(self) -> None:
        """One Adam update of every parameter that received a gradient since zero_grad."""
        self.step_count += 1
        if all(self._has_grad):  # the hot path: every parameter, flat buffers, one kernel
            every = range(len(self.params))
            if not self.fused:
                self._step_unfused(every)
                return
            self._steps.add_(1.0)
            for i in every:
                self._counts[i] += 1
            self._fused(*self._kernel_lists)
            return
        stepped = [i for i, has in enumerate(self._has_grad) if has]
        if not stepped:
            return
        if not self.fused:
            self._step_unfused(stepped)
            return
        for i in stepped:
            self._step_list[i].add_(1.0)
            self._counts[i] += 1
        self._fused(*self._blocks(stepped))

    def _blocks(
        self, which: Iterable[int]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], list[torch.Tensor],
               list[torch.Tensor]]:  # fmt: skip
        """The kernel's five lists for the parameters ``which``, each cut into ``rows``
        blocks (the same step count for every block of a parameter)."""
        lists: tuple[list[torch.Tensor], ...] = ([], [], [], [], [])
        tensors = (self.params, self._grads, self._exp_avgs, self._exp_avg_sqs)
        for i in which:
            split = self.rows is not None and self.rows > 1
            for r in range(self.rows if split else 1):
                for out, source in zip(lists, tensors, strict=False):
                    out.append(source[i][r] if split else source[i])
                lists[4].append(self._step_list[i])
        return lists  # type: ignore[return-value]

    def _fused(self, params, grads, exp_avgs, exp_avg_sqs, steps) -> None:  # type: ignore[no-untyped-def]
        torch._fused_adam_(
            params,
            grads,
            exp_avgs,
            exp_avg_sqs,
            [],  # max_exp_avg_sqs: amsgrad only
            steps,
            lr=self.lr,
            beta1=self.betas[0],
            beta2=self.betas[1],
            weight_decay=0.0,
            eps=self.eps,
            amsgrad=False,
            maximize=False,
        )

    def _step_unfused(self, stepped: Iterable[int]) -> None:
        """The same update as the kernel, as plain ops, for the parameters ``stepped``."""
        beta1, beta2 = self.betas
        for i in stepped:
            self._counts[i] += 1
            self._steps[i] += 1.0
            p, grad = self.params[i], self._grads[i]
            exp_avg, exp_avg_sq = self._exp_avgs[i], self._exp_avg_sqs[i]
            exp_avg.lerp_(grad, 1.0 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
            bias_correction1 = 1.0 - beta1 ** self._counts[i]
            bias_correction2 = 1.0 - beta2 ** self._counts[i]
            denom = (exp_avg_sq.sqrt() / math.sqrt(bias_correction2)).add_(self.eps)
            p.addcdiv_(exp_avg, denom, value=-self.lr / bias_correction1)

    @property
    def device_counts(self) -> torch.Tensor:
        """Each parameter's step count where the kernel reads it (float32, on the
        parameters' device): what steps in a replayed CUDA graph advance."""
        return self._steps

    @property
    def host_counts(self) -> tuple[int, list[int]]:
        """(steps taken, each parameter's steps): the host's copy of the step counts."""
        return self.step_count, list(self._counts)

    def set_host_counts(self, step_count: int, counts: list[int]) -> None:
        """Set the host's step counts, as after steps that ran in a replayed CUDA graph
        (whose device counts advanced there, with no Python running)."""
        self.step_count, self._counts = step_count, list(counts)

    def state_dict(self) -> dict:
        """Tensors and plain numbers only (checkpoints load with ``weights_only=True``)."""
        return {
            "step": self.step_count,
            "steps": torch.tensor(self._counts, dtype=torch.int64),  # per parameter
            "exp_avg": self.exp_avg.clone(),
            "exp_avg_sq": self.exp_avg_sq.clone(),
            "lr": self.lr,
            "betas": list(self.betas),
            "eps": self.eps,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore the moments and the step count (hyperparameters stay as constructed)."""
        for name in ("exp_avg", "exp_avg_sq"):
            saved = state[name]
            if saved.shape != (self.flat_grad.numel(),):
                raise ValueError(
                    f"optimizer state has {saved.numel()} values per moment, "
                    f"this network has {self.flat_grad.numel()} parameters"
                )
            getattr(self, name).copy_(saved)
        self.step_count = int(state["step"])
        counts = state["steps"]
        if len(counts) != len(self.params):
            raise ValueError(
                f"optimizer state covers {len(counts)} parameters, "
                f"this network has {len(self.params)}"
            )
        self._counts = [int(c) for c in counts.tolist()]
        self._steps.copy_(torch.tensor(self._counts, dtype=torch.float32))

