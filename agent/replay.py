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
``n_step`` steps (host-side numpy). A window that holds ``n_step`` steps emits its
oldest transition; an episode end (terminated *or* truncated) flushes every pending
window of that env, each with its own shorter length ``k``. The ring therefore holds
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

from typing import Any, NamedTuple

import numpy as np
import torch

__all__ = ["Batch", "ReplayBuffer"]

# Float dtypes the buffer can return: they need a numpy twin, because the host side
# (n-step windows, writes into CPU storage) works through numpy views.
_FLOAT_DTYPES = (torch.float16, torch.float32, torch.float64)


class Batch(NamedTuple):
    """One sampled batch; every field is a tensor on the buffer's ``device``.

    obs, next_obs: (B, *obs_shape), stored dtype (uint8 stays uint8; float obs in float_dtype).
    actions: (B,) int64.
    rewards: (B,) discounted k-step return, float_dtype.
    dones: (B,) 1.0 only if the episode terminated within the k steps, float_dtype.
    discounts: (B,) gamma**k for the k steps actually taken, float_dtype.
    """

    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    next_obs: torch.Tensor
    dones: torch.Tensor
    discounts: torch.Tensor


def _numpy_dtype(dtype: Any, what: str) -> np.dtype:
    """The numpy dtype for a numpy or torch dtype (``ValueError`` if numpy has none)."""
    if isinstance(dtype, torch.dtype):
        try:
            return torch.empty((), dtype=dtype).numpy().dtype
        except TypeError as err:  # bfloat16 and friends have no numpy twin
            raise ValueError(f"{what}: dtype {dtype} has no numpy equivalent") from err
    try:
        return np.dtype(dtype)
    except TypeError as err:
        raise ValueError(f"{what}: expected a numpy or torch dtype, got {dtype!r}") from err


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


def _as_numpy(x: Any, name: str) -> np.ndarray:
    """A numpy view of ``x`` (numpy array, tensor on any device, or array-like)."""
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, torch.Tensor):
        try:
            return x.detach().cpu().numpy()
        except TypeError as err:
            raise ValueError(f"{name}: tensor dtype {x.dtype} has no numpy equivalent") from err
    return np.asarray(x)


def _normalize_device(device: torch.device | str) -> torch.device:
    """``torch.device`` with an explicit index for CUDA, so "cuda" and "cuda:0" compare equal."""
    dev = torch.device(device)
    if _is_cuda(dev) and dev.index is None:
        dev = torch.device(dev.type, torch.cuda.current_device())
    return dev


def _is_cuda(dev: torch.device) -> bool:
    # A type test, not a placement: pinning and streams exist only for CUDA targets.
    return dev.type == "cuda"


def config_state(buffer: Any) -> dict[str, Any]:
    """The configuration a buffer's state_dict records and a loading buffer must match."""
    return {
        "capacity": buffer.capacity,
        "obs_shape": list(buffer.obs_shape),
        "n_step": buffer.n_step,
        "gamma": buffer.gamma,
        "num_envs": buffer.num_envs,
    }


def check_config_state(buffer: Any, state: dict[str, Any]) -> None:
    """ValueError unless ``state`` was saved by a buffer configured like ``buffer``."""
    for key, want in config_state(buffer).items():
        if key not in state:
            raise ValueError(f"replay state_dict: missing {key!r}")
        got = list(state[key]) if key == "obs_shape" else state[key]
        if got != want:
            raise ValueError(f"replay state_dict: {key} is {got}, this buffer has {want}")


def check_arguments(
    capacity: Any, obs_shape: Any, n_step: Any, gamma: Any, num_envs: Any, float_dtype: Any
) -> tuple[int, ...]:
    """The constructor checks every buffer shares; returns ``obs_shape`` as a tuple of ints."""
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
        raise ValueError(f"capacity must be a positive int, got {capacity!r}")
    if isinstance(n_step, bool) or not isinstance(n_step, int) or n_step < 1:
        raise ValueError(f"n_step must be an int >= 1, got {n_step!r}")
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")
    if not (0.0 < float(gamma) <= 1.0):
        raise ValueError(f"gamma must be in (0, 1], got {gamma!r}")
    try:
        obs_shape = tuple(int(d) for d in obs_shape)
    except TypeError as err:
        raise ValueError(f"obs_shape must be a tuple of ints, got {obs_shape!r}") from err
    if any(d <= 0 for d in obs_shape):
        raise ValueError(f"obs_shape must have positive sizes, got {obs_shape}")
    if float_dtype not in _FLOAT_DTYPES:
        raise ValueError(f"float_dtype must be one of {_FLOAT_DTYPES}, got {float_dtype!r}")
    return obs_shape


def check_explored(explored: Any, num_envs: int) -> np.ndarray | None:
    """``add``'s ``explored`` as a (num_envs,) bool array, None if none is marked."""
    if explored is None:
        return None
    explored = np.asarray(explored)
    if explored.shape != (num_envs,) or explored.dtype != np.bool_:
        raise ValueError(
            f"explored: expected a bool array of shape ({num_envs},), "
            f"got {explored.dtype} {explored.shape}"
        )
    return explored if explored.any() else None


def check_step(
    step: tuple[Any, Any, Any, Any, Any, Any],
    obs_shape: tuple[int, ...],
    obs_dtype: np.dtype,
    num_envs: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(obs, actions, rewards, next_obs, terminated, truncated)`` of one vector-env step
    as numpy arrays, or ValueError naming what was expected and what came.

    ``obs_shape`` is the batch shape ``(num_envs, *obs_shape)``; shared by every buffer.
    """
    obs, actions, rewards, next_obs, terminated, truncated = step

    def frames(x: Any, name: str) -> np.ndarray:
        x = _as_numpy(x, name)
        if x.shape != obs_shape:
            raise ValueError(
                f"{name}: expected shape {obs_shape} (num_envs, *obs_shape), got {tuple(x.shape)}"
            )
        if x.dtype != obs_dtype:
            raise ValueError(f"{name}: expected dtype {obs_dtype}, got {x.dtype}")
        return x

    def vector(x: Any, name: str, kinds: str) -> np.ndarray:
        x = _as_numpy(x, name)
        if x.shape != (num_envs,):
            raise ValueError(
                f"{name}: expected shape ({num_envs},) (num_envs,), got {tuple(x.shape)}"
            )
        if x.dtype.kind not in kinds:
            raise ValueError(f"{name}: expected {_KIND_NAMES[kinds]} dtype, got {x.dtype}")
        return x

    return (
        frames(obs, "obs"),
        vector(actions, "actions", "iu"),
        vector(rewards, "rewards", "fiub"),
        frames(next_obs, "next_obs"),
        vector(terminated, "terminated", "biu"),
        vector(truncated, "truncated", "biu"),
    )


class _PinnedSlots:
    """``slots`` sets of pinned host tensors, reused round-robin (CUDA only).

    A set is handed out again only after the CUDA event recorded behind the last
    copy out of it has completed: a non-blocking copy reads the pinned memory after
    the host has moved on, so overwriting it earlier would corrupt that copy.
    """

    def __init__(self, specs: list[tuple[tuple[int, ...], torch.dtype]], slots: int = 2) -> None:
        self.tensors = [
            tuple(torch.empty(shape, dtype=dtype, pin_memory=True) for shape, dtype in specs)
            for _ in range(slots)
        ]
        # numpy views of the same pinned memory, for cheap host-side writes.
        self.arrays = [tuple(t.numpy() for t in group) for group in self.tensors]
        self.events = [torch.cuda.Event() for _ in range(slots)]
        self.next = 0

    def acquire(self) -> int:
        """Index of the next free set; blocks only while a copy out of it is in flight."""
        slot = self.next
        # Returns at once for an event never recorded.
        self.events[slot].synchronize()
        self.next = (slot + 1) % len(self.tensors)
        return slot

    def release(self, slot: int, stream: torch.cuda.Stream) -> None:
        """Mark the set busy until the copies just enqueued on ``stream`` have run."""
        self.events[slot].record(stream)

    def wait_all(self) -> None:
        for event in self.events:
            event.synchronize()


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
    ) -> None:
        obs_shape = check_arguments(capacity, obs_shape, n_step, gamma, num_envs, float_dtype)

        self.capacity = capacity
        self.obs_shape = obs_shape
        self.n_step = n_step
        self.gamma = float(gamma)
        self.num_envs = num_envs
        self.float_dtype = float_dtype
        self.device = _normalize_device(device)
        self.storage_device = _normalize_device(storage_device)

        # The dtype add() accepts, and the dtype observations are stored in: float
        # observations go straight to float_dtype so that sample() never casts.
        self._obs_in_dtype = _numpy_dtype(obs_dtype, "obs_dtype")
        if np.issubdtype(self._obs_in_dtype, np.floating):
            self.obs_dtype = float_dtype
        else:
            self.obs_dtype = _torch_dtype(self._obs_in_dtype)
        self._obs_in_shape = (num_envs, *obs_shape)
        np_obs = _numpy_dtype(self.obs_dtype, "obs_dtype")

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
        self._write_slots: _PinnedSlots | None = None
        if self.storage_device.type == "cpu":
            self._host: tuple[np.ndarray, ...] | None = tuple(t.numpy() for t in self._fields)
        elif _is_cuda(self.storage_device):
            self._host = None
            max_rows = num_envs * n_step  # the most transitions one add() can finish
            self._write_slots = _PinnedSlots(
                [((max_rows, *t.shape[1:]), t.dtype) for t in self._fields]
            )
            self._staged = 0  # rows staged by the add() in progress
            self._stage_slot = 0
        else:
            raise ValueError(
                f"storage_device must be 'cpu' or a CUDA device, got {self.storage_device}"
            )

        # Sampling path. Pinned staging only for a CPU ring feeding a CUDA learner.
        self._pinned = self.storage_device.type == "cpu" and _is_cuda(self.device)
        self._moves = not self._pinned and self.storage_device != self.device
        self._sample_slots: _PinnedSlots | None = None  # allocated on first sample
        self._copy_stream = torch.cuda.Stream(self.device) if self._pinned else None

        # n-step windows, one per env (host side). Slot of step t is t % n_step for
        # every env, because every add() carries one step of each env.
        self._t = 0
        self._win_obs = np.zeros((num_envs, n_step, *obs_shape), dtype=np_obs)
        self._win_act = np.zeros((num_envs, n_step), dtype=np.int64)
        self._win_rew = np.zeros((num_envs, n_step), dtype=np.float64)
        # Step index (self._t) at which each env's current episode began: its episode
        # length is self._t - start, with nothing to update per step. _last_start is
        # max(start) as a Python int, so the steady state needs no array test.
        self._ep_start = np.zeros(num_envs, dtype=np.int64)
        self._last_start = 0
        pows = self.gamma ** np.arange(n_step + 1, dtype=np.float64)
        self._gamma_pows = pows  # gamma**k, k = 0..n_step
        # _ret_weights[s] @ window rewards = n-step return of the window whose newest
        # step sits in slot s (so its oldest in slot (s + 1) % n).
        slots = np.arange(n_step)
        self._ret_weights = np.stack(
            [pows[(slots - (s + 1)) % n_step] for s in range(n_step)]
        )  # (n_step, n_step)

    # ------------------------------------------------------------------ info
    def __len__(self) -> int:
        return self._size

    @property
    def pinned(self) -> bool:
        """True when batches travel host -> GPU through pinned staging slots."""
        return self._pinned

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
        if self.n_step == 1:
            self._emit(obs, actions, rewards, next_obs, terminated, self.gamma)
        else:
            if explored is not None:
                self._cut(obs, explored)
            self._add_nstep(obs, actions, rewards, next_obs, terminated, truncated)
        if self._write_slots is not None:
            self._commit_staged()

    def _add_nstep(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        next_obs: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
    ) -> None:
        n = self.n_step
        s = self._t % n  # window slot of this step, the same for every env
        self._t += 1
        self._win_obs[:, s] = obs
        self._win_act[:, s] = actions
        self._win_rew[:, s] = rewards

        # Windows holding n steps finish their oldest transition (started n-1 steps
        # ago, in slot (s + 1) % n). With terminated set it is also the longest
        # window of an ending episode, so dones=terminated is right for it.
        oldest = (s + 1) % n
        if self._t - self._last_start >= n:  # every env's episode is >= n steps long
            n_full = self.num_envs
        else:
            full = self._ep_start <= self._t - n  # (E,) episode length >= n
            n_full = np.count_nonzero(full)  # (count_nonzero: ~3x cheaper than any/all)
        if n_full == self.num_envs:
            ret = self._win_rew @ self._ret_weights[s]  # (E,)
            self._emit(
                self._win_obs[:, oldest],
                self._win_act[:, oldest],
                ret,
                next_obs,
                terminated,
                self._gamma_pows[n],
            )
        elif n_full:
            envs = full.nonzero()[0]
            ret = self._win_rew[envs] @ self._ret_weights[s]
            self._emit(
                self._win_obs[envs, oldest],
                self._win_act[envs, oldest],
                ret,
                next_obs[envs],
                terminated[envs],
                self._gamma_pows[n],
            )

        # An episode end flushes the shorter windows left (episode ends are rare, so a
        # loop over the ending envs is cheap).
        ended = terminated | truncated
        if np.count_nonzero(ended):
            for env in ended.nonzero()[0]:
                self._flush_env(int(env), s, next_obs[env], bool(terminated[env]))
            self._last_start = self._t

    def _cut(self, obs: np.ndarray, explored: np.ndarray) -> None:
        """End the pending windows of the explored envs before this step, at ``obs``."""
        last = (self._t - 1) % self.n_step  # the slot of the previous step
        for env in explored.nonzero()[0]:  # at least one: check_explored gives None for none
            self._flush_env(int(env), last, obs[env], terminated=False)
        self._last_start = self._t  # their next windows start with this step

    def _flush_env(self, env: int, s: int, final_obs: np.ndarray, terminated: bool) -> None:
        """Emit env's pending windows shorter than n, which end at the step in slot s (its
        episode ended there, or a random action follows it: ``_cut``)."""
        n = self.n_step
        ep_len = self._t - int(self._ep_start[env])
        m = min(ep_len, n - 1)  # a full window was emitted already
        self._ep_start[env] = self._t  # the next episode starts with the next step
        if m == 0:
            return
        # The window started j steps ago (j = 0..m-1) covers k = j + 1 steps:
        # G_j = r[s - j] + gamma * G_{j-1}, built from the newest step backwards.
        rew = self._win_rew[env]
        returns = np.empty(m, dtype=np.float64)
        g = 0.0
        for j in range(m):
            g = rew[(s - j) % n] + self.gamma * g
            returns[j] = g
        slots = (s - np.arange(m)) % n
        self._emit(
            self._win_obs[env, slots],
            self._win_act[env, slots],
            returns,
            np.broadcast_to(final_obs, (m, *self.obs_shape)),
            terminated,
            self._gamma_pows[1 : m + 1],
        )

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
    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> Batch:
        """``batch_size`` transitions drawn uniformly with replacement, on ``device``.

        Indices come from ``torch.randint`` on the storage device, so ``generator``
        (if given) must live there; the same generator state gives the same batch.
        """
        size = self._size
        if not isinstance(batch_size, int) or batch_size > size or batch_size <= 0:
            raise ValueError(
                f"sample(batch_size={batch_size}) needs 1 <= batch_size <= stored "
                f"transitions, but the buffer holds {size}"
            )
        idx = torch.randint(
            0, size, (batch_size,), generator=generator, device=self.storage_device
        )  # (B,) int64
        return self._gather(idx)

    def gather(self, indices: torch.Tensor) -> Batch:
        """The batch at ring ``indices`` (int64, values in [0, len(self))), on ``device``.

        ``sample`` is ``gather(torch.randint(...))``; this entry point lets a caller
        (a test, or a prioritised sampler) choose the indices itself.
        """
        return self._gather(indices.to(self.storage_device))

    def _gather(self, idx: torch.Tensor) -> Batch:
        """Gather at ``idx`` (on the storage device) and deliver to ``device``."""
        if self._pinned:
            return self._gather_pinned(idx)
        f = self._fields
        batch = Batch(
            f[0].index_select(0, idx),
            f[1].index_select(0, idx),
            f[2].index_select(0, idx),
            f[3].index_select(0, idx),
            f[4].index_select(0, idx),
            f[5].index_select(0, idx),
        )
        if self._moves:  # only unusual pairings reach this (e.g. GPU ring, CPU learner)
            batch = Batch(*(t.to(self.device) for t in batch))
        return batch

    def _gather_pinned(self, idx: torch.Tensor) -> Batch:
        """CPU ring -> pinned staging slot -> GPU, the copy on a side stream."""
        batch_size = idx.shape[0]
        slots = self._sample_slots
        if slots is None or slots.tensors[0][0].shape[0] != batch_size:
            if slots is not None:
                slots.wait_all()  # never drop a slot a copy may still read
            # Pinned once per batch size (the learner uses one size), never per batch.
            self._sample_slots = slots = _PinnedSlots(
                [((batch_size, *t.shape[1:]), t.dtype) for t in self._fields]
            )
        slot = slots.acquire()  # waits only if this slot's previous copy is in flight
        staged = slots.tensors[slot]
        for src, dst in zip(self._fields, staged, strict=True):
            torch.index_select(src, 0, idx, out=dst)  # host gather into pinned memory

        compute = torch.cuda.current_stream(self.device)
        copy_stream = self._copy_stream
        assert copy_stream is not None
        # Allocated and filled on the side stream: it does not wait for the compute
        # stream, so the copy overlaps with kernels already queued there.
        with torch.cuda.stream(copy_stream):
            out = [t.to(self.device, non_blocking=True) for t in staged]
        slots.release(slot, copy_stream)
        compute.wait_stream(copy_stream)  # the learner's kernels see the finished copy
        for t in out:
            # Memory allocated on the side stream but used on the compute stream: keep
            # the allocator from reusing it before the compute stream is done with it.
            t.record_stream(compute)
        return Batch(*out)

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
            "t": self._t,
            **ring,
            "window_obs": torch.from_numpy(self._win_obs.copy()),
            "window_actions": torch.from_numpy(self._win_act.copy()),
            "window_rewards": torch.from_numpy(self._win_rew.copy()),
            "episode_steps": torch.from_numpy(self._t - self._ep_start),
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
        windows = {
            "window_obs": self._win_obs,
            "window_actions": self._win_act,
            "window_rewards": self._win_rew,
            "episode_steps": self._ep_start,  # stored as lengths, kept as start steps
        }
        for name, arr in windows.items():
            if tuple(state[name].shape) != arr.shape:
                raise ValueError(
                    f"replay state_dict: {name} has shape {tuple(state[name].shape)}, "
                    f"expected {arr.shape}"
                )
        if self._write_slots is not None:
            self._write_slots.wait_all()
        for name, t in zip(names, self._fields, strict=True):
            t[:size].copy_(state[name][:size])
        for name, arr in windows.items():
            arr[...] = state[name].cpu().numpy()
        self._pos = int(state["pos"]) % self.capacity
        self._size = size
        self._t = int(state["t"])
        self._ep_start[:] = self._t - self._ep_start  # episode lengths -> start steps
        self._last_start = int(self._ep_start.max())


_KIND_NAMES = {"iu": "an integer", "fiub": "a numeric", "biu": "a bool or integer"}
