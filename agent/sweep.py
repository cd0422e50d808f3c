"""Many seeds and hyperparameter grids, trained in parallel on Ray.

    python run.py --env CartPole-v1 --seeds 10 [--grid sigma0=0.1,0.5 --grid n_step=1,3]
        [--ray-address HOST:PORT] [--retries 1] [--run-dir runs/my-sweep]
    python run.py --resume runs/my-sweep            run only the trials that are missing

A sweep directory holds ``sweep.json`` (the manifest: every trial and its resolved
config, written before anything runs), one ordinary run directory per trial
(``<configuration>/seed_<n>/`` with TensorBoard events, checkpoints and
``result.json``), and at the end ``summary.md``, ``summary.json`` and
``eval_curves.png``.

Each trial is one plain Ray task with one CPU that calls :func:`agent.train.train`
with one torch thread. Plain tasks rather than Ray Tune: a seed x grid sweep is a
fixed list of independent trials (no search algorithm, no scheduler), and keeping
the state in our own run directories (not in Tune's experiment pickles) makes
``--resume``, retries and the summary readable and checkable file by file; it
also needs only the ``ray`` core package.

The statistics are the ones rliable recommends (Agarwal et al. 2021): the
interquartile mean (IQM) over seeds with a percentile bootstrap 95% confidence
interval. Nothing here needs Ray except :func:`run_sweep`; Ray is imported there.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import re
import shutil
import socket
import sys
import tarfile
import tempfile
import time
import traceback
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import Any

import numpy as np

from agent.errors import UserError

__all__ = [
    "MANIFEST",
    "Trial",
    "bootstrap_ci",
    "build_trials",
    "cmd_sweep",
    "iqm",
    "is_sweep_dir",
    "parse_grid",
    "parse_seeds",
    "run_sweep",
    "run_trial",
    "summarize",
]

MANIFEST = "sweep.json"
INSTALL_HINT = 'sweeps need Ray: pip install -e ".[sweep]"'
EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130
DONE = ("finished", "solved")  # result.json statuses of a trial that needs no more work


# ---------------------------------------------------------------------------------------------
# Parsing --seeds and --grid
# ---------------------------------------------------------------------------------------------


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

    from agent.config import Config, _apply

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
            checked: dict[str, Any] = {}
            _apply({key: value}, "--grid", checked)  # type errors name --grid
            values.append(checked[key])
        if len({json.dumps(v, sort_keys=True) for v in values}) < len(values):
            raise UserError(f"--grid {key}: a value is listed twice in {raw!r}")
        grid[key] = values
    return grid


def _config_fields(cls: Any) -> tuple[Any, ...]:
    import dataclasses

    return dataclasses.fields(cls)


# ---------------------------------------------------------------------------------------------
# Trials
# ---------------------------------------------------------------------------------------------


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

    from agent.config import load_config

    keys = list(grid)
    points = [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*grid.values())]
    trials: list[Trial] = []
    dirs: set[str] = set()
    for point in points:
        label = " ".join(f"{k}={_fmt(v)}" for k, v in point.items()) or "base"
        base_dir = "_".join(f"{k}={_dir_part(v)}" for k, v in point.items())
        cfg_dir = base_dir
        n = 2
        while cfg_dir in dirs:  # two values that differ only in odd characters
            cfg_dir, n = f"{base_dir}_{n}", n + 1
        dirs.add(cfg_dir)
        for seed in seeds:
            values = {**overrides, **point, "seed": seed}
            try:
                cfg = load_config(env_id, config_file, values)
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


def is_sweep_dir(path: str | Path) -> bool:
    return (Path(path) / MANIFEST).is_file()


def write_manifest(sweep_dir: Path, manifest: dict[str, Any]) -> None:
    tmp = sweep_dir / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2))
    os.replace(tmp, sweep_dir / MANIFEST)


def read_manifest(sweep_dir: Path) -> tuple[dict[str, Any], list[Trial]]:
    try:
        manifest = json.loads((sweep_dir / MANIFEST).read_text())
        trials = [Trial(**t) for t in manifest["trials"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(
            f"{sweep_dir / MANIFEST} is unreadable or not a sweep manifest ({e}): "
            "start a new sweep with another --run-dir"
        ) from None
    return manifest, trials


# ---------------------------------------------------------------------------------------------
# Trial state on disk
# ---------------------------------------------------------------------------------------------


def _read_result(run_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((run_dir / "result.json").read_text())
    except (OSError, ValueError):
        return None


def trial_state(sweep_dir: Path, trial: Trial) -> str:
    """``done``, ``failed``, ``interrupted`` (a checkpoint to continue from) or ``missing``."""
    run_dir = sweep_dir / trial.run_dir
    result = _read_result(run_dir)
    if result is not None and result.get("status") in DONE:
        return "done"
    if (run_dir / "error.txt").exists():
        return "failed"
    if (run_dir / "checkpoints" / "last.pt").exists():
        return "interrupted"
    return "missing"


# ---------------------------------------------------------------------------------------------
# Statistics (rliable's recommendations, on the seeds of one configuration)
# ---------------------------------------------------------------------------------------------


def iqm(values: Any) -> float:
    """Interquartile mean: the mean of the middle 50% (``scipy.stats.trim_mean(x, 0.25)``)."""
    x = np.sort(np.asarray(values, dtype=np.float64).ravel())
    if x.size == 0:
        raise ValueError("iqm of no values")
    k = int(0.25 * x.size)
    return float(x[k : x.size - k].mean())


def _iqm_rows(samples: np.ndarray) -> np.ndarray:
    n = samples.shape[1]
    k = int(0.25 * n)
    return np.sort(samples, axis=1)[:, k : n - k].mean(axis=1)


def bootstrap_ci(
    values: Any,
    statistic: str = "iqm",
    confidence: float = 0.95,
    reps: int = 50_000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of the IQM (or ``"mean"``) over seeds.

    Resamples the seeds with replacement ``reps`` times (rliable's default of 50 000)
    with a fixed ``seed``, so the same results always give the same interval.
    """
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size == 0:
        raise ValueError("confidence interval of no values")
    rng = np.random.default_rng(seed)
    samples = x[rng.integers(0, x.size, size=(reps, x.size))]
    stats = _iqm_rows(samples) if statistic == "iqm" else samples.mean(axis=1)
    tail = 100 * (1 - confidence) / 2
    lo, hi = np.percentile(stats, [tail, 100 - tail])
    return float(lo), float(hi)


def steps_to_solve(result: dict[str, Any]) -> int | None:
    """Env steps until the policy first counted as solved, or None.

    The confirmed early stop (``solved_step``) when training stopped on it; otherwise the
    first periodic evaluation >= target_return; otherwise the end of training when the
    final evaluation reached it.
    """
    target = result.get("target_return")
    if result.get("solved_step") is not None:
        return int(result["solved_step"])
    if target is None:
        return None
    for step, value in result.get("eval_curve") or []:
        if value >= target:
            return int(step)
    final = result.get("final_eval_return")
    if final is not None and final >= target:
        return int(result["global_step"])
    return None


def _percentiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    q25, med, q75 = np.percentile(np.asarray(values, dtype=np.float64), [25, 50, 75])
    return {"median": float(med), "q25": float(q25), "q75": float(q75), "iqr": float(q75 - q25)}


def summarize(
    sweep_dir: Path, manifest: dict[str, Any], trials: list[Trial], wall_time_s: float | None
) -> dict[str, Any]:
    """Per-trial results read back from each run directory, and per-configuration statistics."""
    rows: list[dict[str, Any]] = []
    for t in trials:
        run_dir = sweep_dir / t.run_dir
        state = trial_state(sweep_dir, t)
        result = _read_result(run_dir) if state == "done" else None
        row: dict[str, Any] = {
            "name": t.name,
            "configuration": t.label,
            "params": t.params,
            "seed": t.seed,
            "run_dir": t.run_dir,
            "state": state,
        }
        if result is not None:
            row.update(
                status=result["status"],
                global_step=result["global_step"],
                target_return=result.get("target_return"),
                solved_step=result.get("solved_step"),
                steps_to_solve=steps_to_solve(result),
                final_eval_return=result.get("final_eval_return"),
                wall_time_s=result.get("wall_time_s"),
                eval_curve=result.get("eval_curve") or [],
            )
        if state == "failed":
            text = (run_dir / "error.txt").read_text(errors="replace").strip().splitlines()
            row["error"] = text[0] if text else "failed"
        rows.append(row)

    configurations: list[dict[str, Any]] = []
    for label in dict.fromkeys(t.label for t in trials):
        mine = [r for r in rows if r["configuration"] == label]
        done = [r for r in mine if r["state"] == "done"]
        targets = {r["target_return"] for r in done}
        target = targets.pop() if len(targets) == 1 else None
        finals = [r["final_eval_return"] for r in done if r["final_eval_return"] is not None]
        solved_steps = [r["steps_to_solve"] for r in done if r["steps_to_solve"] is not None]
        walls = [r["wall_time_s"] for r in done if r["wall_time_s"] is not None]
        final_stats = None
        if finals:
            lo, hi = bootstrap_ci(finals)
            final_stats = {
                "iqm": iqm(finals),
                "ci95_low": lo,
                "ci95_high": hi,
                "mean": float(np.mean(finals)),
                "n": len(finals),
            }
        configurations.append(
            {
                "configuration": label,
                "params": mine[0]["params"],
                "seeds": len(mine),
                "done": len(done),
                "failed": sum(r["state"] == "failed" for r in mine),
                "not_run": sum(r["state"] in ("missing", "interrupted") for r in mine),
                "target_return": target,
                "solved": None if target is None else len(solved_steps),
                "steps_to_solve": _percentiles([float(s) for s in solved_steps]),
                "final_eval_return": final_stats,
                "wall_time_s": (
                    {"median": float(np.median(walls)), "total": float(np.sum(walls))}
                    if walls
                    else None
                ),
            }
        )
    return {
        "env_id": manifest["env_id"],
        "sweep_dir": str(sweep_dir),
        "trials_total": len(trials),
        "trials_done": sum(r["state"] == "done" for r in rows),
        "trials_failed": sum(r["state"] == "failed" for r in rows),
        "complete": all(r["state"] == "done" for r in rows),
        "wall_time_s": wall_time_s,
        "method": (
            "final_eval_return: IQM over seeds (mean of the middle 50%) with a 95% percentile "
            "bootstrap CI (50000 resamples of the seeds, numpy seed 0), as rliable recommends; "
            "steps_to_solve: median and quartiles over the solved seeds; a seed is solved at "
            "its confirmed early stop, else at its first evaluation >= target_return, else at "
            "the end when its final evaluation reaches target_return"
        ),
        "configurations": configurations,
        "trials": rows,
    }


def _num(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def format_summary(summary: dict[str, Any]) -> str:
    """The summary as a markdown document (also printed to the terminal)."""
    lines = [f"# Sweep summary: {summary['env_id']}", ""]
    total, done, failed = (
        summary["trials_total"],
        summary["trials_done"],
        summary["trials_failed"],
    )
    state = "complete" if summary["complete"] else "INCOMPLETE"
    wall = summary.get("wall_time_s")
    wall_text = f", this invocation's wall-clock {wall:.0f} s" if wall is not None else ""
    lines.append(
        f"{total} trials, {done} finished, {failed} failed, {total - done - failed} unfinished "
        f"({state}){wall_text}. Directory: `{summary['sweep_dir']}`."
    )
    lines += [
        "",
        "| configuration | seeds solved | steps to solve: median [q25, q75] "
        "| final eval return: IQM [95% CI] | wall-clock per seed (median) | failed |",
        "|---|---|---|---|---|---|",
    ]
    for c in summary["configurations"]:
        if c["solved"] is None:
            solved = "n/a (no target)"
        else:
            solved = f"{c['solved']}/{c['done']}" + (
                f" (of {c['seeds']})" if c["done"] < c["seeds"] else ""
            )
        s = c["steps_to_solve"]
        steps = "n/a" if s is None else f"{s['median']:.0f} [{s['q25']:.0f}, {s['q75']:.0f}]"
        f = c["final_eval_return"]
        final = (
            "n/a"
            if f is None
            else f"{f['iqm']:.1f} [{f['ci95_low']:.1f}, {f['ci95_high']:.1f}] (n={f['n']})"
        )
        w = c["wall_time_s"]
        wall_cell = "n/a" if w is None else f"{w['median']:.0f} s"
        lines.append(
            f"| {c['configuration']} | {solved} | {steps} | {final} | {wall_cell} | {c['failed']} |"
        )
    targets = {c["target_return"] for c in summary["configurations"]} - {None}
    if targets:
        lines += ["", f"Target return (solved): {', '.join(_num(t) for t in sorted(targets))}."]
    lines += ["", f"Method: {summary['method']}."]
    failed_rows = [r for r in summary["trials"] if r["state"] == "failed"]
    if failed_rows:
        lines += ["", "Failed trials (full traceback in RUN_DIR/error.txt):", ""]
        lines += [f"- `{r['run_dir']}`: {r['error']}" for r in failed_rows]
    return "\n".join(lines) + "\n"


def plot_curves(summary: dict[str, Any], path: Path) -> str | None:
    """Evaluation return vs env steps per configuration: mean over seeds with a 95% band.

    Returns a one-line note when the plot was skipped (no matplotlib, no curves).
    A seed that stopped early keeps its last evaluation to the end of the axis.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return 'note: no eval_curves.png (needs matplotlib: pip install -e ".[bench]")'
    curves: dict[str, list[list[tuple[int, float]]]] = {}
    for r in summary["trials"]:
        if r["state"] == "done" and r.get("eval_curve"):
            curves.setdefault(r["configuration"], []).append(r["eval_curve"])
    if not curves:
        return "note: no eval_curves.png (no periodic evaluations: eval_interval is 0?)"
    fig, ax = plt.subplots(figsize=(8, 5))
    for label, seed_curves in curves.items():
        steps = np.array(sorted({int(s) for c in seed_curves for s, _ in c}))
        table = np.empty((len(seed_curves), steps.size))
        for i, c in enumerate(seed_curves):
            cs = np.array([s for s, _ in c], dtype=np.int64)
            cv = np.array([v for _, v in c], dtype=np.float64)
            idx = np.searchsorted(cs, steps, side="right") - 1  # last evaluation at or before
            table[i] = np.where(idx >= 0, cv[np.clip(idx, 0, None)], np.nan)
        mean = np.nanmean(table, axis=0)
        lo, hi = np.empty_like(mean), np.empty_like(mean)
        for j in range(steps.size):
            col = table[:, j][~np.isnan(table[:, j])]
            lo[j], hi[j] = bootstrap_ci(col, statistic="mean", reps=2_000)
        (line,) = ax.plot(steps, mean, label=f"{label} ({len(seed_curves)} seeds)")
        ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.2)
    targets = {c["target_return"] for c in summary["configurations"]} - {None}
    for t in targets:
        ax.axhline(t, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("environment steps")
    ax.set_ylabel("noise-free evaluation return")
    ax.set_title(f"{summary['env_id']}: mean over seeds, 95% bootstrap band")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


def write_summary(
    sweep_dir: Path, manifest: dict[str, Any], trials: list[Trial], wall_time_s: float | None
) -> tuple[dict[str, Any], str, str | None]:
    summary = summarize(sweep_dir, manifest, trials, wall_time_s)
    text = format_summary(summary)
    (sweep_dir / "summary.md").write_text(text)
    (sweep_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    note = plot_curves(summary, sweep_dir / "eval_curves.png")
    return summary, text, note


# ---------------------------------------------------------------------------------------------
# One trial (runs in a Ray worker)
# ---------------------------------------------------------------------------------------------


def _sees_sweep_dir(sweep_dir: Path, sweep_id: str) -> bool:
    """True when this process sees the driver's sweep directory (same machine or shared FS)."""
    try:
        return json.loads((sweep_dir / MANIFEST).read_text()).get("sweep_id") == sweep_id
    except (OSError, ValueError):
        return False


def _quiet(*args: Any, **kwargs: Any) -> None:
    pass


def run_trial(trial: dict[str, Any], sweep_dir: str, sweep_id: str) -> dict[str, Any]:
    """Train one trial; returns its result (and its run directory as a tar.gz when remote).

    On the driver's filesystem the run directory is written in place, continuing from
    its ``checkpoints/last.pt`` when an earlier attempt left one. On a machine that
    does not see the sweep directory it trains in a temporary directory and ships the
    whole run directory back in the result.
    """
    import torch

    from agent.checkpoint import load_checkpoint
    from agent.config import config_from_dict
    from agent.train import train

    torch.set_num_threads(1)
    spec = Trial(**trial)
    cfg = config_from_dict(dict(spec.config), f"sweep trial {spec.name}")
    local = _sees_sweep_dir(Path(sweep_dir), sweep_id)
    scratch = None
    if local:
        run_dir = Path(sweep_dir) / spec.run_dir
    else:
        scratch = Path(tempfile.mkdtemp(prefix="noisy-dqn-trial-"))
        run_dir = scratch / "run"
    checkpoint = None
    last = run_dir / "checkpoints" / "last.pt"
    if last.exists():
        try:
            checkpoint = load_checkpoint(last)
        except UserError:
            checkpoint = None
    if checkpoint is None and run_dir.exists():
        shutil.rmtree(run_dir)  # a failed start: begin afresh, no stale event files
    with contextlib.suppress(FileNotFoundError):
        (run_dir / "error.txt").unlink()
    result = train(cfg, run_dir, checkpoint=checkpoint, progress=False, echo=_quiet)
    out = dict(result.__dict__)
    out["host"] = socket.gethostname()
    out["archive"] = None
    if scratch is not None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            tar.add(run_dir, arcname=".")
        out["archive"] = buf.getvalue()
        shutil.rmtree(scratch, ignore_errors=True)
    return out


def _unpack(archive: bytes, run_dir: Path) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4
            tar.extractall(run_dir, filter="data")
        else:  # pragma: no cover
            tar.extractall(run_dir)  # our own archive, from our own worker


# ---------------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------------


class _Display:
    """Trial events as lines; on a terminal also one status line, rewritten in place."""

    def __init__(self, total: int, live: bool, stream: Any = None) -> None:
        self.stream = stream or sys.stderr
        self.live = live and self.stream.isatty()
        self.total = total
        self.done = self.failed = self.running = 0
        self.best: tuple[float, str] | None = None
        self.start = time.perf_counter()
        self._shown = False

    def _clear(self) -> None:
        if self._shown:
            self.stream.write("\r\033[K")
            self._shown = False

    def event(self, text: str) -> None:
        self._clear()
        print(text, file=self.stream, flush=True)
        self.status()

    def counts(self) -> str:
        pending = self.total - self.done - self.failed - self.running
        best = "" if self.best is None else f" | best {self.best[0]:.1f} ({self.best[1]})"
        return (
            f"{self.running} running, {self.done} done, {self.failed} failed, {pending} pending"
            f"{best}"
        )

    def status(self) -> None:
        if self.live:
            elapsed = time.perf_counter() - self.start
            self.stream.write(f"\r\033[K[{elapsed:6.0f} s] {self.counts()}")
            self.stream.flush()
            self._shown = True

    def close(self) -> None:
        self._clear()


def _error_line(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        exc = cause
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _deterministic(exc: BaseException) -> bool:
    """A failure that retrying cannot fix: a bad config value, a diverged run."""
    from agent.learner import NonFiniteError

    cause = getattr(exc, "cause", None)
    return isinstance(exc, (UserError, NonFiniteError)) or isinstance(
        cause, (UserError, NonFiniteError)
    )


def _check_address(address: str) -> None:
    """Fail fast, in one line, on an address nothing listens at (ray.init can hang)."""
    if address == "auto":
        return
    rest = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UserError(
            f"--ray-address {address}: expected HOST:PORT of a Ray head (e.g. 10.0.0.5:6379), "
            "ray://HOST:10001, or auto"
        )
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=5):
            pass
    except OSError as e:
        raise UserError(
            f"--ray-address {address}: cannot reach a Ray head there ({e.strerror or e}); "
            "start one with: ray start --head, or drop --ray-address to run locally"
        ) from None


def _init_ray(address: str | None, num_cpus: int | None) -> Any:
    import logging

    import ray

    if address is None:
        ray.init(
            address="local",
            num_cpus=num_cpus,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.ERROR,
        )
        return ray
    _check_address(address)
    root = Path(__file__).resolve().parent.parent
    try:
        ray.init(
            address=address,
            log_to_driver=False,
            logging_level=logging.WARNING,
            # Ship this checkout's code so every node runs the same version.
            runtime_env={"py_modules": [str(root / "agent"), str(root / "envs")]},
        )
    except Exception as e:  # ConnectionError, version mismatch, auth: one line
        raise UserError(
            f"--ray-address {address}: cannot join the Ray cluster ({_error_line(e)}); "
            "check the address printed by `ray start --head` and that Ray versions match"
        ) from None
    return ray


def run_sweep(
    sweep_dir: Path,
    manifest: dict[str, Any],
    trials: list[Trial],
    *,
    ray_address: str | None = None,
    num_cpus: int | None = None,
    retries: int = 1,
    progress: bool = True,
    trial_fn: Callable[..., dict[str, Any]] = run_trial,
    stop_grace_s: float = 60.0,
    out: Any = None,
) -> int:
    """Run every trial that is not done yet; write the summary. Returns the exit status.

    0: every trial finished; 1: some failed (the others are kept and summarised);
    130: interrupted (finished trials kept; ``--resume SWEEP_DIR`` runs the rest).
    """
    out = out or sys.stdout
    start = time.perf_counter()
    todo = [t for t in trials if trial_state(sweep_dir, t) != "done"]
    skipped = len(trials) - len(todo)
    display = _Display(len(trials), progress)
    display.done = skipped
    interrupted = False
    failed: dict[str, str] = {}
    if skipped:
        print(f"{skipped} of {len(trials)} trials already finished: not run again", file=out)
    if todo:
        ray = _init_ray(ray_address, num_cpus)
        try:
            cpus = ray.cluster_resources().get("CPU", 1)
            where = "local Ray" if ray_address is None else f"Ray cluster at {ray_address}"
            print(
                f"sweep: {len(todo)} trials on {where} ({cpus:.0f} CPUs, one per trial)\n"
                f"sweep directory: {sweep_dir}\nwatch it with: tensorboard --logdir {sweep_dir}",
                file=out,
                flush=True,
            )
            interrupted = _drive(
                ray, sweep_dir, manifest, todo, retries, trial_fn, display, failed, stop_grace_s
            )
        finally:
            display.close()
            ray.shutdown()
    wall = time.perf_counter() - start
    summary, text, note = write_summary(sweep_dir, manifest, trials, wall)
    print("\n" + text, file=out)
    print(f"summary: {sweep_dir}/summary.md, {sweep_dir}/summary.json", file=out)
    if note:
        print(note, file=out)
    else:
        print(f"curves: {sweep_dir}/eval_curves.png", file=out)
    if interrupted:
        print(
            f"interrupted: {summary['trials_done']} of {len(trials)} trials finished and kept; "
            f"run the rest with: python run.py --resume {sweep_dir}",
            file=out,
        )
        return EXIT_INTERRUPTED
    if summary["trials_failed"]:
        print(
            f"{summary['trials_failed']} trial(s) failed (see summary.md); retry them with: "
            f"python run.py --resume {sweep_dir}",
            file=out,
        )
        return 1
    return 0


def _drive(
    ray: Any,
    sweep_dir: Path,
    manifest: dict[str, Any],
    todo: list[Trial],
    retries: int,
    trial_fn: Callable[..., dict[str, Any]],
    display: _Display,
    failed: dict[str, str],
    stop_grace_s: float,
) -> bool:
    """Submit trials as CPUs free up, collect results, retry crashes. True if interrupted."""
    remote = ray.remote(num_cpus=1, max_retries=0)(trial_fn)
    queue: deque[Trial] = deque(todo)
    attempts: dict[str, int] = {}
    in_flight: dict[Any, Trial] = {}
    sweep_id = manifest["sweep_id"]

    def submit(t: Trial) -> None:
        attempts[t.name] = attempts.get(t.name, 0) + 1
        in_flight[remote.remote(t.__dict__, str(sweep_dir.resolve()), sweep_id)] = t
        display.running = len(in_flight)

    def collect(ref: Any, stopping: bool) -> None:
        t = in_flight.pop(ref)
        display.running = len(in_flight)
        run_dir = sweep_dir / t.run_dir
        try:
            res = ray.get(ref)
        except Exception as e:
            if stopping or type(e).__name__ == "TaskCancelledError":
                return
            line = _error_line(e)
            if not _deterministic(e) and attempts[t.name] <= retries:
                display.event(f"retry   {t.name}: attempt {attempts[t.name]} failed: {line}")
                queue.append(t)
                return
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "error.txt").write_text(
                f"{line}\n\nattempts: {attempts[t.name]}\n\n"
                + "".join(traceback.format_exception(e))
            )
            failed[t.name] = line
            display.failed += 1
            display.event(f"FAILED  {t.name}: {line}")
            return
        if res.get("archive") and _read_result(run_dir) is None:
            _unpack(res["archive"], run_dir)
        if res["status"] not in DONE:  # stopped by its own SIGINT
            return
        display.done += 1
        final = res.get("final_eval_return")
        if final is not None and (display.best is None or final > display.best[0]):
            display.best = (final, t.name)
        solved = (
            f"solved at {res['solved_step']}" if res.get("solved_step") is not None else "finished"
        )
        display.event(
            f"done    {t.name}: {solved}, final return {_num(final)}, "
            f"{res['wall_time_s']:.0f} s | {display.counts()}"
        )

    try:
        while queue or in_flight:
            capacity = max(1, int(ray.cluster_resources().get("CPU", 1)))
            while queue and len(in_flight) < capacity:
                submit(queue.popleft())
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=1.0)
            for ref in ready:
                collect(ref, stopping=False)
            display.status()
        return False
    except KeyboardInterrupt:
        display.event(
            f"stopping: {len(in_flight)} running trial(s) save a checkpoint and stop "
            "(Ctrl-C again to kill them)"
        )
        try:
            for ref in in_flight:
                ray.cancel(ref, force=False)  # SIGINT in the task: train() saves and returns
            ready, _ = ray.wait(list(in_flight), num_returns=len(in_flight), timeout=stop_grace_s)
            for ref in ready:
                collect(ref, stopping=True)
        except KeyboardInterrupt:
            pass
        for ref in list(in_flight):
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        return True


# ---------------------------------------------------------------------------------------------
# Command line (called by run.py)
# ---------------------------------------------------------------------------------------------

# run.py flags that define what a sweep trains: with --resume they must match the manifest.
_DEFINING = ("env", "config", "seed", "total_steps", "num_envs", "device", "seeds")


def default_sweep_dir(env_id: str) -> Path:
    name = env_id.split(":", 1)[-1].replace("/", "_")
    return Path("runs") / f"{name}__sweep__{time.strftime('%Y%m%d-%H%M%S')}"


def _trials_from_args(args: argparse.Namespace) -> tuple[list[Trial], dict[str, Any]]:
    from agent.config import parse_set
    from envs import check_env_id

    if not args.env:
        raise UserError("--env is required for a sweep: e.g. python run.py --env CartPole-v1")
    grid = parse_grid(args.grid or [])
    overrides: dict[str, Any] = parse_set(args.set or [])
    for key in ("total_steps", "num_envs", "device"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
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
    if not seeds:
        from agent.config import load_config

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
        raise UserError(INSTALL_HINT)


def cmd_sweep(args: argparse.Namespace) -> int:
    """``run.py`` with --seeds, --grid, --ray-address, or --resume of a sweep directory."""
    if args.eval:
        raise UserError("--eval evaluates one checkpoint: drop --seeds/--grid/--ray-address")
    if args.retries is not None and args.retries < 0:
        raise UserError(f"--retries must be >= 0, got {args.retries}")
    retries = 1 if args.retries is None else args.retries
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
                    f"with python run.py --resume {sweep_dir} alone, or pass another --run-dir"
                )
        _require_ray_if_needed(sweep_dir, trials)
    else:
        trials, definition = _trials_from_args(args)
        if args.ray_address is not None:
            _check_address(args.ray_address)  # before anything is written
        sweep_dir = Path(args.run_dir) if args.run_dir else default_sweep_dir(args.env)
        if is_sweep_dir(sweep_dir):
            raise UserError(
                f"{sweep_dir} already holds a sweep: continue it with --resume {sweep_dir}, "
                "or pass another --run-dir"
            )
        if sweep_dir.exists() and (not sweep_dir.is_dir() or any(sweep_dir.iterdir())):
            raise UserError(f"{sweep_dir} exists and is not empty: pass another --run-dir")
        _require_ray()  # after every check of the user's input, before anything is written
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
            "command": "python run.py " + " ".join(sys.argv[1:]),
            **definition,
            "trials": [t.__dict__ for t in trials],
        }
        write_manifest(sweep_dir, manifest)
    try:
        return run_sweep(
            sweep_dir,
            manifest,
            trials,
            ray_address=args.ray_address,
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
