"""A sweep in this process, without Ray: each grid point's seeds train as one group.

The seeds of a grid point step together with their networks stacked
(:func:`agent.seeds.group.train_group`), vector and image observations alike; grid
points run one after another. A caller whose image runs must be lone runs (a report
whose Ray path runs them so) asks for their seeds one after another with
:func:`agent.train.train`. Either way every trial is an ordinary run directory, so
``--resume``, the summary and ``--eval`` are the Ray sweep's.
"""

from __future__ import annotations

import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.sweep.driver import done_line, end_sweep
from agent.sweep.trials import Trial, by_grid_point, remaining, trial_state
from agent.sweep.worker import resume_point

__all__ = ["check_local", "run_local"]


def check_local(trials: list[Trial]) -> None:
    """A :class:`~agent.errors.UserError` before anything is written when a grid point's
    torso does not fit its env or its seeds would not fit in memory together."""
    from agent.config_files import config_from_dict
    from agent.seeds.group import check_memory
    from agent.train import check_observations
    from envs import inspect_env

    for group in by_grid_point(trials):
        cfg = config_from_dict(dict(group[0].config), f"sweep trial {group[0].name}")
        spec = inspect_env(cfg.env_id, cfg.env_kwargs, cfg.wrappers)
        check_observations(cfg, spec)
        check_memory(cfg, spec.obs_shape, spec.obs_dtype, len(group))


def run_local(
    sweep_dir: Path,
    manifest: dict[str, Any],
    trials: list[Trial],
    *,
    progress: bool = True,
    out: Any = None,
    on_done: Callable[[Trial], None] | None = None,
    stack_images: bool = True,
) -> int:
    """Run every trial that is not done, in this process; write the summary. Returns the
    exit status, as :func:`agent.sweep.driver.run_sweep` does. ``on_done``: called with
    each trial that finishes (not one interrupted or failed), as it finishes.
    ``stack_images``: False trains an image env's seeds one after another as lone runs
    (a stacked seed draws its noise from other streams, so it is not that seed's lone run)."""
    from agent.config_files import config_from_dict
    from envs import inspect_env

    out = out or sys.stdout
    start = time.perf_counter()
    todo = remaining(sweep_dir, trials)
    if len(todo) < len(trials):
        print(f"{len(trials) - len(todo)} of {len(trials)} trials already finished: "
              "not run again", file=out)  # fmt: skip
    stopped: int | None = None
    for group in by_grid_point(todo):
        dirs = [sweep_dir / t.run_dir for t in group]
        try:
            cfgs = [config_from_dict(dict(t.config), f"sweep trial {t.name}") for t in group]
            spec = inspect_env(cfgs[0].env_id, cfgs[0].env_kwargs, cfgs[0].wrappers)
            checkpoints = [resume_point(d) for d in dirs]
            if len(spec.obs_shape) == 1 or stack_images:
                stopped = _stacked(group, cfgs, dirs, checkpoints, progress, out, on_done)
            else:
                print(f"{cfgs[0].env_id} has image observations: its seeds train one after "
                      "another, as lone runs", file=out)  # fmt: skip
                stopped = _one_by_one(group, cfgs, dirs, checkpoints, progress, out, on_done)
        except Exception as e:  # a grid point that cannot run (no such GPU): the others can
            _failed(sweep_dir, group, e, out)
        if stopped is not None:
            break
    return end_sweep(
        sweep_dir, manifest, trials, time.perf_counter() - start, stopped is not None,
        stopped == signal.SIGTERM, out,
    )  # fmt: skip


def _stacked(
    group: list[Trial],
    cfgs: list[Any],
    dirs: list[Path],
    checkpoints: list[dict[str, Any] | None],
    progress: bool,
    out: Any,
    on_done: Callable[[Trial], None] | None = None,
) -> int | None:
    """One grid point's seeds as groups of seeds at one env step (seeds that stopped
    together resume together). Returns the stop signal, if one came."""
    from agent.seeds.group import resume_groups, train_group

    trial = {str(d): t for t, d in zip(group, dirs, strict=True)}
    for members in resume_groups(checkpoints):
        results = train_group(
            [cfgs[i] for i in members], [dirs[i] for i in members],
            [checkpoints[i] for i in members], progress=progress,
            echo=lambda line: print(line, file=out, flush=True),
            on_done=lambda r: _report(trial[r.run_dir], r, out, on_done),
        )  # fmt: skip
        for i, result in zip(members, results, strict=True):
            if isinstance(result, BaseException):
                print(f"FAILED  {group[i].name}: {type(result).__name__}: {result}", file=out)
            elif result.stop_signal is not None:
                return result.stop_signal
    return None


def _one_by_one(
    group: list[Trial],
    cfgs: list[Any],
    dirs: list[Path],
    checkpoints: list[dict[str, Any] | None],
    progress: bool,
    out: Any,
    on_done: Callable[[Trial], None] | None = None,
) -> int | None:
    from agent.checkpoint import resume_exactness
    from agent.learner import NonFiniteError
    from agent.train import train

    for t, cfg, run_dir, checkpoint in zip(group, cfgs, dirs, checkpoints, strict=True):
        if checkpoint is not None:
            step = int(checkpoint["counters"]["global_step"])
            how = resume_exactness(checkpoint)
            print(f"resuming {t.name} at step {step:,}, saved {how}", file=out, flush=True)
        try:
            result = train(cfg, run_dir, checkpoint=checkpoint, progress=progress,
                           echo=lambda _: None)  # fmt: skip
        except NonFiniteError as e:  # this seed diverged; the others still run
            (run_dir / "error.txt").write_text(f"NonFiniteError: {e}\n")
            print(f"FAILED  {t.name}: NonFiniteError: {e}", file=out)
            continue
        _report(t, result, out, on_done)
        if result.stop_signal is not None:
            return result.stop_signal
    return None


def _failed(sweep_dir: Path, group: list[Trial], error: Exception, out: Any) -> None:
    """The trials of ``group`` not done failed with ``error``: each gets its ``error.txt``."""
    line = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error) else ''}"
    text = line + "\n\n" + "".join(traceback.format_exception(error))
    for t in group:
        if trial_state(sweep_dir, t) == "done":
            continue
        run_dir = sweep_dir / t.run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "error.txt").write_text(text)
        print(f"FAILED  {t.name}: {line}", file=out, flush=True)


def _report(
    trial: Trial, result: Any, out: Any, on_done: Callable[[Trial], None] | None = None
) -> None:
    if result.status != "interrupted":
        print(done_line(trial.name, result.__dict__), file=out, flush=True)
        if on_done is not None:
            on_done(trial)
