"""MinAtar: learning against our epsilon-greedy ablation and the MinAtar paper, and speed
against MinAtar's own DQN.

Learning (the five games, ``-v0``: the paper's full action set)::

    python -m bench.minatar_suite learn --seeds 101-105 --jobs 2 --plot-dir docs/img/minatar \\
        --json minatar.json

For every game and seed, ``python run.py --env MinAtar/GAME-v0 --seed S`` (the shipped
``configs/minatar.yaml``, 1M steps) and the same command with ``--set
exploration=epsilon --set noisy_layers=none``, each a process of its own. The score of a
run is its final policy's noise-free 100-episode mean (``result.json``). The table gives,
per game: the median over seeds and the IQM [95% bootstrap CI] of both agents, the paired
difference (noisy minus epsilon, seed by seed: its mean with Student's 95% t interval
over seeds), and the MinAtar paper's DQN as read off the learning-curve figure of the MinAtar
repository's README (30 seeds; a 100-episode moving average of *training* returns, under
its epsilon 0.1 behaviour, so not the same measure as our noise-free evaluations) at 1M
and 5M frames. One agent step is one MinAtar frame (no frame skip). ``--from-json``
re-reads earlier ``--json`` files instead of training (several: merged, each game's seeds in
file order); ``--workdir DIR`` keeps the runs in DIR,
so a second invocation reuses the runs that finished there and resumes the interrupted ones
(stopped by a signal, or killed outright after a periodic checkpoint).

Rainbow (the five games, three arms on the same code: ``--config rainbow``, the same
without noisy nets, and today's default)::

    python -m bench.minatar_suite rainbow --seeds 101-105 --jobs 2 --workdir DIR --json F \\
        --plot-dir docs/img/minatar/rainbow [--default-from-json EARLIER_LEARN.json ...]

prints, per game, each arm's median and IQM, the paired differences of the preset against
the preset without noise (what the noise adds inside Rainbow) and against the default,
Revisiting Rainbow's 10M-frame training returns beside them, and the wall time per run;
then on how many games the preset's median reaches Revisiting Rainbow's DQN and Rainbow,
and on how many the noise is ahead of the preset without it, level or behind (the paired
95% CI above zero, across it, below it).
The default's runs of an earlier ``learn`` report can stand in for its arm
(``--default-from-json``): its trajectories did not change since. The report's were
transcribed from docs/research/log.md into ``bench/minatar_default_report.json`` (scores
only: such runs have no wall time or curve, so they count in the scores and are not
drawn); seeds missing there are run.

Cost of the preset (one game, the default and the two rainbow arms, each ``--frames``
steps, interleaved ``--repeats`` times on one core; ``--preset-set`` tries a setting on
the rainbow arms)::

    python -m bench.minatar_suite cost --game Breakout --frames 40000 --repeats 3 --core 0

prints each arm's median wall time per run, per frame, and its ratio to the default's.

Speed (one game, against MinAtar's ``examples/dqn.py``, run unchanged but for its frame
budget; clone https://github.com/kenjyoung/MinAtar for it)::

    python -m bench.minatar_suite speed --reference ~/MinAtar/examples/dqn.py --game breakout \\
        --frames 300000

runs our default command for ``--frames`` steps and the reference for as many frames,
one after the other, each on one thread (and pinned to one core where ``taskset``
exists), and prints the wall time of each per 1M frames, the ratio, the mean training
return of the last 100 episodes, and the noise-free greedy 100-episode mean of each final
network on the same evaluation episodes (``--eval``'s seeds). The reference network is
rebuilt from the weights it saves.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.cartpole import ROOT, parse_seeds, run_ours

GAMES = ["Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders"]
# The MinAtar paper's DQN, read off img/learning_curves.gif of the MinAtar repository
# (training returns, 100-episode moving average, epsilon 0.1): (1M frames, 5M frames).
PAPER_DQN = {
    "Asterix": (10.0, 17.0),
    "Breakout": (9.0, 10.0),
    "Freeway": (50.0, 50.0),
    "Seaquest": (1.0, 20.0),  # the figure predates a Seaquest oxygen fix (MinAtar 1.0.10)
    "SpaceInvaders": (30.0, 45.0),
}
EPSILON = ["--set", "exploration=epsilon", "--set", "noisy_layers=none"]
AGENTS = {"noisy": [], "epsilon": EPSILON}
# The rainbow report's arms: the preset, the preset without noisy nets, today's default.
RAINBOW_ARMS = {
    "rainbow": ["--config", "rainbow"],
    "rainbow-no-noise": ["--config", "rainbow", *EPSILON],
    "default": [],
}
# Revisiting Rainbow (Obando-Ceron & Castro 2021, Figure 2; MinAtar, 10M frames, 10 seeds,
# training returns), read off the figure: DQN, Rainbow, Rainbow without noisy nets.
REVISITING_RAINBOW = {
    "Asterix": (28.2, 41.8, 48.8),
    "Breakout": (7.4, 11.3, 10.7),
    "Freeway": (60.0, 57.1, 57.6),
    "Seaquest": (5.3, 10.0, 6.5),
    "SpaceInvaders": (33.8, 92.8, 99.1),
}


def merge_results(parts: list[dict], games: list[str]) -> dict:
    """Several ``--json`` files (say, one per session's seeds) as one: each game's runs in
    file order, so the noisy and epsilon-greedy lists stay paired seed by seed."""
    results = {g: {a: [] for a in AGENTS} for g in games}
    for part in parts:
        for game in games:
            runs = part.get(game, {a: [] for a in AGENTS})
            if len(runs["noisy"]) != len(runs["epsilon"]):
                raise SystemExit(f"{game}: {len(runs['noisy'])} noisy runs against "
                                 f"{len(runs['epsilon'])} epsilon-greedy in one --from-json file")
            for agent in AGENTS:
                results[game][agent] += runs[agent]
    return results


def seeds_of(runs: list[dict]) -> str:
    """The seeds of ``runs``, read off their run directories (``.../seedN``)."""
    return ",".join(Path(r["run_dir"]).name.removeprefix("seed") for r in runs)


def finished_or_resumed(run_dir: Path) -> dict | None:
    """A run of an earlier ``--workdir`` invocation: its result if it finished, the result of
    resuming it if it was interrupted or killed after a checkpoint, None if it never started."""
    path = run_dir / "result.json"
    if path.exists():
        resume = json.loads(path.read_text())["status"] == "interrupted"
    else:
        # A run killed outright (SIGKILL, a machine going away) leaves no result.json, only
        # its last periodic checkpoint; starting it again would throw that part away.
        resume = (run_dir / "checkpoints" / "last.pt").exists()
        if not resume:
            return None
    if resume:
        cmd = [sys.executable, "run.py", "--resume", str(run_dir), "--no-progress"]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{run_dir} did not resume: {proc.stderr[-2000:]}")
    result = json.loads(path.read_text())
    result["wall_s"] = result["wall_time_s"]  # the whole run's, across resumes
    return result


def learn(args: argparse.Namespace) -> int:
    from agent.sweep.stats import bootstrap_ci, difference_ci, iqm
    from bench.suite import plot

    games = args.games.split(",")
    seeds = parse_seeds(args.seeds)
    extra = [a for kv in args.set for a in ("--set", kv)]
    if args.from_json:
        results = merge_results([json.loads(path.read_text()) for path in args.from_json], games)
    else:
        workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench_minatar_"))
        results = run_arms(games, seeds, AGENTS, workdir, args.jobs, extra)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))

    print("\nMinAtar, -v0 ids, score = the final policy's noise-free 100-episode mean"
          + "".join(f", --set {kv}" for kv in args.set) + "\n")
    print("| game | seeds | noisy: median (IQM [95% CI]) | epsilon-greedy: median (IQM [95% CI]) "
          "| noisy - epsilon, paired mean [95% CI] | paper DQN, 1M / 5M frames (training "
          "returns, epsilon 0.1) | noisy median >= paper 5M | median wall per run (min) |")
    print("|---|---|---|---|---|---|---|---|")
    reached = 0
    shown = [g for g in games if results[g]["noisy"]]
    for game in shown:
        cells = []
        finals = {}
        for agent in AGENTS:
            f = [r["final_eval_return"] for r in results[game][agent]]
            finals[agent] = f
            lo, hi = bootstrap_ci(f)
            cells.append(f"{statistics.median(f):.1f} ({iqm(f):.1f} [{lo:.1f}, {hi:.1f}])")
        mean, lo, hi = difference_ci(finals["noisy"], finals["epsilon"], paired=True)
        one, five = PAPER_DQN[game]
        ok = statistics.median(finals["noisy"]) >= five
        reached += ok
        # Runs from a release that did not record wall time or curves count in the scores only.
        walls = [r["wall_s"] for r in results[game]["noisy"] if r.get("wall_s")]
        wall = f"{statistics.median(walls) / 60:.1f}" if walls else "-"
        print(f"| {game} | {seeds_of(results[game]['noisy'])} | {cells[0]} | {cells[1]} | "
              f"{mean:+.1f} [{lo:+.1f}, {hi:+.1f}] | {one:g} / {five:g} | "
              f"{'yes' if ok else 'no'} | {wall} |")
        curves = {a: [r["eval_curve"] for r in results[game][a] if r.get("eval_curve")]
                  for a in AGENTS}
        if args.plot_dir and all(curves.values()):
            args.plot_dir.mkdir(parents=True, exist_ok=True)
            budget = max(s for runs in curves.values() for c in runs for s, _ in c)
            plot(f"MinAtar/{game}-v0", curves, budget, args.plot_dir / f"{game}.png")
    print(f"\nthe noisy default's median reaches the paper DQN's 5M-frame level on {reached} "
          f"of {len(shown)} games")
    return 0


def run_arms(
    games: list[str], seeds: list[int], arms: dict[str, list[str]], workdir: Path, jobs: int,
    extra: list[str], kept: dict | None = None,
) -> dict:
    """Every game, arm and seed as ``run.py`` processes, ``jobs`` at a time, in ``workdir``
    (finished runs there kept, interrupted ones resumed); ``kept[game][arm]``: earlier
    runs that count instead, by seed."""
    jobs_todo = [(g, a, s) for s in seeds for g in games for a in arms]

    def run(job: tuple[str, str, int]) -> dict:
        game, arm, seed = job
        earlier = (kept or {}).get(game, {}).get(arm, {}).get(seed)
        if earlier is not None:
            return earlier
        env_id = f"MinAtar/{game}-v0"
        r = finished_or_resumed(workdir / game / arm / f"seed{seed}")
        if r is None:
            r = run_ours(seed, extra + arms[arm], workdir / game / arm, env_id)
        print(f"{env_id} | {arm} | seed {seed}: final {r['final_eval_return']:.2f}, "
              f"{r['wall_s']:.0f} s", flush=True)
        return r

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        done = list(pool.map(run, jobs_todo))
    results: dict = {g: {a: [] for a in arms} for g in games}
    for (game, arm, _), r in zip(jobs_todo, done, strict=True):
        results[game][arm].append(r)
    return results


def rainbow(args: argparse.Namespace) -> int:
    """The rainbow preset, the preset without noisy nets and today's default, on the five
    games, beside Revisiting Rainbow's 10M-frame figures."""
    from agent.sweep.stats import bootstrap_ci, difference_ci, iqm, verdict
    from bench.suite import plot

    games = args.games.split(",")
    seeds = parse_seeds(args.seeds)
    if args.from_json:
        results = json.loads(args.from_json.read_text())
    else:
        # The default's runs of an earlier `learn` report (its "noisy" arm), by seed.
        kept: dict = {}
        for path in args.default_from_json or []:
            for game, arms in json.loads(path.read_text()).items():
                for r in arms.get("noisy", []):
                    seed = int(Path(r["run_dir"]).name.removeprefix("seed"))
                    kept.setdefault(game, {}).setdefault("default", {})[seed] = r
        workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench_rainbow_"))
        extra = [a for kv in args.set for a in ("--set", kv)]
        arms = {a: RAINBOW_ARMS[a] for a in args.arms.split(",")}
        results = run_arms(games, seeds, arms, workdir, args.jobs, extra, kept)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))

    print("\nMinAtar, -v0 ids, 1M steps; ours: the final policy's noise-free 100-episode mean; "
          "Revisiting Rainbow (RR): training returns after 10M frames, read off its Figure 2\n")
    print("| game | seeds | rainbow: median (IQM [95% CI]) | rainbow, no noise | default | "
          "rainbow - no noise, paired [95% CI] | rainbow - default, paired [95% CI] | "
          "RR DQN / Rainbow / Rainbow no noise | rainbow >= RR DQN, >= RR Rainbow | "
          "wall per run (min): rainbow / default |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    over_dqn = over_rainbow = 0
    noise_verdicts: list[str] = []  # per game: the noise against the preset without it
    shown = [g for g in games if results.get(g, {}).get("rainbow")]
    for game in shown:
        # An arm left out of the invocation (--arms) shows as a dash.
        finals = {a: [r["final_eval_return"] for r in results[game].get(a, [])]
                  for a in RAINBOW_ARMS}  # fmt: skip
        cells = []
        for arm in RAINBOW_ARMS:
            f = finals[arm]
            if not f:
                cells.append("—")
                continue
            lo, hi = bootstrap_ci(f)
            cells.append(f"{statistics.median(f):.1f} ({iqm(f):.1f} [{lo:.1f}, {hi:.1f}])")
        diffs = []
        for other in ("rainbow-no-noise", "default"):
            if not finals[other]:
                diffs.append("—")
                continue
            mean, lo, hi = difference_ci(finals["rainbow"], finals[other], paired=True)
            diffs.append(f"{mean:+.1f} [{lo:+.1f}, {hi:+.1f}]")
            if other == "rainbow-no-noise":
                noise_verdicts.append(verdict(lo, hi))
        dqn, rb, rb_no_noise = REVISITING_RAINBOW[game]
        median = statistics.median(finals["rainbow"])
        over_dqn += median >= dqn
        over_rainbow += median >= rb
        # Runs transcribed from an earlier report, without a wall time, count in the scores only.
        walls = {a: [r["wall_s"] for r in results[game].get(a, []) if r.get("wall_s")]
                 for a in ("rainbow", "default")}  # fmt: skip
        walls = {a: statistics.median(w) / 60 for a, w in walls.items() if w}
        wall = (f"{walls['rainbow']:.1f} / {walls['default']:.1f} "
                f"({walls['rainbow'] / walls['default']:.2f}x)" if "default" in walls
                else f"{walls['rainbow']:.1f} / —")  # fmt: skip
        print(f"| {game} | {seeds_of(results[game]['rainbow'])} | {' | '.join(cells)} | "
              f"{' | '.join(diffs)} | {dqn:g} / {rb:g} / {rb_no_noise:g} | "
              f"{'yes' if median >= dqn else 'no'}, {'yes' if median >= rb else 'no'} | "
              f"{wall} |")
        # The arms with curves are drawn (runs transcribed from the log have none).
        curves = {a: c for a in RAINBOW_ARMS
                  if (c := [r["eval_curve"] for r in results[game].get(a, [])
                            if r.get("eval_curve")])}  # fmt: skip
        if args.plot_dir and "rainbow" in curves:
            args.plot_dir.mkdir(parents=True, exist_ok=True)
            budget = max(s for runs in curves.values() for c in runs for s, _ in c)
            plot(f"MinAtar/{game}-v0", curves, budget, args.plot_dir / f"{game}.png")
    print(f"\nthe rainbow median reaches Revisiting Rainbow's 10M-frame DQN on {over_dqn} and its "
          f"Rainbow on {over_rainbow} of {len(shown)} games")
    if noise_verdicts:
        print("inside the preset the noise is, against the preset without it (paired 95% CI): "
              + ", ".join(f"{noise_verdicts.count(v)} {v}" for v in ("ahead", "level", "behind"))
              + f" of {len(noise_verdicts)} games")
    return 0


# --- speed against MinAtar's examples/dqn.py ---


def _pinned(cmd: list[str], core: int) -> list[str]:
    return ["taskset", "-c", str(core), *cmd] if shutil.which("taskset") else cmd


def _timed_run(
    env_id: str, seed: int, frames: int, run_dir: Path, core: int, flags: Sequence[str] = ()
) -> float:
    """Wall seconds of one ``run.py`` training run (``flags`` added), periodic evaluations
    off, on one thread pinned to ``core``."""
    cmd = [sys.executable, "run.py", "--env", env_id, "--seed", str(seed), "--total-steps",
           str(frames), "--no-progress", "--run-dir", str(run_dir), "--set", "eval_interval=0",
           "--set", "confirm_episodes=0", *flags]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(_pinned(cmd, core), cwd=ROOT, check=True, env=_one_thread_env(),
                   capture_output=True)
    return time.perf_counter() - start


def _one_thread_env() -> dict[str, str]:
    env = dict(os.environ)
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[key] = "1"
    return env


def _reference_network(state_dict: dict, in_channels: int, n_actions: int):
    """The reference's Q-network (one 3x3 conv, 16 filters; 128 units), rebuilt by layer names."""
    import torch
    from torch import nn

    class Reference(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(in_channels, 16, kernel_size=3, stride=1)
            self.fc_hidden = nn.Linear(16 * 8 * 8, 128)
            self.output = nn.Linear(128, n_actions)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = torch.relu(self.conv(x.float()))
            return self.output(torch.relu(self.fc_hidden(x.flatten(1))))

    net = Reference()
    net.load_state_dict(state_dict)
    return net.eval()


def _greedy_mean(policy, env_id: str, episodes: int, seed: int) -> float:
    """Noise-free greedy mean over the episodes ``run.py --eval`` plays (seed stream 2)."""
    from agent.evaluate import run_episodes
    from envs import make_env

    envs = [make_env(env_id) for _ in range(10)]
    try:
        return run_episodes(policy, envs, episodes, seed=seed, stream=2).mean
    finally:
        for env in envs:
            env.close()


def speed(args: argparse.Namespace) -> int:
    import torch

    title = "".join(part.title() for part in args.game.split("_"))
    env_id = f"MinAtar/{title}-v0"
    workdir = Path(tempfile.mkdtemp(prefix="bench_minatar_speed_"))
    # Ours: the shipped config, periodic evaluations off (the reference has none).
    run_dir = workdir / "ours"
    ours_wall = _timed_run(env_id, args.seed, args.frames, run_dir, args.core)
    # The reference, unchanged but for NUM_FRAMES.
    source = Path(args.reference).expanduser().read_text()
    patched, n = re.subn(r"^NUM_FRAMES = .*$", f"NUM_FRAMES = {args.frames}", source,
                         flags=re.MULTILINE)
    if n != 1:
        raise SystemExit(f"{args.reference}: no NUM_FRAMES line to set")
    script = workdir / "dqn.py"
    script.write_text(patched)
    out = workdir / "reference"
    cmd = [sys.executable, str(script), "-g", args.game, "-o", str(out)]
    start = time.perf_counter()
    subprocess.run(_pinned(cmd, args.core), cwd=workdir, check=True, env=_one_thread_env(),
                   capture_output=True)
    ref_wall = time.perf_counter() - start

    data = torch.load(f"{out}_data_and_weights", weights_only=True)
    ref_train = statistics.fmean(data["returns"][-100:])
    channels = data["policy_net_state_dict"]["conv.weight"].shape[1]
    ref_net = _reference_network(data["policy_net_state_dict"], channels, 6)

    def ref_policy(obs):
        with torch.no_grad():
            return ref_net(torch.from_numpy(obs)).argmax(dim=1).numpy()

    ref_eval = _greedy_mean(ref_policy, env_id, 100, args.seed)
    proc = subprocess.run([sys.executable, "run.py", "--eval", str(run_dir / "checkpoints" /
                           "last.pt"), "--episodes", "100", "--seed", str(args.seed),
                           "--json", "--device", "cpu"], cwd=ROOT, check=True,
                          capture_output=True, text=True)
    ours_eval = json.loads(proc.stdout.strip().splitlines()[-1])["mean_return"]
    events = _training_returns(run_dir)
    ours_train = statistics.fmean(events[-100:])

    per_m = 1e6 / args.frames
    print(f"\n{env_id}, {args.frames:,} frames each, one thread; CPU: {_cpu()}\n")
    print("| agent | wall (s) | wall per 1M frames (min) | ms per frame | training return, "
          "last 100 episodes | noise-free greedy, 100 episodes |")
    print("|---|---|---|---|---|---|")
    for name, wall, train_ret, eval_ret in (
        ("ours (configs/minatar.yaml)", ours_wall, ours_train, ours_eval),
        ("MinAtar examples/dqn.py", ref_wall, ref_train, ref_eval),
    ):
        print(f"| {name} | {wall:.0f} | {wall * per_m / 60:.1f} | "
              f"{1000 * wall / args.frames:.2f} | {train_ret:.2f} | {eval_ret:.2f} |")
    print(f"\nours is {ref_wall / ours_wall:.1f}x faster per frame")
    return 0


def cost(args: argparse.Namespace) -> int:
    """Wall time per frame of the rainbow arms against the default, side by side: each arm
    ``--frames`` steps of one game with periodic evaluations off, one thread, pinned to one
    core, the arms interleaved ``--repeats`` times so that drift hits each alike."""
    env_id = f"MinAtar/{args.game}-v0"
    preset = [a for kv in args.preset_set for a in ("--set", kv)]
    # The rainbow report's arms, the preset's overrides on the two that use the preset.
    arms = {arm: [*flags, *(preset if flags else [])] for arm, flags in RAINBOW_ARMS.items()}
    workdir = Path(tempfile.mkdtemp(prefix="bench_minatar_cost_"))
    walls: dict[str, list[float]] = {arm: [] for arm in arms}
    for repeat in range(args.repeats):
        for arm, flags in arms.items():
            run_dir = workdir / f"{arm}-{repeat}"
            walls[arm].append(_timed_run(env_id, args.seed, args.frames, run_dir, args.core, flags))
    base = statistics.median(walls["default"])
    overrides = " ".join(args.preset_set) or "none"
    print(f"\n{env_id}, {args.frames:,} frames a run, {args.repeats} runs an arm, one thread "
          f"on core {args.core}; CPU: {_cpu()}; preset overrides: {overrides}\n")
    print("| arm | wall per run, median (min-max) s | ms per frame | against the default |")
    print("|---|---|---|---|")
    for arm, w in walls.items():
        median = statistics.median(w)
        print(f"| {arm} | {median:.1f} ({min(w):.1f}-{max(w):.1f}) | "
              f"{1000 * median / args.frames:.2f} | {median / base:.2f}x |")
    return 0


def _training_returns(run_dir: Path) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.value for e in acc.Scalars("charts/episodic_return")]


def _cpu() -> str:
    from agent.setup import cpu_name

    return f"{cpu_name()} ({os.cpu_count()} cores)"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    lp = sub.add_parser("learn", help="the five games, noisy against epsilon-greedy")
    lp.add_argument("--games", default=",".join(GAMES))
    lp.add_argument("--seeds", default="101-105")
    lp.add_argument("--jobs", type=int, default=2)
    lp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for both agents (repeatable)")
    lp.add_argument("--plot-dir", type=Path)
    lp.add_argument("--json", type=Path)
    lp.add_argument("--from-json", type=Path, nargs="+",
                    help="re-read earlier --json files (merged, seeds in file order) "
                         "instead of training")
    lp.add_argument("--workdir", type=Path,
                    help="where the runs go; runs that finished there before are kept, "
                         "interrupted ones resumed")
    rp = sub.add_parser("rainbow", help="the rainbow preset, without noise, and the default")
    rp.add_argument("--games", default=",".join(GAMES))
    rp.add_argument("--seeds", default="101-105")
    rp.add_argument("--jobs", type=int, default=2)
    rp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every arm (repeatable)")
    rp.add_argument("--arms", default=",".join(RAINBOW_ARMS),
                    help="which arms to run, of " + ", ".join(RAINBOW_ARMS) + " (the others "
                         "show as dashes)")
    rp.add_argument("--plot-dir", type=Path)
    rp.add_argument("--json", type=Path)
    rp.add_argument("--from-json", type=Path, help="re-read an earlier --json instead of training")
    rp.add_argument("--default-from-json", type=Path, nargs="+",
                    help="earlier `learn` --json files whose noisy runs are the default arm's "
                         "(the default's trajectories are unchanged since: checked to the bit)")
    rp.add_argument("--workdir", type=Path,
                    help="where the runs go; runs that finished there before are kept, "
                         "interrupted ones resumed")
    sp = sub.add_parser("speed", help="one game against MinAtar's examples/dqn.py")
    sp.add_argument("--reference", required=True, help="path to MinAtar's examples/dqn.py")
    sp.add_argument("--game", default="breakout", help="MinAtar's name: breakout, asterix, ...")
    sp.add_argument("--frames", type=int, default=300_000)
    sp.add_argument("--seed", type=int, default=1)
    sp.add_argument("--core", type=int, default=0, help="the core both runs are pinned to")
    cp = sub.add_parser("cost", help="time per frame: the rainbow arms against the default")
    cp.add_argument("--game", default="Breakout", help="Asterix, Breakout, ...")
    cp.add_argument("--frames", type=int, default=100_000,
                    help="steps a run, the first learning_starts (5,000) without updates")
    cp.add_argument("--repeats", type=int, default=3)
    cp.add_argument("--seed", type=int, default=1)
    cp.add_argument("--core", type=int, default=0, help="the core every run is pinned to")
    cp.add_argument("--preset-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for the two rainbow arms (repeatable)")
    args = p.parse_args()
    if args.mode == "rainbow":
        names = args.arms.split(",")
        if "rainbow" not in names or not set(names) <= set(RAINBOW_ARMS):
            rp.error(f"--arms {args.arms}: name rainbow and any of {', '.join(RAINBOW_ARMS)}, "
                     "comma-separated")  # fmt: skip
    return {"learn": learn, "rainbow": rainbow, "speed": speed, "cost": cost}[args.mode](args)


if __name__ == "__main__":
    sys.exit(main())
