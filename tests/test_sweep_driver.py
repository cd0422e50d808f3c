"""agent/sweep/driver.py: real sweeps on a local Ray (skipped without Ray): failures, retries,
Ctrl-C and SIGTERM, --resume, and seeds stacked in a task; how trials become tasks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sweep_helpers import SHORT

from agent import cli
from agent.checkpoint import load_checkpoint
from agent.seeds.group import GROUP_KEY
from agent.sweep.cli import _trials_from_args
from agent.sweep.driver import run_sweep, tasks
from agent.sweep.stats import iqm
from agent.sweep.trials import write_manifest
from agent.sweep.trials import build_trials
from agent.sweep.worker import run_trials

ROOT = Path(__file__).resolve().parent.parent


def _mtimes(run_dir: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file()}


def test_sweep_on_local_ray_with_a_failing_grid_point_and_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("ray")
    sweep_dir = tmp_path / "sweep"
    # device=cuda:99 is type-valid and passes validation, but fails when the trial runs.
    argv = ["--env", "CartPole-v1", "--seeds", "2", "--grid", "device=cpu,cuda:99"]
    argv += ["--grid", "sigma0=0.1,0.5", *[a for a in SHORT if a not in ("--device", "cpu")]]
    argv += ["--run-dir", str(sweep_dir), "--no-progress", "--ray-address", "local"]
    assert cli.main(argv) == 1  # some trials failed; the others finished
    out = capsys.readouterr()
    assert "FAILED  device=cuda:99 sigma0=0.1 seed=1" in out.err

    manifest = json.loads((sweep_dir / "sweep.json").read_text())
    summary = json.loads((sweep_dir / "summary.json").read_text())
    assert len(manifest["trials"]) == 8
    assert (summary["trials_done"], summary["trials_failed"]) == (4, 4)
    for row in summary["trials"]:
        run_dir = sweep_dir / row["run_dir"]
        if row["params"]["device"] == "cuda:99":
            assert row["state"] == "failed" and (run_dir / "error.txt").exists()
            continue
        result = json.loads((run_dir / "result.json").read_text())
        assert result["status"] == "finished" and result["global_step"] == 2000
        assert row["final_eval_return"] == result["final_eval_return"]
        assert (run_dir / "config.yaml").exists()
        assert list(run_dir.glob("events.out.tfevents.*"))
        assert (run_dir / "checkpoints" / "last.pt").exists()
    for conf in summary["configurations"]:
        finals = [
            r["final_eval_return"]
            for r in summary["trials"]
            if r["configuration"] == conf["configuration"] and r["state"] == "done"
        ]
        if conf["params"]["device"] == "cpu":
            assert conf["final_eval_return"]["iqm"] == pytest.approx(iqm(finals))
            assert conf["done"] == 2
        else:
            assert conf["final_eval_return"] is None and conf["failed"] == 2
    assert "| device=cpu sigma0=0.1 | 0/2 |" in (sweep_dir / "summary.md").read_text()

    # --resume runs only what is missing: the failed trials again, not the finished ones.
    finished = {
        r["run_dir"]: _mtimes(sweep_dir / r["run_dir"])
        for r in summary["trials"]
        if r["state"] == "done"
    }
    assert cli.main(["--resume", str(sweep_dir), "--no-progress", "--ray-address", "local"]) == 1
    out = capsys.readouterr()
    assert "4 of 8 trials already finished: not run again" in out.out
    assert out.err.count("FAILED") == 4 and "device=cpu" not in out.err
    for run_dir, mtimes in finished.items():
        assert _mtimes(sweep_dir / run_dir) == mtimes


def _crash_first_attempt(trials: list[dict], sweep_dir: str, sweep_id: str) -> list[dict]:
    marker = Path(sweep_dir) / "crashed-1"
    if any(t["seed"] == 1 for t in trials) and not marker.exists():
        marker.touch()
        os._exit(1)  # the worker process dies, as under the OOM killer
    return run_trials(trials, sweep_dir, sweep_id)


@pytest.mark.slow
def test_a_killed_trial_is_retried(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ray = pytest.importorskip("ray")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    args = cli.build_parser().parse_args(["--env", "CartPole-v1", "--seeds", "2", *SHORT])
    trials, definition = _trials_from_args(args)
    manifest = {"sweep_id": "s", **definition, "trials": [t.__dict__ for t in trials]}
    write_manifest(tmp_path, manifest)
    code = run_sweep(
        tmp_path, manifest, trials, num_cpus=2, progress=False, trials_fn=_crash_first_attempt
    )
    assert code == 0
    assert "retry   seed=1: attempt 1 failed" in capsys.readouterr().err
    assert json.loads((tmp_path / "summary.json").read_text())["trials_done"] == 2


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "status"),
    [
        (signal.SIGINT, 130),  # Ctrl-C: a terminal signals the whole foreground group
        (signal.SIGTERM, 143),  # Slurm, Kubernetes, a spot machine: before they kill the job
    ],
)
def test_ctrl_c_and_sigterm_keep_finished_trials_and_resume_runs_the_rest(
    tmp_path: Path, signum: int, status: int
) -> None:
    pytest.importorskip("ray")
    sweep_dir = tmp_path / "sweep"
    # total_steps 2000 trials finish early; the 6000-step ones are still running at the signal.
    short = [a for a in SHORT if a not in ("--total-steps", "2000")]
    argv = ["run.py", "--env", "CartPole-v1", "--seeds", "2", *short, "--set", "eval_interval=0"]
    argv += ["--grid", "total_steps=2000,6000", "--run-dir", str(sweep_dir), "--no-progress"]
    argv += ["--ray-address", "local"]
    proc = subprocess.Popen(
        [sys.executable, *argv],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as under a terminal or a scheduler
    )
    deadline = time.time() + 180
    while time.time() < deadline and not (
        list(sweep_dir.glob("total_steps=2000/*/result.json"))
        and list(sweep_dir.glob("total_steps=6000/*/checkpoints/last.pt"))
    ):
        time.sleep(0.2)
    os.killpg(proc.pid, signum)  # to the driver and the Ray processes it started
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == status, output
    assert "run the rest with: python run.py --resume" in output
    results = {p.parent: json.loads(p.read_text()) for p in sweep_dir.glob("*/*/result.json")}
    done_before = [d for d, r in results.items() if r["status"] == "finished"]
    assert done_before
    # A running trial was asked to stop, and saved where it was: not killed, not finished.
    stopped = [r for r in results.values() if r["status"] == "interrupted"]
    assert stopped and all(0 < r["global_step"] < 6000 for r in stopped), output
    # The summary so far is written beside the manifest.
    summary = json.loads((sweep_dir / "summary.json").read_text())
    assert summary["trials_done"] == len(done_before) and not summary["complete"]
    assert (sweep_dir / "summary.md").exists()
    assert len(json.loads((sweep_dir / "sweep.json").read_text())["trials"]) == 4
    mtimes = {d: _mtimes(d) for d in done_before}
    # Only the unfinished trials run, continuing from their checkpoints.
    code = cli.main(["--resume", str(sweep_dir), "--no-progress", "--ray-address", "local"])
    assert code == 0
    for d, m in mtimes.items():
        assert _mtimes(d) == m
    summary = json.loads((sweep_dir / "summary.json").read_text())
    assert summary["complete"] and summary["trials_done"] == 4


def test_a_task_stacks_a_grid_points_seeds_to_fill_the_cpus() -> None:
    trials = build_trials("CartPole-v1", None, {}, [1, 2, 3, 4, 5], {"sigma0": [0.1, 0.5]})
    units = tasks(trials, 4, lambda t: True)  # 10 trials on 4 CPUs: 3 seeds a task
    assert [[t.seed for t in u] for u in units] == [[1, 2, 3], [4, 5]] * 2
    assert all(len({t.label for t in u}) == 1 for u in units)  # one grid point per task
    assert [len(u) for u in tasks(trials, 16, lambda t: True)] == [1] * 10
    assert [len(u) for u in tasks(trials, 1, lambda t: True)] == [5, 5]
    assert [len(u) for u in tasks(trials, 1, lambda t: False)] == [1] * 10  # images


@pytest.mark.slow
def test_seeds_stacked_in_ray_tasks_are_ordinary_trials(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    args = cli.build_parser().parse_args(["--env", "CartPole-v1", "--seeds", "4", *SHORT])
    trials, definition = _trials_from_args(args)
    manifest = {"sweep_id": "s", **definition, "trials": [t.__dict__ for t in trials]}
    write_manifest(tmp_path, manifest)
    assert run_sweep(tmp_path, manifest, trials, num_cpus=2, progress=False) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["trials_done"] == 4
    for t in trials:  # two tasks of two seeds, each seed a run directory of its own
        last = load_checkpoint(tmp_path / t.run_dir / "checkpoints" / "last.pt")
        assert GROUP_KEY in last and last["counters"]["global_step"] == 2000
