"""agent/sweep/worker.py: trials as a Ray worker runs them (called directly: no Ray needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sweep_helpers import SHORT

from agent import cli
from agent.sweep.cli import _trials_from_args
from agent.sweep.worker import run_trial, run_trials, unpack


def test_remote_trial_ships_its_run_directory(tmp_path: Path) -> None:
    """A worker that does not see the sweep directory trains in a temp dir and returns it."""
    args = cli.build_parser().parse_args(["--env", "CartPole-v1", "--seeds", "1", *SHORT])
    args.set = [*args.set, "total_steps=600", "eval_interval=300", "checkpoint_interval=300"]
    args.total_steps = None
    (trial,), _ = _trials_from_args(args)
    (tmp_path / "sweep.json").write_text(json.dumps({"sweep_id": "driver"}))
    out = run_trial(trial.__dict__, str(tmp_path), "another-sweep-id")
    assert out["status"] == "finished" and out["archive"]
    assert not (tmp_path / trial.run_dir).exists()  # nothing written on "this" machine
    unpack(out["archive"], tmp_path / trial.run_dir)
    result = json.loads((tmp_path / trial.run_dir / "result.json").read_text())
    assert result["final_eval_return"] == out["final_eval_return"]
    assert (tmp_path / trial.run_dir / "checkpoints" / "last.pt").exists()


def test_remote_trials_stacked_ship_every_run_directory(tmp_path: Path) -> None:
    args = cli.build_parser().parse_args(["--env", "CartPole-v1", "--seeds", "2", *SHORT])
    args.set = [*args.set, "total_steps=600", "eval_interval=300", "checkpoint_interval=300"]
    args.total_steps = None
    trials, _ = _trials_from_args(args)
    (tmp_path / "sweep.json").write_text(json.dumps({"sweep_id": "driver"}))
    outs = run_trials([t.__dict__ for t in trials], str(tmp_path), "another-sweep-id")
    assert [o["status"] for o in outs] == ["finished", "finished"]
    for trial, out in zip(trials, outs, strict=True):
        assert not (tmp_path / trial.run_dir).exists()
        unpack(out["archive"], tmp_path / trial.run_dir)
        result = json.loads((tmp_path / trial.run_dir / "result.json").read_text())
        assert result["final_eval_return"] == pytest.approx(out["final_eval_return"])
    assert outs[0]["final_eval_return"] is not None
