"""One trial, as it runs inside a Ray worker: an ordinary :func:`agent.train.train` call.

Nothing here imports Ray: :func:`run_trial` is a plain function that the driver wraps
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
from pathlib import Path
from typing import Any

from agent.errors import UserError
from agent.sweep.trials import MANIFEST, Trial

__all__ = ["run_trial", "unpack"]


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


def unpack(archive: bytes, run_dir: Path) -> None:
    """Extract a remote trial's run directory (``run_trial``'s ``archive``) into ``run_dir``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4
            tar.extractall(run_dir, filter="data")
        else:  # pragma: no cover
            tar.extractall(run_dir)  # our own archive, from our own worker
