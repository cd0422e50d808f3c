"""agent/sweep/cli.py: --seeds and --grid parsing, and run.py's sweep errors (no Ray needed)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from sweep_helpers import fake_sweep

from agent import cli
from agent.errors import UserError
from agent.sweep.cli import parse_grid, parse_seeds
from agent.usage import install_hint


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
    code = cli.main(["--env", "CartPole-v1", *argv, "--run-dir", str(sweep_dir)])
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
    argv = ["--env", "CartPole-v1", "--seeds", "3", "--run-dir", str(tmp_path / "s")]
    code = cli.main([*argv, "--ray-address", "local"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and install_hint("sweep") in err
    assert not (tmp_path / "s").exists()


def test_cli_resume_checks_the_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--resume", str(tmp_path), "--seeds", "2"]) == 2
    assert "is not a sweep directory" in capsys.readouterr().err
    manifest, _ = fake_sweep(tmp_path / "s")
    (tmp_path / "s" / "sweep.json").write_text(json.dumps(manifest))
    assert cli.main(["--env", "CartPole-v1", "--seeds", "4", "--run-dir", str(tmp_path / "s")]) == 2
    assert "already holds a sweep: continue it with --resume" in capsys.readouterr().err
    code = cli.main(["--resume", str(tmp_path / "s"), "--env", "CartPole-v1", "--seeds", "2"])
    assert code == 2
    assert "holds a different sweep" in capsys.readouterr().err
