"""The sweep's command line: ``--seeds`` and ``--grid`` parsing, and :func:`cmd_sweep` for run.py.

    python run.py --env CartPole-v1 --seeds 10 [--grid sigma0=0.1,0.5 --grid n_step=1,3]
        [--ray-address HOST:PORT] [--retries 1] [--run-dir runs/my-sweep]
    python run.py --resume runs/my-sweep            run only the trials that are missing

:func:`cmd_sweep` checks all of the user's input (flags, grid values, every trial's
config, the Ray address) before Ray starts or anything is written: a mistake ends in
one line that says what to fix.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from agent.usage import command, install_hint
from agent.errors import UserError
from agent.sweep.driver import check_address, run_sweep
from agent.sweep.local import check_local, run_local
from agent.sweep.trials import (
    MANIFEST,
    Trial,
    build_trials,
    is_sweep_dir,
    read_manifest,
    trial_state,
    write_manifest,
)

__all__ = ["cmd_sweep", "default_sweep_dir", "parse_grid", "parse_seeds"]



def parse_seeds(text: str) -> list[int]:
    """``"10"`` -> seeds 1..10; ``"1-10"`` -> 1..10; ``"3,5,8"`` (or ``"0-4,9"``) -> those."""
    text = text.strip()
    if not text:
        raise UserError("--seeds is empty: pass a count (--seeds 10), a range (1-10) or a list")
    if re.fullmatch(r"\d+", text):
        count = int(text)
        if count < 1:
            raise UserError(f"--seeds {text}: the number of seeds must be >= 1, e.g. --seeds 5")
        return list(range(1, count + 1))
    seeds: list[int] = []
    for item in text.split(","):
        item = item.strip()
        m = re.fullmatch(r"(\d+)\s*-\s*(\d+)", item)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            if hi < lo:
                raise UserError(f"--seeds {text}: range {item} is empty (write low-high)")
            seeds.extend(range(lo, hi + 1))
        elif re.fullmatch(r"\d+", item):
            seeds.append(int(item))
        else:
            raise UserError(
                f"--seeds {text}: {item!r} is not a seed; use a count (10), a range (1-10) "
                "or a list of non-negative ints (3,5,8)"
            )
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise UserError(f"--seeds {text}: seed {repeated[0]} is listed twice")
    return seeds


def _split_top_level(raw: str) -> list[str]:
    """Split on commas outside brackets: ``[64,64],[128]`` -> ``["[64,64]", "[128]"]``."""
    parts, depth, current = [], 0, []
    for ch in raw:
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def parse_grid(items: list[str]) -> dict[str, list[Any]]:
    """``["sigma0=0.1,0.5", "n_step=1,3"]`` -> ``{"sigma0": [0.1, 0.5], "n_step": [1, 3]}``.

    Values are YAML, as for ``--set`` (``hidden_sizes=[64,64],[128,128]``). Keys are
    checked against the config; types and ranges are checked by :func:`build_trials`.
    """
    import difflib

    import yaml

    from agent.config import Config
    from agent.config_files import coerce_value

    known = [f.name for f in _config_fields(Config)]
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UserError(f"--grid expects key=value1,value2, got {item!r}")
        if key == "seed":
            raise UserError("--grid seed=...: seeds are given with --seeds (e.g. --seeds 1-10)")
        if key == "env_id":
            raise UserError("--grid env_id=...: a sweep trains one env; run one sweep per env")
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise UserError(f"--grid: unknown config key {key!r}{hint}; see --list-config")
        if key in grid:
            raise UserError(f"--grid {key} is given twice: list all its values in one --grid")
        texts = [t.strip() for t in _split_top_level(raw)]
        if not raw.strip() or any(not t for t in texts):
            raise UserError(
                f"--grid {key}: empty value in {raw!r}; write --grid {key}=value1,value2"
            )
        values = []
        for t in texts:
            try:
                value = yaml.safe_load(t)
            except yaml.YAMLError:
                raise UserError(f"--grid {key}: cannot parse value {t!r}") from None
            values.append(coerce_value(key, value, "--grid"))  # type errors name --grid
        if len({json.dumps(v, sort_keys=True) for v in values}) < len(values):
            raise UserError(f"--grid {key}: a value is listed twice in {raw!r}")
        grid[key] = values
    return grid


def _config_fields(cls: Any) -> tuple[Any, ...]:
    import dataclasses

    return dataclasses.fields(cls)


# run.py flags that define what a sweep trains: with --resume they must match the manifest.
_DEFINING = ("env", "config", "seed", "total_steps", "num_envs", "device", "seeds")


def default_sweep_dir(env_id: str) -> Path:
    """``runs/<ENV>__sweep__<time>``: where a sweep goes without --run-dir."""
    name = env_id.split(":", 1)[-1].replace("/", "_")
    return Path("runs") / f"{name}__sweep__{time.strftime('%Y%m%d-%H%M%S')}"


def _trials_from_args(args: argparse.Namespace) -> tuple[list[Trial], dict[str, Any]]:
    from agent.config_files import check_flag_values, load_config, parse_set
    from envs import check_env_id

    if not args.env:
        raise UserError(f"--env is required for a sweep: e.g. {command()} --env CartPole-v1")
    grid = parse_grid(args.grid or [])
    overrides: dict[str, Any] = parse_set(args.set or [])
    for key in ("total_steps", "num_envs", "device"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    if getattr(args, "track", False):
        overrides["track"] = True
    if args.seeds is not None:
        if args.seed is not None:
            raise UserError("--seed and --seeds together: drop --seed (--seeds 3,5,8 lists seeds)")
        seeds = parse_seeds(args.seeds)
    else:
        seeds = [args.seed] if args.seed is not None else []
    for key in grid:
        if key in overrides:
            raise UserError(f"{key} is both in --grid and set by another flag: drop one")
    check_env_id(args.env)
    check_flag_values(args, lambda: load_config(args.env, args.config, parse_set(args.set or [])))
    if not seeds:
        seeds = [load_config(args.env, args.config, overrides).seed]
    trials = build_trials(args.env, args.config, overrides, seeds, grid)
    definition = {
        "env_id": args.env,
        "config_file": args.config,
        "overrides": overrides,
        "seeds": seeds,
        "grid": grid,
    }
    return trials, definition


def _require_ray() -> None:
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise UserError(
            f"--ray-address needs Ray: {install_hint('sweep')}, or drop --ray-address to "
            "train the seeds in this process"
        )


def cmd_sweep(args: argparse.Namespace) -> int:
    """``run.py`` with --seeds, --grid, --ray-address, or --resume of a sweep directory."""
    if args.eval:
        raise UserError("--eval evaluates one checkpoint: drop --seeds/--grid/--ray-address")
    if args.retries is not None and args.retries < 0:
        raise UserError(f"--retries must be >= 0, got {args.retries}")
    retries = 1 if args.retries is None else args.retries
    # Ray only where asked for: --ray-address HOST:PORT joins a cluster, "local" starts
    # one over this machine's cores; otherwise the seeds train stacked in this process.
    use_ray = args.ray_address is not None
    ray_address = None if args.ray_address == "local" else args.ray_address
    if args.resume:
        sweep_dir = Path(args.resume)
        if not is_sweep_dir(sweep_dir):
            raise UserError(
                f"{sweep_dir} is not a sweep directory (no {MANIFEST}): --seeds/--grid start a "
                "new sweep with --run-dir, --resume continues one"
            )
        if args.run_dir is not None and Path(args.run_dir).resolve() != sweep_dir.resolve():
            raise UserError("--run-dir and --resume name different directories: drop --run-dir")
        manifest, trials = read_manifest(sweep_dir)
        if any(getattr(args, f) is not None for f in _DEFINING) or args.set or args.grid:
            # "The same command with --resume": it must describe this very sweep.
            again, _ = _trials_from_args(args)
            if [(t.run_dir, t.config) for t in again] != [(t.run_dir, t.config) for t in trials]:
                raise UserError(
                    f"{sweep_dir} holds a different sweep than these flags describe: resume it "
                    f"with {command()} --resume {sweep_dir} alone, or pass another --run-dir"
                )
        if use_ray:
            _require_ray_if_needed(sweep_dir, trials)
    else:
        trials, definition = _trials_from_args(args)
        if ray_address is not None:
            check_address(ray_address)  # before anything is written
        sweep_dir = Path(args.run_dir) if args.run_dir else default_sweep_dir(args.env)
        if is_sweep_dir(sweep_dir):
            raise UserError(
                f"{sweep_dir} already holds a sweep: continue it with --resume {sweep_dir}, "
                "or pass another --run-dir"
            )
        if sweep_dir.exists() and (not sweep_dir.is_dir() or any(sweep_dir.iterdir())):
            raise UserError(f"{sweep_dir} exists and is not empty: pass another --run-dir")
        if use_ray:
            _require_ray()  # after every check of the user's input, before anything is written
        else:
            check_local(trials)
        try:
            sweep_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(
                f"cannot create the sweep directory {sweep_dir} ({e.strerror}): "
                "pass a writable --run-dir"
            ) from None
        manifest = {
            "sweep_id": uuid.uuid4().hex,
            "created": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": command() + " " + " ".join(sys.argv[1:]),
            **definition,
            "trials": [t.__dict__ for t in trials],
        }
        write_manifest(sweep_dir, manifest)
    if not use_ray:
        return run_local(sweep_dir, manifest, trials, progress=not args.no_progress)
    try:
        return run_sweep(
            sweep_dir,
            manifest,
            trials,
            ray_address=ray_address,
            retries=retries,
            progress=not args.no_progress,
        )
    except UserError:
        # A new sweep whose Ray never started leaves nothing behind but its manifest.
        if not args.resume and [p.name for p in sweep_dir.iterdir()] == [MANIFEST]:
            shutil.rmtree(sweep_dir)
        raise


def _require_ray_if_needed(sweep_dir: Path, trials: list[Trial]) -> None:
    if any(trial_state(sweep_dir, t) != "done" for t in trials):
        _require_ray()
