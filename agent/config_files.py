"""How a run's :class:`~agent.config.Config` is resolved from YAML files and overrides.

Precedence, lowest first: ``configs/default.yaml`` < ``configs/<ENV_ID>.yaml`` (or
``configs/atari.yaml`` for ALE ids, ``configs/minatar.yaml`` for MinAtar ids) <
``--config FILE`` < ``--set key=value``. A ``--config`` file may name another as its
``base`` (a preset's name, or a path from its own folder), laid under it. The YAMLs are
the checkout's top-level ``configs/`` folder, which the build ships inside the package as
``agent/configs`` (:data:`CONFIG_DIR` is whichever of the two this copy of the code has).
Unknown keys, wrong types and invalid values raise :class:`UserError` before
anything runs.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml

from agent.config import Config
from agent.errors import UserError

__all__ = [
    "BASE_KEY",
    "CONFIG_DIR",
    "FLAG_MINIMUM",
    "check_flag_values",
    "coerce_value",
    "config_from_dict",
    "config_layers",
    "config_source",
    "env_config_file",
    "load_config",
    "parse_set",
    "presets",
]


def _config_dir() -> Path:
    package = Path(__file__).resolve().parent
    installed = package / "configs"  # a wheel: setup.py maps configs/ here
    return installed if installed.is_dir() else package.parent / "configs"  # a checkout


CONFIG_DIR = _config_dir()
BASE_KEY = "base"  # a config file's key, not a Config field: the file it is laid over


_HINTS = typing.get_type_hints(Config)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (types.UnionType, typing.Union):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"list[{_type_name(typing.get_args(tp)[0])}]"
    if origin is dict:
        return "a mapping such as {key: value}"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any) -> tuple[bool, Any]:
    """(ok, value converted to ``tp``): ints are accepted as floats, nothing else is cast."""
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        for arg in typing.get_args(tp):
            ok, out = _coerce(value, arg)
            if ok:
                return True, out
        return False, None
    if origin is Literal:
        return value in typing.get_args(tp), value
    if origin is list:
        if not isinstance(value, list):
            return False, None
        (item_tp,) = typing.get_args(tp)
        items = [_coerce(v, item_tp) for v in value]
        return all(ok for ok, _ in items), [v for _, v in items]
    if origin is dict:
        if not isinstance(value, dict):
            return False, None
        key_tp, value_tp = typing.get_args(tp)
        pairs = [(_coerce(k, key_tp), _coerce(v, value_tp)) for k, v in value.items()]
        ok = all(k_ok and v_ok for (k_ok, _), (v_ok, _) in pairs)
        return ok, {k: v for (_, k), (_, v) in pairs}
    if tp is Any:
        return True, value
    if tp is type(None):
        return value is None, None
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if tp is float:
        if isinstance(value, str):
            # YAML 1.1 reads "3e-4" (no dot) as a string; accept any float literal.
            try:
                return True, float(value)
            except ValueError:
                return False, None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False, None
        return True, float(value)
    if tp is str:
        return isinstance(value, str), value
    raise TypeError(f"unsupported config type {tp}")


def _apply(values: dict[str, Any], source: str, into: dict[str, Any]) -> None:
    for key, value in values.items():
        if key not in _HINTS:
            close = difflib.get_close_matches(str(key), list(_HINTS), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise UserError(f"unknown config key {key!r} in {source}{hint}")
        ok, converted = _coerce(value, _HINTS[key])
        if not ok:
            raise UserError(
                f"config key {key!r} in {source} must be {_type_name(_HINTS[key])}, got {value!r}"
            )
        into[key] = converted


def coerce_value(key: str, value: Any, source: str) -> Any:
    """``value`` as config key ``key`` holds it (an int is accepted as a float); a
    :class:`UserError` naming ``source`` for an unknown key or a value of the wrong type.
    Ranges are checked with the whole config (:meth:`Config.validate`)."""
    out: dict[str, Any] = {}
    _apply({key: value}, source, out)
    return out[key]


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as e:
        raise UserError(f"cannot read config file {path}: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise UserError(f"config file {path} is not valid YAML: {str(e).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"config file {path} must hold a mapping of key: value")
    return data


def parse_set(items: list[str]) -> dict[str, Any]:
    """``["lr=3e-4", "hidden_sizes=[128,128]"]`` -> values parsed as YAML scalars/lists."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--set expects key=value, got {item!r}")
        try:
            out[key.strip()] = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            raise UserError(f"--set {key}: cannot parse value {raw!r}") from None
    return out


def env_config_file(env_id: str, config_dir: Path = CONFIG_DIR) -> Path | None:
    """``configs/<ENV_ID>.yaml`` (``/`` becomes ``_``), else the family's file:
    ``configs/atari.yaml`` for ALE ids, ``configs/minatar.yaml`` for MinAtar ids."""
    bare = env_id.split(":", 1)[-1]
    path = config_dir / f"{bare.replace('/', '_')}.yaml"
    if path.is_file():
        return path
    family = None
    if bare.startswith("ALE/") or "NoFrameskip" in bare:
        family = config_dir / "atari.yaml"
    elif bare.startswith("MinAtar/"):
        family = config_dir / "minatar.yaml"
    return family if family is not None and family.is_file() else None


# Flags that set a config key, and the least value each takes.
FLAG_MINIMUM = {"seed": 0, "total_steps": 1, "num_envs": 1}


def check_flag_values(args: Any, without_flags: Callable[[], Config]) -> None:
    """A :class:`UserError` for a flag of :data:`FLAG_MINIMUM` below its least value (an
    argparse namespace's attributes), naming the flag and the value the config gives
    without it (``without_flags()``)."""
    for key, least in FLAG_MINIMUM.items():
        value = getattr(args, key, None)
        if value is not None and value < least:
            flag = "--" + key.replace("_", "-")
            raise UserError(
                f"{flag} must be at least {least}, got {value}: e.g. {flag} "
                f"{getattr(without_flags(), key)}, what the config gives without it"
            )


def presets(config_dir: Path | None = None) -> list[str]:
    """The names of the presets shipped with the package (``--config NAME``): the files
    of ``configs/presets/`` (of ``config_dir``), read at each call."""
    folder = (CONFIG_DIR if config_dir is None else config_dir) / "presets"
    return sorted(p.stem for p in folder.glob("*.yaml"))


def _is_name(text: str) -> bool:
    """A preset's name: a word of letters, digits, ``-`` and ``_`` (no ``/`` or ``.``)."""
    return text.replace("-", "").replace("_", "").isalnum()


def config_source(
    config_file: str | Path, config_dir: Path = CONFIG_DIR, named_by: str | None = None
) -> tuple[Path, str]:
    """(the file, how to name it) of ``--config``: a shipped preset by name (a word
    without ``/`` or ``.``, e.g. ``rainbow``), else a path. ``named_by``: what named it,
    for the error (``--config NAME`` unless given)."""
    text = str(config_file)
    if _is_name(text):
        preset = config_dir / "presets" / f"{text}.yaml"
        if preset.is_file():
            return preset, f"the {text} preset"
        names = ", ".join(presets(config_dir)) or "none"
        raise UserError(
            f"{named_by or f'--config {text}'}: no preset of that name (shipped presets: {names}); "
            "give a preset's name or a YAML file's path"
        )
    return Path(config_file), text


def config_layers(
    config_file: str | Path, config_dir: Path = CONFIG_DIR
) -> list[tuple[dict[str, Any], str]]:
    """The settings of ``--config`` and of the files it names as its ``base`` (a preset's
    name, or a path from the naming file's folder), each as (mapping, source), the deepest
    base first: each is laid over the one before it. A chain that comes back to a file it
    has already read is a :class:`UserError`."""
    layers: list[tuple[dict[str, Any], str]] = []
    path, source = config_source(config_file, config_dir)
    read: set[Path] = set()
    while True:
        resolved = path.resolve()
        if resolved in read:
            chain = " -> ".join([s for _, s in layers] + [source])
            raise UserError(f"the config files' bases go round ({chain}): remove one 'base' key")
        read.add(resolved)
        data = _read_yaml(path)
        base = data.pop(BASE_KEY, None)
        layers.append((data, source))
        if base is None:
            return layers[::-1]
        if not isinstance(base, str) or not base:
            raise UserError(
                f"'base' in {source} must be a preset's name or a YAML file's path, got {base!r}"
            )
        named = base if _is_name(base) else path.parent / base
        path, source = config_source(named, config_dir, named_by=f"base: {base} in {source}")


def load_config(
    env_id: str,
    config_file: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    config_dir: Path = CONFIG_DIR,
) -> Config:
    """Resolve defaults < env file < ``config_file`` (a path, or a preset's name) <
    ``overrides`` into a validated Config."""
    values: dict[str, Any] = {}
    _apply(_read_yaml(config_dir / "default.yaml"), "configs/default.yaml", values)
    env_file = env_config_file(env_id, config_dir)
    if env_file is not None:
        _apply(_read_yaml(env_file), f"configs/{env_file.name}", values)
    env_defaults = Config(**{**values, "env_id": env_id})
    if config_file is not None:
        for layer, source in config_layers(config_file, config_dir):
            _apply(layer, source, values)
    _apply(overrides or {}, "--set", values)
    values["env_id"] = env_id
    return Config(**values).validate(env_defaults)


def config_from_dict(data: dict[str, Any], source: str) -> Config:
    """A Config from a saved mapping (a checkpoint's or a run directory's), checked like YAML."""
    values: dict[str, Any] = {}
    _apply(data, source, values)
    return Config(**values).validate()
