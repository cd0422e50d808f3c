"""Checkpoints: atomic writes, weights_only loads, clear errors, RNG state round trip."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from agent import checkpoint as ckpt
from agent.errors import UserError


def _payload(value: float = 1.0) -> dict:
    return {
        "env_id": "CartPole-v1",
        "obs_shape": [4],
        "n_actions": 2,
        "weights": torch.full((3,), value),
        "counters": {"global_step": 7},
    }


def test_round_trip(tmp_path: Path) -> None:
    path = ckpt.save_checkpoint(tmp_path / "c" / "last.pt", _payload(2.0))
    data = ckpt.load_checkpoint(path)
    assert data["format"] == ckpt.FORMAT and data["version"] == ckpt.VERSION
    assert torch.equal(data["weights"], torch.full((3,), 2.0))
    assert not list((tmp_path / "c").glob("*.tmp")), "no temporary file is left behind"


def test_a_run_s_pieces_survive_a_weights_only_file_and_older_files_give_one(
    tmp_path: Path,
) -> None:
    """A resumed run's pieces (machine, steps, wall) come back from last.pt as they were
    saved; a checkpoint written before pieces were kept counts as one piece, on a machine
    nobody recorded, through its step and wall time."""
    pieces = [
        {"machine": None, "from_step": 0, "to_step": 7, "wall_s": 1.5},
        {"machine": "a CPU, 1 torch thread", "from_step": 7, "to_step": 9, "wall_s": 0.5},
    ]
    data = ckpt.training_checkpoint(_payload(1.0), components={}, eval_curve=[], episodes={},
                                    replay=None, wall_time_s=2.0, pieces=pieces)  # fmt: skip
    loaded = ckpt.load_checkpoint(ckpt.save_checkpoint(tmp_path / "last.pt", data))
    assert ckpt.run_pieces(loaded) == pieces
    older = {k: v for k, v in loaded.items() if k != "pieces"}
    assert ckpt.run_pieces(older) == [
        {"machine": None, "software": None, "from_step": 0, "to_step": 7, "wall_s": 2.0}
    ]  # fmt: skip
    assert ckpt.run_pieces({**older, "counters": {"global_step": 0}}) == []


def test_run_directory_resolves_to_last_checkpoint(tmp_path: Path) -> None:
    ckpt.save_checkpoint(tmp_path / "checkpoints" / "last.pt", _payload(3.0))
    assert torch.equal(ckpt.load_checkpoint(tmp_path)["weights"], torch.full((3,), 3.0))


def test_failed_write_keeps_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = ckpt.save_checkpoint(tmp_path / "last.pt", _payload(1.0))

    def full_disk(obj: object, f) -> None:  # writes half a file, then fails like ENOSPC
        f.write(b"PK\x03\x04 half a zip")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(ckpt.CheckpointWriteError, match="No space left on device"):
        ckpt.save_checkpoint(path, _payload(9.0))
    monkeypatch.undo()
    assert torch.equal(ckpt.load_checkpoint(path)["weights"], torch.full((3,), 1.0))
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_dropping_the_replay_keeps_the_rest_of_the_checkpoint_as_it_was(tmp_path: Path) -> None:
    replay = {"obs": torch.arange(200_000, dtype=torch.uint8).reshape(-1, 100), "size": 2000}
    path = ckpt.save_checkpoint(tmp_path / "last.pt", {**_payload(4.0), "version": 1,
                                                        "replay": replay})  # fmt: skip
    size = path.stat().st_size
    freed = ckpt.drop_replay(path)
    assert 200_000 <= freed < size
    data = ckpt.load_checkpoint(path)
    assert "replay" not in data and data["version"] == 1  # the file's own version
    assert torch.equal(data["weights"], torch.full((3,), 4.0))
    assert data["counters"] == {"global_step": 7}
    assert ckpt.resume_exactness(data) == "without the replay buffer: approximate"
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]
    before = path.read_bytes()
    assert ckpt.drop_replay(path) == 0 and path.read_bytes() == before  # nothing to drop


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no checkpoint at"):
        ckpt.load_checkpoint(tmp_path / "nope.pt")
    with pytest.raises(UserError, match=r"directory without checkpoints/last\.pt"):
        ckpt.load_checkpoint(tmp_path)


def test_truncated_or_corrupt_file(tmp_path: Path) -> None:
    path = ckpt.save_checkpoint(tmp_path / "last.pt", _payload())
    raw = path.read_bytes()
    cut = tmp_path / "cut.pt"
    cut.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(UserError, match="truncated or corrupt"):
        ckpt.load_checkpoint(cut)
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"this is not a checkpoint at all")
    with pytest.raises(UserError, match=r"is not a checkpoint \(not a file torch.save wrote\)"):
        ckpt.load_checkpoint(junk)


class _Evil:
    def __reduce__(self):
        return (print, ("code ran",))


def test_files_that_are_not_ours(tmp_path: Path) -> None:
    other = tmp_path / "other.pt"
    torch.save({"state_dict": {"w": torch.zeros(2)}}, other)
    with pytest.raises(UserError, match="not a Noisy DQN checkpoint"):
        ckpt.load_checkpoint(other)
    evil = tmp_path / "evil.pt"
    torch.save({"format": ckpt.FORMAT, "x": _Evil()}, evil)
    with pytest.raises(UserError, match="objects other than tensors"):
        ckpt.load_checkpoint(evil)
    old = tmp_path / "old.pt"
    torch.save({"format": ckpt.FORMAT, "version": 999}, old)
    with pytest.raises(UserError, match="version 999"):
        ckpt.load_checkpoint(old)


def test_compatibility_check_names_both_environments() -> None:
    data = {"env_id": "CartPole-v1", "obs_shape": [4], "n_actions": 2}
    ckpt.check_compatible(data, "CartPole-v1", (4,), 2)
    with pytest.raises(UserError, match=r"trained on CartPole-v1.*Acrobot-v1"):
        ckpt.check_compatible(data, "Acrobot-v1", (6,), 3)


def test_rng_state_round_trip_through_a_weights_only_file(tmp_path: Path) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    state = ckpt.get_rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    path = ckpt.save_checkpoint(tmp_path / "rng.pt", {"rng": state})
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    ckpt.set_rng_state(ckpt.load_checkpoint(path)["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


@pytest.mark.parametrize(
    ("env_id", "kept"),
    [
        ("CartPole-v1", True),
        ("Acrobot-v1", True),
        ("MountainCar-v0", True),
        ("FrozenLake8x8-v1", True),
        ("CliffWalking-v1", True),
        ("Taxi-v4", True),
        ("MinAtar/Seaquest-v1", True),  # the most MinAtar channels (10)
        ("MiniGrid-DoorKey-5x5-v0", True),
        ("ALE/Pong-v5", False),  # 1M frames, 6.7 GiB
    ],
)
def test_save_buffer_auto_keeps_every_default_buffer_but_atari(env_id: str, kept: bool) -> None:
    import dataclasses

    from agent.config_files import load_config
    from agent.train import build_agent
    from envs import inspect_env

    cfg = load_config(env_id, overrides={"device": "cpu"})
    try:
        spec = inspect_env(cfg.env_id, cfg.env_kwargs, cfg.wrappers)
    except UserError as e:  # an extra that is not installed
        pytest.skip(str(e))
    # The buffer the run would build, at a capacity small enough to allocate here.
    small = dataclasses.replace(cfg, buffer_size=64)
    replay = build_agent(small, spec, torch.device("cpu"), eval_envs=1).replay
    nbytes = cfg.buffer_size * replay.bytes_per_transition
    assert cfg.save_buffer == "auto"
    assert ckpt.keeps_buffer(cfg.save_buffer, nbytes) is kept
    assert ckpt.keeps_buffer(True, nbytes) and not ckpt.keeps_buffer(False, nbytes)


def test_a_file_cut_short_anywhere_is_one_line_naming_it_without_the_reader_s_errno(
    tmp_path: Path,
) -> None:
    """A checkpoint cut short (a copy that stopped half-way, a disk that filled outside our
    atomic writes) fails in the zip reader with an errno or miniz's internals, wherever
    the cut falls: the line names the file and that it cannot be read, not those."""
    path = ckpt.save_checkpoint(tmp_path / "last.pt", {**_payload(), "big": torch.ones(20_000)})
    raw = path.read_bytes()
    for size in (100, 5_000, len(raw) // 2, len(raw) - 10):
        cut = tmp_path / f"cut-{size}.pt"
        cut.write_bytes(raw[:size])
        with pytest.raises(UserError) as info:
            ckpt.load_checkpoint(cut)
        message = str(info.value)
        assert str(cut) in message and "\n" not in message
        assert "Errno" not in message and "miniz" not in message, message
        assert isinstance(info.value, ckpt.UnreadableCheckpoint)
