"""bench/suite.py: thresholds of envs beyond the three classic-control ones, and the
noisy-against-epsilon comparison the generality check reads."""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import gymnasium as gym
import pytest

import bench.suite
from agent.config_files import load_config
from agent.errors import UserError


@pytest.fixture(scope="module")
def suite():
    return bench.suite


def run(final: float, curve: list | None = None) -> dict:
    return {"final_eval_return": final, "eval_curve": curve or [], "wall_s": 1.0}


def test_thresholds_come_from_the_goal_then_the_table_then_the_registry(suite):
    assert suite.threshold_of("MountainCar-v0") == (-110.0, "the classic-control goal")
    assert suite.threshold_of("CartPole-v0")[0] == gym.spec("CartPole-v0").reward_threshold
    assert suite.threshold_of("FrozenLake-v1") == (0.7, "registered reward_threshold")
    # Registered at 8, above what the optimal policy averages: the table overrides it
    # with the target of the env's YAML.
    assert gym.spec("Taxi-v4").reward_threshold == 8
    assert suite.threshold_of("Taxi-v4")[0] == load_config("Taxi-v4").target_return == 7.0
    assert suite.threshold_of("Blackjack-v1") == (None, "none registered")
    with pytest.raises(UserError, match="unknown environment id"):
        suite.threshold_of("NoSuchEnv-v0")
    # Family ids register on first use, as run.py registers them.
    pytest.importorskip("minigrid")
    assert suite.threshold_of("MiniGrid-DoorKey-5x5-v0") == (None, "none registered")


def test_config_used_names_the_env_yaml_or_says_there_is_none(suite):
    assert suite.config_used("Acrobot-v1") == (
        "configs/default.yaml < configs/Acrobot-v1.yaml"
    )
    assert suite.config_used("FrozenLake-v1").endswith("(no YAML of its own)")


def test_set_reaches_both_of_our_agents_and_the_ablation_keeps_its_noise_off(suite):
    noisy = suite.our_args(suite.AGENTS[0], ["update_noise=0", "lr=0.001"])
    assert noisy == ["--set", "update_noise=0", "--set", "lr=0.001"]
    ablation = suite.our_args(suite.AGENTS[1], ["noisy_layers=all"])
    assert ablation[:2] == ["--set", "noisy_layers=all"]
    assert ablation[-2:] == ["--set", "noisy_layers=none"]  # the later --set wins
    assert suite.our_args(suite.AGENTS[0], []) == []
    assert suite.config_used("FrozenLake-v1", ["update_noise=0"]).endswith(
        "< --set update_noise=0"
    )


def test_config_file_reaches_both_agents_before_their_set(suite):
    noisy = suite.our_args(suite.AGENTS[0], ["lr=0.001"], "/abs/default.yaml")
    assert noisy == ["--config", "/abs/default.yaml", "--set", "lr=0.001"]
    ablation = suite.our_args(suite.AGENTS[1], [], "/abs/default.yaml")
    assert ablation[:2] == ["--config", "/abs/default.yaml"]
    assert ablation[-2:] == ["--set", "noisy_layers=none"]
    assert suite.config_used("Acrobot-v1", ["lr=0.001"], "configs/default.yaml") == (
        "configs/default.yaml < configs/Acrobot-v1.yaml"
        " < --config configs/default.yaml"
        " < --set lr=0.001"
    )


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Acrobot-v1", "MountainCar-v0"])
def test_config_default_yaml_undoes_every_key_of_an_env_yaml(env_id):
    # What --config configs/default.yaml promises: the config of an env without a YAML.
    from agent.config_files import CONFIG_DIR, env_config_file, load_config

    assert env_config_file(env_id) is not None
    forced = asdict(load_config(env_id, CONFIG_DIR / "default.yaml"))
    plain = asdict(load_config("FrozenLake-v1"))
    assert env_config_file("FrozenLake-v1") is None
    del forced["env_id"], plain["env_id"]
    assert forced == plain


def test_a_missing_config_file_is_a_one_line_usage_error(tmp_path):
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "-m", "bench.suite", "--config", str(tmp_path / "nope.yaml")],
        cwd=root, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "nope.yaml: no such file" in proc.stderr.splitlines()[-1]
    assert "Traceback" not in proc.stderr


def test_summarise_without_a_threshold_reports_final_returns_only(suite):
    row = suite.summarise(None, [run(-0.1), run(0.02), run(-0.05), run(0.0)], None)
    assert row["solved"] == "-" and row["steps"] == "-"
    assert row["finals"] == "-0.10 0.02 -0.05 0.00"
    assert row["iqm"].startswith("-0.025 [")


def test_summarise_with_a_threshold_counts_solves_and_steps(suite):
    results = [run(0.8, [[2000, 0.5], [4000, 0.7]]), run(0.6, [[2000, 0.3]])]
    row = suite.summarise(0.7, results, None)
    assert row["solved"] == "1/2"
    assert row["steps"].startswith("never")  # median of 4,000 and never


def test_compare_passes_when_noisy_is_level_and_says_where_it_is_ahead(suite):
    noisy = [run(200.0, [[2000, 200.0]]) for _ in range(10)]
    eps = [run(200.0, [[4000, 200.0]]) for _ in range(9)] + [run(100.0, [[2000, 0.0]])]
    c = suite.compare(195.0, noisy, eps)
    assert c["solved"] == (10, 10, 9, 10)
    assert c["steps"] == (2000.0, 4000.0)
    assert c["verdict"] == "noisy >= epsilon (ahead on solve rate)"
    level = suite.compare(195.0, noisy, noisy)
    assert level["verdict"] == "noisy >= epsilon"
    assert level["iqm_diff"] == 0.0 and level["iqm_diff_ci"] == (0.0, 0.0)


def test_compare_fails_when_noisy_is_behind_and_says_whether_beyond_the_noise(suite):
    eps = [run(1.0) for _ in range(10)]
    far_behind = [run(0.0) for _ in range(10)]
    c = suite.compare(0.7, far_behind, eps)
    assert c["verdict"] == ("noisy < epsilon (solve rate, final-return IQM; "
                            "beyond the 95% CI)")
    assert math.isinf(c["steps"][0]) and math.isinf(c["steps"][1])
    one_seed_behind = [run(0.0)] + [run(1.0) for _ in range(9)]
    c = suite.compare(0.7, one_seed_behind, eps)
    assert c["verdict"] == "noisy < epsilon (solve rate; within the 95% CI)"


def test_compare_without_a_threshold_uses_the_final_return_iqm_alone(suite):
    noisy = [run(x) for x in (-0.2, -0.1, 0.0, 0.1, 0.2)]
    eps = [run(x + 0.01) for x in (-0.2, -0.1, 0.0, 0.1, 0.2)]
    c = suite.compare(None, noisy, eps)
    assert "solved" not in c and "steps" not in c
    assert c["iqm_diff"] == pytest.approx(-0.01)
    assert c["verdict"] == "noisy < epsilon (final-return IQM; within the 95% CI)"


def test_comparison_rows_give_solve_rates_steps_and_iqm_or_say_there_is_no_threshold(suite):
    cartpole = {suite.AGENTS[0]: [run(200.0, [[2000, 200.0]])] * 3,
                suite.AGENTS[1]: [run(200.0, [[4000, 200.0]])] * 3}
    row = suite.comparison_row("CartPole-v0", *suite.threshold_of("CartPole-v0")[:1], cartpole)
    assert row["config"] == "default.yaml"  # CartPole-v0 has no YAML of its own
    assert row["seeds solved, noisy / epsilon"] == "3/3 / 3/3"
    assert row["median steps to solve, noisy / epsilon"] == "2,000 / 4,000"
    assert row["final return IQM, noisy / epsilon"] == "200.0 / 200.0"
    blackjack = {suite.AGENTS[0]: [run(-0.05)] * 3, suite.AGENTS[1]: [run(-0.1)] * 3}
    row = suite.comparison_row("Blackjack-v1", None, blackjack)
    assert row["seeds solved, noisy / epsilon"] == "- (no threshold)"
    assert row["verdict"].startswith("noisy >= epsilon")


def test_comparison_rows_name_the_config_file_after_the_env_yaml(suite):
    results = {suite.AGENTS[0]: [run(-90.0, [[30000, -90.0]])],
               suite.AGENTS[1]: [run(-95.0, [[20000, -95.0]])]}
    row = suite.comparison_row("Acrobot-v1", -100.0, results,
                               config_file="configs/default.yaml")
    assert row["config"] == "Acrobot-v1.yaml < --config configs/default.yaml"
    assert row["seeds solved, noisy / epsilon"] == "1/1 / 1/1"


def test_print_comparison_prints_one_row_per_env(suite, capsys):
    results = {env: {suite.AGENTS[0]: [run(1.0)], suite.AGENTS[1]: [run(1.0)]}
               for env in ("CartPole-v0", "Acrobot-v1")}
    suite.print_comparison(list(results), {env: (None, "") for env in results}, results)
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("| ")]
    assert [x.split(" | ")[0] for x in lines] == ["| env", "| CartPole-v0", "| Acrobot-v1"]


def test_paired_counts_seeds_higher_equal_lower(suite):
    assert suite.paired([0.7, 0.5, 0.6], [0.6, 0.5, 0.8]) == (1, 1, 1)
    with pytest.raises(ValueError):
        suite.paired([0.7], [0.6, 0.5])


def test_print_comparison_paired_by_seed_adds_a_column(suite, capsys):
    results = {"FrozenLake-v1": {suite.AGENTS[0]: [run(0.6), run(0.75)],
                                 suite.AGENTS[1]: [run(0.7), run(0.75)]}}
    suite.print_comparison(["FrozenLake-v1"], {"FrozenLake-v1": (0.7, "registered")},
                           results, title="more", paired_by_seed=True)
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "### more"
    assert out[3].count("|") == out[4].count("|") and out[4].startswith("|---")
    assert "| 0 / 1 / 1 | noisy < epsilon (solve rate, final-return IQM;" in out[5]
