"""Faults injected the way they happen: a full disk, a scheduler's SIGTERM, a terminal's
Ctrl-C to the whole process group, an exception mid-run. Nothing saved may be lost."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from agent.checkpoint import CheckpointWriteError, load_checkpoint
from agent.config_files import load_config
from agent.learner import NonFiniteError
from agent.monitor import Monitor
from agent.train import train

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "run.py", "--env", "CartPole-v1", "--no-progress", "--device", "cpu"]


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 600 KB tmpfs: room for one CartPole last.pt, best.pt and the events, not for two."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(mount)], capture_output=True
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {made.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_full_disk_is_one_line_and_keeps_the_last_good_checkpoint(tiny_disk: Path) -> None:
    run_dir = tiny_disk / "run"
    out = subprocess.run(
        [*CLI, "--total-steps", "3000", "--run-dir", str(run_dir), "--set",
         "checkpoint_interval=1000"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 1, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "last.pt" in lines[0] and "No space left on device" in lines[0]
    assert "--run-dir" in lines[0] and "free some space" in lines[0]
    # The checkpoint written before the disk filled up is intact and resumable.
    data = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert data["counters"]["global_step"] == 1000
    assert load_checkpoint(run_dir / "checkpoints" / "best.pt")["env_id"] == "CartPole-v1"
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.suffix == ".tmp"]


def test_a_failed_best_write_still_saves_last(tmp_path: Path) -> None:
    # best.pt cannot be replaced (a directory is in the way): the run must still leave
    # a last.pt to resume from, and say so in its one-line error.
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "best.pt").mkdir(parents=True)
    cfg = load_config(
        "CartPole-v1",
        overrides={"total_steps": 2000, "eval_interval": 1000, "checkpoint_interval": 100_000,
                   "learning_starts": 500, "device": "cpu"},
    )
    with pytest.raises(CheckpointWriteError) as info:
        train(cfg, run_dir, progress=False, echo=lambda _: None)
    assert info.value.path.name == "best.pt"
    assert info.value.saved_instead == (run_dir / "checkpoints" / "last.pt", 1000)
    assert "was saved at step 1000" in str(info.value) and "\n" not in str(info.value)
    assert load_checkpoint(run_dir / "checkpoints" / "last.pt")["counters"]["global_step"] == 1000


def _start(args: list[str]) -> subprocess.Popen:
    """run.py in its own session (process group), as a terminal or a scheduler runs it."""
    return subprocess.Popen(
        [*CLI, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )


def _wait_for_training(proc: subprocess.Popen, run_dir: Path) -> None:
    deadline = time.time() + 60
    while not (run_dir / "config.yaml").exists() and time.time() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    time.sleep(2.0)  # let it train a little


@pytest.mark.parametrize(
    ("sig", "code", "extra"),
    [
        (signal.SIGTERM, 143, []),
        # Ctrl-C reaches the async workers too: they must not die before the parent saves.
        (signal.SIGINT, 130, ["--num-envs", "2", "--set", "vector=async"]),
        (signal.SIGTERM, 143, ["--num-envs", "2", "--set", "vector=async"]),
    ],
    ids=["sigterm", "sigint-async", "sigterm-async"],
)
def test_a_signal_to_the_process_group_saves_and_says_how_to_resume(
    tmp_path: Path, sig: signal.Signals, code: int, extra: list[str]
) -> None:
    run_dir = tmp_path / "run"
    proc = _start(["--total-steps", "400000", "--run-dir", str(run_dir), *extra])
    _wait_for_training(proc, run_dir)
    os.killpg(proc.pid, sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "Traceback" not in err, err
    assert f"interrupted ({sig.name})" in out and f"--resume {run_dir}" in out
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "interrupted" and result["stop_signal"] == sig
    step = int(load_checkpoint(run_dir / "checkpoints" / "last.pt")["counters"]["global_step"])
    assert result["global_step"] == step and 0 < step < 400_000


def test_an_error_mid_run_still_flushes_events_and_closes_the_envs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logged: list[int] = []
    episode = Monitor.episode

    def counting(self: Monitor, step: int, episodic_return: float, length: int) -> None:
        logged.append(step)
        episode(self, step, episodic_return, length)

    monkeypatch.setattr(Monitor, "episode", counting)
    cfg = load_config(
        "CartPole-v1",
        overrides={"total_steps": 3000, "lr": 1e30, "max_grad_norm": None, "learning_starts": 100,
                   "log_interval": 100, "eval_interval": 0, "num_envs": 2, "vector": "async",
                   "device": "cpu"},
    )
    # Keep the traceback alive, as an interactive session does (sys.last_traceback): then
    # nothing but train() itself can close what train() opened.
    with pytest.raises(NonFiniteError) as info:
        train(cfg, tmp_path / "run", progress=False, echo=lambda _: None)
    assert info.value is not None
    acc = EventAccumulator(str(tmp_path / "run"), size_guidance={"scalars": 0})
    acc.Reload()
    assert logged and [e.step for e in acc.Scalars("charts/episodic_return")] == logged
    # The async vector env's worker processes were stopped.
    deadline = time.time() + 10
    while multiprocessing.active_children() and time.time() < deadline:
        time.sleep(0.1)
    assert not multiprocessing.active_children()


@pytest.mark.parametrize(
    ("second", "checkpoint_interval"),
    [(["--resume"], 1000), (["--run-dir"], 1_000_000)],
    ids=["resume-while-training", "new-run-before-any-checkpoint"],
)
def test_a_second_process_on_a_run_still_training_is_refused_until_it_dies(
    tmp_path: Path, second: list[str], checkpoint_interval: int
) -> None:
    """Two processes in one run directory would overwrite each other's checkpoints: a
    --resume of a run that is still going, or a new run there before its first
    checkpoint, ends in one line naming the process, exit 2, and the run goes on. Once
    the first dies, even by SIGKILL, the directory is free again."""
    run_dir = tmp_path / "run"
    # No early stop: on a loaded machine CartPole can solve before the second one starts.
    first = _start(["--total-steps", "400000", "--run-dir", str(run_dir),
                    "--set", f"checkpoint_interval={checkpoint_interval}",
                    "--set", "early_stop=false"])  # fmt: skip
    try:
        _wait_for_training(first, run_dir)
        if second == ["--resume"]:
            deadline = time.time() + 60
            while not (run_dir / "checkpoints" / "last.pt").exists() and time.time() < deadline:
                time.sleep(0.1)
        out = subprocess.run([*CLI, *second, str(run_dir), "--total-steps", "500000"],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1, out.stderr
        assert f"{run_dir} is being trained by process {first.pid}" in lines[0]
        assert "--run-dir" in lines[0]
        assert first.poll() is None  # still training
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=60)

    if second == ["--resume"]:
        last = load_checkpoint(run_dir / "checkpoints" / "last.pt")
        total = int(last["counters"]["global_step"]) + 500
    else:
        assert not (run_dir / "checkpoints" / "last.pt").exists()
        total = 500
    again = subprocess.run([*CLI, *second, str(run_dir), "--total-steps", str(total)], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert json.loads((run_dir / "result.json").read_text())["global_step"] == total


# run.py whose process is killed by SIGKILL inside its second checkpoint write, after the
# file is written and before its rename: where a lost machine or the OOM killer stops it.
_KILLED_MID_WRITE = """
import os, signal, stat, sys
import agent.checkpoint as checkpoint
from agent import cli
fsync, writes = os.fsync, []
def killed_on_the_second(fd):
    fsync(fd)
    if stat.S_ISREG(os.fstat(fd).st_mode):  # a file's, not its directory's
        writes.append(fd)
    if len(writes) == 2:
        os.kill(os.getpid(), signal.SIGKILL)
checkpoint.os.fsync = killed_on_the_second
sys.exit(cli.main(sys.argv[1:]))
"""


def test_a_write_cut_by_sigkill_is_cleaned_up_by_the_resume(tmp_path: Path) -> None:
    """A process killed mid-write leaves a temporary file as large as the checkpoint; the
    next process in the run directory removes it and resumes from the intact last.pt."""
    run_dir = tmp_path / "run"
    args = [*CLI[2:], "--total-steps", "3000", "--run-dir", str(run_dir),
            "--set", "checkpoint_interval=1000", "--set", "eval_interval=0"]  # fmt: skip
    killed = subprocess.run([sys.executable, "-c", _KILLED_MID_WRITE, *args], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    checkpoints = run_dir / "checkpoints"
    left = [p for p in checkpoints.iterdir() if p.suffix == ".tmp"]
    assert len(left) == 1 and left[0].stat().st_size > 0
    assert load_checkpoint(checkpoints / "last.pt")["counters"]["global_step"] == 1000

    again = subprocess.run([*CLI, "--resume", str(run_dir)], cwd=ROOT, capture_output=True,
                           text=True, timeout=300)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert json.loads((run_dir / "result.json").read_text())["global_step"] == 3000
    assert sorted(p.name for p in checkpoints.iterdir()) == ["last.pt"]
