"""--track: the run on Weights & Biases beside TensorBoard, offline (WANDB_MODE=offline, no
network): every scalar TensorBoard gets, the config, the results, a resume into the same
W&B run, the videos of --eval --video; without wandb, or without a W&B login where no
terminal can ask for one, one line and no half-made run directory."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import types
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


class _FakeRun:
    """What the tracker uses of a W&B run, recorded nowhere."""

    id = "fake"

    def __init__(self) -> None:
        self.summary: dict[str, float] = {}

    def define_metric(self, *args: object, **kwargs: object) -> None:
        pass

    def log(self, values: dict[str, object]) -> None:
        pass

    def finish(self) -> None:
        pass


def _wandb_without_a_key() -> types.ModuleType:
    """wandb as it is installed without an API key (no `wandb login`, no WANDB_API_KEY):
    with WANDB_MODE unset and stdin not a terminal, ``init`` raises wandb's UsageError (a
    ``wandb.errors.Error``), as wandb 0.31's login does; offline, it starts a run."""
    wandb = types.ModuleType("wandb")
    errors = types.ModuleType("wandb.errors")

    class Error(Exception):
        pass

    class UsageError(Error):
        pass

    errors.Error, errors.UsageError = Error, UsageError  # type: ignore[attr-defined]

    def init(**kwargs: object) -> _FakeRun:
        offline = os.environ.get("WANDB_MODE") in ("offline", "disabled")
        if not offline and not os.environ.get("WANDB_API_KEY") and not sys.stdin.isatty():
            raise UsageError("No API key configured. Use `wandb login` to log in.")
        return _FakeRun()

    wandb.errors, wandb.Error, wandb.init = errors, Error, init  # type: ignore[attr-defined]
    return wandb


def _tracking_error(code: int, err: str) -> str:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert "wandb login" in lines[0] and "WANDB_MODE=offline" in lines[0], lines[0]
    return lines[0]


def test_a_w_and_b_run_that_cannot_log_in_is_one_line_and_leaves_no_run_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", _wandb_without_a_key())
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setattr(sys, "stdin", io.StringIO())  # a script, nohup, a batch job
    args = ["--env", "CartPole-v1", "--track", "--no-progress", "--device", "cpu"]
    # A new directory, with a parent it made too: both gone again.
    new = tmp_path / "runs" / "new"
    _tracking_error(cli.main([*args, "--run-dir", str(new)]), capsys.readouterr().err)
    assert not (tmp_path / "runs").exists()
    # A directory that was there: what it held before stays, nothing else.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    _tracking_error(cli.main([*args, "--run-dir", str(mine)]), capsys.readouterr().err)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_a_resumed_run_whose_w_and_b_run_cannot_start_keeps_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", _wandb_without_a_key())
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setattr(sys, "stdin", io.StringIO())
    run = tmp_path / "run"
    monkeypatch.setenv("WANDB_MODE", "offline")  # tracked offline, then interrupted
    assert cli.main(["--env", "CartPole-v1", "--run-dir", str(run), "--no-progress",
                     "--device", "cpu", "--total-steps", "600", "--track", "--set",
                     "random_starts=300", "--set", "eval_interval=0"]) == 0  # fmt: skip
    files = sorted(run.rglob("*"))
    saved = {p: p.read_bytes() for p in (run / "checkpoints").iterdir()}
    monkeypatch.delenv("WANDB_MODE")
    capsys.readouterr()
    code = cli.main(["--resume", str(run), "--total-steps", "900", "--no-progress"])
    _tracking_error(code, capsys.readouterr().err)
    assert sorted(run.rglob("*")) == files  # nothing of the run removed
    assert {p: p.read_bytes() for p in (run / "checkpoints").iterdir()} == saved
