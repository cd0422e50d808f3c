"""bench/minatar_suite.py: ``--from-json`` files of several sessions merged into one report."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

import bench.minatar_suite

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def minatar():
    return bench.minatar_suite


def runs(game: str, seeds: list[int], finals: dict[str, list[float]]) -> dict:
    return {game: {agent: [{"run_dir": f"/w/{game}/{agent}/seed{s}", "final_eval_return": f,
                            "eval_curve": [[1000, f]], "wall_s": 60.0}
                           for s, f in zip(seeds, finals[agent], strict=True)]
                   for agent in ("noisy", "epsilon")}}


def test_merge_keeps_each_games_seeds_paired_in_file_order(minatar):
    a = runs("Breakout", [101, 102], {"noisy": [1.0, 2.0], "epsilon": [3.0, 4.0]})
    b = runs("Breakout", [103], {"noisy": [5.0], "epsilon": [6.0]})
    b |= runs("Asterix", [103], {"noisy": [7.0], "epsilon": [8.0]})
    merged = minatar.merge_results([a, b], ["Asterix", "Breakout"])
    assert [r["final_eval_return"] for r in merged["Breakout"]["noisy"]] == [1.0, 2.0, 5.0]
    assert [r["final_eval_return"] for r in merged["Breakout"]["epsilon"]] == [3.0, 4.0, 6.0]
    assert minatar.seeds_of(merged["Breakout"]["epsilon"]) == "101,102,103"
    assert minatar.seeds_of(merged["Asterix"]["noisy"]) == "103"


def test_merge_refuses_a_file_whose_agents_ran_different_seeds(minatar):
    bad = runs("Breakout", [101, 102], {"noisy": [1.0, 2.0], "epsilon": [3.0, 4.0]})
    bad["Breakout"]["epsilon"].pop()
    with pytest.raises(SystemExit, match="Breakout: 2 noisy runs against 1"):
        minatar.merge_results([bad], ["Breakout"])


def test_from_json_reports_every_seed_of_every_file_and_skips_unrun_games(tmp_path):
    first = runs("Breakout", [101, 102], {"noisy": [10.0, 12.0], "epsilon": [11.0, 13.0]})
    # A run of a release that saved neither its wall time nor its curve counts in the scores.
    del first["Breakout"]["noisy"][0]["wall_s"], first["Breakout"]["noisy"][0]["eval_curve"]
    second = runs("Breakout", [103], {"noisy": [14.0], "epsilon": [9.0]})
    paths = []
    for i, part in enumerate((first, second)):
        paths.append(tmp_path / f"{i}.json")
        paths[-1].write_text(json.dumps(part))
    proc = subprocess.run(
        [sys.executable, "-m", "bench.minatar_suite", "learn", "--from-json", *map(str, paths),
         "--plot-dir", str(tmp_path / "plots")],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=120)
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| Breakout")]
    assert len(rows) == 1 and "| 101,102,103 |" in rows[0]
    assert not any(line.startswith("| Asterix") for line in proc.stdout.splitlines())
    # Only the runs with a curve are drawn; the plot is still made.
    assert (tmp_path / "plots" / "Breakout.png").exists()


def rainbow_row(tmp_path: Path, game: str, arms: dict, *args: str) -> tuple[list[str], str]:
    """``rainbow --from-json`` over ``{game: arms}``: the cells of the game's row, and stdout."""
    path = tmp_path / "rainbow.json"
    path.write_text(json.dumps({game: arms}))
    proc = subprocess.run(
        [sys.executable, "-m", "bench.minatar_suite", "rainbow", "--from-json", str(path), *args],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=120)
    (row,) = [line for line in proc.stdout.splitlines() if line.startswith(f"| {game} ")]
    return [c.strip() for c in row.strip("|").split("|")], proc.stdout


def test_the_rainbow_report_pairs_its_arms_and_counts_the_goals(tmp_path, minatar):
    seeds = [101, 102, 103]
    finals = {"rainbow": [12.0, 14.0, 13.0], "rainbow-no-noise": [10.0, 12.0, 11.0],
              "default": [9.0, 9.5, 10.0]}  # fmt: skip
    game = {arm: [{"run_dir": f"/w/Breakout/{arm}/seed{s}", "final_eval_return": f,
                   "eval_curve": [[1000, f]], "wall_s": 60.0 * (2 if arm != "default" else 1)}
                  for s, f in zip(seeds, finals[arm], strict=True)] for arm in finals}
    cells, stdout = rainbow_row(tmp_path, "Breakout", game, "--games", "Breakout,Asterix",
                                "--plot-dir", str(tmp_path / "plots"))  # fmt: skip
    assert cells[1] == "101,102,103"
    assert cells[5].startswith("+2.0")  # rainbow minus no noise, paired by seed: mean 2
    assert cells[6].startswith("+3.5")  # rainbow minus the default: mean 3.5
    dqn, rb, _ = minatar.REVISITING_RAINBOW["Breakout"]
    assert cells[8] == f"{'yes' if 13.0 >= dqn else 'no'}, {'yes' if 13.0 >= rb else 'no'}"
    assert "(2.00x)" in cells[9]
    assert "on 1 and its Rainbow on 1 of 1 games" in stdout
    # +2 on every seed: the paired t interval is the point, above zero
    assert "the noise is, against the preset without it (paired 95% CI): 1 ahead, 0 level, " \
        "0 behind of 1 games" in stdout
    assert (tmp_path / "plots" / "Breakout.png").exists()


def test_the_rainbow_report_shows_an_arm_not_run_as_a_dash(tmp_path, minatar):
    """--arms rainbow,rainbow-no-noise: the default's cells are dashes, not an error."""
    runs = {arm: [{"run_dir": f"/w/Seaquest/{arm}/seed{s}", "final_eval_return": f,
                   "eval_curve": [[1000, f]], "wall_s": 90.0}
                  for s, f in ((101, 5.0), (102, 7.0))] for arm in ("rainbow", "rainbow-no-noise")}
    cells, stdout = rainbow_row(tmp_path, "Seaquest", runs, "--games", "Seaquest")
    assert cells[4] == "—" and cells[6] == "—"  # the default, and rainbow minus it
    assert cells[5].startswith("+0.0")  # rainbow minus no noise: equal on both seeds
    assert "0 ahead, 1 level, 0 behind of 1 games" in stdout
    assert cells[9] == "1.5 / —"
    bad = subprocess.run(
        [sys.executable, "-m", "bench.minatar_suite", "rainbow", "--arms", "default"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--arms default" in bad.stderr


@pytest.mark.slow
def test_the_cost_table_times_each_arm_against_the_default_of_the_same_invocation():
    pytest.importorskip("minatar")
    proc = subprocess.run(
        [sys.executable, "-m", "bench.minatar_suite", "cost", "--frames", "6000",
         "--repeats", "1", "--preset-set", "num_atoms=11"],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=600)
    rows = {cells[0]: cells for line in proc.stdout.splitlines() if line.startswith("| ")
            for cells in [[c.strip() for c in line.strip("|").split("|")]]}  # fmt: skip
    assert rows["default"][3] == "1.00x"
    for arm in ("rainbow", "rainbow-no-noise"):
        ms_per_frame, ratio = float(rows[arm][2]), float(rows[arm][3].rstrip("x"))
        assert ms_per_frame > 0 and ratio > 0
    assert "preset overrides: num_atoms=11" in proc.stdout


# Dies the way a run does when its machine goes away: SIGKILL, right after the first
# periodic checkpoint, so no result.json is written.
KILLED_AFTER_CHECKPOINT = """
import os, signal, sys
from agent.cli import entry
from agent.train import Checkpoints
save_last = Checkpoints.save_last
def save_then_die(self, obs):
    save_last(self, obs)
    os.kill(os.getpid(), signal.SIGKILL)
Checkpoints.save_last = save_then_die
sys.argv = ["run.py", *sys.argv[1:]]
entry()
"""


def test_a_run_killed_after_a_checkpoint_is_resumed_not_lost(tmp_path, minatar):
    run_dir = tmp_path / "CartPole" / "rainbow" / "seed0"
    args = ["--env", "CartPole-v1", "--seed", "0", "--total-steps", "1200", "--no-progress",
            "--run-dir", str(run_dir), "--set", "checkpoint_interval=400",
            "--set", "eval_interval=0"]
    killed = subprocess.run([sys.executable, "-c", KILLED_AFTER_CHECKPOINT, *args], cwd=ROOT,
                            capture_output=True, text=True)
    assert killed.returncode == -9
    assert (run_dir / "checkpoints" / "last.pt").exists()
    assert not (run_dir / "result.json").exists()

    result = minatar.finished_or_resumed(run_dir)
    assert result is not None
    assert result["status"] == "finished"
    assert result["global_step"] == 1200
    assert json.loads((run_dir / "result.json").read_text())["global_step"] == 1200


def test_a_run_that_never_checkpointed_counts_as_not_started(tmp_path, minatar):
    run_dir = tmp_path / "seed0"
    run_dir.mkdir()
    (run_dir / "events.out.tfevents.0").write_bytes(b"")
    assert minatar.finished_or_resumed(run_dir) is None


def test_the_rainbow_report_takes_a_default_transcribed_without_walls_or_curves(tmp_path):
    """The default's report runs were transcribed from the log: scores only. They pair by
    seed and count; the wall column and the plot use the runs that have them."""
    seeds = [101, 102]
    finals = {"rainbow": (50.0, 54.0), "rainbow-no-noise": (53.0, 57.0)}
    game = {arm: [{"run_dir": f"/w/Freeway/{arm}/seed{s}", "final_eval_return": f,
                   "eval_curve": [[1000, f]], "wall_s": 120.0}
                  for s, f in zip(seeds, finals[arm], strict=True)]
            for arm in finals}  # fmt: skip
    game["default"] = [{"run_dir": f"minatar-report/Freeway/noisy/seed{s}",
                        "final_eval_return": f} for s, f in zip(seeds, (49.0, 51.0), strict=True)]
    cells, stdout = rainbow_row(tmp_path, "Freeway", game, "--games", "Freeway",
                                "--plot-dir", str(tmp_path / "plots"))  # fmt: skip
    assert cells[4].startswith("50.0")  # the default's median
    assert cells[5].startswith("-3.0")  # the noise 3 behind on both seeds
    assert "0 ahead, 0 level, 1 behind of 1 games" in stdout
    assert cells[6].startswith("+2.0")  # rainbow minus the default, paired by seed
    assert cells[9] == "2.0 / —"
    assert (tmp_path / "plots" / "Freeway.png").exists()


def test_the_transcribed_default_report_matches_its_medians(minatar):
    """bench/minatar_default_report.json against the medians the results page gives for
    the default (docs/results.md#minatar): a slip in transcription shows here."""
    data = json.loads((ROOT / "bench" / "minatar_default_report.json").read_text())
    results = (ROOT / "docs" / "results.md").read_text()
    for game, arms in data.items():
        finals = [r["final_eval_return"] for r in arms["noisy"]]
        seeds = [int(r["run_dir"].rsplit("seed", 1)[1]) for r in arms["noisy"]]
        assert seeds == list(range(101, 101 + len(seeds)))
        row = f"| {game} | {','.join(map(str, seeds))} | {statistics.median(finals):.1f} ("
        assert row in results
        # The epsilon-greedy arm, paired seed by seed, its median in the same row.
        epsilon = arms["epsilon"]
        assert [r["run_dir"].replace("epsilon", "noisy") for r in epsilon] == [
            r["run_dir"] for r in arms["noisy"]
        ]
        line = next(x for x in results.splitlines() if x.startswith(row))
        median = statistics.median(r["final_eval_return"] for r in epsilon)
        assert line.split(" | ")[3].startswith(f"{median:.1f} (")


def test_the_rainbow_report_matches_the_results_page():
    """bench/minatar_rainbow_report.json, the report's own --json, against the medians of
    each arm the results page gives (docs/results.md#minatar-rainbow)."""
    data = json.loads((ROOT / "bench" / "minatar_rainbow_report.json").read_text())
    results = (ROOT / "docs" / "results.md").read_text()
    for game, arms in data.items():
        medians = []
        for arm in bench.minatar_suite.RAINBOW_ARMS:  # the table's column order
            seeds = sorted(int(r["run_dir"].rsplit("seed", 1)[1]) for r in arms[arm])
            assert seeds == list(range(101, 106)), (game, arm)
            medians.append(f"{statistics.median(r['final_eval_return'] for r in arms[arm]):.1f}")
        row = f"| {game} | {medians[0]} ("
        line = next((ln for ln in results.splitlines() if ln.startswith(row)), None)
        assert line is not None, row
        assert [c.strip().split(" ")[0] for c in line.split("|")[2:5]] == medians
