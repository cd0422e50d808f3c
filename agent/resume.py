"""What ``--resume`` continues: the run directory and the checkpoint it goes on from, or
one line (:class:`UserError`) whose advice is a ``--resume`` that the command takes.

A run resumes from its ``checkpoints/last.pt``, exactly where that holds the replay
buffer. Where last.pt is missing or cannot be read (a copy cut short, a damaged disk),
another checkpoint of the run goes on instead: a copy of last.pt put in its
``checkpoints/`` (as exactly as the copy was saved), or its ``best.pt`` (approximately:
the network alone). Going back to one of those while last.pt can be read would
overwrite the run's later state, so then the advice is the run directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent.checkpoint import UnreadableCheckpoint, load_checkpoint
from agent.errors import UserError
from agent.usage import command

__all__ = ["how_it_ended", "resume_checkpoint", "resume_source"]


def resume_source(path: Path) -> tuple[Path, Path]:
    """(the run directory, the checkpoint file) that ``--resume PATH`` continues: a run
    directory (or its ``checkpoints/``) from its ``last.pt``; a checkpoint file in a run's
    ``checkpoints/`` (``last.pt``, ``best.pt``, a copy of ``last.pt`` put there) from that
    file, into that run."""
    if path.is_file() or path.suffix == ".pt":
        if path.parent.name != "checkpoints":
            raise UserError(
                f"--resume continues a run in its own directory, and {path} is not in one "
                "(RUN_DIR/checkpoints/): give the run directory, or copy the file into the "
                "run's checkpoints/ and --resume that copy"
            )
        return path.parent.parent, path
    run_dir = path.parent if path.name == "checkpoints" else path
    return run_dir, run_dir / "checkpoints" / "last.pt"


def resume_checkpoint(run_dir: Path, source: Path) -> dict[str, Any]:
    """The checkpoint that a resume of ``run_dir`` from ``source`` starts from, or a
    :class:`UserError` whose advice is a ``--resume`` that this command takes.

    ``last.pt`` resumes exactly (or as exactly as it was saved). Another checkpoint of the
    run (best.pt, a copy of last.pt) is taken only where last.pt is missing or cannot be
    read: going back to it would overwrite the run's later state at the next save."""
    last = run_dir / "checkpoints" / "last.pt"
    if source.name != "last.pt":
        if not source.is_file():
            raise UserError(
                f"no checkpoint at {source}: give a run directory or a checkpoint file in "
                "its checkpoints/"
            )
        if last.is_file() and _readable(last) is not None:
            raise UserError(
                f"{last} can be read: --resume {run_dir} continues the run from it exactly; "
                f"to go back to {source.name} instead (its step, approximately), move last.pt "
                "out of checkpoints/ first"
            )
        return load_checkpoint(source)
    if not last.is_file():
        what = "has no checkpoints/last.pt" if run_dir.is_dir() else "does not exist"
        otherwise = (f"--resume continues a run directory that {command()} wrote (RUN_DIR, "
                     "or RUN_DIR/checkpoints/last.pt)")  # fmt: skip
        raise UserError(f"{run_dir} {what}: {_other_checkpoints(run_dir, otherwise)}")
    try:
        return load_checkpoint(last)
    except UnreadableCheckpoint:
        otherwise = (f"--resume a copy of it put in {run_dir}/checkpoints/, or start the run "
                     "again with another --run-dir")  # fmt: skip
        raise UserError(
            f"{last} cannot be read (truncated or corrupt): "
            f"{_other_checkpoints(run_dir, otherwise)}"
        ) from None


def _other_checkpoints(run_dir: Path, otherwise: str) -> str:
    """The advice for a run whose last.pt cannot resume it: its best.pt, where that can
    be read, else ``otherwise``."""
    best = run_dir / "checkpoints" / "best.pt"
    data = _readable(best) if best.is_file() else None
    if data is None:
        return otherwise
    step = int(data["counters"]["global_step"])
    return (
        f"continue it from its best policy with --resume {best} (approximately: training "
        f"goes on from step {step} with a fresh optimizer and replay buffer), or --resume a "
        f"copy of its last.pt put in {run_dir}/checkpoints/"
    )


def _readable(path: Path) -> dict[str, Any] | None:
    """The checkpoint at ``path``, or None where it does not load."""
    try:
        return load_checkpoint(path)
    except UserError:
        return None


def how_it_ended(run_dir: Path, step: int) -> str | None:
    """'finished ...' when result.json says the run ended by itself (not interrupted)."""
    try:
        result = json.loads((run_dir / "result.json").read_text())
    except (OSError, ValueError):
        return None  # killed before it could write one: resumable
    if result.get("status") not in ("finished", "solved") or result.get("global_step") != step:
        return None
    solved = result.get("solved_step")
    return (f"finished: solved at step {solved}, stopped early at step {step}"
            if result["status"] == "solved" and solved is not None
            else f"finished all its {step} steps")
