"""Environment families from other packages: MinAtar and MiniGrid, by their bare ids.

* **MinAtar** (Young & Tian 2019; ``MinAtar/Breakout-v0``, ``-v1`` with the minimal
  action set): minatar registers its ids through a gymnasium plugin hook that gymnasium
  1.x no longer calls, so :func:`register_family` calls ``minatar.gym.register_envs``
  itself. Observations are ``(10, 10, C)`` bool grids, one channel per object kind:
  :func:`adapt_minatar` makes them ``(C, 10, 10)`` for the MinAtar CNN (by the game's
  layout, not by shape: Seaquest has 10 channels on its 10x10 grid).
  MinAtar's sticky actions repeat the previous action with probability 0.1, and the
  previous action outlives ``reset``: :class:`MinAtarEpisodes` sets it to no-op at every
  reset, as the ALE does, so an episode depends on its seed and its actions only (exact
  resume and evaluation need that).
* **MiniGrid** (``MiniGrid-*`` and ``BabyAI-*`` ids, registered when minigrid is
  imported): a ``Dict`` observation of the agent's 7x7 egocentric view as (object,
  colour, state) codes, its direction and a mission text. :func:`adapt_minigrid` keeps
  the view, one-hot encoded (the codes are categories, not intensities): one bool
  channel per object kind, colour and state, ``(21, 7, 7)``, the same kind of input as
  MinAtar's. minigrid's own ``OneHotPartialObsWrapper`` encodes the same way, but cell
  by cell in Python (about 40% of a DoorKey step) and with three state channels, which
  the agent's direction (0-3) overflows under ``FullyObsWrapper``: here the encoding
  is vectorised and has four. The direction and the mission are dropped, as
  ``ImgObsWrapper`` does for most MiniGrid baselines; a task whose mission varies
  between episodes needs a wrapper of the user's that encodes it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from agent.errors import UserError
from agent.usage import install_hint

__all__ = [
    "FAMILIES",
    "MinAtarEpisodes",
    "adapt_minatar",
    "adapt_minigrid",
    "family_of",
    "is_minatar",
    "is_minigrid_dict",
    "register_family",
]


@dataclass(frozen=True)
class Family:
    """A package whose ids start with ``prefix``: its extra, and how its ids get registered."""

    name: str
    prefixes: tuple[str, ...]
    extra: str
    register: Callable[[], None]
    versions_differ: bool = False
    """Its -v0 and -v1 ids are variants, not old and new: gymnasium's "out of date"
    warning at ``make`` of a -v0 id is wrong and is silenced."""


def _register_minatar() -> None:
    minatar_gym = importlib.import_module("minatar.gym")
    if "MinAtar/Breakout-v0" not in gym.registry:
        minatar_gym.register_envs()


def _register_minigrid() -> None:
    importlib.import_module("minigrid")  # registers every MiniGrid and BabyAI id


FAMILIES = (
    Family("MinAtar", ("MinAtar/",), "minatar", _register_minatar, versions_differ=True),
    Family("MiniGrid", ("MiniGrid-", "BabyAI-"), "minigrid", _register_minigrid),
)


def family_of(env_id: str) -> Family | None:
    """The family whose prefix ``env_id`` (without a ``module:`` part) starts with."""
    name = env_id.rpartition(":")[2]
    return next((f for f in FAMILIES if name.startswith(f.prefixes)), None)


def register_family(family: Family) -> None:
    """Register the family's ids; its package missing is a UserError naming the extra."""
    try:
        family.register()
    except ImportError as e:
        raise UserError(
            f"{family.name} environments need the {family.extra} extra ({e.name} is missing): "
            f"{install_hint(family.extra)}"
        ) from None


class MinAtarEpisodes(gym.Wrapper):
    """Resets MinAtar's sticky-action memory with the episode (no-op, as the ALE does)."""

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        game = getattr(self.env.unwrapped, "game", None)
        if game is not None and hasattr(game, "last_action"):
            game.last_action = 0
        return self.env.reset(**kwargs)


def is_minatar(env: gym.Env) -> bool:
    gym_module = sys.modules.get("minatar.gym")
    return gym_module is not None and isinstance(env.unwrapped, gym_module.BaseEnv)


def adapt_minatar(env: gym.Env) -> gym.Env:
    """MinAtar's ``(H, W, C)`` grids as ``(C, H, W)`` bool, unless a wrapper changed them."""
    from gymnasium.wrappers import TransformObservation

    space = env.observation_space
    if not (isinstance(space, gym.spaces.Box) and space == env.unwrapped.observation_space):
        return env
    height, width, channels = space.shape
    chw = gym.spaces.Box(0, 1, shape=(channels, height, width), dtype=np.bool_)

    def channel_first(obs: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(obs.transpose(2, 0, 1), dtype=np.bool_)

    return TransformObservation(env, channel_first, chw)


def is_minigrid_dict(env: gym.Env) -> bool:
    """True for a MiniGrid env whose observations are still minigrid's own dict."""
    if "minigrid" not in sys.modules:
        return False
    from minigrid.minigrid_env import MiniGridEnv

    space = env.observation_space
    return (
        isinstance(env.unwrapped, MiniGridEnv)
        and isinstance(space, gym.spaces.Dict)
        and "image" in space.spaces
    )


def adapt_minigrid(env: gym.Env) -> gym.Env:
    """The agent's view one-hot encoded, channel-first ``(C, H, W)`` bool (module docstring)."""
    from gymnasium.wrappers import TransformObservation
    from minigrid.core.constants import COLOR_TO_IDX, OBJECT_TO_IDX, STATE_TO_IDX

    height, width, _ = env.observation_space["image"].shape
    n_objects, n_colours = len(OBJECT_TO_IDX), len(COLOR_TO_IDX)
    # Door states (open, closed, locked), or the agent's direction (0-3) in a full view.
    n_states = max(len(STATE_TO_IDX), 4)
    channels = n_objects + n_colours + n_states
    rows, cols = np.indices((height, width))
    space = gym.spaces.Box(0, 1, shape=(channels, height, width), dtype=np.bool_)

    def one_hot(obs: dict[str, Any]) -> np.ndarray:
        codes = obs["image"]  # (H, W, 3): object, colour, state
        out = np.zeros((channels, height, width), dtype=np.bool_)
        out[codes[:, :, 0], rows, cols] = True
        out[n_objects + codes[:, :, 1], rows, cols] = True
        out[n_objects + n_colours + codes[:, :, 2], rows, cols] = True
        return out

    return TransformObservation(env, one_hot, space)
