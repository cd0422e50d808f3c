"""agent/sweep/report.py: the summary's statistics, table and plot from run directories."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from sweep_helpers import fake_sweep

from agent.sweep.report import format_summary, plot_curves, summarize
from agent.usage import install_hint


def test_summary_statistics_from_run_directories(tmp_path: Path) -> None:
    manifest, trials = fake_sweep(tmp_path)
    s = summarize(tmp_path, manifest, trials, wall_time_s=12.0)
    assert (s["trials_total"], s["trials_done"], s["trials_failed"]) == (8, 7, 1)
    assert not s["complete"]
    a, b = s["configurations"]
    assert a["configuration"] == "sigma0=0.1" and b["configuration"] == "sigma0=0.5"
    assert (a["done"], a["solved"], a["failed"]) == (4, 3, 0)
    assert a["steps_to_solve"] == {"median": 2000.0, "q25": 2000.0, "q75": 2000.0, "iqr": 0.0}
    assert a["final_eval_return"]["iqm"] == pytest.approx((480 + 490) / 2)
    assert a["final_eval_return"]["n"] == 4
    assert (b["done"], b["solved"], b["failed"]) == (3, 0, 1)
    assert b["steps_to_solve"] is None
    assert b["final_eval_return"]["iqm"] == 30.0  # 3 seeds: int(0.75) = 0 trimmed: the mean
    assert b["wall_time_s"] == {"median": 20.0, "total": 60.0}
    text = format_summary(s)
    assert "| sigma0=0.1 | 3/4 | 2000 [2000, 2000] | 485.0 [" in text
    assert "| sigma0=0.5 | 0/3 (of 4) | n/a | 30.0 [" in text
    assert "`sigma0=0.5/seed_4`: RuntimeError: boom" in text


def test_plot_is_skipped_with_a_note_without_matplotlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest, trials = fake_sweep(tmp_path)
    s = summarize(tmp_path, manifest, trials, wall_time_s=None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    note = plot_curves(s, tmp_path / "eval_curves.png")
    assert note is not None and "matplotlib" in note and "\n" not in note
    # matplotlib alone draws it: not the bench extra (SB3, Box2D, rliable, ...).
    assert "pip install matplotlib" in note and install_hint("bench") not in note
    assert not (tmp_path / "eval_curves.png").exists()


def test_plot_written_with_matplotlib(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    manifest, trials = fake_sweep(tmp_path)
    s = summarize(tmp_path, manifest, trials, wall_time_s=None)
    assert plot_curves(s, tmp_path / "eval_curves.png") is None
    assert (tmp_path / "eval_curves.png").stat().st_size > 1000
