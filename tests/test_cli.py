"""The command line a newcomer meets: resume by run directory or last.pt, extending a finished
run, errors that name their fix, returns printed and written readably."""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from agent import cli
from agent.evaluate import format_return, json_ready

ROOT = Path(__file__).resolve().parent.parent

# Cue-v0 pays 1 per matching action over 5 steps (threshold 4.5): solved within a few
# thousand steps, so early stop happens well before total_steps.
CUE = "envs.testing:NoisyDQN/Cue-v0"
CUE_SETTINGS = {
    "learning_starts": 200,
    "train_freq": 2,
    "buffer_size": 5_000,
    "eval_interval": 250,
    "eval_episodes": 10,
    "confirm_episodes": 20,
    "early_stop": True,
    "target_update_interval": 100,
    "n_step": 1,
    "gamma": 0.5,
    "log_interval": 500,
    "checkpoint_interval": 1_000,
}


def _train(run_dir: Path, total_steps: int, **overrides: object) -> int:
    sets = [a for k, v in {**CUE_SETTINGS, **overrides}.items() for a in ("--set", f"{k}={v}")]
    return cli.main(["--env", CUE, "--total-steps", str(total_steps), "--run-dir", str(run_dir),
                     "--no-progress", "--device", "cpu", *sets])


def _result(run_dir: Path) -> dict:
    return json.loads((run_dir / "result.json").read_text())


def _one_line_error(code: int, err: str) -> str:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_resume_takes_the_run_directory_or_its_last_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run_dir = tmp_path / "run"
    assert _train(run_dir, 1_000, early_stop="false") == 0
    last = run_dir / "checkpoints" / "last.pt"
    assert cli.main(["--resume", str(last), "--total-steps", "1500", "--no-progress"]) == 0
    assert _result(run_dir)["global_step"] == 1_500
    assert cli.main(["--resume", str(last.parent), "--total-steps", "2000",
                     "--no-progress"]) == 0
    assert _result(run_dir)["global_step"] == 2_000
    capsys.readouterr()
    # best.pt holds no replay or optimizer: while last.pt can be read, a resume from best.pt
    # (which would go back to its step) names the exact one instead.
    code = cli.main(["--resume", str(run_dir / "checkpoints" / "best.pt")])
    assert f"--resume {run_dir} " in _one_line_error(code, capsys.readouterr().err)


def test_a_run_whose_last_pt_is_cut_short_resumes_as_the_error_advises(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run_dir = tmp_path / "run"
    assert _train(run_dir, 1_000, early_stop="false") == 0
    checkpoints = run_dir / "checkpoints"
    last, best = checkpoints / "last.pt", checkpoints / "best.pt"
    copy = tmp_path / "backup" / "last.pt"
    copy.parent.mkdir()
    copy.write_bytes(last.read_bytes())
    last.write_bytes(copy.read_bytes()[: copy.stat().st_size // 2])  # a copy cut short
    capsys.readouterr()
    line = _one_line_error(cli.main(["--resume", str(run_dir)]), capsys.readouterr().err)
    assert "Errno" not in line
    # The advice is a command that runs: on from best.pt, approximately.
    advised = re.search(r"--resume (\S+)", line)
    assert advised is not None and Path(advised.group(1)) == best, line
    assert cli.main(["--resume", advised.group(1), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "approximate" in out
    result = _result(run_dir)
    best_step = torch.load(best, weights_only=True)["counters"]["global_step"]
    assert result["status"] == "finished" and result["global_step"] == 1_000
    assert result["pieces"][-1]["from_step"] == best_step < 1_000
    assert torch.load(last, weights_only=True)["counters"]["global_step"] == 1_000
    # A copy of last.pt outside any run: one line saying where it goes, and from there
    # (last.pt cut short again) it continues the run, exactly as the copy was saved.
    line = _one_line_error(cli.main(["--resume", str(copy)]), capsys.readouterr().err)
    assert "checkpoints/" in line
    last.write_bytes(copy.read_bytes()[:100])
    placed = checkpoints / "last-copy.pt"
    placed.write_bytes(copy.read_bytes())
    code = cli.main(["--resume", str(placed), "--total-steps", "1200", "--no-progress"])
    assert code == 0 and "exact" in capsys.readouterr().out
    assert [p["from_step"] for p in _result(run_dir)["pieces"]] == [0, 1_000]


def test_a_finished_run_says_so_and_an_extension_keeps_the_whole_runs_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run_dir = tmp_path / "run"
    assert _train(run_dir, 20_000) == 0
    first = _result(run_dir)
    assert first["status"] == "solved" and first["global_step"] < 20_000
    capsys.readouterr()

    # Resuming it as it is would train on past its early stop: refused, with the fix.
    line = _one_line_error(cli.main(["--resume", str(run_dir)]), capsys.readouterr().err)
    assert f"solved at step {first['solved_step']}" in line
    assert f"--total-steps N, N above {first['global_step']}" in line
    code = cli.main(["--resume", str(run_dir), "--total-steps", str(first["global_step"])])
    assert "--total-steps" in _one_line_error(code, capsys.readouterr().err)

    # Extended, it trains to the new end; result.json describes the whole run.
    end = first["global_step"] + 1_000
    assert cli.main(["--resume", str(run_dir), "--total-steps", str(end), "--no-progress"]) == 0
    whole = _result(run_dir)
    assert whole["global_step"] == end
    assert whole["solved_step"] == first["solved_step"]
    assert whole["wall_time_s"] > first["wall_time_s"]
    # Two pieces, the start and the extension, on this machine; their walls make the run's.
    from agent.setup import describe_machine, describe_software

    here = describe_machine(torch.device("cpu"))
    assert [(p["machine"], p["from_step"], p["to_step"]) for p in whole["pieces"]] == [
        (here, 0, first["global_step"]), (here, first["global_step"], end)
    ]  # fmt: skip
    # Each piece names what it ran with: Python and the versions of the packages.
    software = describe_software()
    assert [p["software"] for p in whole["pieces"]] == [software, software]
    assert f"torch {torch.__version__}" in software and f"numpy {np.__version__}" in software
    assert sum(p["wall_s"] for p in whole["pieces"]) == pytest.approx(whole["wall_time_s"])
    assert whole["eval_curve"][: len(first["eval_curve"])] == first["eval_curve"]
    assert len(whole["eval_curve"]) > len(first["eval_curve"])

    # Finished all of its steps: the same refusal, with the step count.
    line = _one_line_error(cli.main(["--resume", str(run_dir)]), capsys.readouterr().err)
    assert f"finished all its {end} steps" in line


def test_in_a_terminal_no_message_lands_on_the_progress_bar_s_line(tmp_path: Path) -> None:
    from conftest import BAR_FRAME, run_in_a_terminal, text_after_a_bar

    run_dir = tmp_path / "run"
    code, lines = run_in_a_terminal([
        "--env", "CartPole-v1", "--total-steps", "400", "--run-dir", str(run_dir),
        "--device", "cpu", "--set", "random_starts=100", "--set", "learning_starts=100",
        "--set", "log_interval=100", "--set", "eval_interval=0",
    ])  # fmt: skip
    assert code == 0 and any(BAR_FRAME.search(line) for line in lines), lines
    assert text_after_a_bar(lines) == []
    assert any(str(run_dir) in line for line in lines)  # the messages: on lines of their own
    # A resume prints its own line first, then the run's: none on a bar either.
    code, lines = run_in_a_terminal(["--resume", str(run_dir), "--total-steps", "600"])
    assert code == 0 and any(BAR_FRAME.search(line) for line in lines), lines
    assert text_after_a_bar(lines) == []


@pytest.mark.parametrize(
    ("args", "fix"),
    [
        (["--total-steps", "100"], "--set learning_starts=N"),
        (["--set", "lr=-1"], "--set lr="),
        (["--set", "gamma=1.5"], "--set gamma="),
        (["--set", "batch_size=64", "--set", "buffer_size=10"], "--set batch_size=N"),
        (["--set", "learning_starts=10", "--set", "batch_size=32"], "--set learning_starts=32"),
        (["--set", "noise_interval=0"], "--set noise_interval="),
        (["--set", "exploration=noisy", "--set", "noisy_layers=none"], "--set noisy_layers="),
        (["--set", "hidden_sizes=[]"], "--set hidden_sizes="),
        (["--set", "eval_episodes=0"], "--set eval_episodes="),
        # A flag's value is fixed with the flag; a fix names CartPole-v1's own value
        # (its config trains 50,000 steps, the default config 150,000).
        (["--total-steps", "-5"], "--total-steps 50000,"),
        (["--total-steps", "0", "--seeds", "2"], "--total-steps 50000,"),
        (["--num-envs", "0"], "--num-envs 1,"),
        (["--seed", "-1"], "--seed 1,"),
        (["--set", "total_steps=-5"], "--set total_steps=50000"),
    ],
)
def test_config_errors_name_what_fixes_them(
    args: list[str], fix: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    code = cli.main(["--env", "CartPole-v1", "--run-dir", str(tmp_path / "r"), *args])
    line = _one_line_error(code, capsys.readouterr().err)
    assert fix in line
    assert not (tmp_path / "r").exists()


def test_help_for_config_lists_every_preset_of_the_presets_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent import config_files

    monkeypatch.setenv("COLUMNS", "1000")  # one line per option, no name broken at a hyphen

    def listed() -> set[str]:
        (line,) = [x for x in cli.build_parser().format_help().splitlines()
                   if x.lstrip().startswith("--config")]  # fmt: skip
        return set(re.findall(r"[\w-]+", line.split("preset", 1)[1]))

    shipped = {p.stem for p in (config_files.CONFIG_DIR / "presets").glob("*.yaml")}
    assert len(shipped) > 1 and shipped <= listed()
    # A preset added to the folder is listed without an edit anywhere else.
    (tmp_path / "presets").mkdir()
    for name in ("rainbow", "my-new-preset"):
        (tmp_path / "presets" / f"{name}.yaml").write_text("lr: 0.001\n")
    monkeypatch.setattr(config_files, "CONFIG_DIR", tmp_path)
    assert {"rainbow", "my-new-preset"} <= listed() and "der" not in listed()


def test_resume_of_what_holds_no_run_suggests_only_what_resume_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
    (tmp_path / "empty" / "checkpoints" / "best.pt").write_bytes(b"")
    for path in (tmp_path / "nope", tmp_path / "empty"):
        line = _one_line_error(cli.main(["--resume", str(path)]), capsys.readouterr().err)
        assert str(path) in line and "best.pt" not in line  # --resume refuses best.pt
    run_dir = tmp_path / "run"
    assert _train(run_dir, 1_000, early_stop="false") == 0
    capsys.readouterr()
    code = cli.main(["--resume", str(run_dir), "--total-steps", "-5"])
    line = _one_line_error(code, capsys.readouterr().err)
    assert "--total-steps N, N above 1000" in line and "--set" not in line


@pytest.mark.parametrize(
    ("env_id", "settings", "taken"),
    [
        ("CartPole-v1", {"eval_interval": 500, "confirm_episodes": 2}, "best.pt"),
        # MinAtar evaluates every 50,000 steps: a short run writes no best.pt.
        ("MinAtar/Breakout-v1", {"learning_starts": 100, "buffer_size": 1_000}, "last.pt"),
    ],
)
def test_the_hint_after_training_works_and_evaluates_the_best_policy_or_the_latest(
    env_id: str, settings: dict, taken: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    if env_id.startswith("MinAtar/"):
        pytest.importorskip("minatar")
    run_dir = tmp_path / "run"
    sets = [a for k, v in settings.items() for a in ("--set", f"{k}={v}")]
    assert cli.main(["--env", env_id, "--total-steps", "1000", "--run-dir", str(run_dir),
                     "--no-progress", "--device", "cpu", *sets]) == 0  # fmt: skip
    (hint,) = [line for line in capsys.readouterr().out.splitlines() if "evaluate with:" in line]
    words = shlex.split(hint.split("evaluate with:", 1)[1])
    argv = words[words.index("--eval"):]
    assert cli.main([*argv, "--episodes", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    if taken == "last.pt":
        assert report["checkpoint"] == str(run_dir / "checkpoints" / "last.pt")
    else:  # the one of the two that its own scores favour
        result = _result(run_dir)
        assert result["best_confirmed"]
        better = result["best_eval_return"] > result["final_eval_return"]
        assert report["checkpoint"] == str(run_dir / "checkpoints" /
                                           ("best.pt" if better else "last.pt"))  # fmt: skip


def _eval_json(capsys: pytest.CaptureFixture, *args: str) -> dict:
    capsys.readouterr()
    assert cli.main(["--eval", *args, "--json", "--device", "cpu"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _replay(named: dict) -> list[str]:
    """--eval's flags for the episodes a score names (result.json's *_episodes)."""
    return ["--seed", str(named["seed"]), "--stream", str(named["stream"]), "--round",
            str(named["round"]), "--episodes", str(named["episodes"]),
            "--epsilon", str(named["epsilon"])]  # fmt: skip


def test_every_score_of_a_run_is_what_eval_gives_on_the_episodes_it_names(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    # eval_epsilon: random actions too, drawn per episode, which --eval must draw alike.
    assert _train(run_dir, 1_000, early_stop="false", eval_epsilon=0.2) == 0
    result = _result(run_dir)
    best, last = run_dir / "checkpoints" / "best.pt", run_dir / "checkpoints" / "last.pt"
    assert result["best_confirmed"] and result["best_eval_episodes"]["epsilon"] == 0.2
    report = _eval_json(capsys, str(best), *_replay(result["best_eval_episodes"]))
    assert report["mean_return"] == result["best_eval_return"]
    report = _eval_json(capsys, str(last), *_replay(result["final_eval_episodes"]))
    assert report["mean_return"] == result["final_eval_return"]
    assert report["mean_length"] == result["final_eval_mean_length"]
    # TensorBoard's last periodic round played last.pt's policy; eval/round names it.
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    (periodic,) = [e for e in acc.Scalars("eval/mean_return") if e.step == 1_000]
    (round_index,) = [e.value for e in acc.Scalars("eval/round") if e.step == 1_000]
    named = {**result["final_eval_episodes"], "round": int(round_index), "episodes": 10}
    report = _eval_json(capsys, str(last), *_replay(named))
    assert report["mean_return"] == pytest.approx(periodic.value, rel=1e-6)  # float32 events
    # The default is the checkpoint's own eval_epsilon: the run's protocol.
    assert _eval_json(capsys, str(last), "--episodes", "2")["episode_seeds"]["epsilon"] == 0.2


def test_eval_of_a_run_directory_plays_the_policy_its_scores_favour_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run_dir = tmp_path / "run"
    assert _train(run_dir, 600, early_stop="false") == 0
    written = _result(run_dir)
    best, last = run_dir / "checkpoints" / "best.pt", run_dir / "checkpoints" / "last.pt"

    def taken(**figures: object) -> str:
        (run_dir / "result.json").write_text(json.dumps({**written, **figures}))
        return _eval_json(capsys, str(run_dir), "--episodes", "1")["checkpoint"]

    assert taken(best_confirmed=True, best_eval_return=4.0, final_eval_return=3.0) == str(best)
    assert taken(best_confirmed=True, best_eval_return=3.0, final_eval_return=4.0) == str(last)
    # A best.pt score of the round that picked it is no evidence against a fresh one.
    assert taken(best_confirmed=False, best_eval_return=4.0, final_eval_return=3.0) == str(last)
    # No final score (a run still going, or interrupted): its best policy.
    assert taken(best_confirmed=True, best_eval_return=4.0, final_eval_return=None) == str(best)
    capsys.readouterr()
    assert cli.main(["--eval", str(run_dir), "--episodes", "1", "--device", "cpu"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("checkpoint:")]
    assert str(best) in line


def test_a_file_that_torch_did_not_write_is_not_a_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    text = tmp_path / "README.md"
    text.write_text("# a text file\n")
    for args in (["--eval", str(text)], ["--export", str(text)]):
        line = _one_line_error(cli.main(args), capsys.readouterr().err)
        assert "is not a checkpoint" in line


def test_eval_finds_the_env_in_the_checkpoint_and_writes_clean_json(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run_dir = tmp_path / "run"
    assert _train(run_dir, 600, early_stop="false") == 0
    capsys.readouterr()
    last = run_dir / "checkpoints" / "last.pt"
    assert cli.main(["--eval", str(last), "--episodes", "3", "--json", "--device", "cpu"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    report = json.loads(out[-1])
    assert report["env"] == CUE
    # No float in the JSON has more digits than it means (no 9.299999999999999).
    for number in re.findall(r"-?\d+\.\d+", out[-1]):
        assert len(number.lstrip("-").replace(".", "").lstrip("0")) <= 12, number
    assert format_return(report["mean_return"]) in out[0]


def test_ctrl_c_during_eval_ends_it_in_one_line_with_the_signals_status(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal

    import agent.evaluate

    run_dir = tmp_path / "run"
    assert _train(run_dir, 600, early_stop="false") == 0
    capsys.readouterr()
    real, calls = agent.evaluate.run_episodes, []

    def interrupted(policy, *args, **kwargs):  # type: ignore[no-untyped-def]
        def acting(obs):  # type: ignore[no-untyped-def]
            calls.append(1)
            if len(calls) == 12:  # Ctrl-C: one SIGINT to this process, mid-episodes
                os.kill(os.getpid(), signal.SIGINT)
            return policy(obs)

        return real(acting, *args, **kwargs)

    monkeypatch.setattr(agent.evaluate, "run_episodes", interrupted)
    last = run_dir / "checkpoints" / "last.pt"
    code = cli.main(["--eval", str(last), "--episodes", "100000", "--device", "cpu"])
    assert code == 130 and len(calls) == 12  # not one step after the signal
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    # 10 copies of 5-step episodes: after 12 steps, two rounds of 10 have ended
    assert err.startswith("interrupted (SIGINT) after 20 of 100000 episodes")


@pytest.mark.parametrize(
    ("x", "text"),
    [(0.955, "0.955"), (9.3, "9.30"), (487.25, "487"), (-200.0, "-200"), (1234.5, "1234"),
     (0.0123, "0.0123"), (0.0, "0"), (7.949, "7.95")],
)
def test_returns_print_with_three_significant_digits(x: float, text: str) -> None:
    assert format_return(x) == text


def test_json_floats_read_as_the_numbers_they_are() -> None:
    mean = float(torch.tensor([9.0, 9.5, 9.4], dtype=torch.float64).mean())
    assert mean != 9.3  # a mean of returns carries binary noise
    cleaned = json_ready({"mean": mean, "curve": [(1000, 0.1 + 0.2)], "steps": 3})
    assert json.dumps(cleaned) == '{"mean": 9.3, "curve": [[1000, 0.3]], "steps": 3}'
    assert math.isclose(json_ready(1 / 3), 1 / 3, rel_tol=1e-11)


def test_run_py_and_the_console_script_start_the_process_the_same_way() -> None:
    # Both go through cli.entry, which imports torch with the collector paused before
    # main(): calling main() alone made a whole CartPole command about 15% slower.
    import importlib.metadata
    import subprocess
    import sys

    (script,) = importlib.metadata.entry_points(group="console_scripts", name="noisy-dqn")
    assert script.value == "agent.cli:entry"
    code = (
        "import runpy, sys\n"
        "import agent.cli as cli\n"
        "calls = []\n"
        "cli._import_torch = lambda: calls.append(1)\n"
        "sys.argv = ['run.py', '--env', 'Nope-v0']\n"
        "try:\n"
        "    runpy.run_path('run.py', run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    print(len(calls), e.code)\n"
    )
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.split() == ["1", "2"], out.stderr


def test_output_whose_reader_has_gone_ends_quietly() -> None:
    # `noisy-dqn --list-config | head -5`: head exits after five lines, and every later
    # write goes to a pipe with no reader.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        out = subprocess.run([sys.executable, "run.py", "--list-config"], cwd=ROOT,
                             stdout=write_end, stderr=subprocess.PIPE, text=True,
                             timeout=120)  # fmt: skip
    finally:
        os.close(write_end)
    assert out.stderr == ""
    assert out.returncode == cli.EXIT_BROKEN_PIPE  # 128 + SIGPIPE, as `seq 9 | head -1`'s seq


def test_a_run_whose_update_cannot_compile_says_so_in_one_line_and_trains_eagerly(
    tmp_path: Path,
) -> None:
    """learner_backend compile where inductor's C++ compiler is missing (CXX names none
    that exists): the run prints one line naming the cause, trains on, and its result
    records the backend that ran."""
    run_dir = tmp_path / "run"
    env = {**os.environ, "CXX": str(tmp_path / "no-such-g++")}
    out = subprocess.run(
        [sys.executable, "run.py", "--env", "CartPole-v1", "--total-steps", "600",
         "--set", "learning_starts=200", "--set", "eval_interval=0",
         "--set", "learner_backend=compile", "--run-dir", str(run_dir), "--no-progress"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    said = [line for line in (out.stdout + out.stderr).splitlines() if "compile" in line]
    assert len(said) == 1 and "could not be compiled" in said[0] and "C++ compiler" in said[0]
    assert "Traceback" not in out.stderr
    assert json.loads((run_dir / "result.json").read_text())["learner_backend"] == "torch"



def test_the_learners_news_during_a_run_lands_above_the_progress_bar(tmp_path: Path) -> None:
    """The compile backend's one line comes at the first update, with the bar on screen
    (here the line that compiling failed: no C++ compiler): on a line of its own."""
    from conftest import BAR_FRAME, run_in_a_terminal, text_after_a_bar

    code, lines = run_in_a_terminal([
        "--env", "CartPole-v1", "--total-steps", "400", "--run-dir", str(tmp_path / "run"),
        "--device", "cpu", "--set", "random_starts=100", "--set", "learning_starts=100",
        "--set", "log_interval=50", "--set", "eval_interval=0",
        "--set", "learner_backend=compile",
    ], env={"CXX": str(tmp_path / "no-such-g++")})  # fmt: skip
    assert code == 0 and any(BAR_FRAME.search(line) for line in lines), lines
    assert any("could not be compiled" in line for line in lines), lines
    assert text_after_a_bar(lines) == []
