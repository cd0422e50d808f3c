"""The replay family: where transitions are stored and how batches are drawn.

- :mod:`agent.replay.flat`: :class:`ReplayBuffer`, whole observations in a ring (vectors,
  small images), on the host or on the GPU;
- :mod:`agent.replay.frames`: :class:`FrameReplayBuffer`, frame stacks (Atari) with each
  frame stored once;
- :mod:`agent.replay.nstep`: the n-step windows both share;
- :mod:`agent.replay.prioritized`: proportional prioritized sampling (a sum tree), which
  both take with ``alpha``;
- :mod:`agent.replay.base`: the :class:`Replay` interface, :class:`Batch`, argument checks
  and the pinned staging slots.
"""

from agent.replay.base import Batch, Replay, choose_storage
from agent.replay.flat import ReplayBuffer
from agent.replay.frames import FrameReplayBuffer
from agent.replay.nstep import NStepWindows
from agent.replay.prioritized import PrioritizedSampler, SumTree

__all__ = [
    "Batch",
    "FrameReplayBuffer",
    "NStepWindows",
    "PrioritizedSampler",
    "Replay",
    "ReplayBuffer",
    "SumTree",
    "choose_storage",
]
