"""The end of a sweep: per-configuration results read back from the run directories.

:func:`write_summary` writes ``summary.json`` (every trial and every configuration's
statistics), ``summary.md`` (the table the sweep also prints) and ``eval_curves.png``
(evaluation return vs env steps; skipped with a one-line note without matplotlib).
Everything is recomputed from the files on disk, so a summary after ``--resume``
covers the trials of every invocation.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from agent.sweep.stats import bootstrap_ci, iqm, percentiles, steps_to_solve
from agent.sweep.trials import Trial, read_result, trial_state

__all__ = ["format_number", "format_summary", "plot_curves", "summarize", "write_summary"]


def summarize(
    sweep_dir: Path, manifest: dict[str, Any], trials: list[Trial], wall_time_s: float | None
) -> dict[str, Any]:
    """Per-trial results read back from each run directory, and per-configuration statistics."""
    rows: list[dict[str, Any]] = []
    for t in trials:
        run_dir = sweep_dir / t.run_dir
        state = trial_state(sweep_dir, t)
        result = read_result(run_dir)
        row: dict[str, Any] = {
            "name": t.name,
            "configuration": t.label,
            "params": t.params,
            "seed": t.seed,
            "run_dir": t.run_dir,
            "state": state,
            # An interrupted run's result.json knows the env's target too.
            "target_return": (result or t.config).get("target_return"),
        }
        if result is not None and state == "done":
            row.update(
                status=result["status"],
                global_step=result["global_step"],
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
        targets = {r["target_return"] for r in mine} - {None}
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
                "steps_to_solve": percentiles([float(s) for s in solved_steps]),
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


def format_number(x: float | None, digits: int = 1) -> str:
    """``x`` with ``digits`` decimals; ``n/a`` for a missing or NaN value."""
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
        if c["done"] == 0:
            solved = f"none finished (of {c['seeds']})"
        elif c["solved"] is None:
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
        solved_at = ", ".join(format_number(t) for t in sorted(targets))
        lines += ["", f"Target return (solved): {solved_at}."]
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
    except ImportError:  # matplotlib alone draws it: not the whole bench extra
        return "note: no eval_curves.png (needs matplotlib: pip install matplotlib)"
    curves: dict[str, list[list[tuple[int, float]]]] = {}
    for r in summary["trials"]:
        if r["state"] == "done" and r.get("eval_curve"):
            curves.setdefault(r["configuration"], []).append(r["eval_curve"])
    if not curves:
        finished = any(r["state"] == "done" for r in summary["trials"])
        why = "no finished trial evaluated periodically" if finished else "no trial finished"
        return f"note: no eval_curves.png ({why})"
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
    """Write summary.json, summary.md and eval_curves.png; return the summary, its text, a note.

    The note is :func:`plot_curves`' one line when the plot was skipped, else None.
    """
    summary = summarize(sweep_dir, manifest, trials, wall_time_s)
    text = format_summary(summary)
    (sweep_dir / "summary.md").write_text(text)
    (sweep_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    note = plot_curves(summary, sweep_dir / "eval_curves.png")
    return summary, text, note
