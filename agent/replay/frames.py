"""Replay for stacked image observations: every frame stored once, stacks rebuilt at sample time.

An Atari observation is a stack of the last ``C`` frames (``(4, 84, 84)`` uint8), and
consecutive observations share ``C - 1`` of them. :class:`ReplayBuffer` stores ``obs``
and ``next_obs`` whole: ``2 * 4 * 84 * 84`` bytes (~56 KB) per transition, 56 GB for
the paper's 1M transitions. :class:`FrameReplayBuffer` stores each frame once
(~7 KB per transition, ~7.1 GB for 1M) and rebuilds both stacks from frame indices
when a batch is sampled. Same interface as :class:`ReplayBuffer`: ``add`` / ``sample``
/ ``__len__`` / ``state_dict`` / ``load_state_dict``, :class:`~agent.replay.base.Batch`,
n-step returns, ``num_envs``, and for a CUDA learner either pinned staging slots (the
frames on the host) or the frames themselves in GPU memory (``storage_device``).

Layout. Each sub-environment ``e`` owns a ring of ``S = ceil(capacity / num_envs)``
frame slots; frames are written in order and numbered by a per-env counter (slot =
counter % S). A transition lives in the slot of the newest frame of its ``obs``, and
holds the flat frame indices of its ``obs`` and ``next_obs`` stacks (computed when the
frames were written), plus action, k-step return, done and discount.

Exactness does not depend on how the env builds its stacks. On every ``add`` the
buffer checks, per env:

* ``obs`` equals the previous ``next_obs`` (the episode goes on) -> reuse its frames;
  otherwise (a reset) it starts a new *segment*: one frame when the stack is the reset
  frame repeated (gymnasium's ``FrameStackObservation`` with ``padding_type="reset"``),
  all ``C`` frames otherwise;
* ``next_obs[:-1] == obs[1:]`` (the stack slid by one frame) -> write one frame;
  otherwise a new segment as above.

A stack is the last ``C`` frames of its segment, with indices before the segment's
first frame clamped to it. So a rebuilt stack is always byte-equal to what the env
returned, across episode boundaries, life losses (terminal for the replay, but the
game and the stack go on) and ring wrap-around, and an env that is not a frame stack
at all still works (at ``C`` frames per step).

Overwriting: writing frame ``w`` of env ``e`` overwrites frame ``w - S``, the oldest
frame of the transition whose ``obs`` ends at frame ``w - S + C - 1``, so that
transition (in slot ``(w + C - 1) % S``) is dropped; transitions are valid only while
all their frames are live. Slots without a transition (the final frame of an episode,
a segment's padding frames, windows still pending) are never sampled: ``sample``
draws slots uniformly and redraws the few that hold no transition, which keeps the
draw uniform over stored transitions. ``capacity`` therefore counts frame slots:
``len(buffer)`` stays slightly below it (by one slot per episode in the ring).

n-step returns come from the windows both buffers share (:mod:`agent.replay.nstep`), over
the stacks' frame indices: emitted when full, flushed at an episode end (terminated or
truncated) with shorter lengths; ``dones`` is 1 only for termination.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from agent.replay.nstep import NStepWindows
from agent.replay.prioritized import PrioritizedSampler, load_priorities, priorities_state
from agent.replay.base import (
    Batch,
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

__all__ = ["FrameReplayBuffer"]

# Rejection rounds in sample() before falling back to an exact draw over stored slots.
_MAX_REDRAWS = 32


def _frame_slots(capacity: int, frames: int, n_step: int, num_envs: int) -> int:
    """Frame slots per env for ``capacity`` transitions of ``frames``-frame stacks
    (ValueError where too few)."""
    slots = math.ceil(capacity / num_envs)
    # A pending window's frames must outlive it: at most 2C frames are written per step
    # (two new segments), and a window is at most n_step steps old.
    min_slots = 2 * frames * (n_step + 1) + 2
    if slots < min_slots:
        raise ValueError(
            f"capacity {capacity} gives {slots} frame slots per env; a FrameReplayBuffer "
            f"with {frames}-frame stacks and n_step={n_step} needs at least {min_slots} per "
            f"env (capacity >= {min_slots * num_envs})"
        )
    return slots


class FrameReplayBuffer:
    """Uniform replay for ``(C, H, W)`` integer frame stacks, one stored frame per step.

    Args:
        capacity: frame slots over all envs together (``ceil(capacity / num_envs)`` per
            env); about as many transitions are kept.
        obs_shape: ``(C, H, W)``: C stacked frames of H x W.
        obs_dtype: the integer dtype of the observations (uint8 for Atari).
        device: where sampled batches are returned (the learner's device).
        storage_device: where the frames live: ``"cpu"`` (a CUDA ``device`` then gets
            pinned staging), or ``device`` itself (a GPU: each frame is copied over as it
            is stored, and a batch's frames are gathered there). Indices, scalars and
            priorities stay on the host either way.
        n_step, gamma, num_envs, float_dtype, alpha, priority_eps: as for
            :class:`~agent.replay.flat.ReplayBuffer` (priorities are kept per slot).
    """

    def __init__(
        self,
        capacity: int,
        obs_shape: tuple[int, ...] | list[int],
        obs_dtype: np.dtype | type | torch.dtype = np.uint8,
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
        if len(obs_shape) != 3:
            raise ValueError(f"obs_shape must be (C, H, W) with positive sizes, got {obs_shape}")
        self._obs_in_dtype = numpy_dtype(obs_dtype, "obs_dtype")
        if not np.issubdtype(self._obs_in_dtype, np.integer):
            raise ValueError(
                f"FrameReplayBuffer stores integer frames (uint8), got {self._obs_in_dtype}"
            )
        self.device = normalize_device(device)
        self.storage_device = normalize_device(storage_device)
        host = torch.device("cpu")
        on_gpu = self.storage_device == self.device and is_cuda(self.device)
        if self.storage_device != host and not on_gpu:
            raise ValueError(
                f"FrameReplayBuffer keeps its frames on the host or on the learner's CUDA "
                f"device ({self.device}), got storage_device {self.storage_device}"
            )
        c, h, w = obs_shape
        slots = _frame_slots(capacity, c, n_step, num_envs)

        self.capacity = capacity
        self.obs_shape = obs_shape
        self.n_step = n_step
        self.gamma = float(gamma)
        self.num_envs = num_envs
        self.float_dtype = float_dtype
        self.obs_dtype = torch_dtype(self._obs_in_dtype)
        self.slots_per_env = slots
        self._obs_in_shape = (num_envs, *obs_shape)

        total = num_envs * slots
        # Frames, and per slot the transition whose obs ends at that slot's frame.
        # torch.empty: pages are only committed as the ring fills.
        self._frames = torch.empty((total, h, w), dtype=self.obs_dtype, device=self.storage_device)
        self._obs_idx = torch.zeros((total, c), dtype=torch.int64)  # flat frame indices
        self._next_idx = torch.zeros((total, c), dtype=torch.int64)
        self._actions = torch.zeros(total, dtype=torch.int64)
        self._rewards = torch.zeros(total, dtype=float_dtype)
        self._dones = torch.zeros(total, dtype=float_dtype)
        self._discounts = torch.zeros(total, dtype=float_dtype)
        self._valid_t = torch.zeros(total, dtype=torch.bool)
        self._tensors = {
            "frames": self._frames,
            "obs_idx": self._obs_idx,
            "next_idx": self._next_idx,
            "actions": self._actions,
            "rewards": self._rewards,
            "dones": self._dones,
            "discounts": self._discounts,
            "valid": self._valid_t,
        }
        # numpy views for host-side writes (frames on a GPU are copied there one by one)
        self._frames_np = self._frames.numpy() if self.storage_device == host else None
        self._obs_idx_np = self._obs_idx.numpy()
        self._next_idx_np = self._next_idx.numpy()
        self._actions_np = self._actions.numpy()
        self._rewards_np = self._rewards.numpy()
        self._dones_np = self._dones.numpy()
        self._discounts_np = self._discounts.numpy()
        self._valid = self._valid_t.numpy()
        self._size = 0  # valid transitions
        self.priorities = None if alpha is None else PrioritizedSampler(total, alpha, priority_eps)
        self._dropped: list[int] = []  # slots whose transitions this add() overwrote

        # Per-env frame streams.
        self._count = np.zeros(num_envs, dtype=np.int64)  # frames written
        self._seg_start = np.zeros(num_envs, dtype=np.int64)  # counter of the segment start
        self._cur_stack = np.zeros((num_envs, c), dtype=np.int64)  # stack of the last next_obs
        self._last_obs = np.zeros((num_envs, *obs_shape), dtype=self._obs_in_dtype)
        self._has_last = np.zeros(num_envs, dtype=bool)
        self._stack_offsets = np.arange(-c + 1, 1, dtype=np.int64)  # (C,) oldest .. newest

        # n-step windows of stack indices, emitting finished transitions here.
        self._windows = NStepWindows(num_envs, n_step, self.gamma, (c,), np.int64, self._emit)

        # Sampling: pinned staging for a CUDA learner of host frames; otherwise what the
        # host gathers (scalars, and host frames) moves to a learner elsewhere.
        self._pinned = is_cuda(self.device) and self._frames_np is not None
        self._moves = not self._pinned and self.device != host
        self.transfer = PinnedTransfer(self.device) if self._pinned else None
        """Sampled batches' way to the GPU (None for a learner on the host)."""

    # ------------------------------------------------------------------ info
    @staticmethod
    def storage_bytes(
        capacity: int, obs_shape: tuple[int, ...], obs_dtype: np.dtype, float_dtype: torch.dtype,
        num_envs: int = 1,
    ) -> int:
        """Bytes of storage a buffer of this configuration allocates (frames, indices and
        scalars; priorities not counted, as ``ReplayBuffer.storage_bytes`` counts none)."""
        c, h, w = obs_shape
        float_item = torch.empty((), dtype=float_dtype).element_size()
        per_slot = h * w * np.dtype(obs_dtype).itemsize + 2 * c * 8 + 8 + 3 * float_item + 1
        return num_envs * math.ceil(capacity / num_envs) * per_slot

    def __len__(self) -> int:
        return self._size

    @property
    def prioritized(self) -> bool:
        return self.priorities is not None

    @property
    def generator_device(self) -> torch.device:
        """Where ``sample``'s generator lives: the host, where the slots are drawn, even when
        the frames live in GPU memory."""
        return torch.device("cpu")

    @property
    def pinned(self) -> bool:
        """True when batches travel host -> GPU through pinned staging slots."""
        return self._pinned

    @property
    def bytes_per_transition(self) -> int:
        """Bytes of storage per slot: one frame plus the transition's indices and scalars."""
        total = sum(t.element_size() * t[0].numel() for t in self._tensors.values())
        return int(total)

    def __repr__(self) -> str:
        return (
            f"FrameReplayBuffer(size={self._size}/{self.capacity}, obs_shape={self.obs_shape}, "
            f"obs_dtype={self.obs_dtype}, n_step={self.n_step}, gamma={self.gamma}, "
            f"num_envs={self.num_envs}, device={self.device}, float_dtype={self.float_dtype})"
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

        As :meth:`ReplayBuffer.add <agent.replay.flat.ReplayBuffer.add>`: ``next_obs`` is the
        true next observation, ``terminated`` stops bootstrapping, ``truncated`` ends the
        n-step windows but bootstraps, ``explored`` ends them before a random action. A
        ``terminated`` step whose env is not reset (a lost life) is fine: the next
        ``obs`` continues the same frames.
        """
        obs, actions, rewards, next_obs, terminated, truncated = check_step(
            (obs, actions, rewards, next_obs, terminated, truncated),
            self._obs_in_shape,
            self._obs_in_dtype,
            self.num_envs,
        )
        explored = check_explored(explored, self.num_envs)
        terminated, truncated = terminated != 0, truncated != 0

        # Vectorised checks over all envs: does obs continue, does next_obs slide by one?
        cont = self._has_last & (obs == self._last_obs).reshape(self.num_envs, -1).all(1)
        slide = (next_obs[:, :-1] == obs[:, 1:]).reshape(self.num_envs, -1).all(1)
        self._last_obs[...] = next_obs
        self._has_last[:] = True
        obs_stacks = np.empty_like(self._cur_stack)  # (E, C) flat frame indices
        for e in range(self.num_envs):
            obs_stacks[e] = self._cur_stack[e] if cont[e] else self._new_segment(e, obs[e])
            if slide[e]:
                self._cur_stack[e] = self._stack(e, self._write(e, next_obs[e, -1]))
            else:
                self._cur_stack[e] = self._new_segment(e, next_obs[e])
        if self._dropped:
            if self.priorities is not None:
                self.priorities.drop(np.array(self._dropped))
            self._dropped.clear()
        # The frames of pending windows outlive this step's writes (min_slots), so the
        # windows can finish transitions after them.
        self._windows.push(obs_stacks, actions, rewards, self._cur_stack.copy(), terminated,
                           truncated, explored)  # fmt: skip

    def _write(self, e: int, frame: np.ndarray) -> int:
        """Write one frame of env e; drop the transition whose oldest frame it overwrites."""
        s = self.slots_per_env
        w = int(self._count[e])
        base = e * s
        for slot in (w % s, (w + self.obs_shape[0] - 1) % s):
            if self._valid[base + slot]:
                self._valid[base + slot] = False
                self._size -= 1
                self._dropped.append(base + slot)
        if self._frames_np is not None:
            self._frames_np[base + w % s] = frame
        else:
            self._frames[base + w % s].copy_(torch.as_tensor(frame))
        self._count[e] = w + 1
        return w

    def _stack(self, e: int, w: int) -> np.ndarray:
        """Flat frame indices (oldest first) of the stack whose newest frame is counter w."""
        counters = np.maximum(w + self._stack_offsets, self._seg_start[e])
        return e * self.slots_per_env + counters % self.slots_per_env

    def _new_segment(self, e: int, stack: np.ndarray) -> np.ndarray:
        """Write a stack that does not continue the env's frames; return its indices."""
        if (stack[1:] == stack[:-1]).all():  # the reset frame, repeated: store it once
            w = self._write(e, stack[-1])
            self._seg_start[e] = w
        else:
            w = self._write(e, stack[0])
            self._seg_start[e] = w
            for frame in stack[1:]:
                w = self._write(e, frame)
        return self._stack(e, w)

    def _emit(
        self,
        obs_stacks: np.ndarray,
        actions: np.ndarray,
        returns: np.ndarray,
        next_stacks: np.ndarray,
        dones: np.ndarray | bool,
        discounts: np.ndarray | float,
    ) -> None:
        """Store m finished transitions, each in the slot of its obs's newest frame."""
        m = len(actions)
        dones = np.broadcast_to(dones, (m,))
        discounts = np.broadcast_to(discounts, (m,))
        if self.priorities is not None:
            self.priorities.store(obs_stacks[:, -1])
        for row in range(m):
            i = int(obs_stacks[row, -1])
            if not self._valid[i]:
                self._valid[i] = True
                self._size += 1
            self._obs_idx_np[i] = obs_stacks[row]
            self._next_idx_np[i] = next_stacks[row]
            self._actions_np[i] = actions[row]
            self._rewards_np[i] = returns[row]
            self._dones_np[i] = float(dones[row])
            self._discounts_np[i] = discounts[row]

    # ------------------------------------------------------------------ sample
    def sample(
        self, batch_size: int, generator: torch.Generator | None = None, beta: float = 1.0
    ) -> Batch:
        """``batch_size`` transitions drawn with replacement, on ``device``.

        Uniformly: draws slots with ``torch.randint`` (CPU ``generator``) and redraws
        those that hold no transition. By priority (``alpha``): from the sum tree, where
        empty slots have none, with importance weights of exponent ``beta``. The same
        generator state gives the same batch.
        """
        check_sample_size(batch_size, self._size)
        if self.priorities is not None:
            slots, weights = self.priorities.sample(batch_size, generator, beta)
            w = torch.from_numpy(weights.astype(numpy_dtype(self.float_dtype, "weights")))
            return self._gather(torch.from_numpy(slots), w)
        s = self.slots_per_env
        used = int(min(s, self._count.max()))  # slots written in the fullest env
        span = self.num_envs * used

        def draw(k: int) -> torch.Tensor:
            u = torch.randint(0, span, (k,), generator=generator)
            return (u // used) * s + u % used

        idx = draw(batch_size)
        for _ in range(_MAX_REDRAWS):
            bad = ~self._valid_t[idx]
            n_bad = int(bad.sum())
            if n_bad == 0:
                break
            idx[bad] = draw(n_bad)
        else:  # almost never: an exact draw over the stored transitions
            stored = self._valid_t.nonzero().squeeze(1)
            idx = stored[torch.randint(0, len(stored), (batch_size,), generator=generator)]
        return self._gather(idx)

    def update_priorities(self, indices: torch.Tensor, errors: torch.Tensor) -> None:
        """Priorities ``|errors| + eps`` for the slots ``indices`` of a sampled batch
        (a no-op for uniform sampling)."""
        if self.priorities is not None:
            self.priorities.update(indices, errors)

    def stored_slots(self) -> torch.Tensor:
        """Flat slot ids of every stored transition (int64, ascending), for :meth:`gather`."""
        return self._valid_t.nonzero().squeeze(1)

    def gather(self, slots: torch.Tensor) -> Batch:
        """The batch at flat slot ids (from :meth:`stored_slots`), on ``device``."""
        slots = slots.to("cpu", torch.int64)
        if not bool(self._valid_t[slots].all()):
            raise ValueError("gather: some slots hold no transition")
        return self._gather(slots)

    def _gather(self, idx: torch.Tensor, weights: torch.Tensor | None = None) -> Batch:
        b = idx.shape[0]
        c, h, w = self.obs_shape
        obs_frames = self._obs_idx.index_select(0, idx).view(-1)  # (B*C,)
        next_frames = self._next_idx.index_select(0, idx).view(-1)
        if self._pinned:
            return self._gather_pinned(idx, obs_frames, next_frames, weights)
        # Frames on a GPU: their indices go there, the frames never leave it.
        obs_frames = obs_frames.to(self.storage_device)
        next_frames = next_frames.to(self.storage_device)
        batch = Batch(
            self._frames.index_select(0, obs_frames).view(b, c, h, w),
            self._actions.index_select(0, idx),
            self._rewards.index_select(0, idx),
            self._frames.index_select(0, next_frames).view(b, c, h, w),
            self._dones.index_select(0, idx),
            self._discounts.index_select(0, idx),
            idx,
            weights,
        )
        return delivered(batch, self.device) if self._moves else batch

    def _gather_pinned(
        self,
        idx: torch.Tensor,
        obs_frames: torch.Tensor,
        next_frames: torch.Tensor,
        weights: torch.Tensor | None,
    ) -> Batch:
        """Host gather into pinned staging, then to the GPU (:class:`PinnedTransfer`)."""
        b = idx.shape[0]
        c, h, w = self.obs_shape
        specs = [
            ((b, c, h, w), self.obs_dtype),
            ((b,), torch.int64),
            ((b,), self.float_dtype),
            ((b, c, h, w), self.obs_dtype),
            ((b,), self.float_dtype),
            ((b,), self.float_dtype),
        ]
        if weights is not None:
            specs.append(((b,), self.float_dtype))

        def fill(st: tuple[torch.Tensor, ...]) -> None:
            torch.index_select(self._frames, 0, obs_frames, out=st[0].view(b * c, h, w))
            torch.index_select(self._actions, 0, idx, out=st[1])
            torch.index_select(self._rewards, 0, idx, out=st[2])
            torch.index_select(self._frames, 0, next_frames, out=st[3].view(b * c, h, w))
            torch.index_select(self._dones, 0, idx, out=st[4])
            torch.index_select(self._discounts, 0, idx, out=st[5])
            if weights is not None:
                st[6].copy_(weights)

        assert self.transfer is not None
        out = self.transfer(specs, fill)
        return Batch(*out[:6], idx, out[6] if weights is not None else None)

    # ------------------------------------------------------------------ state
    _HOST_ARRAYS = ("_count", "_seg_start", "_cur_stack", "_last_obs", "_has_last")

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly: plain tensors and numbers only.

        Loadable with ``torch.load(..., weights_only=True)``. The storage tensors share
        memory with the buffer (like ``nn.Module.state_dict``): save before the next add.
        """
        state: dict[str, Any] = {**config_state(self), "size": self._size}
        state.update(self._tensors)
        for name in self._HOST_ARRAYS:
            state[name.lstrip("_")] = torch.from_numpy(getattr(self, name).copy())
        state.update(self._windows.state_dict())
        state.update(priorities_state(self.priorities))
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` from a buffer with the same configuration."""
        check_config_state(self, state)
        for name, t in self._tensors.items():
            src = state.get(name)
            if not isinstance(src, torch.Tensor) or src.dtype != t.dtype or src.shape != t.shape:
                raise ValueError(
                    f"replay state_dict: {name} must be a {t.dtype} tensor of shape "
                    f"{tuple(t.shape)}"
                )
        for name in self._HOST_ARRAYS:
            key = name.lstrip("_")
            arr = getattr(self, name)
            src = state.get(key)
            if not isinstance(src, torch.Tensor) or tuple(src.shape) != arr.shape:
                raise ValueError(f"replay state_dict: {key} must have shape {arr.shape}")
        self._windows.check_state(state)
        valid = state["valid"]
        if int(valid.sum()) != int(state["size"]):
            raise ValueError("replay state_dict: size does not match the stored transitions")
        load_priorities(self.priorities, state)
        for name, t in self._tensors.items():
            t.copy_(state[name])
        for name in self._HOST_ARRAYS:
            getattr(self, name)[...] = state[name.lstrip("_")].numpy()
        self._windows.load_state_dict(state)
        self._size = int(state["size"])
