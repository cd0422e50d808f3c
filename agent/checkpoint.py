"""Checkpoints: plain tensors and numbers, written atomically, loaded with weights_only=True.

Two kinds of checkpoint, both a dict of tensors and plain values. Their contents
are defined here, in :func:`policy_checkpoint` and :func:`training_checkpoint`, next
to their loading and their format version:

    format, version          identify our files
    env_id, obs_shape, obs_dtype, n_actions
    config                   the resolved Config as a dict
    q_network                the online network's state dict
    counters                 global_step, episodes, evaluation rounds, ...
  training checkpoints (``last.pt``) add what an exact resume needs:
    target_network, learner  state dicts (the learner's holds the optimizer)
    eval_curve               (env steps, mean return) of every periodic evaluation
    rng, sample_generator, exploration, selector    every random stream; the exploration
                             policy's state holds its noise schedule (version 1 kept the
                             noise counter in the selector's, and the stream alone as
                             explore_rng: read as such)
    envs                     per sub-env episode number and actions so far (exact resume)
    replay                   the buffer's state dict, when ``save_buffer`` keeps it
                             (:func:`keeps_buffer`; without it a resume is approximate;
                             :func:`drop_replay` takes it out of a finished run's file)
    wall_time_s              wall seconds of the run so far, every resumed piece included
    pieces                   each piece of the run so far (its start, then each resume):
                             the machine, the software, its first and last env step, its
                             wall seconds (:func:`run_pieces`)

``best.pt`` is a policy checkpoint: it is for evaluation, so it never carries the
replay buffer (gigabytes with Atari) or the optimizer.

Writing goes to a temporary file in the same directory, flushed and fsynced,
then ``os.replace``d over the old file: a crash or a full disk mid-write leaves
the previous checkpoint intact, and a failed write raises
:class:`CheckpointWriteError`, one line naming the file, the cause and the fix. What
a killed process could not clean up, the next run in its directory removes
(:func:`remove_partial_writes`).
"""

from __future__ import annotations

import os
import pickle
import random
import tempfile
from pathlib import Path
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from agent.errors import UserError
from agent.usage import command

__all__ = [
    "BUFFER_LIMIT",
    "FORMAT",
    "READS",
    "VERSION",
    "CheckpointWriteError",
    "GeneratorState",
    "UnreadableCheckpoint",
    "buffer_left_out",
    "check_compatible",
    "drop_replay",
    "get_rng_state",
    "holds_training",
    "keeps_buffer",
    "load_checkpoint",
    "policy_checkpoint",
    "remove_partial_writes",
    "restore_policy",
    "restore_training",
    "resume_exactness",
    "run_pieces",
    "save_checkpoint",
    "set_rng_state",
    "training_checkpoint",
]

FORMAT = "noisy-dqn-checkpoint"
VERSION = 2
READS = (1, 2)  # the versions this release loads
BUFFER_LIMIT = 1 << 30
"""``save_buffer: auto`` keeps a replay buffer in ``last.pt`` up to this many bytes at
full capacity: every default but Atari's 1M frames (6.7 GiB)."""


def keeps_buffer(save_buffer: bool | str, nbytes: int) -> bool:
    """Whether ``last.pt`` holds the replay buffer (an exact resume): ``save_buffer``
    true, or ``auto`` with the buffer's ``nbytes`` at full capacity within
    :data:`BUFFER_LIMIT`. Judged per run, so a seed of a group or a sweep keeps its
    buffer exactly when it would alone."""
    return save_buffer is True or (save_buffer == "auto" and nbytes <= BUFFER_LIMIT)


def buffer_left_out(save_buffer: bool | str, nbytes: int | None = None) -> str:
    """"without the replay buffer (why): ...", for the messages about a ``last.pt`` saved
    without it, which say that a resume from it is approximate and why; ``nbytes``: the
    buffer's size at full capacity, when known."""
    why = "save_buffer: false"
    if save_buffer == "auto":
        size = "" if nbytes is None else f"{nbytes / 2**30:.1f} GiB, "
        why = (
            f"{size}over save_buffer auto's {BUFFER_LIMIT / 2**30:.0f} GiB; "
            "--set save_buffer=true when starting a run keeps it"
        )
    return (
        f"without the replay buffer ({why}): a resume from it is approximate, learning "
        "pauses for learning_starts steps while the buffer refills"
    )


class UnreadableCheckpoint(UserError):
    """A checkpoint file that cannot be read: cut short (a copy that stopped half-way, a
    disk that filled outside our atomic writes), damaged, or not a file ``torch.save``
    wrote. ``path`` names it; a run directory's other checkpoint may still be read."""

    def __init__(self, path: Path, message: str) -> None:
        super().__init__(message)
        self.path = Path(path)


class CheckpointWriteError(Exception):
    """A checkpoint could not be written (full disk, quota, read-only file system, ...).

    The file at ``path`` is as it was before the attempt. ``str()`` is one line that
    names the file, the cause and the fix.
    """

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(path, reason)
        self.path = Path(path)
        self.reason = reason
        self.saved_instead: tuple[Path, int] | None = None
        """(path, env step) of a checkpoint that was still written after this failure."""

    def __str__(self) -> str:
        saved = ""
        if self.saved_instead is not None:
            path, step = self.saved_instead
            saved = f"; {path} was saved at step {step}, resume from it with --resume"
        return (
            f"cannot write {self.path} ({self.reason}); the previous file there is intact{saved}: "
            "free some space or pass another --run-dir"
        )


def _reason(exc: BaseException) -> str:
    """The root cause of a failed write in a few words (torch wraps ENOSPC in a RuntimeError)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.strerror:
            return seen.strerror
        seen = seen.__cause__ or seen.__context__
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text


_PARTIAL = ".tmp"  # the suffix of a write in progress: .last.pt.XXXXXXXX.tmp


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` (plus format and version) to ``path`` atomically.

    Raises :class:`CheckpointWriteError` if the file cannot be written; the previous
    file at ``path`` is left untouched and no temporary file is left behind.
    """
    path = Path(path)
    data = {"format": FORMAT, "version": VERSION, **payload}
    tmp_name: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=_PARTIAL, dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            torch.save(data, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except BaseException as exc:
        # Whatever went wrong (full disk, Ctrl-C), the previous file is untouched.
        if tmp_name is not None:
            Path(tmp_name).unlink(missing_ok=True)
        # torch.save reports a full disk as a RuntimeError from its zip writer, chained
        # to the OSError; either way the user needs the file and the cause.
        if isinstance(exc, (OSError, RuntimeError)):
            raise CheckpointWriteError(path, _reason(exc)) from None
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


def remove_partial_writes(directory: str | Path) -> list[Path]:
    """Delete the temporary files that writes killed mid-way (SIGKILL, a lost machine)
    left in ``directory``, a checkpoint as large as the replay buffer each; returns them.

    Only for a directory this process holds (:func:`agent.setup.hold_run_dir`): another
    writer's file in progress would be taken from under it.
    """
    partial = sorted(Path(directory).glob(f".*.pt.*{_PARTIAL}"))  # save_checkpoint's names
    for path in partial:
        path.unlink(missing_ok=True)
    return partial


def drop_replay(path: str | Path) -> int:
    """Rewrite the checkpoint at ``path`` without its replay buffer, atomically; returns
    the bytes freed (0 when it held none).

    For a finished run that will not train on: what stays still evaluates and exports,
    and a resume fills the buffer again before learning (approximate, not exact). The
    buffer's tensors are memory-mapped, never read.
    """
    path = Path(path)
    before = path.stat().st_size
    data = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    if "replay" not in data:
        return 0
    del data["replay"]
    save_checkpoint(path, data)  # keeps the file's own format version
    return before - path.stat().st_size


def holds_training(data: dict[str, Any]) -> bool:
    """Whether ``data`` is a :func:`training_checkpoint` (``last.pt``, or a copy of one),
    which a resume restores whole; a :func:`policy_checkpoint` (``best.pt``) holds the
    online network and the counters alone."""
    return "rng" in data and "envs" in data


def resume_exactness(data: dict[str, Any]) -> str:
    """How a resume from the ``last.pt`` ``data`` goes, for the lines that announce it."""
    if "replay" in data:
        return "with the replay buffer: exact"
    return "without the replay buffer: approximate"


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
            f"no checkpoint at {path}: give a file that {command()} wrote "
            "(RUN_DIR/checkpoints/last.pt or best.pt)"
        )
    with path.open("rb") as f:
        is_zip = f.read(4) == b"PK\x03\x04"  # torch.save writes a zip archive
    if not is_zip:
        raise UnreadableCheckpoint(
            path,
            f"{path} is not a checkpoint (not a file torch.save wrote): give a file that "
            f"{command()} wrote (RUN_DIR/checkpoints/last.pt or best.pt)",
        )
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise UserError(
            f"{path} holds objects other than tensors and numbers: it is not a Noisy DQN "
            f"checkpoint (only files that {command()} wrote load)"
        ) from None
    except Exception:  # a cut or damaged file fails anywhere inside the unpickler
        # The reader's own words (an errno, miniz's internals) say nothing the user can act on.
        raise UnreadableCheckpoint(
            path,
            f"{path} is truncated or corrupt: give another checkpoint, the run's other one "
            "(best.pt or last.pt beside it) or an earlier copy",
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UserError(
            f"{path} is not a Noisy DQN checkpoint: give a file that {command()} wrote "
            "(RUN_DIR/checkpoints/last.pt or best.pt)"
        )
    if data.get("version") not in READS:
        raise UserError(
            f"{path} has checkpoint format version {data.get('version')}, written by a newer "
            f"release; this one reads versions {', '.join(map(str, READS))}: use the release "
            "that wrote it"
        )
    return data


def policy_checkpoint(
    *,
    env_id: str,
    obs_shape: tuple[int, ...],
    obs_dtype: str,
    n_actions: int,
    config: dict[str, Any],
    q_network: nn.Module,
    counters: dict[str, Any],
) -> dict[str, Any]:
    """What evaluation (``--eval``) needs: the spaces, the config and the online network."""
    return {
        "env_id": env_id,
        "obs_shape": list(obs_shape),
        "obs_dtype": obs_dtype,
        "n_actions": n_actions,
        "config": config,
        "q_network": q_network.state_dict(),
        "counters": dict(counters),
    }


def training_checkpoint(
    policy: dict[str, Any],
    *,
    components: Mapping[str, Any],
    eval_curve: list[tuple[int, float]],
    episodes: dict[str, Any],
    replay: Any | None,
    wall_time_s: float = 0.0,
    pieces: list[dict[str, Any]],
) -> dict[str, Any]:
    """A :func:`policy_checkpoint` plus everything an exact resume needs (``last.pt``).

    ``components``: every stateful part of the run by name (the target network, the
    learner, the exploration policy, the selector, the replay's sampling generator as a
    :class:`GeneratorState`, the augmentation; None where a run has none), each saved as
    its ``state_dict()`` under its name. ``episodes`` is the episode bookkeeping's state
    (``agent.episodes``). With ``replay=None`` the buffer is not saved and a resume starts
    with an empty one.
    """
    data = {
        **policy,
        "eval_curve": torch.tensor(eval_curve or [], dtype=torch.float64).reshape(-1, 2),
        "rng": get_rng_state(),
        "envs": episodes,
        "wall_time_s": wall_time_s,
        "pieces": pieces,
    }
    data.update({name: part.state_dict() for name, part in components.items() if part is not None})
    if replay is not None:
        data["replay"] = replay.state_dict()
    return data


class GeneratorState:
    """A ``torch.Generator`` as a component of a checkpoint: its state tensor."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def state_dict(self) -> torch.Tensor:
        return self.generator.get_state()

    def load_state_dict(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)


def restore_policy(
    data: dict[str, Any], *, q_network: nn.Module, target_network: nn.Module
) -> None:
    """Load a :func:`policy_checkpoint`'s network into a run's online and target networks,
    for a resume from it (the rest of the run starts afresh: :func:`resume_exactness`)."""
    q_network.load_state_dict(data["q_network"])
    target_network.load_state_dict(data["q_network"])


def restore_training(
    data: dict[str, Any],
    *,
    q_network: nn.Module,
    replay: Any,
    components: Mapping[str, Any],
) -> list[tuple[int, float]]:
    """Load a :func:`training_checkpoint` into the run's parts; returns the eval curve.

    Each of ``components`` loads its saved state (a part the checkpoint does not hold,
    such as an augmentation added since, keeps its own). The counters and the episode
    state (``data["counters"]``, ``data["envs"]``) are read by their owners. The replay
    buffer is restored only if it was saved.
    """
    q_network.load_state_dict(data["q_network"])
    if "replay" in data:
        replay.load_state_dict(data["replay"])
    set_rng_state(data["rng"])
    data = _version_1_exploration(data)
    for name, part in components.items():
        if part is not None and name in data:
            part.load_state_dict(data[name])
    return [(int(s), float(r)) for s, r in data["eval_curve"].tolist()]


def run_pieces(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The pieces of the run a :func:`training_checkpoint` holds, each a dict: ``machine``
    (where it ran), ``software`` (what it ran with; absent from pieces saved before it was
    kept), ``from_step`` and ``to_step`` (env steps), ``wall_s``. A checkpoint written
    before pieces were kept holds the run so far as one piece on an unknown machine with
    unknown software (None)."""
    if "pieces" in data:
        return [dict(piece) for piece in data["pieces"]]
    step = int(data["counters"]["global_step"])
    if step == 0:
        return []
    wall = float(data.get("wall_time_s", 0.0))
    return [{"machine": None, "software": None, "from_step": 0, "to_step": step,
             "wall_s": wall}]  # fmt: skip


def _version_1_exploration(data: dict[str, Any]) -> dict[str, Any]:
    """A version-1 checkpoint's exploration state as version 2 has it: the stream alone
    (``explore_rng``) and the noise counter in the selector's state."""
    if "exploration" in data or "explore_rng" not in data:
        return data
    noise = {"step": data["selector"]["step"]}
    return {**data, "exploration": {"rng": data["explore_rng"], "noise": noise}}


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
