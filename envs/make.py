"""Build gymnasium environments and check that the agent can drive them.

Vector environments run with gymnasium's ``AutoresetMode.DISABLED``: the training
loop resets an ended sub-environment itself, with a seed derived from
``(seed, env index, episode number)``. Two things follow:

* every step the vector env returns is a real transition and ``next_obs`` is the
  true final observation when an episode ends (no ``final_obs`` juggling, no
  fake reset transition as in the default ``NEXT_STEP`` mode);
* an episode is a pure function of its seed and its actions, so a resumed run
  rebuilds the exact state of its environments by replaying the actions of the
  current episodes (see ``agent/train.py``).

Atari (ALE) ids get the standard DQN preprocessing from gymnasium's own wrappers
(:func:`make_atari`): the ALE env is built with ``frameskip=1`` (sticky actions stay
as the id defines them: 0.25 for ``ALE/...-v5``, none for ``...NoFrameskip-v4``),
then ``AtariPreprocessing`` (up to 30 no-op actions at reset, frame skip 4 with a
max over the last two frames, 84x84 grayscale uint8) and ``FrameStackObservation``
(the last 4 frames, padded with the reset frame): observations are ``(4, 84, 84)``
uint8. Episodes are whole games and rewards are the raw score: reward clipping
and terminal-on-life-loss are training-only and live in the training loop
(config keys ``clip_rewards`` and ``terminal_on_life_loss``), so evaluation and
the logged returns always see the real game.

Every other env gets its observations adapted by :func:`adapt_observations`, inside
:func:`make_env` (the one factory of training's vector env, evaluation and video, so
the three cannot differ), with gymnasium's own wrappers:

* ``Box`` of rank 1: as it is.
* ``Box`` of rank 3 (an image): channel-last ``(H, W, C)`` (the last dimension smaller
  than the other two) is transposed to ``(C, H, W)``; channel-first stays. Images of
  36x36 and up go to the Nature CNN; smaller ones (at least 3x3, e.g. MinAtar's 10x10
  grids) to the MinAtar CNN, with uint8 pixels scaled to float32 in [0, 1] (bool and
  float values stay as they are). Smaller than 3x3: flattened.
* ``Box`` of rank 4 (a stack of images, e.g. ``FrameStackObservation`` over RGB frames):
  ``(S, H, W, C)`` or ``(S, C, H, W)`` becomes ``(S * C, H, W)``, by the same rules.
* ``Box`` of rank 2: a uint8 frame of at least 36x36 becomes a one-channel image
  ``(1, H, W)``; anything else is flattened (``FlattenObservation``).
* ``Box`` of rank 0 or > 4: flattened.
* ``Discrete``, ``MultiDiscrete``, ``MultiBinary`` and ``Tuple`` / ``Dict`` of those
  (and of ``Box``): ``FlattenObservation`` (one-hot for the discrete parts, as
  ``gymnasium.spaces.flatten`` defines it), then ``DtypeObservation`` to float32.
* Anything else (``Text``, ``Graph``, ``Sequence``, ``OneOf``, or a Tuple holding
  one): a :class:`UserError` saying so.

``env_kwargs`` (the config key) are passed to every ``gymnasium.make`` of a run; a
keyword the env does not take is a :class:`UserError` naming it. ``wrappers`` (the
config key, :mod:`envs.wrappers`) wrap the env as ``gymnasium.make`` returns it, before
any of the above. MinAtar and MiniGrid ids are registered on first use and MiniGrid's
dict observations encoded (:mod:`envs.families`).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from agent.errors import UserError
from agent.usage import install_hint
from agent.signals import ignore_stop_signals
from envs.families import (
    MinAtarEpisodes,
    adapt_minatar,
    adapt_minigrid,
    family_of,
    is_minatar,
    is_minigrid_dict,
    register_family,
)
from envs.wrappers import WrapperSpec, apply_wrappers

__all__ = [
    "ATARI_FRAME_SKIP",
    "ATARI_FRAME_STACK",
    "ATARI_SCREEN_SIZE",
    "MIN_IMAGE_SIZE",
    "EnvSpec",
    "adapt_observations",
    "check_env_id",
    "episode_seed",
    "inspect_env",
    "is_atari",
    "make_atari",
    "make_env",
    "make_vector_env",
]

# The DQN (Nature, 2015) preprocessing used by the NoisyNet paper.
ATARI_FRAME_SKIP = 4
ATARI_SCREEN_SIZE = 84
ATARI_FRAME_STACK = 4
ATARI_NOOP_MAX = 30
_ALE_ENTRY_POINT = "ale_py.env:AtariEnv"
# The smallest image kept as an image (the MinAtar CNN's 3x3 kernel); smaller ones are flattened.
MIN_IMAGE_SIZE = 3
# The smallest single 2-D uint8 frame read as a one-channel image (the Nature CNN's minimum).
MIN_FRAME_SIZE = 36


@dataclass(frozen=True)
class EnvSpec:
    """What the agent needs to know about an environment, as plain values."""

    env_id: str
    obs_shape: tuple[int, ...]
    obs_dtype: str
    n_actions: int
    reward_threshold: float | None
    max_episode_steps: int | None


def _is_atari_id(env_id: str) -> bool:
    return env_id.startswith("ALE/") or "NoFrameskip" in env_id


def _register_atari() -> None:
    try:
        ale_py = importlib.import_module("ale_py")
    except ImportError:
        raise UserError(
            f"Atari environments need the atari extra: {install_hint('atari')}"
        ) from None
    gym.register_envs(ale_py)


def _try_register_atari() -> None:
    try:
        ale_py = importlib.import_module("ale_py")
    except ImportError:
        return
    gym.register_envs(ale_py)


def check_env_id(env_id: str) -> None:
    """Raise :class:`UserError` (with close ids as suggestions) unless ``env_id`` is registered.

    ``module:Env-v0`` ids import ``module`` first, as ``gymnasium.make`` does; MinAtar,
    MiniGrid and ALE ids are registered from their packages on first use.
    """
    module, _, name = env_id.rpartition(":")
    before = set(gym.registry)
    if module:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise UserError(
                f"cannot import the module of env id {env_id!r} ({e}); check the module name "
                "before ':' and that it is installed"
            ) from None
    family = family_of(name)
    if name not in gym.registry:
        if family is not None:
            register_family(family)  # a one-line error naming the extra when it is missing
        elif _is_atari_id(name):
            _register_atari()  # a one-line error when the atari extra is missing
        else:
            _try_register_atari()  # other ALE ids (e.g. Pong-v4), if ale-py is there
    try:
        gym.spec(name)
        return
    except gym.error.Error:
        pass
    close = difflib.get_close_matches(name, list(gym.registry), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}?" if close else "see gymnasium.pprint_registry()"
    if module:
        added = sorted(set(gym.registry) - before)
        found = f"it registered {len(added)} other ids" if added else "it registered no ids"
        raise UserError(
            f"importing {module!r} did not register {name!r} ({found}): {hint}"
        )
    if family is None and not close:
        hint += (
            "; an env from another package: name the module that registers it, "
            "--env package.module:Env-v0"
        )
    raise UserError(f"unknown environment id {env_id!r}: {hint}")


def is_atari(env_id: str) -> bool:
    """True for a registered ALE game with image observations (after :func:`check_env_id`)."""
    try:
        spec = gym.spec(env_id.rpartition(":")[2])
    except gym.error.Error:
        return False
    return spec.entry_point == _ALE_ENTRY_POINT and spec.kwargs.get("obs_type", "rgb") in (
        "rgb",
        "grayscale",
    )


def _constructor_arguments(env_id: str) -> list[str]:
    """Keyword names the env's constructor takes (for hints; empty when they cannot be read)."""
    from gymnasium.envs.registration import load_env_creator

    try:
        entry = gym.spec(env_id.rpartition(":")[2]).entry_point
        creator = load_env_creator(entry) if isinstance(entry, str) else entry
        parameters = inspect.signature(creator).parameters.values()
    except (gym.error.Error, ImportError, AttributeError, TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in parameters if p.kind in kinds and p.name != "render_mode"]


def _missing_dependency(env_id: str, message: str) -> str:
    """The line for an env whose package is missing, from gymnasium's ``message``: what is
    missing and the last ``pip install`` it names, the smallest that works (for Box2D,
    ``gymnasium[box2d]`` alone: a ready-built wheel, or swig as its own dependency where
    it builds; gymnasium's own message passes on a ``pip install swig`` step first)."""
    missing = re.match(r"\s*(\S+) is not installed", message)
    installs = re.findall(r"`(pip install [^`]+)`", message)
    if missing is None or not installs:
        return f"{env_id} needs a package that is not installed: {message}"
    return f"{env_id} needs {missing.group(1)}, which is not installed: {installs[-1]}"


def _gym_make(env_id: str, env_kwargs: Mapping[str, Any] | None, **fixed: Any) -> gym.Env:
    """``gymnasium.make`` with the user's ``env_kwargs``; a keyword it rejects is a UserError."""
    user = dict(env_kwargs or {})
    try:
        return gym.make(env_id, **user, **fixed)
    except gym.error.DependencyNotInstalled as e:
        raise UserError(_missing_dependency(env_id, str(e))) from None
    except (TypeError, ValueError, KeyError) as e:
        if not user:
            raise
        found = re.search(r"unexpected keyword argument '(\w+)'", str(e))
        if found:
            key, names = found.group(1), _constructor_arguments(env_id)
            close = difflib.get_close_matches(key, names, n=1)
            if close:
                hint = f"did you mean {close[0]}?"
            elif names:
                hint = f"it takes {', '.join(names)}"
            else:
                hint = "see the env's constructor"
            raise UserError(
                f"{env_id} does not accept env_kwargs key {key!r} ({hint}): fix or remove it "
                "in env_kwargs"
            ) from None
        reason = str(e).splitlines()[0] if str(e) else ""
        raise UserError(
            f"{env_id} rejected env_kwargs {user} ({type(e).__name__}: {reason}): "
            "fix or remove those values"
        ) from None


def make_atari(
    env_id: str,
    *,
    render_mode: str | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    wrappers: Sequence[WrapperSpec] | None = None,
) -> gym.Env:
    """An ALE game with DQN preprocessing: ``(4, 84, 84)`` uint8 stacks, raw rewards, full games.

    The ALE env is made with ``frameskip=1`` so that ``AtariPreprocessing`` does the
    skipping (and the max-pooling over the last two frames), and with grayscale
    observations, which the preprocessing ignores (it reads the screen); sticky actions
    (``repeat_action_probability``) stay as the id defines them unless ``env_kwargs``
    set them.
    """
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    if env_kwargs and "frameskip" in env_kwargs:
        raise UserError(
            "env_kwargs cannot set frameskip for Atari ids: the DQN preprocessing skips "
            f"{ATARI_FRAME_SKIP} frames itself; remove it from env_kwargs"
        )
    fixed: dict[str, Any] = {"frameskip": 1}
    if not (env_kwargs and "obs_type" in env_kwargs):
        # AtariPreprocessing reads the ALE screen itself; an RGB observation copied out
        # at every emulator frame would be thrown away.
        fixed["obs_type"] = "grayscale"
    if render_mode is not None:
        fixed["render_mode"] = render_mode
    env = apply_wrappers(_gym_make(env_id, env_kwargs, **fixed), wrappers)
    try:
        env = AtariPreprocessing(
            env,
            noop_max=ATARI_NOOP_MAX,
            frame_skip=ATARI_FRAME_SKIP,
            screen_size=ATARI_SCREEN_SIZE,
            terminal_on_life_loss=False,  # training-only, done by the loop (replay terminal)
            grayscale_obs=True,
            scale_obs=False,
        )
    except gym.error.DependencyNotInstalled:
        env.close()
        raise UserError(
            f"Atari preprocessing needs OpenCV: {install_hint('atari')} "
            "(or pip install opencv-python-headless)"
        ) from None
    return FrameStackObservation(env, ATARI_FRAME_STACK, padding_type="reset")


def _flattenable(space: gym.Space) -> bool:
    """True for spaces ``gymnasium.spaces.flatten`` turns into a meaningful fixed-size vector."""
    spaces = gym.spaces
    if isinstance(space, (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)):
        return True
    if isinstance(space, spaces.Tuple):
        return all(_flattenable(s) for s in space.spaces)
    if isinstance(space, spaces.Dict):
        return all(_flattenable(s) for s in space.spaces.values())
    return False


def _is_image(height: int, width: int) -> bool:
    return min(height, width) >= MIN_IMAGE_SIZE


def _pixel_scale(space: gym.spaces.Box, height: int, width: int) -> float | None:
    """255 for a small uint8 image (the MinAtar CNN takes values in [0, 1]), else None."""
    small = min(height, width) < MIN_FRAME_SIZE
    return 255.0 if small and space.dtype == np.uint8 else None


def _channel_first(env: gym.Env, space: gym.spaces.Box) -> gym.Env:
    """Images ``(H, W, C)`` / ``(C, H, W)`` and stacks of them ``(S, H, W, C)`` / ``(S, C, H, W)``
    as ``(channels, H, W)`` (a stack's frames and channels merged); too small: flattened."""
    from gymnasium.wrappers import FlattenObservation, TransformObservation

    shape = space.shape
    lead = len(shape) - 3  # 1 for a stack
    if shape[-1] < shape[-3] and shape[-1] < shape[-2]:  # channel-last
        axes = (*range(lead), lead + 2, lead, lead + 1)
    else:
        axes = tuple(range(len(shape)))
    moved = tuple(shape[a] for a in axes)
    height, width = moved[-2:]
    if not _is_image(height, width):
        return FlattenObservation(env)
    out = (int(np.prod(moved[:-2])), height, width)
    scale = _pixel_scale(space, height, width)
    if out == shape and scale is None:
        return env

    def to_chw(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.transpose(x, axes)).reshape(out)

    if scale is None:
        chw = gym.spaces.Box(to_chw(space.low), to_chw(space.high), dtype=space.dtype)
        return TransformObservation(env, to_chw, chw)

    def to_scaled_chw(x: np.ndarray) -> np.ndarray:
        return to_chw(x).astype(np.float32) / np.float32(scale)

    scaled = gym.spaces.Box(0.0, 1.0, shape=out, dtype=np.float32)
    return TransformObservation(env, to_scaled_chw, scaled)


def adapt_observations(env: gym.Env) -> gym.Env:
    """``env`` with observations the Q-network takes: vectors ``(D,)`` or images ``(C, H, W)``.

    The rules are in this module's docstring; every adaptation is one of gymnasium's
    observation wrappers, so it applies to ``reset`` and ``step`` alike and the
    wrapped env keeps rendering (video) as before.
    """
    from gymnasium.wrappers import DtypeObservation, FlattenObservation, ReshapeObservation

    space = env.observation_space
    if isinstance(space, gym.spaces.Box):
        shape = space.shape
        if len(shape) == 1:
            return env
        if len(shape) in (3, 4):
            return _channel_first(env, space)
        if len(shape) == 2 and space.dtype == np.uint8 and min(shape) >= MIN_FRAME_SIZE:
            return ReshapeObservation(env, (1, *shape))  # one grayscale frame
        return FlattenObservation(env)
    if _flattenable(space):
        return DtypeObservation(FlattenObservation(env), np.float32)
    raise UserError(
        f"observation space {space} cannot be flattened into a fixed-size vector (Noisy DQN "
        "takes Box, Discrete, MultiDiscrete, MultiBinary, and Tuple or Dict of those): "
        "wrap the env to give such observations"
    )


def make_env(
    env_id: str,
    *,
    render_mode: str | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    wrappers: Sequence[WrapperSpec] | None = None,
) -> gym.Env:
    """One environment (for evaluation, video, and the factory of each vector sub-environment).

    ``gymnasium.make`` with ``env_kwargs``, then the user's ``wrappers``, then the
    preprocessing of the id's family: Atari ids the DQN preprocessing
    (:func:`make_atari`), MinAtar and MiniGrid observations theirs (:mod:`envs.families`),
    and every env :func:`adapt_observations`.
    """
    check_env_id(env_id)
    if is_atari(env_id):
        return make_atari(env_id, render_mode=render_mode, env_kwargs=env_kwargs, wrappers=wrappers)
    fixed = {} if render_mode is None else {"render_mode": render_mode}
    family = family_of(env_id)
    with warnings.catch_warnings():
        if family is not None and family.versions_differ:
            warnings.filterwarnings("ignore", ".*is out of date", DeprecationWarning)
        env = _gym_make(env_id, env_kwargs, **fixed)
    minatar = is_minatar(env)
    if minatar:
        env = MinAtarEpisodes(env)
    env = apply_wrappers(env, wrappers)
    try:
        if minatar:
            env = adapt_minatar(env)
        elif is_minigrid_dict(env):
            env = adapt_minigrid(env)
        return adapt_observations(env)
    except UserError as e:
        env.close()
        raise UserError(f"{env_id}: {e}") from None


def inspect_env(
    env_id: str,
    env_kwargs: Mapping[str, Any] | None = None,
    wrappers: Sequence[WrapperSpec] | None = None,
) -> EnvSpec:
    """Build the env once, check for Discrete actions and report the adapted observations."""
    env = make_env(env_id, env_kwargs=env_kwargs, wrappers=wrappers)
    try:
        obs_space, act_space = env.observation_space, env.action_space
        if not isinstance(act_space, gym.spaces.Discrete):
            raise UserError(
                f"{env_id} has a {type(act_space).__name__} action space; Noisy DQN needs a "
                "Discrete action space: pick an environment with discrete actions"
            )
        assert isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) in (1, 3)
        spec = env.spec
        return EnvSpec(
            env_id=env_id,
            obs_shape=tuple(int(s) for s in obs_space.shape),
            obs_dtype=np.dtype(obs_space.dtype).name,
            n_actions=int(act_space.n),
            reward_threshold=None if spec is None else spec.reward_threshold,
            max_episode_steps=None if spec is None else spec.max_episode_steps,
        )
    finally:
        env.close()


def make_vector_env(
    env_id: str,
    num_envs: int,
    vector: str = "sync",
    env_kwargs: Mapping[str, Any] | None = None,
    wrappers: Sequence[WrapperSpec] | None = None,
) -> gym.vector.VectorEnv:
    """``num_envs`` copies of ``env_id`` that the caller resets itself (autoreset disabled):
    ``sync``, stepped one after another in this process; ``async``, each in a worker
    process; ``ale``, an ALE game's copies in ale-py's ``AtariVectorEnv``, stepped by C++
    threads with the same preprocessing (:mod:`envs.ale_vector`)."""
    if num_envs < 1:
        raise UserError(f"num_envs must be >= 1, got {num_envs}: pass --num-envs 1 or more")
    check_env_id(env_id)
    kwargs = dict(env_kwargs or {})
    wrapper_specs = list(wrappers or [])
    mode = gym.vector.AutoresetMode.DISABLED
    if vector == "sync":
        fns: list[Callable[[], gym.Env]] = [
            lambda: make_env(env_id, env_kwargs=kwargs, wrappers=wrapper_specs)
            for _ in range(num_envs)
        ]
        return gym.vector.SyncVectorEnv(fns, autoreset_mode=mode)
    if vector == "async":
        parent = os.getpid()

        def worker_env() -> gym.Env:
            # A terminal's Ctrl-C (or Slurm's SIGTERM) reaches the whole process group:
            # workers ignore it and let the parent save and close them. (AsyncVectorEnv
            # also calls this factory once in the parent, for the spaces.)
            if os.getpid() != parent:
                ignore_stop_signals()
            return make_env(env_id, env_kwargs=kwargs, wrappers=wrapper_specs)

        return gym.vector.AsyncVectorEnv([worker_env] * num_envs, autoreset_mode=mode)
    if vector == "ale":
        return _ale_vector_env(env_id, num_envs, kwargs, wrapper_specs)
    raise UserError(
        f"vector must be 'sync', 'async' or 'ale', got {vector!r}: use --set vector=sync"
    )


def _ale_vector_env(
    env_id: str, num_envs: int, env_kwargs: Mapping[str, Any], wrappers: Sequence[WrapperSpec]
) -> gym.vector.VectorEnv:
    """ale-py's ``AtariVectorEnv`` with :func:`make_atari`'s protocol (:mod:`envs.ale_vector`)."""
    from envs.ale_vector import AleVectorEnv

    if not is_atari(env_id):
        raise UserError(
            f"vector=ale steps ALE games only, and {env_id} is not one: --set vector=sync"
        )
    if wrappers:
        raise UserError(
            "vector=ale cannot apply wrappers: AtariVectorEnv's copies live in C++; "
            "--set vector=async applies them"
        )
    return AleVectorEnv(env_id, num_envs, env_kwargs, frame_skip=ATARI_FRAME_SKIP,
                        screen_size=ATARI_SCREEN_SIZE, frame_stack=ATARI_FRAME_STACK,
                        noop_max=ATARI_NOOP_MAX)  # fmt: skip


def episode_seed(seed: int, env_index: int, episode: int, stream: int = 0) -> int:
    """The reset seed of episode ``episode`` of sub-environment ``env_index``.

    Independent streams per (run seed, stream, env, episode), so that a resumed
    run can re-create any episode without replaying the ones before it, and
    evaluation episodes (another ``stream``) never repeat training's.
    """
    state = np.random.SeedSequence([seed, stream, env_index, episode]).generate_state(1)
    return int(state[0])
