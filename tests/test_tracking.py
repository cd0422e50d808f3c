"""--track: the run on Weights & Biases beside TensorBoard, offline (WANDB_MODE=offline, no
network): every scalar TensorBoard gets, the config, the results, a resume into the same
W&B run, the videos of --eval --video; without wandb, one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from agent import cli
from agent.monitor import Monitor

ROOT = Path(__file__).resolve().parent.parent


class Recorder:
    """A tracker that keeps what it was given."""

    def __init__(self) -> None:
        self.logged: list[tuple[int, str, float]] = []
        self.results: dict[str, float] = {}
        self.closed = False

    def log(self, step: int, values: dict[str, float]) -> None:
        self.logged += [(step, k, v) for k, v in values.items()]

    def summary(self, results: dict[str, float]) -> None:
        self.results.update(results)

    def close(self) -> None:
        self.closed = True


def test_the_tracker_gets_every_scalar_tensorboard_gets(tmp_path: Path) -> None:
    tracker = Recorder()
    monitor = Monitor(tmp_path, 100, progress=False, tracker=tracker)
    monitor.episode(10, 5.0, 7)
    monitor.scalars(20, {"losses/td_loss": 0.5, "charts/epsilon": 0.1})
    monitor.sps(30)
    monitor.hparams({"lr": 0.1}, {"eval/final_mean_return": 3.0})
    monitor.close()
    acc = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    acc.Reload()
    board = {(e.step, tag, e.value) for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)}
    assert {(s, t) for s, t, _ in tracker.logged} == {(s, t) for s, t, _ in board}
    assert (10, "charts/episodic_return", 5.0) in tracker.logged
    assert tracker.results == {"eval/final_mean_return": 3.0} and tracker.closed


def _records(run_dir: Path) -> bytes:
    """Every offline W&B record file of the run directory, as bytes (keys are stored as
    plain strings), once W&B's service has written them out (it writes a short run's
    records when it stops, as it does when a process exits)."""
    import wandb

    wandb.teardown()
    return b"".join(p.read_bytes() for p in sorted(run_dir.glob("wandb/offline-run-*/*.wandb")))


def test_a_tracked_run_offline_then_resumed_into_the_same_w_and_b_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    base = ["--env", "CartPole-v1", "--run-dir", str(run), "--no-progress", "--device", "cpu",
            "--set", "random_starts=300", "--set", "eval_interval=500", "--set",
            "early_stop=false", "--set", "checkpoint_interval=500"]  # fmt: skip
    assert cli.main([*base, "--total-steps", "1000", "--track"]) == 0
    run_id = (run / "wandb_id").read_text().strip()
    first = _records(run)
    for key in (b"charts/episodic_return", b"eval/mean_return", b"eval/final_mean_return",
                b"global_step", b"wandb_project", b"noise_interval"):  # fmt: skip
        assert key in first, key
    assert cli.main(["--resume", str(run), "--total-steps", "1500", "--no-progress"]) == 0
    assert (run / "wandb_id").read_text().strip() == run_id
    runs = sorted(p.name for p in run.glob("wandb/offline-run-*"))
    assert len(runs) == 2 and all(name.endswith(run_id) for name in runs)  # one W&B run


def test_eval_videos_go_to_the_run_s_w_and_b_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb")
    pytest.importorskip("moviepy")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    assert cli.main(["--env", "CartPole-v1", "--run-dir", str(run), "--no-progress",
                     "--total-steps", "600", "--set", "random_starts=300", "--set",
                     "eval_interval=0"]) == 0  # fmt: skip
    assert not (run / "wandb_id").exists()  # not tracked while it trained
    code = cli.main(["--env", "CartPole-v1", "--eval", str(run), "--episodes", "1",
                     "--video", str(tmp_path / "videos"), "--track"])  # fmt: skip
    assert code == 0 and (run / "wandb_id").is_file()
    assert b"videos/" in _records(run)


def test_tracking_without_wandb_is_one_line(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['wandb'] = None\n"
        "from agent import cli\n"
        f"sys.exit(cli.main(['--env', 'CartPole-v1', '--track', '--run-dir', "
        f"{str(tmp_path / 'r')!r}]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "Weights & Biases, which is not installed" in lines[0] and ".[track]" in lines[0]
    assert not (tmp_path / "r").exists()  # refused before anything was written
