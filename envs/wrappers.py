"""Users' own gymnasium wrappers, named by import path in the config key ``wrappers``.

Each entry is ``"module:Class"`` or a one-key mapping ``{"module:Class": {kwargs}}``
(the form of RL Zoo's ``env_wrapper``), for example::

    wrappers:
      - minigrid.wrappers:FullyObsWrapper
      - gymnasium.wrappers:TimeAwareObservation: {flatten: true}

They wrap the env as ``gymnasium.make`` returns it, in the order given, before the
project's own preprocessing (Atari's, MiniGrid's, the observation adaptation), inside
:func:`envs.make_env`: training, evaluation, ``--video`` and ``--export`` all see them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym

from agent.errors import UserError

__all__ = ["WrapperSpec", "apply_wrappers", "load_wrapper"]

WrapperSpec = str | Mapping[str, Mapping[str, Any] | None]


def _parse(spec: WrapperSpec) -> tuple[str, dict[str, Any]]:
    if isinstance(spec, str):
        return spec, {}
    if isinstance(spec, Mapping) and len(spec) == 1:
        ((path, kwargs),) = spec.items()
        if kwargs is None or isinstance(kwargs, Mapping):
            return str(path), dict(kwargs or {})
    raise UserError(
        f"wrappers entry {spec!r} must be 'module:Class' or {{'module:Class': {{key: value}}}}: "
        "fix it in wrappers"
    )


def load_wrapper(spec: WrapperSpec) -> tuple[str, Callable[..., gym.Env], dict[str, Any]]:
    """(import path, the wrapper class or factory, its keyword arguments) of one entry."""
    path, kwargs = _parse(spec)
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        hint = path.rpartition(".")
        example = f"{hint[0]}:{hint[2]}" if hint[1] else "gymnasium.wrappers:TimeAwareObservation"
        raise UserError(f"wrapper {path!r} must be named as module:Class, e.g. {example!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UserError(
            f"wrapper {path!r}: cannot import {module_name!r} ({e}); check the name and that "
            "its package is installed"
        ) from None
    try:
        wrapper = module
        for part in attr.split("."):
            wrapper = getattr(wrapper, part)
    except AttributeError:
        raise UserError(f"wrapper {path!r}: {module_name} has no {attr!r}") from None
    if isinstance(wrapper, type) and not issubclass(wrapper, gym.Wrapper):
        raise UserError(
            f"wrapper {path!r} is not a gymnasium wrapper (a subclass of gymnasium.Wrapper): "
            "remove it from wrappers"
        )
    if not callable(wrapper):
        raise UserError(f"wrapper {path!r} is not a class or function: remove it from wrappers")
    return path, wrapper, kwargs


def apply_wrappers(env: gym.Env, specs: Sequence[WrapperSpec] | None) -> gym.Env:
    """``env`` wrapped by each entry of ``specs`` in turn; a bad entry is a UserError
    (the env is closed first)."""
    for spec in specs or ():
        try:
            path, wrapper, kwargs = load_wrapper(spec)
            try:
                wrapped = wrapper(env, **kwargs)
            except (TypeError, ValueError, AssertionError, KeyError) as e:
                reason = str(e).splitlines()[0] if str(e) else type(e).__name__
                raise UserError(
                    f"wrapper {path!r} with {kwargs} failed on {env} ({reason}): fix its keyword "
                    "arguments or remove it from wrappers"
                ) from None
            if not isinstance(wrapped, gym.Env):
                raise UserError(
                    f"wrapper {path!r} returned {type(wrapped).__name__}, not a gymnasium env: "
                    "remove it from wrappers"
                )
        except UserError:
            env.close()
            raise
        env = wrapped
    return env
