"""What both replay buffers share (:mod:`agent.replay.flat`, :mod:`agent.replay.frames`): the
sampled :class:`Batch`, the checks of their arguments and steps, dtype and device
helpers, and how batches reach a CUDA learner from host memory (pinned staging)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch

__all__ = [
    "FLOAT_DTYPES",
    "Batch",
    "PinnedSlots",
    "PinnedTransfer",
    "Replay",
    "as_numpy",
    "check_arguments",
    "check_config_state",
    "check_explored",
    "check_sample_size",
    "check_step",
    "choose_storage",
    "config_state",
    "delivered",
    "is_cuda",
    "normalize_device",
    "numpy_dtype",
    "torch_dtype",
]

# Float dtypes the buffer can return: they need a numpy twin, because the host side
# (n-step windows, writes into CPU storage) works through numpy views.
FLOAT_DTYPES = (torch.float16, torch.float32, torch.float64)


class Batch(NamedTuple):
    """One sampled batch; every field is a tensor on the buffer's ``device``, but ``indices``.

    obs, next_obs: (B, *obs_shape), stored dtype (uint8 stays uint8; float obs in float_dtype).
    actions: (B,) int64.
    rewards: (B,) discounted k-step return, float_dtype.
    dones: (B,) 1.0 only if the episode terminated within the k steps, float_dtype.
    discounts: (B,) gamma**k for the k steps actually taken, float_dtype.
    indices: (B,) int64, the slots drawn, where they were drawn (the storage device, or the
        host for a prioritized buffer): what :meth:`Replay.update_priorities` takes back.
    weights: (B,) importance-sampling weights in (0, 1], float_dtype, from a prioritized
        buffer; None from a uniform one (every weight 1: the loss is a plain mean).
    """

    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    next_obs: torch.Tensor
    dones: torch.Tensor
    discounts: torch.Tensor
    indices: torch.Tensor | None = None
    weights: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> Batch:
        """Every field on ``device`` (None stays None)."""
        return Batch(*(None if t is None else t.to(device) for t in self))

    @staticmethod
    def stack(batches: Sequence[Batch]) -> Batch:
        """Batches of equal shapes as one, each field stacked along a new first axis."""
        columns = zip(*batches, strict=True)
        return Batch(*(None if col[0] is None else torch.stack(col) for col in columns))

    @property
    def learned(self) -> tuple[torch.Tensor, ...]:
        """The fields an update reads (``weights`` only where there are any)."""
        fields = (self.obs, self.actions, self.rewards, self.next_obs, self.dones,
                  self.discounts)  # fmt: skip
        return fields if self.weights is None else (*fields, self.weights)


class Replay(Protocol):
    """The interface both replay buffers implement: what the training loop, checkpoints
    and the exploration probe use."""

    capacity: int
    n_step: int
    device: torch.device
    storage_device: torch.device

    def __len__(self) -> int: ...

    @property
    def prioritized(self) -> bool:
        """True when ``sample`` draws by priority (and returns importance weights)."""

    @property
    def generator_device(self) -> torch.device:
        """Where the ``generator`` that ``sample`` takes must live."""

    def add(
        self,
        obs: Any,
        actions: Any,
        rewards: Any,
        next_obs: Any,
        terminated: Any,
        truncated: Any,
        explored: np.ndarray | None = None,
    ) -> None:
        """One step of every env; finished n-step transitions are stored."""

    def sample(
        self, batch_size: int, generator: torch.Generator | None = None, beta: float = 1.0
    ) -> Batch:
        """``batch_size`` stored transitions, with replacement, on ``device``: uniformly,
        or by priority with importance weights of exponent ``beta``."""

    def update_priorities(self, indices: torch.Tensor, errors: torch.Tensor) -> None:
        """The learner's per-sample errors for a batch's ``indices`` (a no-op when uniform)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def numpy_dtype(dtype: Any, what: str) -> np.dtype:
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


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


def as_numpy(x: Any, name: str) -> np.ndarray:
    """A numpy view of ``x`` (numpy array, tensor on any device, or array-like)."""
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, torch.Tensor):
        try:
            return x.detach().cpu().numpy()
        except TypeError as err:
            raise ValueError(f"{name}: tensor dtype {x.dtype} has no numpy equivalent") from err
    return np.asarray(x)


def normalize_device(device: torch.device | str) -> torch.device:
    """``torch.device`` with an explicit index for CUDA, so "cuda" and "cuda:0" compare equal."""
    dev = torch.device(device)
    if is_cuda(dev) and dev.index is None:
        dev = torch.device(dev.type, torch.cuda.current_device())
    return dev


def is_cuda(dev: torch.device) -> bool:
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
    if float_dtype not in FLOAT_DTYPES:
        raise ValueError(f"float_dtype must be one of {FLOAT_DTYPES}, got {float_dtype!r}")
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
        x = as_numpy(x, name)
        if x.shape != obs_shape:
            raise ValueError(
                f"{name}: expected shape {obs_shape} (num_envs, *obs_shape), got {tuple(x.shape)}"
            )
        if x.dtype != obs_dtype:
            raise ValueError(f"{name}: expected dtype {obs_dtype}, got {x.dtype}")
        return x

    def vector(x: Any, name: str, kinds: str) -> np.ndarray:
        x = as_numpy(x, name)
        if x.shape != (num_envs,):
            raise ValueError(
                f"{name}: expected shape ({num_envs},) (num_envs,), got {tuple(x.shape)}"
            )
        if x.dtype.kind not in kinds:
            raise ValueError(f"{name}: expected {KIND_NAMES[kinds]} dtype, got {x.dtype}")
        return x

    return (
        frames(obs, "obs"),
        vector(actions, "actions", "iu"),
        vector(rewards, "rewards", "fiub"),
        frames(next_obs, "next_obs"),
        vector(terminated, "terminated", "biu"),
        vector(truncated, "truncated", "biu"),
    )


class PinnedSlots:
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


class PinnedTransfer:
    """Batches from host memory to ``device`` (CUDA): the host gathers into a pinned
    staging set (allocated once per batch layout, never per batch), which is copied
    non-blocking on a side stream; the compute stream waits for that copy only, so it
    overlaps with kernels already queued there."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.slots: PinnedSlots | None = None
        self.stream = torch.cuda.Stream(device)

    def __call__(
        self,
        specs: list[tuple[tuple[int, ...], torch.dtype]],
        fill: Callable[[tuple[torch.Tensor, ...]], None],
    ) -> list[torch.Tensor]:
        """``fill(staged)`` writes the batch into pinned tensors of layout ``specs``
        (shape, dtype); returns their copies on ``device``, ready on the current stream."""
        slots = self.slots
        if slots is None or [(tuple(t.shape), t.dtype) for t in slots.tensors[0]] != specs:
            if slots is not None:
                slots.wait_all()  # never drop a set a copy may still read
            self.slots = slots = PinnedSlots(specs)
        slot = slots.acquire()  # waits only if this set's previous copy is in flight
        staged = slots.tensors[slot]
        fill(staged)
        compute = torch.cuda.current_stream(self.device)
        # Allocated and filled on the side stream: it does not wait for the compute stream.
        with torch.cuda.stream(self.stream):
            out = [t.to(self.device, non_blocking=True) for t in staged]
        slots.release(slot, self.stream)
        compute.wait_stream(self.stream)  # the learner's kernels see the finished copy
        for t in out:
            # Memory allocated on the side stream but used on the compute stream: keep
            # the allocator from reusing it before the compute stream is done with it.
            t.record_stream(compute)
        return out


def check_sample_size(batch_size: Any, stored: int) -> None:
    """A ``ValueError`` unless ``1 <= batch_size <= stored`` (an int)."""
    if not isinstance(batch_size, int) or batch_size > stored or batch_size <= 0:
        raise ValueError(
            f"sample(batch_size={batch_size}) needs 1 <= batch_size <= stored "
            f"transitions, but the buffer holds {stored}"
        )


def delivered(batch: Batch, device: torch.device) -> Batch:
    """``batch`` moved to ``device`` (its ``indices`` stay where they are)."""
    weights = batch.weights
    return Batch(*(t.to(device) for t in batch[:6]), batch.indices,
                 None if weights is None else weights.to(device))  # fmt: skip


KIND_NAMES = {"iu": "an integer", "fiub": "a numeric", "biu": "a bool or integer"}


def choose_storage(
    asked: str, device: torch.device, frames: bool, bytes_needed: int, free_bytes: int | None
) -> torch.device:
    """Where a replay buffer is stored (``replay_storage``): the host, or ``device``.

    ``free_bytes``: the device's free memory (None off CUDA). ``auto`` takes the device
    when the buffer needs at most a quarter of it: the networks, activations and the
    caching allocator need the rest. ``frames``: frame replay, whose frames go to the
    device only when ``device`` is asked for (``auto`` keeps them on the host, with
    pinned staging: the GPU path of frames is not yet measured against it).
    """
    host = torch.device("cpu")
    if device.type != "cuda" or asked == "pinned" or (frames and asked == "auto"):
        return host
    if asked == "device" or (free_bytes is not None and 4 * bytes_needed <= free_bytes):
        return device
    return host
