"""The trials of a sweep: every grid point x seed, the manifest, and each trial's state on disk.

A sweep directory holds ``sweep.json`` (the manifest: every trial and its resolved config,
written before anything runs) and one ordinary run directory per trial
(``<configuration>/seed_<n>/``). Whether a trial still needs work is read back from its
run directory, never kept in memory, so ``--resume`` after any stop sees the truth.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.errors import UserError

__all__ = [
    "DONE",
    "MANIFEST",
    "Trial",
    "build_trials",
    "by_grid_point",
    "is_sweep_dir",
    "read_manifest",
    "read_result",
    "remaining",
    "trial_state",
    "trials_of_points",
    "write_manifest",
]

MANIFEST = "sweep.json"
DONE = ("finished", "solved")  # result.json statuses of a trial that needs no more work


def _fmt(value: Any) -> str:
    """Compact display of a config value: ``[64,64]``, ``true``, ``null``, ``0.1``."""
    return json.dumps(value, separators=(",", ":")) if not isinstance(value, str) else value


def _dir_part(value: Any) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", _fmt(value)).strip("-") or "x"


@dataclass
class Trial:
    """One (grid point, seed): its resolved config and its run directory inside the sweep."""

    name: str
    """``"sigma0=0.1 n_step=3 seed=2"``: unique within the sweep."""
    label: str
    """The grid point, ``"sigma0=0.1 n_step=3"`` (``"base"`` without --grid)."""
    params: dict[str, Any]
    seed: int
    run_dir: str
    """Relative to the sweep directory."""
    config: dict[str, Any] = field(repr=False)


def build_trials(
    env_id: str,
    config_file: str | None,
    overrides: dict[str, Any],
    seeds: list[int],
    grid: dict[str, list[Any]],
) -> list[Trial]:
    """Every grid point x seed, each config resolved and validated now (before Ray starts)."""
    import itertools

    keys = list(grid)
    points = [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*grid.values())]
    return trials_of_points(env_id, config_file, overrides, seeds, points)


def trials_of_points(
    env_id: str | None,
    config_file: str | None,
    overrides: dict[str, Any],
    seeds: list[int],
    points: list[dict[str, Any]],
    names: list[str] | None = None,
) -> list[Trial]:
    """Every point x seed, each config resolved and validated now: a point is config values
    over ``overrides`` (an ``env_id`` among them trains that env instead of ``env_id``).
    ``names``: each point's label and directory (``Alien/der``: nested directories); by
    default ``key=value`` pairs."""
    from agent.config_files import load_config

    if names is not None and (len(names) != len(points) or len(set(names)) != len(names)):
        raise ValueError("trials_of_points needs one distinct name per point")
    trials: list[Trial] = []
    dirs: set[str] = set()
    for i, point in enumerate(points):
        if names is None:
            label = " ".join(f"{k}={_fmt(v)}" for k, v in point.items()) or "base"
            base_dir = "_".join(f"{k}={_dir_part(v)}" for k, v in point.items())
        else:
            label = names[i]
            base_dir = "/".join(_dir_part(part) for part in names[i].split("/"))
        cfg_dir = base_dir
        n = 2
        while cfg_dir in dirs:  # two values that differ only in odd characters
            cfg_dir, n = f"{base_dir}_{n}", n + 1
        dirs.add(cfg_dir)
        values_of_point = {k: v for k, v in point.items() if k != "env_id"}
        point_env = point.get("env_id", env_id)
        if point_env is None:
            raise ValueError(f"point {label} names no env_id, and there is no default")
        for seed in seeds:
            values = {**overrides, **values_of_point, "seed": seed}
            try:
                cfg = load_config(point_env, config_file, values)
            except UserError as e:
                where = f"grid point {label}" if point else "the sweep's config"
                raise UserError(f"{where}: {e}") from None
            run_dir = f"{cfg_dir}/seed_{seed}" if cfg_dir else f"seed_{seed}"
            trials.append(
                Trial(
                    name=f"{label} seed={seed}" if point else f"seed={seed}",
                    label=label,
                    params=point,
                    seed=seed,
                    run_dir=run_dir,
                    config=cfg.to_dict(),
                )
            )
    return trials


def by_grid_point(trials: list[Trial]) -> list[list[Trial]]:
    """``trials`` by grid point (their ``label``), in order: the seeds that can train together."""
    points: dict[str, list[Trial]] = {}
    for t in trials:
        points.setdefault(t.label, []).append(t)
    return list(points.values())


def is_sweep_dir(path: str | Path) -> bool:
    """True when ``path`` holds a sweep manifest (run.py's --resume tells sweeps from runs)."""
    return (Path(path) / MANIFEST).is_file()


def write_manifest(sweep_dir: Path, manifest: dict[str, Any]) -> None:
    """Write ``sweep.json`` atomically: a crash leaves the old manifest or the new, never half."""
    tmp = sweep_dir / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2))
    os.replace(tmp, sweep_dir / MANIFEST)


def read_manifest(sweep_dir: Path) -> tuple[dict[str, Any], list[Trial]]:
    """The manifest and its trials; a one-line UserError when it is not one."""
    try:
        manifest = json.loads((sweep_dir / MANIFEST).read_text())
        trials = [Trial(**t) for t in manifest["trials"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(
            f"{sweep_dir / MANIFEST} is unreadable or not a sweep manifest ({e}): "
            "start a new sweep with another --run-dir"
        ) from None
    return manifest, trials


def read_result(run_dir: Path) -> dict[str, Any] | None:
    """A run directory's ``result.json`` (written by train() when it returns), or None."""
    try:
        return json.loads((run_dir / "result.json").read_text())
    except (OSError, ValueError):
        return None


def remaining(sweep_dir: Path, trials: list[Trial]) -> list[Trial]:
    """The trials not done yet, grouped by grid point in the order a sweep runs them: the
    grid points with a run stopped at a checkpoint first (a resumed sweep finishes what it
    had started before it starts anything new), then the others; each part in the order
    the grid points first appear in the manifest, done trials included."""
    first: dict[str, int] = {}
    for i, t in enumerate(trials):
        first.setdefault(t.label, i)
    states = [(t, trial_state(sweep_dir, t)) for t in trials]
    todo = [t for t, state in states if state != "done"]
    started = {t.label for t, state in states if state == "interrupted"}
    return sorted(todo, key=lambda t: (t.label not in started, first[t.label]))  # stable


def trial_state(sweep_dir: Path, trial: Trial) -> str:
    """``done``, ``failed``, ``interrupted`` (a checkpoint to continue from) or ``missing``."""
    run_dir = sweep_dir / trial.run_dir
    result = read_result(run_dir)
    if result is not None and result.get("status") in DONE:
        return "done"
    if (run_dir / "error.txt").exists():
        return "failed"
    if (run_dir / "checkpoints" / "last.pt").exists():
        return "interrupted"
    return "missing"
