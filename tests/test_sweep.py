"""Sweeps: parsing, statistics and summaries without Ray; a real sweep on a local Ray."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import run
from agent import sweep
from agent.errors import UserError
from agent.sweep import (
    bootstrap_ci,
    build_trials,
    iqm,
    parse_grid,
    parse_seeds,
    steps_to_solve,
    summarize,
)

ROOT = Path(__file__).resolve().parent.parent

# A few thousand CartPole steps with evaluations, logging and checkpoints.
SHORT = [
    "--total-steps",
    "2000",
    "--device",
    "cpu",
    "--set",
    "early_stop=false",
    "--set",
    "learning_starts=200",
    "--set",
    "train_freq=2",
    "--set",
    "buffer_size=5000",
    "--set",
    "eval_interval=1000",
    "--set",
    "eval_episodes=2",
    "--set",
    "confirm_episodes=3",
    "--set",
    "checkpoint_interval=1000",
]


# --- parsing ----------------------------------------------------------------------------------


def test_parse_seeds_count_range_and_list() -> None:
    assert parse_seeds("3") == [1, 2, 3]
    assert parse_seeds("1-4") == [1, 2, 3, 4]
    assert parse_seeds("3,5,8") == [3, 5, 8]
    assert parse_seeds("0-2, 9") == [0, 1, 2, 9]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("0", "must be >= 1"),
        ("", "empty"),
        ("5-2", "is empty"),
        ("1,x", "'x' is not a seed"),
        ("-3", "is not a seed"),
        ("1,2,1", "seed 1 is listed twice"),
    ],
)
def test_parse_seeds_errors(text: str, fragment: str) -> None:
    with pytest.raises(UserError, match=fragment):
        parse_seeds(text)


def test_parse_grid_yaml_values_and_lists() -> None:
    grid = parse_grid(["sigma0=0.1,0.5", "hidden_sizes=[64,64],[128]", "dueling=true,false"])
    assert grid == {
        "sigma0": [0.1, 0.5],
        "hidden_sizes": [[64, 64], [128]],
        "dueling": [True, False],
    }
    assert parse_grid(["lr=3e-4,1e-3"]) == {"lr": [3e-4, 1e-3]}  # YAML strings become floats


@pytest.mark.parametrize(
    ("items", "fragment"),
    [
        (["sigma=0.1"], "unknown config key 'sigma' \\(did you mean sigma0\\?\\)"),
        (["sigma0="], "empty value"),
        (["sigma0=0.1,"], "empty value"),
        (["sigma0"], "expects key=value1,value2"),
        (["seed=1,2"], "--seeds"),
        (["env_id=CartPole-v1"], "one env"),
        (["n_step=1", "n_step=3"], "given twice"),
        (["n_step=1,1"], "listed twice"),
        (["lr=abc"], "'lr' in --grid must be float"),
        (["hidden_sizes=[64,"], "cannot parse"),
    ],
)
def test_parse_grid_errors(items: list[str], fragment: str) -> None:
    with pytest.raises(UserError, match=fragment):
        parse_grid(items)


def test_build_trials_crosses_grid_and_seeds() -> None:
    grid = parse_grid(["sigma0=0.1,0.5", "hidden_sizes=[32],[64,64]"])
    trials = build_trials("CartPole-v1", None, {"total_steps": 2000}, [1, 2], grid)
    assert len(trials) == 8
    assert len({t.run_dir for t in trials}) == 8
    assert trials[0].run_dir == "sigma0=0.1_hidden_sizes=32/seed_1"
    assert trials[0].name == "sigma0=0.1 hidden_sizes=[32] seed=1"
    assert trials[-1].config["hidden_sizes"] == [64, 64] and trials[-1].config["seed"] == 2
    assert all(t.config["total_steps"] == 2000 for t in trials)
    assert [t.run_dir for t in build_trials("CartPole-v1", None, {}, [3], {})] == ["seed_3"]


def test_build_trials_validates_every_grid_point_first() -> None:
    with pytest.raises(UserError, match="grid point batch_size=100000: invalid config"):
        build_trials("CartPole-v1", None, {}, [1], {"batch_size": [32, 100_000]})


# --- statistics on fixed numbers ---------------------------------------------------------------


def test_iqm_is_the_mean_of_the_middle_half() -> None:
    assert iqm([1, 2, 3, 4, 5, 6, 7, 8]) == 4.5  # mean of 3, 4, 5, 6
    assert iqm([0, 0, 0, 100]) == 0.0  # the outlier is trimmed
    assert iqm(range(1, 11)) == 5.5  # 10 values: 2 trimmed at each end (scipy's trim_mean)
    assert iqm([7.0]) == 7.0
    assert iqm([500, 10, 480, 495, 20, 490, 500, 470]) == pytest.approx((470 + 480 + 490 + 495) / 4)


def test_bootstrap_ci_fixed_numbers() -> None:
    # Two seeds: resampled IQMs (= means) are 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4.
    assert bootstrap_ci([0.0, 1.0]) == (0.0, 1.0)
    assert bootstrap_ci([5.0, 5.0, 5.0]) == (5.0, 5.0)
    assert bootstrap_ci([3.0]) == (3.0, 3.0)
    # Same numbers, same interval (fixed bootstrap seed).
    x = [120.0, 500.0, 480.0, 90.0, 500.0, 310.0]
    assert bootstrap_ci(x) == bootstrap_ci(x)
    lo, hi = bootstrap_ci(x)
    assert lo <= iqm(x) <= hi


def test_bootstrap_ci_matches_exact_resampling_distribution() -> None:
    # n=4: all 4**4 resamples are equally likely; the bootstrap percentiles converge to theirs.
    x = np.array([10.0, 200.0, 300.0, 500.0])
    exact = sorted(iqm(x[list(idx)]) for idx in itertools.product(range(4), repeat=4))
    lo_exact, hi_exact = np.percentile(exact, [2.5, 97.5])
    lo, hi = bootstrap_ci(x)
    assert lo == pytest.approx(lo_exact, abs=5.0)
    assert hi == pytest.approx(hi_exact, abs=5.0)


def test_steps_to_solve() -> None:
    base = {"target_return": 475.0, "global_step": 9000, "final_eval_return": 100.0}
    assert steps_to_solve({**base, "solved_step": 6000, "eval_curve": []}) == 6000
    curve = [[1000, 20.0], [2000, 480.0], [3000, 300.0]]
    assert steps_to_solve({**base, "solved_step": None, "eval_curve": curve}) == 2000
    low = [[1000, 20.0]]
    assert steps_to_solve({**base, "solved_step": None, "eval_curve": low}) is None
    final = {**base, "final_eval_return": 490.0, "solved_step": None, "eval_curve": low}
    assert steps_to_solve(final) == 9000
    assert steps_to_solve({**base, "target_return": None, "solved_step": None}) is None


def _fake_sweep(tmp_path: Path) -> tuple[dict, list[sweep.Trial]]:
    grid = {"sigma0": [0.1, 0.5]}
    trials = build_trials("CartPole-v1", None, {}, [1, 2, 3, 4], grid)
    manifest = {"sweep_id": "x", "env_id": "CartPole-v1", "trials": [t.__dict__ for t in trials]}
    finals = {"0.1": [500.0, 480.0, 100.0, 490.0], "0.5": [20.0, 30.0, 40.0]}
    for t in trials:
        run_dir = tmp_path / t.run_dir
        run_dir.mkdir(parents=True)
        key = str(t.params["sigma0"])
        if t.seed > len(finals[key]):
            (run_dir / "error.txt").write_text("RuntimeError: boom\n\ntraceback")
            continue
        final = finals[key][t.seed - 1]
        result = {
            "status": "finished",
            "global_step": 4000,
            "target_return": 475.0,
            "solved_step": None,
            "final_eval_return": final,
            "wall_time_s": 10.0 * t.seed,
            "eval_curve": [[1000, 10.0], [2000, final], [4000, final]],
        }
        (run_dir / "result.json").write_text(json.dumps(result))
    return manifest, trials


def test_summary_statistics_from_run_directories(tmp_path: Path) -> None:
    manifest, trials = _fake_sweep(tmp_path)
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
    text = sweep.format_summary(s)
    assert "| sigma0=0.1 | 3/4 | 2000 [2000, 2000] | 485.0 [" in text
    assert "| sigma0=0.5 | 0/3 (of 4) | n/a | 30.0 [" in text
    assert "`sigma0=0.5/seed_4`: RuntimeError: boom" in text


def test_plot_is_skipped_with_a_note_without_matplotlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest, trials = _fake_sweep(tmp_path)
    s = summarize(tmp_path, manifest, trials, wall_time_s=None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    note = sweep.plot_curves(s, tmp_path / "eval_curves.png")
    assert note is not None and "matplotlib" in note and "\n" not in note
    assert not (tmp_path / "eval_curves.png").exists()


def test_plot_written_with_matplotlib(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    manifest, trials = _fake_sweep(tmp_path)
    s = summarize(tmp_path, manifest, trials, wall_time_s=None)
    assert sweep.plot_curves(s, tmp_path / "eval_curves.png") is None
    assert (tmp_path / "eval_curves.png").stat().st_size > 1000


def test_remote_trial_ships_its_run_directory(tmp_path: Path) -> None:
    """A worker that does not see the sweep directory trains in a temp dir and returns it."""
    args = run.build_parser().parse_args(["--env", "CartPole-v1", "--seeds", "1", *SHORT])
    args.set = [*args.set, "total_steps=600", "eval_interval=300", "checkpoint_interval=300"]
    args.total_steps = None
    (trial,), _ = sweep._trials_from_args(args)
    (tmp_path / "sweep.json").write_text(json.dumps({"sweep_id": "driver"}))
    out = sweep.run_trial(trial.__dict__, str(tmp_path), "another-sweep-id")
    assert out["status"] == "finished" and out["archive"]
    assert not (tmp_path / trial.run_dir).exists()  # nothing written on "this" machine
    sweep._unpack(out["archive"], tmp_path / trial.run_dir)
    result = json.loads((tmp_path / trial.run_dir / "result.json").read_text())
    assert result["final_eval_return"] == out["final_eval_return"]
    assert (tmp_path / trial.run_dir / "checkpoints" / "last.pt").exists()


# --- command line errors: one line, exit status 2, no Ray needed -------------------------------


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--seeds", "0"], "--seeds 0: the number of seeds must be >= 1"),
        (["--seeds", "2", "--grid", "sigma=0.1,0.5"], "unknown config key 'sigma'"),
        (["--seeds", "2", "--grid", "sigma0="], "--grid sigma0: empty value"),
        (["--seeds", "2", "--grid", "n_step=0,3"], "grid point n_step=0: invalid config"),
        (["--seeds", "2", "--seed", "4"], "--seed and --seeds together"),
        (["--seeds", "2", "--ray-address", "127.0.0.1:1"], "cannot reach a Ray head"),
        (["--seeds", "2", "--ray-address", "nonsense"], "expected HOST:PORT"),
        (["--seeds", "2", "--retries", "-1"], "--retries must be >= 0"),
        (["--seeds", "2", "--eval", "x.pt"], "--eval evaluates one checkpoint"),
    ],
)
def test_cli_errors_are_one_line_exit_2(
    argv: list[str], fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep_dir = tmp_path / "sweep"
    code = run.main(["--env", "CartPole-v1", *argv, "--run-dir", str(sweep_dir)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert fragment in err
    assert not sweep_dir.exists()  # nothing written


def test_cli_without_ray_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a)
    )
    code = run.main(["--env", "CartPole-v1", "--seeds", "3", "--run-dir", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert code == 2 and err == 'error: sweeps need Ray: pip install -e ".[sweep]"\n'


def test_cli_resume_checks_the_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run.main(["--resume", str(tmp_path), "--seeds", "2"]) == 2
    assert "is not a sweep directory" in capsys.readouterr().err
    manifest, _ = _fake_sweep(tmp_path / "s")
    (tmp_path / "s" / "sweep.json").write_text(json.dumps(manifest))
    assert run.main(["--env", "CartPole-v1", "--seeds", "4", "--run-dir", str(tmp_path / "s")]) == 2
    assert "already holds a sweep: continue it with --resume" in capsys.readouterr().err
    code = run.main(["--resume", str(tmp_path / "s"), "--env", "CartPole-v1", "--seeds", "2"])
    assert code == 2
    assert "holds a different sweep" in capsys.readouterr().err


# --- a real sweep on a local Ray ---------------------------------------------------------------


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
    argv += ["--run-dir", str(sweep_dir), "--no-progress"]
    assert run.main(argv) == 1  # some trials failed; the others finished
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
    assert run.main(["--resume", str(sweep_dir), "--no-progress"]) == 1
    out = capsys.readouterr()
    assert "4 of 8 trials already finished: not run again" in out.out
    assert out.err.count("FAILED") == 4 and "device=cpu" not in out.err
    for run_dir, mtimes in finished.items():
        assert _mtimes(sweep_dir / run_dir) == mtimes


def _crash_first_attempt(trial: dict, sweep_dir: str, sweep_id: str) -> dict:
    marker = Path(sweep_dir) / f"crashed-{trial['seed']}"
    if trial["seed"] == 1 and not marker.exists():
        marker.touch()
        os._exit(1)  # the worker process dies, as under the OOM killer
    return sweep.run_trial(trial, sweep_dir, sweep_id)


@pytest.mark.slow
def test_a_killed_trial_is_retried(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ray = pytest.importorskip("ray")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    args = run.build_parser().parse_args(["--env", "CartPole-v1", "--seeds", "2", *SHORT])
    trials, definition = sweep._trials_from_args(args)
    manifest = {"sweep_id": "s", **definition, "trials": [t.__dict__ for t in trials]}
    sweep.write_manifest(tmp_path, manifest)
    code = sweep.run_sweep(
        tmp_path, manifest, trials, num_cpus=2, progress=False, trial_fn=_crash_first_attempt
    )
    assert code == 0
    assert "retry   seed=1: attempt 1 failed" in capsys.readouterr().err
    assert json.loads((tmp_path / "summary.json").read_text())["trials_done"] == 2


@pytest.mark.slow
def test_ctrl_c_keeps_finished_trials_and_resume_runs_the_rest(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    sweep_dir = tmp_path / "sweep"
    # total_steps 2000 trials finish early; the 10000-step ones are still running at Ctrl-C.
    short = [a for a in SHORT if a not in ("--total-steps", "2000")]
    argv = ["run.py", "--env", "CartPole-v1", "--seeds", "2", *short, "--set", "eval_interval=0"]
    argv += ["--grid", "total_steps=2000,10000", "--run-dir", str(sweep_dir), "--no-progress"]
    proc = subprocess.Popen(
        [sys.executable, *argv],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline and not list(sweep_dir.glob("total_steps=2000/*/result.json")):
        time.sleep(0.5)
    time.sleep(3)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal signals the whole group
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, output
    assert "run the rest with: python run.py --resume" in output
    results = {p.parent: json.loads(p.read_text()) for p in sweep_dir.glob("*/*/result.json")}
    done_before = [d for d, r in results.items() if r["status"] == "finished"]
    assert done_before
    mtimes = {d: _mtimes(d) for d in done_before}
    # Only the unfinished trials run, continuing from their checkpoints.
    code = run.main(["--resume", str(sweep_dir), "--no-progress"])
    assert code == 0
    for d, m in mtimes.items():
        assert _mtimes(d) == m
    summary = json.loads((sweep_dir / "summary.json").read_text())
    assert summary["complete"] and summary["trials_done"] == 4
