"""Checkpoints: plain tensors and numbers, written atomically, loaded with weights_only=True.

A checkpoint is a dict::

    format, version          identify our files
    env_id, obs_shape, obs_dtype, n_actions
    config                   the resolved Config as a dict
    q_network, target_network, optimizer     state dicts
    counters                 global_step, updates, episodes, ...
    rng                      python / numpy / torch states, as tensors and ints
    envs                     per sub-env episode number and actions so far (exact resume)
    replay                   the buffer's state dict (optional: ``save_buffer``)

Writing goes to a temporary file in the same directory, flushed and fsynced,
then ``os.replace``d over the old file: a crash or a full disk mid-write leaves
the previous checkpoint intact.
"""

from __future__ import annotations

import os
import pickle
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agent.errors import UserError

__all__ = [
    "FORMAT",
    "VERSION",
    "check_compatible",
    "get_rng_state",
    "load_checkpoint",
    "save_checkpoint",
    "set_rng_state",
]

FORMAT = "noisy-dqn-checkpoint"
VERSION = 1


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` (plus format and version) to ``path`` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"format": FORMAT, "version": VERSION, **payload}
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(data, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        # Whatever went wrong (full disk, Ctrl-C), the previous file is untouched.
        Path(tmp_name).unlink(missing_ok=True)
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass
    return path


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load one of our checkpoints onto the CPU; :class:`UserError` for anything else."""
    path = Path(path)
    if path.is_dir():
        candidate = path / "checkpoints" / "last.pt"
        if not candidate.is_file():
            raise UserError(
                f"{path} is a directory without checkpoints/last.pt: give a checkpoint file "
                "(RUN_DIR/checkpoints/last.pt or best.pt)"
            )
        path = candidate
    if not path.is_file():
        raise UserError(
            f"no checkpoint at {path}: give a file written by run.py "
            "(RUN_DIR/checkpoints/last.pt or best.pt)"
        )
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise UserError(
            f"{path} holds objects other than tensors and numbers: it is not a Noisy DQN "
            "checkpoint (only files written by run.py load)"
        ) from None
    except Exception as e:  # a cut or damaged file fails anywhere inside the unpickler
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(
            f"{path} is truncated or corrupt ({reason}): use another checkpoint, e.g. best.pt "
            "or an earlier copy"
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UserError(
            f"{path} is not a Noisy DQN checkpoint: give a file written by run.py "
            "(RUN_DIR/checkpoints/last.pt or best.pt)"
        )
    if data.get("version") != VERSION:
        raise UserError(
            f"{path} has checkpoint format version {data.get('version')}, this release reads "
            f"version {VERSION}: use the release that wrote it"
        )
    return data


def check_compatible(
    data: dict[str, Any], env_id: str, obs_shape: tuple[int, ...], n_actions: int
) -> None:
    """:class:`UserError` unless the checkpoint's spaces match the environment's."""
    saved_shape = tuple(int(s) for s in data["obs_shape"])
    if saved_shape != tuple(obs_shape) or int(data["n_actions"]) != n_actions:
        raise UserError(
            f"checkpoint was trained on {data['env_id']} (observations {saved_shape}, "
            f"{data['n_actions']} actions) but {env_id} has observations {tuple(obs_shape)} and "
            f"{n_actions} actions: pass --env {data['env_id']} or a checkpoint of {env_id}"
        )


def get_rng_state() -> dict[str, Any]:
    """Python, numpy (legacy global) and torch RNG states as plain tensors and ints."""
    version, py_state, gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": (version, torch.tensor(py_state, dtype=torch.int64), gauss),
        "numpy": (np_name, torch.from_numpy(np_keys.astype(np.int64)), np_pos, np_has_gauss,
                  np_gauss),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, py_state, gauss = state["python"]
    random.setstate((version, tuple(int(x) for x in py_state.tolist()), gauss))
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = state["numpy"]
    np.random.set_state((np_name, np_keys.numpy().astype(np.uint32), np_pos, np_has_gauss,
                         np_gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
