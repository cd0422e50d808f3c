"""bench/curve.py: a run's curve read over its resumed pieces, and drawn."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from torch.utils.tensorboard import SummaryWriter

from bench.curve import EPISODES, EVAL, moving_mean, read_curves

ROOT = Path(__file__).resolve().parent.parent


def _piece(run_dir: Path, points: list[tuple[int, float, float]], name: str) -> None:
    """One process's event file: (step, wall time, eval return) points."""
    writer = SummaryWriter(str(run_dir), filename_suffix=name)
    for step, wall, value in points:
        writer.add_scalar(EVAL, value, step, walltime=wall)
        writer.add_scalar(EPISODES, value - 1.0, step, walltime=wall)
    writer.close()


def test_a_resumed_run_drops_the_redone_steps_and_the_gap_between_pieces(
    tmp_path: Path,
) -> None:
    # First piece: steps 0-500 over 50 s; it saved at 300 and was stopped; the second piece
    # starts an hour later from step 300's checkpoint (logging from 400) and runs 20 s.
    first = [(step, 1000.0 + step / 10, float(step)) for step in range(0, 600, 100)]
    second = [(step, 5000.0 + (step - 400) / 10, float(step) + 0.5) for step in (400, 500, 600)]
    _piece(tmp_path, first, "a")
    _piece(tmp_path, second, "b")

    curves = read_curves(tmp_path)

    steps = [p[0] for p in curves[EVAL]]
    assert steps == [0, 100, 200, 300, 400, 500, 600]
    assert [p[2] for p in curves[EVAL]][4:] == [400.5, 500.5, 600.5]  # the second piece's
    walls = [p[1] for p in curves[EVAL]]
    assert walls[:4] == pytest.approx([0.0, 10.0, 20.0, 30.0])
    # the first piece ran 50 s (its redone steps included), the hour between not counted
    assert walls[4:] == pytest.approx([50.0, 60.0, 70.0])
    assert [p[0] for p in curves[EPISODES]] == steps


def test_moving_mean_averages_up_to_the_window_before_each_value() -> None:
    assert moving_mean([1.0, 3.0, 5.0, 7.0], window=2).tolist() == [1.0, 2.0, 4.0, 6.0]


def test_the_command_draws_a_png_and_refuses_a_directory_without_events(tmp_path: Path) -> None:
    _piece(tmp_path / "run", [(0, 10.0, -21.0), (1000, 20.0, -15.0)], "a")
    out = tmp_path / "curve.png"
    command = [sys.executable, "-m", "bench.curve", str(tmp_path / "run"), "--out", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| 1,000 |" in done.stdout
    command[3] = str(tmp_path)  # holds a run directory, no events of its own
    empty = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert empty.returncode == 2 and len(empty.stderr.strip().splitlines()) == 1
