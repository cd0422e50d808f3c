"""Trials as they run inside a Ray worker: one (an ordinary :func:`agent.train.train` call)
or several seeds of one grid point together (:func:`agent.seeds.group.train_group`).

Nothing here imports Ray: :func:`run_trials` is a plain function that the driver wraps
in ``ray.remote``, and can be called directly (the tests do).
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import socket
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agent.errors import UserError
from agent.sweep.trials import MANIFEST, Trial

__all__ = ["resume_point", "run_trial", "run_trials", "unpack"]


def _sees_sweep_dir(sweep_dir: Path, sweep_id: str) -> bool:
    """True when this process sees the driver's sweep directory (same machine or shared FS)."""
    try:
        return json.loads((sweep_dir / MANIFEST).read_text()).get("sweep_id") == sweep_id
    except (OSError, ValueError):
        return False


def _quiet(*args: Any, **kwargs: Any) -> None:
    """train()'s echo in a worker: silent; the driver prints one line per trial instead."""


def run_trial(trial: dict[str, Any], sweep_dir: str, sweep_id: str) -> dict[str, Any]:
    """Train one trial; returns its result (and its run directory as a tar.gz when remote).

    On the driver's filesystem the run directory is written in place, continuing from
    its ``checkpoints/last.pt`` when an earlier attempt left one. On a machine that
    does not see the sweep directory it trains in a temporary directory and ships the
    whole run directory back in the result.
    """
    import torch

    from agent.config_files import config_from_dict
    from agent.train import train

    torch.set_num_threads(1)
    spec = Trial(**trial)
    cfg = config_from_dict(dict(spec.config), f"sweep trial {spec.name}")
    with _run_dirs([spec], sweep_dir, sweep_id) as (dirs, remote):
        result = train(cfg, dirs[0], checkpoint=resume_point(dirs[0]), progress=False,
                       echo=_quiet)  # fmt: skip
        return _outcome(result, dirs[0], remote)


def run_trials(trials: list[dict[str, Any]], sweep_dir: str, sweep_id: str) -> list[dict[str, Any]]:
    """Train several trials of one grid point together, their networks stacked
    (:func:`agent.seeds.group.train_group`); one result per trial, in order, as
    :func:`run_trial` gives it, or ``{"status": "failed", "error": line}`` for a seed that
    failed alone (diverged). Seeds whose checkpoints are at different env steps train
    as separate groups, one after another."""
    if len(trials) == 1:
        return [run_trial(trials[0], sweep_dir, sweep_id)]
    import torch

    from agent.config_files import config_from_dict
    from agent.seeds.group import resume_groups, train_group

    torch.set_num_threads(1)
    specs = [Trial(**t) for t in trials]
    cfgs = [config_from_dict(dict(s.config), f"sweep trial {s.name}") for s in specs]
    outcomes: list[dict[str, Any]] = [{} for _ in specs]
    with _run_dirs(specs, sweep_dir, sweep_id) as (dirs, remote):
        checkpoints = [resume_point(d) for d in dirs]
        for members in resume_groups(checkpoints):
            results = train_group(
                [cfgs[i] for i in members], [dirs[i] for i in members],
                [checkpoints[i] for i in members], progress=False, echo=_quiet,
            )  # fmt: skip
            for i, result in zip(members, results, strict=True):
                outcomes[i] = _outcome(result, dirs[i], remote)
    return outcomes


@contextlib.contextmanager
def _run_dirs(
    specs: list[Trial], sweep_dir: str, sweep_id: str
) -> Iterator[tuple[list[Path], bool]]:
    """The trials' run directories: in the sweep directory where this process sees it,
    else in a temporary directory (removed after), shipped back with the results."""
    if _sees_sweep_dir(Path(sweep_dir), sweep_id):
        yield [Path(sweep_dir) / s.run_dir for s in specs], False
        return
    scratch = Path(tempfile.mkdtemp(prefix="noisy-dqn-trial-"))
    try:
        yield [scratch / s.run_dir for s in specs], True
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _outcome(result: Any, run_dir: Path, remote: bool) -> dict[str, Any]:
    """A trial's result for the driver: its fields, the host, and (remote) its run directory."""
    if isinstance(result, BaseException):
        return {"status": "failed", "error": f"{type(result).__name__}: {result}"}
    out = dict(result.__dict__)
    out["host"] = socket.gethostname()
    out["archive"] = None
    if remote:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            tar.add(run_dir, arcname=".")
        out["archive"] = buf.getvalue()
    return out


def resume_point(run_dir: Path) -> dict[str, Any] | None:
    """A trial's ``last.pt`` to continue from, or None: then whatever an earlier attempt
    left there is removed (a failed start: begin afresh, no stale event files). An earlier
    attempt's ``error.txt`` goes either way."""
    from agent.checkpoint import load_checkpoint

    checkpoint = None
    last = run_dir / "checkpoints" / "last.pt"
    if last.exists():
        try:
            checkpoint = load_checkpoint(last)
        except UserError:
            checkpoint = None
    if checkpoint is None and run_dir.exists():
        shutil.rmtree(run_dir)
    with contextlib.suppress(FileNotFoundError):
        (run_dir / "error.txt").unlink()
    return checkpoint


def unpack(archive: bytes, run_dir: Path) -> None:
    """Extract a remote trial's run directory (``run_trial``'s ``archive``) into ``run_dir``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4
            tar.extractall(run_dir, filter="data")
        else:  # pragma: no cover
            tar.extractall(run_dir)  # our own archive, from our own worker
