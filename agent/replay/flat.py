"""Replay buffer: preallocated ring storage, n-step returns, pinned host-to-device staging.

The learner's only source of data. One :class:`ReplayBuffer` serves every device:

* ``device == storage_device`` (CPU training, or a GPU-resident buffer): indices are
  drawn where the storage lives and the batch is gathered there; nothing is copied
  between devices.
* ``storage_device="cpu"`` with a CUDA ``device``: the batch is gathered on the host
  with ``index_select(..., out=...)`` into one of two *pinned staging* slots that are
  allocated (and pinned) once, then copied to the GPU with ``non_blocking=True`` on a
  side stream, so that the copy overlaps with the learner's kernels on the compute
  stream. A slot is refilled only after the CUDA event recorded behind its last copy
  has completed, so a copy still in flight is never overwritten. No per-batch
  ``.pin_memory()``.

n-step returns are accumulated at ``add`` time, per env, in a window of the last
``n_step`` steps (host-side numpy, :mod:`agent.replay.nstep`, shared with frame replay). A
window that holds ``n_step`` steps emits its oldest transition; an episode end
(terminated *or* truncated) flushes every pending window of that env, each with its
own shorter length ``k``. The ring therefore holds
finished transitions only, and ``sample`` is a plain gather:

    target = rewards + discounts * (1 - dones) * Q_target(next_obs)

with ``rewards`` the discounted k-step return, ``discounts = gamma**k``, and
``dones = 1`` only when the episode *terminated* within those k steps (a time-limit
truncation still bootstraps from the final observation).

Dtypes: integer observations (uint8 Atari frames) are stored and returned in their
own dtype; the network converts and scales them on its device, which keeps host
memory and host-to-device traffic 4x smaller than float32. Float observations are
stored and returned in ``float_dtype`` (float32 by default, float64 for a float64
network), as are rewards, dones and discounts; actions are int64.

Assumed use (see docs/design.md): one ``add`` per step of a gymnasium vector env whose
every step is real and whose ``next_obs`` is the true final observation at an
episode end: ``AutoresetMode.DISABLED`` (what ``agent/train.py`` uses) or
``SAME_STEP`` with ``final_obs`` substituted, never raw ``NEXT_STEP`` output.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from agent.replay.nstep import NStepWindows
from agent.replay.prioritized import PrioritizedSampler, load_priorities, priorities_state
from agent.replay.base import (
    Batch,
    PinnedSlots,
    PinnedTransfer,
    check_arguments,
    check_config_state,
    check_explored,
    check_sample_size,
    check_step,
    config_state,
    delivered,
    is_cuda,
    normalize_device,
    numpy_dtype,
    torch_dtype,
)

__all__ = ["Batch", "ReplayBuffer"]


class ReplayBuffer:
    """Uniform experience replay with n-step returns for a vector env.

    Args:
        capacity: transitions kept, over all envs together (the oldest are overwritten).
        obs_shape: shape of one observation (without the env dimension).
        obs_dtype: dtype of the observations ``add`` receives (numpy or torch dtype).
        device: where sampled batches are returned (the learner's device).
        storage_device: where the ring lives; ``"cpu"`` (default) or ``device`` itself
            for a GPU-resident buffer.
        n_step: steps per return (1 = plain one-step DQN).
        gamma: discount factor in (0, 1].
        num_envs: envs of the vector env; every ``add`` carries one step of each.
        float_dtype: dtype of rewards, dones, discounts and float observations
            (float16, float32 or float64).
        alpha: None for uniform sampling; else sample by priority with this exponent
            (:mod:`agent.replay.prioritized`; Rainbow's is 0.5).
        priority_eps: added to every ``|error|`` that sets a priority.

    Attributes:
        obs_dtype: the torch dtype observations are stored and returned in: the input
            dtype for integer observations, ``float_dtype`` for float ones.
        device, storage_device: normalised ``torch.device`` objects.

    ``add`` takes host data (what a gymnasium vector env returns, numpy or CPU
    tensors); a tensor on another device is copied to the host first. The n-step
    windows always live on the host, whatever ``storage_device`` is.
    """

    def __init__(
        self,
        capacity: int,
        obs_shape: tuple[int, ...] | list[int],
        obs_dtype: np.dtype | type | torch.dtype,
        *,
        device: torch.device | str,
        storage_device: torch.device | str = "cpu",
        n_step: int = 1,
        gamma: float = 0.99,
        num_envs: int = 1,
        float_dtype: torch.dtype = torch.float32,
        alpha: float | None = None,
        priority_eps: float = 1e-6,
    ) -> None:
        obs_shape = check_arguments(capacity, obs_shape, n_step, gamma, num_envs, float_dtype)
        self.priorities = (
            None if alpha is None else PrioritizedSampler(capacity, alpha, priority_eps)
        )

        self.capacity = capacity
        self.obs_shape = obs_shape
        self.n_step = n_step
        self.gamma = float(gamma)
        self.num_envs = num_envs
        self.float_dtype = float_dtype
        self.device = normalize_device(device)
        self.storage_device = normalize_device(storage_device)

        # The dtype add() accepts, and the dtype observations are stored in: float
        # observations go straight to float_dtype so that sample() never casts.
        self._obs_in_dtype = numpy_dtype(obs_dtype, "obs_dtype")
        if np.issubdtype(self._obs_in_dtype, np.floating):
            self.obs_dtype = float_dtype
        else:
            self.obs_dtype = torch_dtype(self._obs_in_dtype)
        self._obs_in_shape = (num_envs, *obs_shape)
        np_obs = numpy_dtype(self.obs_dtype, "obs_dtype")

        # Ring storage, allocated once. Field order = Batch order. torch.empty: pages of
        # a CPU buffer are only touched (committed) as the ring fills.
        on = {"device": self.storage_device}
        self._fields: tuple[torch.Tensor, ...] = (
            torch.empty((capacity, *obs_shape), dtype=self.obs_dtype, **on),  # obs
            torch.empty(capacity, dtype=torch.int64, **on),  # actions
            torch.empty(capacity, dtype=float_dtype, **on),  # rewards (k-step return)
            torch.empty((capacity, *obs_shape), dtype=self.obs_dtype, **on),  # next_obs
            torch.empty(capacity, dtype=float_dtype, **on),  # dones
            torch.empty(capacity, dtype=float_dtype, **on),  # discounts
        )
        self._pos = 0  # next ring slot to write
        self._size = 0  # finished transitions stored

        # Host-side writes: straight into the storage through numpy views on CPU; into
        # pinned staging rows (then one non-blocking copy per field) for GPU storage.
        self._write_slots: PinnedSlots | None = None
        if self.storage_device.type == "cpu":
            self._host: tuple[np.ndarray, ...] | None = tuple(t.numpy() for t in self._fields)
        elif is_cuda(self.storage_device):
            self._host = None
            max_rows = num_envs * n_step  # the most transitions one add() can finish
            self._write_slots = PinnedSlots(
                [((max_rows, *t.shape[1:]), t.dtype) for t in self._fields]
            )
            self._staged = 0  # rows staged by the add() in progress
            self._stage_slot = 0
        else:
            raise ValueError(
                f"storage_device must be 'cpu' or a CUDA device, got {self.storage_device}"
            )

        # Sampling path. Pinned staging only for a CPU ring feeding a CUDA learner.
        self._pinned = self.storage_device.type == "cpu" and is_cuda(self.device)
        self._moves = not self._pinned and self.storage_device != self.device
        self.transfer = PinnedTransfer(self.device) if self._pinned else None
        """Sampled batches' way to the GPU, for a ring in host memory (else None)."""
        self._draw_slots: PinnedSlots | None = None  # a prioritized draw to a GPU ring

        # n-step windows, one per env (host side), emitting finished transitions here.
        self._windows = NStepWindows(num_envs, n_step, self.gamma, obs_shape, np_obs, self._emit)

    # ------------------------------------------------------------------ info
    def __len__(self) -> int:
        return self._size

    @property
    def prioritized(self) -> bool:
        return self.priorities is not None

    @property
    def generator_device(self) -> torch.device:
        """Where ``sample``'s generator lives: the host for priorities (the sum tree is
        numpy), else the storage device (indices are drawn where the ring is)."""
        return torch.device("cpu") if self.prioritized else self.storage_device

    @property
    def pinned(self) -> bool:
        """True when batches travel host -> GPU through pinned staging slots."""
        return self._pinned

    @staticmethod
    def storage_bytes(
        capacity: int, obs_shape: tuple[int, ...], obs_dtype: np.dtype, float_dtype: torch.dtype
    ) -> int:
        """Bytes of ring storage a buffer of this configuration allocates."""
        obs_item = (
            torch.empty((), dtype=float_dtype).element_size()
            if np.issubdtype(obs_dtype, np.floating)
            else np.dtype(obs_dtype).itemsize
        )
        float_item = torch.empty((), dtype=float_dtype).element_size()
        per = 2 * int(np.prod(obs_shape)) * obs_item + 8 + 3 * float_item
        return capacity * per

    @property
    def bytes_per_transition(self) -> int:
        """Bytes of ring storage per stored transition (n-step windows not counted)."""
        return sum(t[0].numel() * t.element_size() for t in self._fields)

    def __repr__(self) -> str:
        return (
            f"ReplayBuffer(size={self._size}/{self.capacity}, obs_shape={self.obs_shape}, "
            f"obs_dtype={self.obs_dtype}, n_step={self.n_step}, gamma={self.gamma}, "
            f"num_envs={self.num_envs}, device={self.device}, "
            f"storage_device={self.storage_device}, float_dtype={self.float_dtype})"
        )

    # ------------------------------------------------------------------ add
    def add(
        self,
        obs: np.ndarray | torch.Tensor,
        actions: np.ndarray | torch.Tensor,
        rewards: np.ndarray | torch.Tensor,
        next_obs: np.ndarray | torch.Tensor,
        terminated: np.ndarray | torch.Tensor,
        truncated: np.ndarray | torch.Tensor,
        explored: np.ndarray | None = None,
    ) -> None:
        """Store one step of every env (arrays with a leading ``num_envs`` dimension).

        ``next_obs`` is the true next observation: the final one where an episode
        ended. ``terminated`` stops bootstrapping; ``truncated`` (a time limit) ends
        the n-step windows but still bootstraps from ``next_obs``. ``explored`` (E,)
        bool marks envs whose action this step was a random one, not the policy's: the
        n-step returns of their earlier steps end before it and bootstrap from ``obs``,
        so that no return carries the consequences of an action the policy would not
        take (Watkins's Q(lambda) cuts its traces at exploratory actions the same way).
        """
        obs, actions, rewards, next_obs, terminated, truncated = check_step(
            (obs, actions, rewards, next_obs, terminated, truncated),
            self._obs_in_shape,
            self._obs_in_dtype,
            self.num_envs,
        )
        explored = check_explored(explored, self.num_envs)
        if terminated.dtype != np.bool_:
            terminated = terminated != 0
        if truncated.dtype != np.bool_:
            truncated = truncated != 0

        if self._write_slots is not None:  # GPU storage: stage rows, copy once at the end
            self._stage_slot = self._write_slots.acquire()
            self._staged = 0
        self._windows.push(obs, actions, rewards, next_obs, terminated, truncated, explored)
        if self._write_slots is not None:
            self._commit_staged()

    def _emit(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        next_obs: np.ndarray,
        dones: np.ndarray | bool,
        discounts: np.ndarray | float,
    ) -> None:
        """Write m finished transitions (numpy, or scalars that broadcast) to the ring."""
        m = len(actions)
        values = (obs, actions, rewards, next_obs, dones, discounts)
        if self._write_slots is not None:
            # GPU storage: stage now, copy to the ring in _commit_staged.
            rows = slice(self._staged, self._staged + m)
            for dst, src in zip(self._write_slots.arrays[self._stage_slot], values, strict=True):
                dst[rows] = src
            self._staged += m
            return
        host = self._host
        assert host is not None
        pos = self._pos
        if pos + m <= self.capacity:  # the common case: one contiguous block
            rows = slice(pos, pos + m)
            host[0][rows] = obs
            host[1][rows] = actions
            host[2][rows] = rewards
            host[3][rows] = next_obs
            host[4][rows] = dones
            host[5][rows] = discounts
        else:
            for ring_rows, src_rows in self._ring_blocks(m):
                for dst, src in zip(host, values, strict=True):
                    dst[ring_rows] = src if np.ndim(src) == 0 else src[src_rows]
        self._advance(m)

    def _ring_blocks(self, m: int) -> list[tuple[slice, slice]]:
        """(ring rows, source rows) blocks for writing m rows at the ring position.

        Wraps around the end; of more than ``capacity`` rows only the last
        ``capacity`` are kept (the earlier ones would be overwritten anyway).
        """
        cap = self.capacity
        skip = max(0, m - cap)
        pos = (self._pos + skip) % cap
        first = min(m - skip, cap - pos)
        blocks = [(slice(pos, pos + first), slice(skip, skip + first))]
        if skip + first < m:
            rest = m - skip - first
            blocks.append((slice(0, rest), slice(skip + first, m)))
        return blocks

    def _advance(self, m: int) -> None:
        if self.priorities is not None:
            kept = min(m, self.capacity)
            self.priorities.store((self._pos + (m - kept) + np.arange(kept)) % self.capacity)
        self._pos = (self._pos + m) % self.capacity
        self._size = min(self._size + m, self.capacity)

    def _commit_staged(self) -> None:
        """GPU storage: copy the rows staged by this add() into the ring, non-blocking.

        The copies run on the current stream, so they are ordered with the gathers of
        later samples on that stream; the slot's event keeps its pinned rows intact
        until the copies have read them.
        """
        slots = self._write_slots
        assert slots is not None
        m = self._staged
        if m == 0:
            return
        staged = slots.tensors[self._stage_slot]
        for ring_rows, src_rows in self._ring_blocks(m):
            for dst, src in zip(self._fields, staged, strict=True):
                dst[ring_rows].copy_(src[src_rows], non_blocking=True)
        slots.release(self._stage_slot, torch.cuda.current_stream(self.storage_device))
        self._advance(m)

    # ------------------------------------------------------------------ sample
    def sample(
        self, batch_size: int, generator: torch.Generator | None = None, beta: float = 1.0
    ) -> Batch:
        """``batch_size`` transitions drawn with replacement, on ``device``.

        Uniformly: indices from ``torch.randint`` on the storage device, so
        ``generator`` (if given) must live there. By priority (``alpha``): from the sum
        tree, with a CPU ``generator``, and importance weights of exponent ``beta``. The
        same generator state gives the same batch.
        """
        size = self._size
        check_sample_size(batch_size, size)
        if self.priorities is not None:
            slots, weights = self.priorities.sample(batch_size, generator, beta)
            idx = torch.from_numpy(slots)
            w = torch.from_numpy(weights.astype(numpy_dtype(self.float_dtype, "weights")))
            return self._gather(*self._to_storage(idx, w))._replace(indices=idx)
        idx = torch.randint(
            0, size, (batch_size,), generator=generator, device=self.storage_device
        )  # (B,) int64
        return self._gather(idx)

    def _to_storage(
        self, idx: torch.Tensor, weights: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A prioritized draw's slots and weights (host) where the ring is: for a ring in
        GPU memory, through pinned staging (allocated once per batch size) and a
        non-blocking copy, so that the host does not wait for the device's queue."""
        if not is_cuda(self.storage_device):
            return idx, weights
        staging = self._draw_slots
        specs = [((len(idx),), torch.int64), ((len(idx),), self.float_dtype)]
        if staging is None or [(tuple(t.shape), t.dtype) for t in staging.tensors[0]] != specs:
            if staging is not None:
                staging.wait_all()
            self._draw_slots = staging = PinnedSlots(specs)
        slot = staging.acquire()
        staging.tensors[slot][0].copy_(idx)
        staging.tensors[slot][1].copy_(weights)
        moved = [t.to(self.storage_device, non_blocking=True) for t in staging.tensors[slot]]
        staging.release(slot, torch.cuda.current_stream(self.storage_device))
        return moved[0], moved[1]

    def update_priorities(self, indices: torch.Tensor, errors: torch.Tensor) -> None:
        """Priorities ``|errors| + eps`` for the slots ``indices`` of a sampled batch
        (a no-op for uniform sampling)."""
        if self.priorities is not None:
            self.priorities.update(indices, errors)

    def gather(self, indices: torch.Tensor) -> Batch:
        """The batch at ring ``indices`` (int64, values in [0, len(self))), on ``device``.

        ``sample`` is ``gather(torch.randint(...))``; this entry point lets a caller
        (a test) choose the indices itself.
        """
        return self._gather(indices.to(self.storage_device))

    def _gather(self, idx: torch.Tensor, weights: torch.Tensor | None = None) -> Batch:
        """Gather at ``idx`` (on the storage device) and deliver to ``device``, with the
        importance ``weights`` (host) of a prioritized draw."""
        if self._pinned:
            return self._gather_pinned(idx, weights)
        f = self._fields
        batch = Batch(
            f[0].index_select(0, idx),
            f[1].index_select(0, idx),
            f[2].index_select(0, idx),
            f[3].index_select(0, idx),
            f[4].index_select(0, idx),
            f[5].index_select(0, idx),
            idx,
            None if weights is None else weights.to(self.storage_device),
        )
        # Only unusual pairings move here (e.g. GPU ring, CPU learner).
        return delivered(batch, self.device) if self._moves else batch

    def _gather_pinned(self, idx: torch.Tensor, weights: torch.Tensor | None) -> Batch:
        """CPU ring -> pinned staging -> GPU (:class:`PinnedTransfer`)."""
        specs = [((idx.shape[0], *t.shape[1:]), t.dtype) for t in self._fields]
        if weights is not None:
            specs.append(((idx.shape[0],), self.float_dtype))

        def fill(staged: tuple[torch.Tensor, ...]) -> None:
            for src, dst in zip(self._fields, staged, strict=False):
                torch.index_select(src, 0, idx, out=dst)  # host gather into pinned memory
            if weights is not None:
                staged[6].copy_(weights)

        assert self.transfer is not None
        out = self.transfer(specs, fill)
        return Batch(*out[:6], idx, out[6] if weights is not None else None)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly: plain tensors and numbers only.

        Loadable with ``torch.load(..., weights_only=True)``. Includes the partially
        filled n-step windows of every env. When the ring is full, its tensors share
        memory with the buffer (like ``nn.Module.state_dict``): save before the next add.
        """
        if self._write_slots is not None:
            self._write_slots.wait_all()  # nothing pending into the GPU ring
        size = self._size
        names = ("obs", "actions", "rewards", "next_obs", "dones", "discounts")
        ring = {
            name: (t if size == self.capacity else t[:size].clone())
            for name, t in zip(names, self._fields, strict=True)
        }
        return {
            **config_state(self),
            "pos": self._pos,
            "size": size,
            **ring,
            **self._windows.state_dict(),
            **priorities_state(self.priorities),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` from a buffer with the same configuration."""
        check_config_state(self, state)
        size = int(state["size"])
        if not 0 <= size <= self.capacity:
            raise ValueError(f"replay state_dict: size {size} outside [0, {self.capacity}]")
        names = ("obs", "actions", "rewards", "next_obs", "dones", "discounts")
        for name, t in zip(names, self._fields, strict=True):
            src = state[name]
            if src.dtype != t.dtype or tuple(src.shape[1:]) != tuple(t.shape[1:]):
                raise ValueError(
                    f"replay state_dict: {name} is {src.dtype} {tuple(src.shape)}, "
                    f"expected {t.dtype} (N, {', '.join(map(str, t.shape[1:]))})"
                )
            if src.shape[0] < size:
                raise ValueError(f"replay state_dict: {name} has {src.shape[0]} rows < {size}")
        self._windows.check_state(state)
        load_priorities(self.priorities, state)
        if self._write_slots is not None:
            self._write_slots.wait_all()
        for name, t in zip(names, self._fields, strict=True):
            t[:size].copy_(state[name][:size])
        self._windows.load_state_dict(state)
        self._pos = int(state["pos"]) % self.capacity
        self._size = size
