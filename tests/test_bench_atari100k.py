"""bench/atari100k.py: human-normalised scores, the aggregates and the paired difference
against cases worked by hand, the FLOP count against the network's own layers, and a
report of two tiny runs through the sweep machinery, collected and resumed."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from agent.checkpoint import load_checkpoint
from agent.errors import UserError
from agent.networks import QNetwork
from agent.setup import describe_machine, describe_software

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("rliable")
atari100k = pytest.importorskip("bench.atari100k")


def test_human_normalised_scores_are_0_at_random_and_1_at_human() -> None:
    pong = atari100k.BY_NAME["Pong"]
    assert pong.normalized(-20.7) == 0.0 and pong.normalized(14.6) == 1.0
    assert pong.normalized(-3.05) == pytest.approx(0.5)
    assert len(atari100k.GAMES) == 26 and pong.env_id == "PongNoFrameskip-v4"


def test_aggregates_of_a_case_worked_by_hand() -> None:
    # Two seeds x two games: 0, 1, 2, 3. IQM: the middle half, (1 + 2) / 2; the optimality
    # gap: the mean shortfall below 1, (1 + 0 + 0 + 0) / 4.
    matrix = np.array([[0.0, 1.0], [2.0, 3.0]])
    agg = atari100k.aggregates(matrix, reps=2000)
    assert agg["IQM"][0] == 1.5 and agg["median"][0] == 1.5 and agg["mean"][0] == 1.5
    assert agg["optimality gap"][0] == 0.25
    for point, low, high in agg.values():
        assert low <= point <= high
    # Stratified: each game's runs are resampled among themselves (game 1: 0 or 2, game 2:
    # 1 or 3), so every resampled mean lies in [(0 + 1) / 2, (2 + 3) / 2].
    assert agg["mean"][1] == 0.5 and agg["mean"][2] == 2.5


def test_the_paired_difference_resamples_both_arms_alike() -> None:
    rng = np.random.default_rng(0)
    b = rng.uniform(0, 2, (3, 5))
    diff = atari100k.paired_difference(b + 0.25, b, reps=2000)
    for name in ("IQM", "median", "mean"):
        assert diff[name] == pytest.approx((0.25, 0.25, 0.25))  # the same runs every draw
    independent = atari100k.aggregates(b + 0.25, reps=2000)["IQM"]
    assert independent[2] - independent[1] > 0.1  # alone, the arm's own spread


def test_the_table_aggregates_per_game_means_beside_the_published_tables(
    tmp_path: Path,
) -> None:
    """Two games, two seeds: the arm's per-game means are Pong's normalised (0 + 1) / 2 =
    0.5 and Boxing's (0.25 + 0.75) / 2 = 0.5, so every aggregate of them is 0.5 (the
    optimality gap 1 - 0.5). DER's published Pong, -19.3, is 1.4 / 35.3 = 0.040 and its
    Boxing, 0.2, is 0.1 / 12 = 0.008; their IQM, median and mean are 0.024."""
    pong, boxing = atari100k.BY_NAME["Pong"], atari100k.BY_NAME["Boxing"]

    def raw(game: atari100k.Game, normalised: float) -> float:
        return game.random + normalised * (game.human - game.random)

    runs = [{"game": g.name, "arm": arm, "seed": seed, "score": raw(g, x), "wall_s": 60.0,
             "final_eval_s": 6.0, "curve": []}
            for arm in ("der", "der-epsilon")
            for g, xs in ((pong, (0.0, 1.0)), (boxing, (0.25, 0.75)))
            for seed, x in zip((101, 102), xs, strict=True)]  # fmt: skip
    (tmp_path / "r.json").write_text(json.dumps({"runs": runs}))
    text = atari100k.table(argparse.Namespace(json=str(tmp_path / "r.json"),
                                              arms="der,der-epsilon", reps=200,
                                              published="DER"))  # fmt: skip
    assert "| per-game means | IQM | median | mean | optimality gap |" in text
    assert "| der | 0.500 | 0.500 | 0.500 | 0.500 |" in text
    assert "| der-epsilon | 0.500 | 0.500 | 0.500 | 0.500 |" in text
    assert "| DER as published | 0.024 | 0.024 | 0.024 | 0.976 |" in text
    assert "| DrQ as published |" in text and "| SPR as published |" in text


def test_arms_are_compared_on_the_seeds_they_all_have() -> None:
    """One JSON may hold more seeds of one arm than of another (the DrQ runs: drq-epsilon
    on seeds 1-3, drq-noisy on 1-2): the two are compared on seeds 1-2, on every game both
    have them for; a game one arm lacks a seed of drops out."""
    runs = [{"game": game, "arm": arm, "seed": seed, "score": 0.0}
            for game in ("Breakout", "Krull")
            for arm, seeds in (("drq-epsilon", (1, 2, 3)), ("drq-noisy", (1, 2)))
            for seed in seeds]  # fmt: skip
    runs.append({"game": "Seaquest", "arm": "drq-epsilon", "seed": 1, "score": 0.0})
    runs.append({"game": "Seaquest", "arm": "drq-noisy", "seed": 2, "score": 0.0})
    assert atari100k.complete_cells(runs, ["drq-noisy", "drq-epsilon"]) == (
        ["Breakout", "Krull"], [1, 2])
    assert atari100k.complete_cells(runs, ["drq-epsilon"]) == (["Breakout", "Krull"], [1, 2, 3])
    assert atari100k.complete_cells(runs, ["drq-epsilon", "der"]) == ([], [])  # der: no runs
    assert atari100k.complete_cells(runs, []) == ([], [])


def test_the_flop_count_is_the_networks_own_layers() -> None:
    net = QNetwork((4, 84, 84), 18, (256,), torso="der", dueling=True, num_atoms=51)
    x = torch.zeros(1, 4, 84, 84)
    macs = []

    def hook(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        if isinstance(module, nn.Conv2d):
            macs.append(output.numel() * module.in_channels * module.kernel_size[0] ** 2)
        else:
            macs.append(module.in_features * module.out_features)

    for m in net.modules():
        if isinstance(m, nn.Conv2d) or hasattr(m, "in_features"):
            m.register_forward_hook(hook)
    net(x)
    assert len(macs) == 6  # two convolutions, two layers per stream
    first = macs[0]  # the first convolution: no input gradient
    forward = sum(macs)
    assert atari100k.der_flops(18) == 2 * (3 * 32 * forward + 32 * (first + 2 * (forward - first)))


def full_disk(obj: object, f: io.BufferedWriter) -> None:  # half a file, then ENOSPC
    f.write(b"PK\x03\x04 half a zip")
    raise OSError(28, "No space left on device")


def test_a_report_runs_through_the_sweep_collects_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ale_py = pytest.importorskip("ale_py")
    report = tmp_path / "report.json"
    short = ["total_steps=150", "learning_starts=100", "final_episodes=1", "eval_envs=1",
             "eval_epsilon=1.0", "buffer_size=1000", "n_step=3",
             "env_kwargs={max_num_frames_per_episode: 2000}"]  # fmt: skip
    args = argparse.Namespace(seeds="101-101", arms="der,der-epsilon", games="Boxing",
                              sweep=str(tmp_path / "sweep"), ray_address=None,
                              json=str(report), set=short, keep_replay=True)  # fmt: skip
    assert atari100k.report(args) == 0
    runs = json.loads(report.read_text())["runs"]
    lasts = [tmp_path / "sweep" / "Boxing" / arm / "seed_101" / "checkpoints" / "last.pt"
             for arm in ("der", "der-epsilon")]  # fmt: skip
    assert all("replay" in load_checkpoint(last) for last in lasts)  # --keep-replay
    # Collecting drops landed runs' replay buffers; a full disk leaves each file whole.
    out = io.StringIO()
    with monkeypatch.context() as m:
        m.setattr(torch, "save", full_disk)
        atari100k.collect(tmp_path / "sweep", report, out)
    assert out.getvalue().count("No space left on device") == 2
    assert all("replay" in load_checkpoint(last) for last in lasts)
    atari100k.collect(tmp_path / "sweep", report, io.StringIO())
    for last in lasts:  # the networks stay, for --eval
        data = load_checkpoint(last)
        assert "replay" not in data and "q_network" in data
    assert sorted((r["game"], r["arm"], r["seed"]) for r in runs) == [
        ("Boxing", "der", 101), ("Boxing", "der-epsilon", 101)
    ]  # fmt: skip
    for run in runs:
        assert run["steps"] == 150 and run["episodes"] == 1 and run["wall_s"] > 0
        assert run["machines"] == [describe_machine(torch.device("cpu"))]  # one piece, here
        assert run["software"] == [describe_software()]
        assert f"ale-py {ale_py.__version__}" in run["software"][0]  # the Atari package too
        assert isinstance(run["score"], float)
    sweep = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    configs = {t["label"]: t["config"] for t in sweep["trials"]}
    assert configs["Boxing/der-epsilon"]["noisy_layers"] == "none"
    assert configs["Boxing/der"]["torso"] == "der" and configs["Boxing/der"]["env_id"] == (
        "BoxingNoFrameskip-v4")  # fmt: skip
    # Again, in a fresh sweep directory: the JSON holds both, nothing runs.
    again = argparse.Namespace(**{**vars(args), "sweep": str(tmp_path / "sweep2")})
    assert atari100k.report(again) == 0
    assert not (tmp_path / "sweep2").exists()
    text = atari100k.table(argparse.Namespace(json=str(report), arms="der,der-epsilon",
                                              reps=200, published="DER"))  # fmt: skip
    assert "1 of 26 games" in text and "| Boxing |" in text and "paired" in text


def test_wall_times_are_given_per_machine_and_runs_of_several_or_none_apart() -> None:
    def run(wall_min: float, machines: list | None) -> dict:
        return {"wall_s": wall_min * 60 + 30, "final_eval_s": 30.0, "machines": machines}

    runs = [
        run(20, ["Xeon, 1 torch thread"]),
        run(40, ["Xeon, 1 torch thread"]),
        run(10, ["EPYC, 1 torch thread"]),
        run(50, ["EPYC, 1 torch thread", "Xeon"]),
        run(60, [None, "Xeon, 1 torch thread"]),
        run(70, None),
    ]
    lines = atari100k.wall_times(runs)
    assert len(lines) == 3
    assert lines[0].startswith("training wall time per run, 1 run on EPYC, 1 torch thread: "
                               "median 10.0 min [10.0, 10.0]")  # fmt: skip
    assert lines[1].startswith("training wall time per run, 2 runs on Xeon, 1 torch thread: "
                               "median 30.0 min [20.0, 40.0]")  # fmt: skip
    assert lines[2].startswith("training wall time per run, 3 runs on several or unrecorded "
                               "machines: median 60.0 min [50.0, 70.0]")  # fmt: skip
    named = atari100k.wall_times(runs[2:3], "der-floor")
    assert named == [lines[0].replace("per run, 1 run", "per run, der-floor, 1 run")]


def test_the_table_says_per_game_where_the_first_arm_is_ahead_level_or_behind(
    tmp_path: Path,
) -> None:
    """Three seeds a game: Pong's noise arm ahead by 3 on every seed, Boxing's mixed, so
    the paired CI lies above zero for one and across it for the other. Alien's is ahead
    on every seed but by 1, 2 and 9: level (t interval [-6.8, +14.8]), where a bootstrap
    of the three differences never crosses zero."""
    runs = []
    boxing_deltas, alien_deltas = (-4.0, 6.0, -1.0), (1.0, 2.0, 9.0)
    for i, (pong, boxing) in enumerate(((-10, 5), (-12, 1), (-8, 9))):
        seed = 101 + i
        for game, score, delta in (("Pong", pong, 3.0), ("Boxing", boxing, boxing_deltas[i]),
                                   ("Alien", 700 + boxing, alien_deltas[i])):  # fmt: skip
            runs += [{"game": game, "arm": "der", "seed": seed, "score": score + delta,
                      "wall_s": 60.0, "final_eval_s": 6.0, "curve": []},
                     {"game": game, "arm": "der-epsilon", "seed": seed, "score": float(score),
                      "wall_s": 60.0, "final_eval_s": 6.0, "curve": []}]  # fmt: skip
    (tmp_path / "r.json").write_text(json.dumps({"runs": runs}))
    text = atari100k.table(argparse.Namespace(json=str(tmp_path / "r.json"),
                                              arms="der,der-epsilon", reps=500,
                                              published="DER"))  # fmt: skip
    assert "3 of 26 games" in text
    assert "| game | der, seeds 101-103 (mean) | der-epsilon (mean) | DER as published |" in text
    assert ("| Pong | -7.0, -9.0, -5.0 (-7.0) | -10.0, -12.0, -8.0 (-10.0) | -19.3 "
            "| +3.0 [+3.0, +3.0]: ahead |") in text  # fmt: skip
    # A game whose scores are all under 10 in magnitude gets two decimals.
    assert "| Boxing | 1.00, 7.00, 8.00 (5.33) | 5.00, 1.00, 9.00 (5.00) | 0.2 | +0.3 [" in text
    assert ("| Alien | 706.0, 703.0, 718.0 (709.0) | 705.0, 701.0, 709.0 (705.0) | 739.9 "
            "| +4.0 [-6.8, +14.8]: level |") in text  # fmt: skip
    assert ("ahead on 1 (Pong), level on 2, behind on 0 (none)") in text


def _atari100k_section() -> list[str]:
    page = (ROOT / "docs" / "results.md").read_text().splitlines()
    start = page.index("## Atari 100k { #atari100k }")
    end = next((i for i in range(start + 1, len(page)) if page[i].startswith("## ")), len(page))
    return page[start:end]


def _page_table(section: list[str], header: str) -> list[str]:
    """The lines of the section's table whose header line starts with ``header``."""
    start = next(i for i, line in enumerate(section) if line.startswith(header))
    end = next((i for i in range(start, len(section)) if not section[i].startswith("|")),
               len(section))  # fmt: skip
    return section[start:end]


def _page_arms(section: list[str]) -> list[str]:
    """The arms of the page's per-game table, read from its header: the first column's
    ``ARM, seeds ... (mean)``, then each ``ARM (mean)``."""
    header = next(line for line in section if line.startswith("| game | "))
    cells = [c.strip() for c in header.strip("|").split("|")][1:]
    arms = [cells[0].split(",")[0]]
    arms += [c.removesuffix(" (mean)") for c in cells[1:] if c.endswith(" (mean)")]
    return arms


def test_the_results_page_gives_the_reports_per_game_rows() -> None:
    """docs/results.md#atari100k against the committed bench/atari100k_report.json, for
    the arms its table names (two today, three once report three lands): every game that
    every arm has finished on every seed has the row the table command prints, and no
    other game has one. A slip in copying a landed game shows here."""
    runs = atari100k.read_report(ROOT / "bench" / "atari100k_report.json")["runs"]
    section = _atari100k_section()
    arms = _page_arms(section)
    games, seeds = atari100k.complete_cells(runs, arms)
    expected = atari100k.game_rows(runs, arms, games, seeds)
    assert _page_table(section, expected[0]) == expected
    assert f"{len(games)} of 26 games so far" in " ".join(section) or len(games) == 26


def test_the_results_pages_aggregates_are_the_jsons() -> None:
    """The page's aggregate rows, each arm's and each paired difference's: the point
    values (the first number of each cell) recomputed from the JSON's runs, to the three
    decimals shown (the intervals are the table command's 50,000 resamples)."""
    runs = atari100k.read_report(ROOT / "bench" / "atari100k_report.json")["runs"]
    section = _atari100k_section()
    arms = _page_arms(section)
    games, seeds = atari100k.complete_cells(runs, arms)
    matrices = {a: atari100k.score_matrix(runs, a, games, seeds) for a in arms}
    fns = atari100k._metric_fns()
    # The "| arm | IQM |" table only: the per-game means' table names the arms again.
    rows = {line.split("|")[1].strip(): line for line in _page_table(section, "| arm | IQM |")}
    checked = 0
    for label, line in rows.items():
        if label in arms:
            points = [fns[m](matrices[label]) for m in atari100k.METRICS]
        elif label.endswith(", paired") and label.split(" - ")[0] in arms:
            a, b = label.removesuffix(", paired").split(" - ")
            points = [fns[m](matrices[a]) - fns[m](matrices[b]) for m in atari100k.METRICS]
        else:
            continue
        cells = [c.strip() for c in line.strip("|").split("|")][1:]
        shown = [float(c.split()[0].replace("+", "")) for c in cells]
        assert shown == pytest.approx(points, abs=5.1e-4), label
        checked += 1
    assert checked >= len(arms) + len(arms) - 1  # every arm, and the first against the rest


def test_the_results_pages_per_game_means_are_the_jsons() -> None:
    """The page's aggregates over one value a game: each arm's from its seeds' means in
    the JSON, each published method's from its per-game table, over the games the arms
    have finished."""
    runs = atari100k.read_report(ROOT / "bench" / "atari100k_report.json")["runs"]
    section = _atari100k_section()
    arms = _page_arms(section)
    games, seeds = atari100k.complete_cells(runs, arms)
    matrices = {a: atari100k.score_matrix(runs, a, games, seeds) for a in arms}
    values = atari100k.per_game_means(matrices, games)
    fns = atari100k._metric_fns()
    table = _page_table(section, "| per-game means |")[2:]  # below the header and its rule
    rows = {line.split("|")[1].strip(): line for line in table}
    assert set(rows) == set(values)
    for label, line in rows.items():
        shown = [float(c) for c in line.strip("|").split("|")[1:]]
        assert shown == pytest.approx([fns[m](values[label]) for m in atari100k.METRICS],
                                      abs=5.1e-4), label  # fmt: skip


def test_the_per_game_rows_give_the_published_scores_asked_for(tmp_path: Path) -> None:
    """The second report's rows stand beside DER's, DrQ's and SPR's published means, in the
    order asked; a label the table does not know ends the command with the ones it does."""
    arms = (("der-shift", 9.0), ("der-shift-epsilon", 7.0))
    runs = [{"game": "Breakout", "arm": arm, "seed": seed, "score": score, "wall_s": 60.0,
             "final_eval_s": 6.0, "curve": []}
            for seed in (101, 102) for arm, score in arms]  # fmt: skip
    (tmp_path / "r.json").write_text(json.dumps({"runs": runs}))
    args = argparse.Namespace(json=str(tmp_path / "r.json"), arms="der-shift,der-shift-epsilon",
                              reps=200, published="DER,DrQ,SPR")  # fmt: skip
    text = atari100k.table(args)
    assert ("| game | der-shift, seeds 101, 102 (mean) | der-shift-epsilon (mean) | DER as "
            "published | DrQ as published | SPR as published | der-shift - der-shift-epsilon, "
            "paired") in text
    assert "| Breakout | 9.00, 9.00 (9.00) | 7.00, 7.00 (7.00) | 1.9 | 16.1 | 17.1 | +2.0" in text
    with pytest.raises(UserError, match="--published DrQe: one of DER, DrQ, SPR"):
        atari100k.table(argparse.Namespace(**{**vars(args), "published": "DER,DrQe"}))


def test_the_table_names_an_arm_it_has_no_runs_of_and_refuses_one_it_does_not_know(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An arm of the machinery with no runs in the JSON yet is left out in a line that says
    so; a name that is no arm (a typo) ends the command in one line with exit status 2."""
    runs = [{"game": "Breakout", "arm": "der", "seed": seed, "score": 2.0, "wall_s": 60.0,
             "final_eval_s": 6.0, "curve": []} for seed in (101, 102)]  # fmt: skip
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"runs": runs}))
    args = argparse.Namespace(json=str(path), arms="der,der-floor", reps=100, published="DER")
    text = atari100k.table(args)
    assert f"der-floor: no runs in {path} yet, left out" in text
    assert "| der | " in text and "der - der-floor" not in text
    alone = atari100k.table(argparse.Namespace(**{**vars(args), "arms": "der-floor"}))
    assert f"der-floor: no runs in {path} yet, left out" in alone
    assert "nothing to aggregate yet" in alone
    monkeypatch.setattr("sys.argv", ["atari100k", "table", "--json", str(path),
                                     "--arms", "der,der-flor", "--reps", "100"])  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        atari100k.main()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("bench.atari100k table: unknown arm der-flor: one of")


def test_with_three_arms_the_first_is_paired_against_each_of_the_others(tmp_path: Path) -> None:
    """The third report's table: der-floor against der-epsilon and against der, each in the
    aggregates (a paired row), per game (a column, in the order of the arms) and in the
    per-game count; the off-greedy share of the runs that recorded one."""
    pong = atari100k.BY_NAME["Pong"]
    runs = []
    for seed in (101, 102, 103):
        # below human (14.6), so that the optimality gap moves with the scores
        for arm, score in (("der-floor", seed - 113.0), ("der-epsilon", seed - 119.0),
                           ("der", seed - 111.0)):  # fmt: skip
            runs.append({"game": "Pong", "arm": arm, "seed": seed, "score": score,
                         "wall_s": 60.0, "final_eval_s": 6.0, "curve": [],
                         "off_greedy": {"mean": 0.01 * seed / 100, "curve": []}
                         if arm == "der-floor" else None})  # fmt: skip
    (tmp_path / "r.json").write_text(json.dumps({"runs": runs}))
    args = argparse.Namespace(json=str(tmp_path / "r.json"), arms="der-floor,der-epsilon,der",
                              reps=200, published="DER")  # fmt: skip
    lines = atari100k.table(args).splitlines()
    rows = {line.split(" | ")[0]: line for line in lines if line.startswith("| der-floor - ")}
    ahead, behind = 6.0 / (pong.human - pong.random), -2.0 / (pong.human - pong.random)
    # Every run of a game moves by the same amount: each metric's difference and both ends
    # of its interval are that amount (the optimality gap's, below 1 throughout, its negative).
    for name, delta in (("| der-floor - der-epsilon, paired", ahead),
                        ("| der-floor - der, paired", behind)):  # fmt: skip
        cells = rows[name].strip("| ").split(" | ")[1:]
        for metric, cell in zip(atari100k.METRICS, cells, strict=True):
            want = -delta if metric == "optimality gap" else delta
            point, low, high = (float(x) for x in cell.replace("[", "").replace("]", "")
                                .replace(",", "").split())  # fmt: skip
            assert point == pytest.approx(want, abs=1e-3) and low <= point <= high
            assert high - low == pytest.approx(0.0, abs=1e-3)
    header = next(line for line in lines if line.startswith("| game | der-floor"))
    assert header.index("der-floor - der-epsilon, paired") < header.index("der-floor - der, paired")
    pong_row = next(line for line in lines if line.startswith("| Pong | -12.0, -11.0, -10.0"))
    assert pong_row.endswith("| +6.0 [+6.0, +6.0]: ahead | -2.0 [-2.0, -2.0]: behind |")
    text = "\n".join(lines)
    assert "der-floor against der-epsilon, per game" in text and "ahead on 1 (Pong)" in text
    assert "der-floor against der, per game" in text and "behind on 1 (Pong)" in text
    assert "| Pong | 0.0102 (3) |" in text  # der-floor's share, the mean of its three runs
    assert "der - " not in text and "der-epsilon - " not in text


def test_the_off_greedy_share_is_read_from_the_runs_events(tmp_path: Path) -> None:
    """collect's off-greedy record: the logged shares' mean, and their means per bin of
    5,000 steps; a run that logged none (one older than the scalar) records None."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "run"))
    for step, share in ((1_000, 0.02), (4_000, 0.04), (6_000, 0.01), (10_000, 0.03)):
        writer.add_scalar("exploration/off_greedy_fraction", share, step)
    writer.add_scalar("charts/episodic_return", 5.0, 3_000)
    writer.close()
    record = atari100k.off_greedy(tmp_path / "run")
    assert record == {"mean": pytest.approx(0.025),
                      "curve": [[5_000.0, pytest.approx(0.03)], [10_000.0, pytest.approx(0.02)]]}
    assert atari100k.training_curve(tmp_path / "run") == [[5_000.0, 5.0]]
    SummaryWriter(str(tmp_path / "old")).close()
    assert atari100k.off_greedy(tmp_path / "old") is None


@pytest.mark.parametrize("arm", sorted(atari100k.SCREENING))
def test_each_screening_variant_is_der_with_one_key_changed(arm: str) -> None:
    from agent.config_files import load_config

    der = load_config("BreakoutNoFrameskip-v4", "der").to_dict()
    variant = load_config("BreakoutNoFrameskip-v4", "der", atari100k.ARMS[arm]).to_dict()
    changed = {k for k in der if der[k] != variant[k]}
    assert changed == set(atari100k.SCREENING[arm]), changed


@pytest.mark.parametrize("arm", ["der-shift", "der-shift-epsilon", "der-floor"])
def test_the_report_arms_are_the_shipped_presets_of_their_names(arm: str) -> None:
    """The report's arms run as --config der plus their settings; a user runs the preset:
    the same config, key for key."""
    from agent.config_files import load_config

    preset = load_config("BreakoutNoFrameskip-v4", arm).to_dict()
    assert preset == load_config("BreakoutNoFrameskip-v4", "der", atari100k.ARMS[arm]).to_dict()
    der = load_config("BreakoutNoFrameskip-v4", "der").to_dict()
    changed = {k for k in der if der[k] != preset[k]}
    if arm == "der-floor":  # der itself but the floor
        assert changed == {"noisy_epsilon"} and preset["noisy_epsilon"] == 0.01
    else:
        assert "augment" in changed


def test_the_drq_arms_are_their_presets_and_bf16_changes_one_key() -> None:
    """The DrQ(epsilon) arms train the presets of their names, not der with settings; the
    bfloat16 arm is drq-epsilon with learner_autocast and nothing else."""
    from agent.config_files import load_config

    game = atari100k.BY_NAME["Krull"]
    trials = atari100k.arm_trials(["drq-epsilon", "drq-epsilon-bf16", "drq-noisy", "der"],
                                  [game], [1, 2], {})  # fmt: skip
    configs = {(t.label, t.seed): {k: v for k, v in t.config.items() if k != "seed"}
               for t in trials}  # fmt: skip
    assert [t.label for t in trials][::2] == [
        "Krull/drq-epsilon", "Krull/drq-epsilon-bf16", "Krull/drq-noisy", "Krull/der"]
    for arm, preset in (("drq-epsilon", "drq-epsilon"), ("drq-noisy", "drq-noisy"),
                        ("der", "der")):  # fmt: skip
        expected = load_config(game.env_id, preset).to_dict()
        del expected["seed"]
        assert configs[(f"Krull/{arm}", 1)] == expected
    fp32, bf16 = configs[("Krull/drq-epsilon", 2)], configs[("Krull/drq-epsilon-bf16", 2)]
    assert {k for k in fp32 if fp32[k] != bf16[k]} == {"learner_autocast"}
    assert bf16["learner_autocast"] == "bfloat16"


def test_der_floor_is_the_screened_arm() -> None:
    """The report runs exactly what the tuning seeds screened: der-noisy-epsilon."""
    assert atari100k.ARMS["der-floor"] == atari100k.ARMS["der-noisy-epsilon"] == {
        "noisy_epsilon": 0.01}


@pytest.mark.parametrize(("suffix", "key", "value"), [("intensity", "intensity_scale", 0.05),
                                                      ("target1", "target_update_interval", 1)])
def test_shift_variants_are_the_shift_arms_with_one_key_changed(suffix, key, value) -> None:
    from agent.config_files import load_config

    for shift in ("der-shift", "der-shift-epsilon"):
        plain = load_config("BreakoutNoFrameskip-v4", "der", atari100k.ARMS[shift]).to_dict()
        variant = load_config("BreakoutNoFrameskip-v4", "der",
                              atari100k.ARMS[f"{shift}-{suffix}"]).to_dict()  # fmt: skip
        assert {k for k in plain if plain[k] != variant[k]} == {key}
        assert variant[key] == value and variant["augment"] == "shift"


def test_speed_runs_each_repeat_of_an_arm_in_a_fresh_run_directory(tmp_path, monkeypatch) -> None:
    # run.py refuses a --run-dir that already holds a run (exit 2); a second repeat of the
    # same arm and length must not meet the first one's directory.
    def fake_run(args, **kwargs):
        run_dir = Path(args[args.index("--run-dir") + 1])
        if (run_dir / "result.json").exists():
            raise atari100k.subprocess.CalledProcessError(2, args)
        run_dir.mkdir(parents=True)
        (run_dir / "result.json").write_text(json.dumps({"final_eval_wall_s": 0.0}))

    monkeypatch.setattr(atari100k.subprocess, "run", fake_run)
    walls = [atari100k._ours("Krull", 2_100, tmp_path, "der") for _ in range(2)]
    assert all(w >= 0.0 for w in walls)


def test_speed_times_the_learner_backend_a_whole_run_takes(tmp_path, monkeypatch) -> None:
    # Its runs are short, where auto keeps the numpy engine; a 100k-step run compiles.
    seen: list[list[str]] = []

    def fake_run(args, **kwargs):
        seen.append(args)
        run_dir = Path(args[args.index("--run-dir") + 1])
        run_dir.mkdir(parents=True)
        (run_dir / "result.json").write_text(json.dumps({"final_eval_wall_s": 0.0}))

    monkeypatch.setattr(atari100k.subprocess, "run", fake_run)
    for arm in ("der", "der-epsilon", "drq-epsilon"):
        atari100k._ours("Krull", 2_100, tmp_path, arm)
        assert atari100k.whole_run_backend(arm) == "compile"
    assert all("learner_backend=compile" in args for args in seen)


def test_a_learning_step_is_timed_after_each_arm_has_compiled_once(tmp_path, monkeypatch) -> None:
    # A run's wall time: 10 ms a step, plus 30 s where its arm's update is compiled cold
    # (its first run). The difference of two timed runs must be the step alone.
    compiled: set[str] = set()

    def fake_ours(game, steps, work, arm="der"):
        cold = arm not in compiled
        compiled.add(arm)
        return steps * 0.010 + (30.0 if cold else 3.0)

    monkeypatch.setattr(atari100k, "_ours", fake_ours)
    ms = atari100k.learning_step_ms("Krull", ["der", "der-epsilon"], (2_100, 4_100), 2, tmp_path)
    assert ms == {"der": pytest.approx([10.0, 10.0]), "der-epsilon": pytest.approx([10.0, 10.0])}


def test_the_screening_grid_gives_each_arm_its_normalised_difference_from_the_baseline() -> None:
    """Pong, seed 1: the baseline at 0.6 normalised, der at 0.85 (+0.25), a variant at 0.35
    (-0.25); seed 2 has no baseline run, so der's score there is shown and not compared.
    Boxing, seed 1: der at +0.5 over the baseline. der is ahead on 2 of its 2 compared
    cells, mean (0.25 + 0.5) / 2."""
    pong, boxing = atari100k.BY_NAME["Pong"], atari100k.BY_NAME["Boxing"]

    def run(game: atari100k.Game, arm: str, seed: int, normalised: float) -> dict:
        return {"game": game.name, "arm": arm, "seed": seed,
                "score": game.random + normalised * (game.human - game.random)}  # fmt: skip

    runs = [run(pong, "der-noisy-epsilon", 1, 0.35), run(pong, "der", 1, 0.85),
            run(pong, "der-epsilon", 1, 0.6), run(pong, "der", 2, 0.1),
            run(boxing, "der", 1, 0.75), run(boxing, "der-epsilon", 1, 0.25)]  # fmt: skip
    lines = atari100k.screen(runs)
    assert lines[0] == "| game, seed | der-epsilon | der | der-noisy-epsilon |"
    assert lines[2:5] == [
        "| Boxing, 1 | 3.10 | 9.10 (+0.500) |  |",  # scores under 10: two decimals
        "| Pong, 1 | 0.5 | 9.3 (+0.250) | -8.3 (-0.250) |",
        "| Pong, 2 |  | -17.2 |  |",
    ]
    assert lines[5] == ("| against der-epsilon |  | ahead on 2 of 2, mean +0.375 "
                        "| ahead on 0 of 1, mean -0.250 |")  # fmt: skip


def test_each_arms_mix_of_machines_and_commits_is_counted() -> None:
    """The page states where each arm trained: a count per CPU, runs resumed on another
    CPU apart, runs that predate the record as unrecorded, and the commits."""
    amd, intel = "AMD EPYC, 1 torch thread", "Intel(R) Xeon(R) Processor, 1 torch thread"
    runs = [
        {"arm": "der", "machines": [amd], "commit": "aaaaaaa1"},
        {"arm": "der", "machines": [amd], "commit": "bbbbbbb2"},
        {"arm": "der", "machines": [intel, amd], "commit": "aaaaaaa1"},
        {"arm": "der", "machines": None, "commit": "aaaaaaa1"},
        {"arm": "der", "machines": [None, intel], "commit": "aaaaaaa1"},
        {"arm": "der-floor", "machines": [intel], "commit": "ccccccc3"},
    ]
    der, floor = atari100k.machine_mix(runs, ["der", "der-floor"])
    assert der == ("der: 5 runs, 2 on AMD EPYC, 2 on more than one CPU, 1 unrecorded; "
                   "from 2 commits (aaaaaaa, bbbbbbb)")
    assert floor == "der-floor: 1 run, 1 on Intel(R) Xeon(R) Processor; from 1 commit (ccccccc)"
