"""Proportional prioritized replay (Schaul et al. 2016): a sum tree over a buffer's slots.

Both buffers (:mod:`agent.replay.flat`, :mod:`agent.replay.frames`) take ``alpha`` and
hold a :class:`PrioritizedSampler` over their slots. They tell it which slots received a
transition (:meth:`~PrioritizedSampler.store`: at the largest priority seen so far, so
that every new transition is replayed at least once soon) and which lost one
(:meth:`~PrioritizedSampler.drop`); ``sample`` draws slot ``i`` with probability
``P(i) = p_i^alpha / sum_k p_k^alpha`` and returns importance weights
``w_i = (N P(i))^-beta`` divided by the batch's largest (as Dopamine's Rainbow does; the
``N`` cancels). A learner's per-sample errors come back through
:meth:`~PrioritizedSampler.update` as ``p_i = |error_i| + eps``.

On CUDA an update's errors are device tensors: reading them would stall the host until
the update has run. :meth:`~PrioritizedSampler.update` only enqueues a non-blocking
copy into pinned memory; the priorities are written into the tree before the next
``store``, ``drop``, ``sample`` or ``state_dict`` (by then the copy has long finished:
acting reads its actions after the update on the same stream).

The tree is numpy, float64, with up to 64 children per node (three levels for 100k
slots), so that a batch is found with a few vectorised numpy calls per level rather than
a few per binary level (17 for 100k slots). Parent sums are recomputed from their
children on every write, never adjusted by differences, so rounding errors cannot
accumulate over millions of updates.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from agent.replay.base import PinnedSlots

__all__ = [
    "PrioritizedSampler",
    "SumTree",
    "annealed_beta",
    "load_priorities",
    "priorities_state",
]


class SumTree:
    """Non-negative values at ``capacity`` leaves and the sums of every subtree.

    ``set`` writes many leaves at once; ``find`` maps many prefix-sum targets at once to
    the leaves whose interval ``[prefix(i), prefix(i) + value(i))`` holds them, and never
    to a leaf of value zero. ``branching``: children per node; by default the fewest
    levels with at most 64 children each, the children as few as that allows (47 for
    100k leaves, three levels), since a level costs a few numpy calls over B x children.
    """

    def __init__(self, capacity: int, branching: int | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if branching is None:
            depth = max(1, math.ceil(math.log(capacity) / math.log(64) - 1e-9))
            branching = max(2, math.ceil(capacity ** (1.0 / depth) - 1e-9))
        if branching < 2:
            raise ValueError(f"branching must be >= 2, got {branching}")
        self.capacity = capacity
        self.branching = branching
        depth = 1
        while branching**depth < capacity:
            depth += 1
        # levels[0]: the root's children; levels[-1]: the leaves (padded with zeros).
        self.levels = [np.zeros(branching ** (d + 1)) for d in range(depth)]
        self._room: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    @property
    def leaves(self) -> np.ndarray:
        """The leaf values, ``(capacity,)`` (a view: write them through :meth:`set`)."""
        return self.levels[-1][: self.capacity]

    @property
    def total(self) -> float:
        return float(self.levels[0].sum())

    def set(self, indices: np.ndarray, values: np.ndarray | float) -> None:
        """Leaves ``indices`` take ``values`` (a repeated index: the last value wins)."""
        indices = np.asarray(indices, dtype=np.int64)
        if len(indices) == 0:
            return
        self.levels[-1][indices] = values
        k = self.branching
        nodes = indices // k  # repeats are harmless: each writes the same sum
        for depth in range(len(self.levels) - 2, -1, -1):
            # A parent is its children's sum, recomputed whole: never adjusted by
            # differences, whose rounding errors would add up over millions of writes.
            self.levels[depth][nodes] = self.levels[depth + 1].reshape(-1, k)[nodes].sum(axis=1)
            nodes //= k

    def find(self, targets: np.ndarray) -> np.ndarray:
        """For each target in ``[0, total)``, the leaf whose interval holds it (int64)."""
        k, batch = self.branching, len(targets)
        prefix, starts, ends = self._scratch(batch)
        # prefix[1 + r*k + c]: the sum of row r's children up to and including c, all rows
        # of a level laid end to end, so one cumsum and one searchsorted serve the batch.
        self.levels[0].cumsum(out=prefix[1 : k + 1])
        # (A target that rounding carried past the last child takes the last: see below.)
        node = np.minimum(prefix[: k + 1].searchsorted(targets, side="right") - 1, k - 1)
        left = targets - prefix[node]  # what remains of each target inside its node
        for level in self.levels[1:]:
            level.reshape(-1, k)[node].ravel().cumsum(out=prefix[1:])
            absolute = prefix[starts] + left
            child = np.minimum(prefix.searchsorted(absolute, side="right"), ends) - 1
            left = absolute - prefix[child]
            node = node * k + (child - starts)
        empty = self.levels[-1][node] == 0
        if empty.any():  # a target carried past its node's last leaf with mass
            node[empty] = self._last_with_mass(node[empty])
        return node

    def _scratch(self, batch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(prefix room, each row's first index, each row's end) for a batch, kept."""
        if self._room is None or len(self._room[1]) != batch:
            starts = np.arange(batch) * self.branching
            self._room = (np.zeros(batch * self.branching + 1), starts, starts + self.branching)
        return self._room

    def _last_with_mass(self, leaves: np.ndarray) -> np.ndarray:
        """For leaves of value zero, the nearest leaf with mass before them (else after)."""
        values = self.levels[-1]
        out = leaves.copy()
        for i, leaf in enumerate(leaves):
            before = np.flatnonzero(values[:leaf] > 0)
            out[i] = before[-1] if len(before) else leaf + np.flatnonzero(values[leaf:] > 0)[0]
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"leaves": torch.from_numpy(self.leaves.copy())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        leaves = state["leaves"]
        if tuple(leaves.shape) != (self.capacity,):
            raise ValueError(f"sum tree state: leaves of shape {tuple(leaves.shape)}, "
                             f"expected ({self.capacity},)")  # fmt: skip
        self.levels[-1][:] = 0.0
        self.set(np.arange(self.capacity), leaves.numpy())


class PrioritizedSampler:
    """Proportional prioritized sampling over ``slots`` buffer slots.

    Args:
        slots: how many slots the buffer has (leaves of the tree).
        alpha: how much priorities count, ``P(i) ~ p_i^alpha`` (0 would be uniform;
            Rainbow uses 0.5).
        eps: added to every ``|error|``, so that no stored transition has probability 0.
    """

    def __init__(self, slots: int, alpha: float, eps: float = 1e-6) -> None:
        if not alpha > 0:
            raise ValueError(f"alpha must be > 0, got {alpha}")
        if not eps > 0:
            raise ValueError(f"eps must be > 0, got {eps}")
        self.alpha, self.eps = float(alpha), float(eps)
        self.tree = SumTree(slots)
        self.max_priority = 1.0
        """The largest ``|error| + eps`` seen: new transitions are stored at it."""
        # Device errors whose copies to the host are in flight: (slots, staging slot); the
        # pinned staging is allocated once (per batch size), never per update.
        self._pending: list[tuple[np.ndarray, int]] = []
        self._staging: PinnedSlots | None = None

    def store(self, slots: np.ndarray) -> None:
        """Slots that received a new transition: at the largest priority so far."""
        self.flush()
        self.tree.set(slots, self.max_priority**self.alpha)

    def drop(self, slots: np.ndarray) -> None:
        """Slots whose transition is gone: never sampled again until stored."""
        self.flush()
        self.tree.set(slots, 0.0)

    def sample(
        self, batch_size: int, generator: torch.Generator | None, beta: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """(slots ``(B,)`` int64, importance weights ``(B,)`` float64 in (0, 1]).

        Stratified: one uniform draw in each of ``batch_size`` equal parts of the total
        (``torch.rand`` on ``generator``, a CPU generator, or torch's default one).
        """
        self.flush()
        total = self.tree.total
        if not total > 0:
            raise ValueError("sample: no stored transition has a priority")
        draws = torch.rand(batch_size, generator=generator, dtype=torch.float64).numpy()
        targets = (np.arange(batch_size) + draws) * (total / batch_size)
        slots = self.tree.find(targets)
        priorities = self.tree.levels[-1][slots]
        # (N P(i))^-beta / max_j (N P(j))^-beta = (p_i / min_j p_j)^-beta
        weights = (priorities / priorities.min()) ** -beta
        return slots, weights

    def update(self, slots: torch.Tensor | np.ndarray, errors: torch.Tensor) -> None:
        """New priorities ``|errors| + eps`` for ``slots`` (from :meth:`sample`). CUDA
        errors are read later, without stalling the host (see the module's doc)."""
        slots = slots.numpy() if isinstance(slots, torch.Tensor) else np.asarray(slots)
        errors = errors.detach()
        if errors.device.type == "cpu":
            self._write(slots, errors.numpy())
            return
        staging = self._staging
        if staging is None or staging.tensors[0][0].shape != errors.shape or (
            staging.tensors[0][0].dtype != errors.dtype
        ):
            if staging is not None:
                self.flush()  # nothing pending may read a staging set that goes away
            self._staging = staging = PinnedSlots([(tuple(errors.shape), errors.dtype)])
        if len(self._pending) == len(staging.tensors):
            self.flush()  # every staging set holds errors not yet read: read them first
        slot = staging.acquire()
        staging.tensors[slot][0].copy_(errors, non_blocking=True)
        staging.release(slot, torch.cuda.current_stream(errors.device))
        self._pending.append((slots.copy(), slot))

    def flush(self) -> None:
        """Write the priorities of device updates whose copies were in flight."""
        pending, self._pending = self._pending, []
        for slots, slot in pending:
            assert self._staging is not None
            self._staging.events[slot].synchronize()
            self._write(slots, self._staging.arrays[slot][0])

    def _write(self, slots: np.ndarray, errors: np.ndarray) -> None:
        priorities = np.abs(errors.astype(np.float64)) + self.eps
        # A diverged update (NaN, inf) must not poison the tree: the learner reports it.
        priorities = np.where(np.isfinite(priorities), priorities, self.max_priority)
        self.max_priority = max(self.max_priority, float(priorities.max()))
        self.tree.set(slots, priorities**self.alpha)

    def state_dict(self) -> dict[str, Any]:
        self.flush()
        return {**self.tree.state_dict(), "max_priority": self.max_priority,
                "alpha": self.alpha}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if float(state["alpha"]) != self.alpha:
            raise ValueError(
                f"replay state_dict: priorities saved with alpha {state['alpha']}, this "
                f"buffer has {self.alpha}"
            )
        self._pending = []
        self.tree.load_state_dict(state)
        self.max_priority = float(state["max_priority"])


def priorities_state(sampler: PrioritizedSampler | None) -> dict[str, Any]:
    """A buffer's ``state_dict`` entry for its sampler (none when it samples uniformly)."""
    return {} if sampler is None else {"priorities": sampler.state_dict()}


def load_priorities(sampler: PrioritizedSampler | None, state: dict[str, Any]) -> None:
    """Restore :func:`priorities_state`; ValueError when the state and the buffer disagree
    on prioritized sampling (before anything is written)."""
    saved = state.get("priorities")
    if (sampler is None) != (saved is None):
        has, lacks = ("priorities", "none") if saved is not None else ("none", "priorities")
        raise ValueError(f"replay state_dict: saved with {has}, this buffer has {lacks}")
    if sampler is not None:
        sampler.load_state_dict(saved)


def annealed_beta(start: float, progress: float) -> float:
    """The importance-sampling exponent at ``progress`` (0 to 1) of a run: linear from
    ``start`` to 1, as Schaul et al. anneal it (it must reach 1 by the end of learning,
    when the bias of prioritized sampling matters most)."""
    return start + (1.0 - start) * min(1.0, progress)
