"""Atari 100k with data-efficient Rainbow (``--config der``) on a CPU: how fast, against
what floor and which peer.

    python -m bench.atari100k speed --peer PATH/TO/Kaixhin-Rainbow [--game krull]

times a learning step of ours and of Kaixhin/Rainbow's DER command (its README's
settings, run unmodified through ``--shim``, which maps its ``atari_py`` import onto
ale-py) in one invocation, one thread each, one process at a time. A learning step is an
agent step with its update: each command runs twice, to 1,600 + ``--short`` and to
1,600 + ``--long`` steps, and the difference of the two wall times over the difference
of the steps cancels start-up, the warm-up before learning, compiling and any
evaluation. Both run with the learner backend a whole 100k-step run takes (on a CPU the
compiled update: ``whole_run_backend``), not the numpy engine that runs so short
would take. Beside them: one update of ours alone, and the floor a core's
matrix-product speed puts under it (the multiply-adds of the three forward passes and
the backward of an update).

    python -m bench.atari100k speed --arms der,der-epsilon --repeats 3

times ours with each arm's settings instead (medians of ``--repeats``, the arms
interleaved), the first against the rest: what the noise costs a learning step.

    python -m bench.atari100k report --seeds 101-103 --arms der,der-epsilon \
        --sweep DIR [--ray-address local] [--json bench/atari100k_report.json]

runs the report: the 26 games x the arms x the seeds as one sweep of the project's sweep
machinery (in this process one run at a time; ``--ray-address local`` runs one per core,
``HOST:PORT`` on a Ray cluster), leaving out every run whose score the JSON already holds;
run again, it resumes. Each finished run's score, wall time, training curve, the
machines it trained on and the software it trained with go into the JSON (``collect``
does it at any time), which is committed as runs land. A landed run's ``last.pt`` then
keeps its networks, not its 0.7 GB replay buffer (``--keep-replay`` keeps it, to train
the run on exactly).

    python -m bench.atari100k table --json bench/atari100k_report.json [--plot-dir DIR]

prints the aggregates (IQM, median, mean and optimality gap of human-normalised scores
with stratified-bootstrap 95% CIs, by rliable), the same over per-game means beside the
published tables of DER, DrQ and SPR, the paired difference of the arms, the
per-game table beside DER's published scores (the rows of docs/results.md#atari100k, as
they go there; ``--published DER,DrQ,SPR`` puts the others' beside them too), and draws
the curves and the performance profiles. The second report, the augmented presets, keeps
its runs in a JSON of its own:

    python -m bench.atari100k report --seeds 101-103 --arms der-shift,der-shift-epsilon \
        --sweep DIR --json bench/atari100k_shift_report.json
    python -m bench.atari100k table --json bench/atari100k_shift_report.json \
        --arms der-shift,der-shift-epsilon --published DER,DrQ,SPR

    python -m bench.atari100k screen [--json bench/atari100k_screening.json]

prints the screening's grid (tuning seeds; docs/research/log.md#atari100k-screening): a
row per game and seed, every arm's score and its human-normalised difference from
``--baseline`` (der-epsilon), and per arm how many of those cells it is ahead on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agent.errors import UserError

__all__ = ["ARMS", "GAMES", "der_batch", "der_learner", "learning_step_ms", "median_ms", "speed",
           "update_ms", "whole_run_backend"]

ROOT = Path(__file__).resolve().parent.parent
LEARN_START = 1600  # DER's, ours and the peer's
# Kaixhin/Rainbow's README command for data-efficient Rainbow.
PEER_ARGS = ["--target-update", "2000", "--learn-start", str(LEARN_START), "--memory-capacity",
             "100000", "--replay-frequency", "1", "--multi-step", "20", "--architecture",
             "data-efficient", "--hidden-size", "256", "--learning-rate", "0.0001"]  # fmt: skip
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


@dataclass(frozen=True)
class Game:
    """An Atari 100k game: its random and human scores (the human-normalised score's ends,
    as Dopamine's ``normalization_utils`` has them) and the per-game means published for
    DER (van Hasselt et al. 2019), DrQ (Kostrikov et al. 2021) and SPR (Schwarzer et al.
    2021), as SPR's per-game table gives them (reproduced in Table 5 of Cetin et al. 2022)."""

    name: str
    random: float
    human: float
    der: float
    drq: float
    spr: float

    @property
    def env_id(self) -> str:
        return f"{self.name}NoFrameskip-v4"

    def normalized(self, score: float | np.ndarray) -> float | np.ndarray:
        """The human-normalised score: 0 at random play, 1 at the human score."""
        return (score - self.random) / (self.human - self.random)


# The 26 games of Atari 100k (Kaiser et al. 2019).
GAMES: tuple[Game, ...] = (
    Game("Alien", 227.8, 7127.7, der=739.9, drq=771.2, spr=801.5),
    Game("Amidar", 5.8, 1719.5, der=188.6, drq=102.8, spr=176.3),
    Game("Assault", 222.4, 742.0, der=431.2, drq=452.4, spr=571.0),
    Game("Asterix", 210.0, 8503.3, der=470.8, drq=603.5, spr=977.8),
    Game("BankHeist", 14.2, 753.1, der=51.0, drq=168.9, spr=380.9),
    Game("BattleZone", 2360.0, 37187.5, der=10124.6, drq=12954.0, spr=16651.0),
    Game("Boxing", 0.1, 12.1, der=0.2, drq=6.0, spr=35.8),
    Game("Breakout", 1.7, 30.5, der=1.9, drq=16.1, spr=17.1),
    Game("ChopperCommand", 811.0, 7387.8, der=861.8, drq=780.3, spr=974.8),
    Game("CrazyClimber", 10780.5, 35829.4, der=16185.3, drq=20516.5, spr=42923.6),
    Game("DemonAttack", 152.1, 1971.0, der=508.0, drq=1113.4, spr=545.2),
    Game("Freeway", 0.0, 29.6, der=27.9, drq=9.8, spr=24.4),
    Game("Frostbite", 65.2, 4334.7, der=866.8, drq=331.1, spr=1821.5),
    Game("Gopher", 257.6, 2412.5, der=349.5, drq=636.3, spr=715.2),
    Game("Hero", 1027.0, 30826.4, der=6857.0, drq=3736.3, spr=7019.2),
    Game("Jamesbond", 29.0, 302.8, der=301.6, drq=236.0, spr=365.4),
    Game("Kangaroo", 52.0, 3035.0, der=779.3, drq=940.6, spr=3276.4),
    Game("Krull", 1598.0, 2665.5, der=2851.5, drq=4018.1, spr=3688.9),
    Game("KungFuMaster", 258.5, 22736.3, der=14346.1, drq=9111.0, spr=13192.7),
    Game("MsPacman", 307.3, 6951.6, der=1204.1, drq=960.5, spr=1313.2),
    Game("Pong", -20.7, 14.6, der=-19.3, drq=-8.5, spr=-5.9),
    Game("PrivateEye", 24.9, 69571.3, der=97.8, drq=-13.6, spr=124.0),
    Game("Qbert", 163.9, 13455.0, der=1152.9, drq=854.4, spr=669.1),
    Game("RoadRunner", 11.5, 7845.0, der=9600.0, drq=8895.1, spr=14220.5),
    Game("Seaquest", 68.4, 42054.7, der=354.1, drq=301.2, spr=583.1),
    Game("UpNDown", 533.4, 11693.2, der=2877.4, drq=3180.8, spr=28138.5),
)
BY_NAME = {game.name: game for game in GAMES}
# The arms: settings over --config der. der-epsilon is DER without noisy nets, exploring
# as DrQ(epsilon) does (epsilon from 1 to 0.01 over the first 5,000 steps).
EPSILON = {"exploration": "epsilon", "noisy_layers": "none", "epsilon_start": 1.0,
           "epsilon_end": 0.01, "epsilon_fraction": 0.05}  # fmt: skip
# der-shift and der-shift-epsilon are the presets of those names (a test holds them equal):
# the shift, on the noisy arm with the screening's floor of 1% random actions.
SHIFT = {"augment": "shift"}
SHIFT_NOISY = {**SHIFT, "noisy_epsilon": 0.01}
ARMS: dict[str, dict[str, Any]] = {
    "der": {},
    "der-epsilon": EPSILON,
    # The third report's noisy agent, the preset of that name (a test holds them equal):
    # the screening's der-noisy-epsilon, a floor of 1% random actions under the noise.
    "der-floor": {"noisy_epsilon": 0.01},
    "der-shift": {**SHIFT_NOISY},
    "der-shift-epsilon": {**EPSILON, **SHIFT},
    # The shift with SPR's and DrQ(epsilon)'s intensity noise, on both arms: screened
    # against the shift alone before the augmented presets take it or leave it.
    "der-shift-intensity": {**SHIFT_NOISY, "intensity_scale": 0.05},
    "der-shift-epsilon-intensity": {**EPSILON, **SHIFT, "intensity_scale": 0.05},
    # The shift with the target network copied at every update (DrQ(epsilon)'s and SPR's),
    # on both arms: screened before the augmented presets take it or leave it.
    "der-shift-target1": {**SHIFT_NOISY, "target_update_interval": 1},
    "der-shift-epsilon-target1": {**EPSILON, **SHIFT, "target_update_interval": 1},
}
# The screening's variants (tuning seeds 1-2, against der-epsilon; docs/research/log.md
# #atari100k-screening): der with one exploration or learning key changed each.
SCREENING: dict[str, dict[str, Any]] = {
    "der-noisy-epsilon": {"noisy_epsilon": 0.01},  # a floor of random actions under the noise
    "der-sigma0.5": {"sigma0": 0.5},  # SPR's noise scale
    "der-random-starts": {"random_starts": LEARN_START},  # random actions until learning starts
    "der-n10": {"n_step": 10},  # Dopamine's DER
    # DrQ(epsilon)'s and SPR's: the target network a copy of the online one at every update
    "der-target1": {"target_update_interval": 1},
}
ARMS.update(SCREENING)
# Arms that start from another preset than der (the settings above are over it): DrQ(epsilon)'s
# agent as Dopamine's DrQ_eps.gin sets it, in float32 and with its loss in bfloat16 (the
# one-learner issue's check of bfloat16 on learning), and its noisy twin. Tuning seeds only.
PRESET_OF = {"drq-epsilon": "drq-epsilon", "drq-epsilon-bf16": "drq-epsilon",
             "drq-noisy": "drq-noisy"}  # fmt: skip
ARMS.update({"drq-epsilon": {}, "drq-epsilon-bf16": {"learner_autocast": "bfloat16"},
             "drq-noisy": {}})  # fmt: skip
CURVE_BIN = 5_000  # training returns are averaged over bins of this many steps


def der_flops(n_actions: int, atoms: int = 51, batch: int = 32, hidden: int = 256) -> int:
    """Floating-point operations (2 per multiply-add) of the matrix products of one DER
    update: the online network over obs and next_obs, the target over next_obs, and the
    backward over obs (weight gradients everywhere, input gradients but the first layer's)."""
    conv1 = 16 * 16 * (4 * 25) * 32  # multiply-adds per image
    conv2 = 3 * 3 * (32 * 25) * 64
    heads = 2 * 576 * hidden + hidden * atoms + hidden * n_actions * atoms
    forward = conv1 + conv2 + heads
    backward = conv1 + 2 * (conv2 + heads)
    return 2 * (3 * batch * forward + batch * backward)


def core_gflops(size: int = 2048, repeats: int = 5) -> float:
    """One core's float32 matrix-product speed on a large square product (torch's BLAS)."""
    torch.set_num_threads(1)
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def der_learner(n_actions: int, noisy: bool = True, backend: str = "auto") -> Any:
    """A DER network (``der``'s, or without its noisy layers as ``der-epsilon``) and its
    learner with ``backend``, seeded, on the CPU."""
    import copy

    from agent.learner import Learner
    from agent.networks import QNetwork

    torch.manual_seed(0)
    net = QNetwork((4, 84, 84), n_actions, (256,), torso="der", dueling=True,
                   noisy_layers="all" if noisy else "none", sigma0=0.1, num_atoms=51,
                   input_scale=255.0)  # fmt: skip
    return Learner(net, copy.deepcopy(net).requires_grad_(False), lr=1e-4, noise=noisy,
                   backend=backend, announce=lambda _: None)  # fmt: skip


def der_batch(n_actions: int, batch_size: int = 32) -> Any:
    """A replay batch of random frames for a DER update."""
    from agent.replay import Batch

    g = torch.Generator().manual_seed(0)

    def frames() -> torch.Tensor:
        return torch.randint(0, 256, (batch_size, 4, 84, 84), dtype=torch.uint8, generator=g)

    b = batch_size
    return Batch(frames(), torch.randint(0, n_actions, (b,), generator=g), torch.rand(b),
                 frames(), torch.zeros(b), torch.full((b,), 0.99**20), torch.arange(b),
                 torch.rand(b) + 0.5)  # fmt: skip


def median_ms(fn: Callable[[], Any], calls: int, warmup: int = 10) -> float:
    """The median wall time of ``fn()`` in milliseconds, after ``warmup`` calls."""
    times = []
    for i in range(calls + warmup):
        start = time.perf_counter()
        fn()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def update_ms(n_actions: int, updates: int = 200, backend: str = "auto") -> float:
    """The median wall time of one DER update of ours (batch 32 of random frames, the
    learner ``backend``), one thread; a compiled one is compiled in its warm-up."""
    import contextlib

    from agent.setup import limit_cpu_threads

    learner, batch = der_learner(n_actions, backend=backend), der_batch(n_actions)
    with contextlib.ExitStack() as cleanup:
        limit_cpu_threads(1, cleanup)  # as training on a CPU
        return median_ms(lambda: learner.update(batch), updates)


def whole_run_backend(arm: str) -> str:
    """The learner backend a whole run of ``arm`` (its 100k steps) takes on a CPU: what
    ``speed`` times, whose short runs would keep the numpy engine (agent.setup's rule)."""
    from agent.config_files import load_config
    from agent.networks import resolve_torso
    from agent.setup import learner_backend

    cfg = load_config("KrullNoFrameskip-v4", PRESET_OF.get(arm, "der"), ARMS[arm])
    return learner_backend(cfg, resolve_torso((4, 84, 84), cfg.torso), torch.device("cpu"))


def _ours(game: str, steps: int, work: Path, arm: str = "der") -> float:
    """Wall seconds of ``run.py --config der`` with ``arm``'s settings for ``steps``
    steps, less its final evaluation (one episode, played at random)."""
    run_dir = work / f"{arm}_{steps}"
    env_id = "".join(w.capitalize() for w in game.split("_")) + "NoFrameskip-v4"
    settings = [a for k, v in ARMS[arm].items() for a in ("--set", f"{k}={v}")]
    args = [sys.executable, "run.py", "--env", env_id, "--config", PRESET_OF.get(arm, "der"),
            "--total-steps",
            str(steps), "--set", "final_episodes=1", "--set", "eval_envs=1", "--set",
            "eval_epsilon=1.0", *settings, "--set",
            f"learner_backend={whole_run_backend(arm)}", "--run-dir", str(run_dir),
            "--no-progress"]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(args, cwd=ROOT, env={**os.environ, **ONE_THREAD}, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    wall = time.perf_counter() - start
    result = json.loads((run_dir / "result.json").read_text())
    shutil.rmtree(run_dir)  # the next repeat's run starts in a fresh directory
    return wall - float(result["final_eval_wall_s"] or 0.0)


def _peer(peer: Path, shim: Path, game: str, steps: int, work: Path) -> float:
    """Wall seconds of Kaixhin/Rainbow's DER command for ``steps`` steps (no evaluation)."""
    args = [sys.executable, str(peer / "main.py"), "--disable-cuda", "--game", game, "--T-max",
            str(steps), "--evaluation-interval", str(10**9), "--id", f"bench_{steps}",
            *PEER_ARGS]  # fmt: skip
    env = {**os.environ, **ONE_THREAD, "PYTHONPATH": str(shim)}
    start = time.perf_counter()
    subprocess.run(args, cwd=work, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)  # fmt: skip
    return time.perf_counter() - start


def learning_step_ms(
    game: str, arms: list[str], steps: tuple[int, int], repeats: int, work: Path
) -> dict[str, list[float]]:
    """Each arm's milliseconds per learning step in each of ``repeats``: the difference of
    a run to ``steps[1]`` and one to ``steps[0]`` over the steps between them."""
    # An untimed short run of each arm first: a compiled update is compiled there, into
    # inductor's cache, so every timed run loads it alike and the difference cancels it.
    # A cold compile in one timed run only would shorten the difference by the compile.
    for arm in arms:
        _ours(game, steps[0], work, arm)
    # Each arm's short and long runs, the arms interleaved, so drift hits them alike.
    per_step: dict[str, list[float]] = {arm: [] for arm in arms}
    for _ in range(repeats):
        for arm in arms:
            short, long = (_ours(game, n, work, arm) for n in steps)
            per_step[arm].append((long - short) / (steps[1] - steps[0]) * 1e3)
    return per_step


def speed(args: argparse.Namespace) -> dict:
    """Per learning step of ours and the peer's, one update of ours, and the floor."""
    steps = (LEARN_START + args.short, LEARN_START + args.long)
    learning = args.long - args.short
    out: dict = {"game": args.game, "learning_steps": learning, "torch": torch.__version__}
    arms = args.arms.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        repeats = learning_step_ms(args.game, arms, steps, args.repeats, work)
        out["ms_per_learning_step"] = {arm: float(np.median(v)) for arm, v in repeats.items()}
        out["ms_per_learning_step_repeats"] = repeats
        # The arms ran in turn within each repeat: each repeat's ratio is a pair.
        out["ratio_repeats"] = {
            arm: [a / b for a, b in zip(repeats[arms[0]], repeats[arm], strict=True)]
            for arm in arms[1:]
        }
        out["ours_ms_per_learning_step"] = out["ms_per_learning_step"][arms[0]]
        if args.peer:
            peer = [_peer(Path(args.peer), Path(args.shim), args.game, n, work) for n in steps]
            out["peer_ms_per_learning_step"] = (peer[1] - peer[0]) / learning * 1e3
            out["peer_over_ours"] = out["peer_ms_per_learning_step"] / out[
                "ours_ms_per_learning_step"]  # fmt: skip
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    env_id = "".join(w.capitalize() for w in args.game.split("_")) + "NoFrameskip-v4"
    n_actions = int(gym.make(env_id).action_space.n)
    out["n_actions"] = n_actions
    out["learner_backend"] = whole_run_backend(arms[0])
    out["update_ms"] = update_ms(n_actions, backend=out["learner_backend"])
    out["core_gflops"] = core_gflops()
    out["update_gflop"] = der_flops(n_actions) / 1e9
    out["floor_ms"] = out["update_gflop"] / out["core_gflops"] * 1e3
    steps_min = 100_000 * out["ours_ms_per_learning_step"] / 1e3 / 60
    print(f"{args.game} ({n_actions} actions), {learning} learning steps, one thread each:")
    print(f"  ours ({arms[0]}): {out['ours_ms_per_learning_step']:.1f} ms per learning step "
          f"(a 100k run: about {steps_min:.0f} min of learning)")  # fmt: skip
    for arm in arms[1:]:
        ms, ratios = out["ms_per_learning_step"][arm], out["ratio_repeats"][arm]
        print(f"  {arm}: {ms:.1f} ms per learning step; {arms[0]} is "
              f"{out['ours_ms_per_learning_step'] / ms:.2f}x it (repeat by repeat: "
              f"{', '.join(f'{r:.2f}' for r in ratios)})")  # fmt: skip
    if args.peer:
        print(f"  Kaixhin/Rainbow: {out['peer_ms_per_learning_step']:.1f} ms per learning step, "
              f"{out['peer_over_ours']:.2f}x ours")  # fmt: skip
    print(f"  one update of ours alone ({out['learner_backend']}): {out['update_ms']:.1f} ms; "
          "its matrix products are "
          f"{out['update_gflop']:.2f} GFLOP, {out['floor_ms']:.1f} ms at this core's "
          f"{out['core_gflops']:.0f} GFLOP/s")  # fmt: skip
    return out


# --------------------------------------------------------------------------- the report
def _git_commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, check=True)  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout.strip() or None


def read_report(path: Path) -> dict[str, Any]:
    """The report's JSON (its runs, each a game, arm, seed and score), or an empty one."""
    if not path.is_file():
        return {"runs": []}
    return json.loads(path.read_text())


def _key(run: dict[str, Any]) -> tuple[str, str, int]:
    return run["game"], run["arm"], int(run["seed"])


def _scores(runs: Sequence[dict[str, Any]]) -> dict[tuple[str, str, int], float]:
    """Each run's raw score by its (game, arm, seed)."""
    return {_key(r): r["score"] for r in runs}


def _trial_key(trial: Any) -> tuple[str, str, int]:
    """A sweep trial's (game, arm, seed), as :func:`_key` gives a JSON run's."""
    game, arm = trial.label.split("/")
    return game, arm, trial.seed


def training_curve(
    run_dir: Path, bin_steps: int = CURVE_BIN, tag: str = "charts/episodic_return"
) -> list[list[float]]:
    """[end step of the bin, mean of the values logged in it] for every bin with a value of
    the run's TensorBoard scalar ``tag``: by default the training return of the episodes
    ending in the bin (raw game scores)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    if tag not in acc.Tags()["scalars"]:
        return []
    bins: dict[int, list[float]] = {}
    for event in acc.Scalars(tag):
        end = -(-event.step // bin_steps) * bin_steps
        bins.setdefault(end, []).append(event.value)
    return [[float(end), float(np.mean(values))] for end, values in sorted(bins.items())]


def off_greedy(run_dir: Path, bin_steps: int = CURVE_BIN) -> dict[str, Any] | None:
    """The share of training actions off the noise-free greedy ones
    (``exploration/off_greedy_fraction``, logged every ``log_interval`` steps over as many
    steps each): over the whole run and per bin of ``bin_steps``; None where the run logged
    none (a run older than that scalar)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tag = "exploration/off_greedy_fraction"
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    if tag not in acc.Tags()["scalars"]:
        return None
    values = [event.value for event in acc.Scalars(tag)]
    return {"mean": round(float(np.mean(values)), 5),
            "curve": [[end, round(v, 5)] for end, v in training_curve(run_dir, bin_steps, tag)]}


def collect(sweep_dir: Path, report: Path, out: Any = sys.stdout, keep_replay: bool = False) -> int:
    """Add every finished run of the sweep to the report's JSON (runs it holds stay as
    they are); returns how many were added. Unless ``keep_replay``, each run the JSON
    holds then loses the replay buffer from its ``last.pt`` (:func:`drop_replays`)."""
    from agent.sweep.trials import read_manifest, read_result, trial_state

    manifest, trials = read_manifest(sweep_dir)
    data = read_report(report)
    have = {_key(r) for r in data["runs"]}
    added = 0
    for trial in trials:
        key = _trial_key(trial)
        if key in have or trial_state(sweep_dir, trial) != "done":
            continue
        game, arm, _ = key
        run_dir = sweep_dir / trial.run_dir
        result = read_result(run_dir)
        assert result is not None
        data["runs"].append({
            "game": game, "arm": arm, "seed": trial.seed,
            "score": result["final_eval_return"],
            "episodes": trial.config["final_episodes"],
            "steps": result["global_step"],
            "wall_s": round(result["wall_time_s"], 1),
            "final_eval_s": round(result.get("final_eval_wall_s") or 0.0, 1),
            "machines": run_machines(result),
            "software": run_software(result),
            "commit": manifest.get("commit"),
            "curve": training_curve(run_dir),
            "off_greedy": off_greedy(run_dir),
        })  # fmt: skip
        added += 1
        print(f"{game} {arm} seed {trial.seed}: {result['final_eval_return']:.1f} "
              f"({result['wall_time_s'] / 60:.1f} min)", file=out)  # fmt: skip
    order = {g.name: i for i, g in enumerate(GAMES)}
    data["runs"].sort(key=lambda r: (order.get(r["game"], 99), r["arm"], r["seed"]))
    report.write_text(json.dumps(data, indent=1) + "\n")
    if not keep_replay:
        drop_replays(sweep_dir, trials, data["runs"], out)
    return added


def drop_replays(
    sweep_dir: Path, trials: Sequence[Any], runs: Sequence[dict[str, Any]], out: Any = sys.stdout
) -> int:
    """Drop the replay buffer from the ``last.pt`` of each of the sweep's ``trials`` that
    ``runs`` hold (a DER run's is 0.7 GB, 156 of them over 100 GB); its score is in the
    JSON, its networks stay in the checkpoint for ``--eval``. Returns the bytes freed."""
    from agent.checkpoint import CheckpointWriteError, drop_replay

    landed = {_key(r) for r in runs}
    freed = 0
    for trial in trials:
        last = sweep_dir / trial.run_dir / "checkpoints" / "last.pt"
        if _trial_key(trial) in landed and last.is_file():
            try:
                freed += drop_replay(last)
            except CheckpointWriteError as e:  # the file stays whole; the report goes on
                print(f"kept the replay buffer: {e}", file=out)
    if freed:
        print(f"dropped the replay buffers of landed runs' last.pt: {freed / 2**30:.1f} GiB "
              "freed (--keep-replay keeps them)", file=out)  # fmt: skip
    return freed


def run_machines(result: dict[str, Any]) -> list[str | None] | None:
    """Where a run trained, from its result.json's ``pieces``: each machine once, in the
    order the pieces ran (None for a piece whose checkpoint did not say), or None where
    result.json predates pieces."""
    return _piece_values(result, "machine")


def run_software(result: dict[str, Any]) -> list[str | None] | None:
    """What a run trained with (Python and package versions), from its result.json's
    ``pieces``, as :func:`run_machines` gives the machines."""
    return _piece_values(result, "software")


def _piece_values(result: dict[str, Any], key: str) -> list[str | None] | None:
    pieces = result.get("pieces")
    if not pieces:
        return None
    return list(dict.fromkeys(piece.get(key) for piece in pieces))


def wall_times(runs: Sequence[dict[str, Any]], arm: str | None = None) -> list[str]:
    """The training and final-evaluation wall times per run, as lines: by machine where
    each run trained on one known machine, then the rest together (a run resumed on other
    hardware, or one recorded before runs kept their machine). ``arm``: the arm that
    ``runs`` are all of, named in each line."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        machines = r.get("machines") or [None]
        groups.setdefault(machines[0] if len(machines) == 1 and machines[0] else "", []).append(r)
    lines = []
    for machine in sorted(groups, key=lambda m: (m == "", m)):
        group = groups[machine]
        walls = [r["wall_s"] - r["final_eval_s"] for r in group]
        evals = [r["final_eval_s"] for r in group]
        where = f"on {machine}" if machine else "on several or unrecorded machines"
        shares = [r["final_eval_s"] / r["wall_s"] for r in group if r["wall_s"] > 0]
        lines.append(
            f"training wall time per run, {f'{arm}, ' if arm else ''}{len(group)} "
            f"run{'s' * (len(group) > 1)} {where}: median "
            f"{np.median(walls) / 60:.1f} min [{min(walls) / 60:.1f}, {max(walls) / 60:.1f}]; "
            f"the final evaluation: median {np.median(evals) / 60:.1f} min "
            f"[{min(evals) / 60:.1f}, {max(evals) / 60:.1f}], a median "
            f"{np.median(shares):.0%} of a run's wall time [{min(shares):.0%}, {max(shares):.0%}]"
        )
    return lines


def machine_mix(runs: Sequence[dict[str, Any]], arms: Sequence[str]) -> list[str]:
    """Per arm, where its runs trained and from how many commits: a count per CPU, runs
    that trained on more than one (resumed on another VM, or a piece unrecorded) apart,
    and runs recorded before runs kept their machine as unrecorded."""
    lines = []
    for arm in arms:
        mine = [r for r in runs if r["arm"] == arm]
        counts: dict[str, int] = {}
        for r in mine:
            machines = r.get("machines") or []
            if not machines:
                where = "unrecorded"
            elif len(machines) > 1:
                where = "on more than one CPU"
            else:
                where = "on " + str(machines[0]).split(",")[0]  # the CPU, not its threads
            counts[where] = counts.get(where, 0) + 1
        commits = sorted({r.get("commit") or "?" for r in mine})
        ranked = sorted(counts.items(), key=lambda kv: -kv[1])
        lines.append(f"{arm}: {len(mine)} run{'s' * (len(mine) != 1)}, "
                     + ", ".join(f"{n} {where}" for where, n in ranked)
                     + f"; from {len(commits)} commit{'s' * (len(commits) != 1)} "
                     f"({', '.join(c[:7] for c in commits)})")  # fmt: skip
    return lines


def arm_trials(
    arms: Sequence[str], games: Sequence[Game], seeds: Sequence[int], overrides: dict[str, Any]
) -> list[Any]:
    """The sweep's trials: game by game, each arm's seeds in turn (the sweep runs a grid
    point's seeds together), so a game's comparison is complete after its arms' runs. An
    arm is its settings over its preset (``PRESET_OF``, else ``der``)."""
    from agent.sweep.trials import trials_of_points

    return [
        trial
        for g in games
        for a in arms
        for trial in trials_of_points(None, PRESET_OF.get(a, "der"), overrides, list(seeds),
                                      [{"env_id": g.env_id, **ARMS[a]}], [f"{g.name}/{a}"])
    ]  # fmt: skip


def report(args: argparse.Namespace) -> int:
    """Run what the report misses, as one sweep; collect what finished into the JSON."""
    from agent.config_files import parse_set
    from agent.sweep.cli import parse_seeds
    from agent.sweep.trials import is_sweep_dir, read_manifest, write_manifest

    sweep_dir, report_json = Path(args.sweep), Path(args.json)
    if is_sweep_dir(sweep_dir):
        manifest, trials = read_manifest(sweep_dir)
        print(f"resuming the sweep in {sweep_dir} ({len(trials)} runs)")
    else:
        arms = args.arms.split(",")
        games = [BY_NAME[g] for g in args.games.split(",")] if args.games else list(GAMES)
        refuse_unknown_arms(arms)
        have = {_key(r) for r in read_report(report_json)["runs"]}
        seeds = parse_seeds(args.seeds)
        overrides = parse_set(args.set or [])  # a smoke test's short runs; the report has none
        built = arm_trials(arms, games, seeds, overrides)
        trials = [t for t in built if _trial_key(t) not in have]
        if not trials:
            print(f"{report_json} holds every run asked for")
            return 0
        sweep_dir.mkdir(parents=True, exist_ok=True)
        manifest = {
            "sweep_id": __import__("uuid").uuid4().hex,
            "created": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": "python -m bench.atari100k " + " ".join(sys.argv[1:]),
            "env_id": "Atari 100k",
            "config_file": "der",
            "commit": _git_commit(),
            "trials": [t.__dict__ for t in trials],
        }
        write_manifest(sweep_dir, manifest)
        print(f"{len(trials)} runs to go in {sweep_dir} (the JSON holds {len(have)})")

    def landed(trial: Any) -> None:  # each run's score into the JSON as it lands
        collect(sweep_dir, report_json, keep_replay=args.keep_replay)

    if args.ray_address is None:
        from agent.sweep.local import run_local

        # Lone runs, as on Ray (one seed a task): the report's scores do not depend on
        # whether Ray ran them.
        return run_local(sweep_dir, manifest, trials, progress=False, on_done=landed,
                         stack_images=False)  # fmt: skip
    from agent.sweep.driver import run_sweep

    address = None if args.ray_address == "local" else args.ray_address
    return run_sweep(sweep_dir, manifest, trials, ray_address=address, progress=False,
                     on_done=landed)  # fmt: skip


# --------------------------------------------------------------------------- aggregates
METRICS = ("IQM", "median", "mean", "optimality gap")


def score_matrix(
    runs: Sequence[dict[str, Any]], arm: str, games: Sequence[str], seeds: Sequence[int]
) -> np.ndarray:
    """Human-normalised scores ``(len(seeds), len(games))`` of ``arm``: a run per cell."""
    by_key = _scores(runs)
    return np.array([[BY_NAME[g].normalized(by_key[(g, arm, s)]) for g in games]
                     for s in seeds], dtype=np.float64)  # fmt: skip


PUBLISHED = {"DER": "der", "DrQ": "drq", "SPR": "spr"}  # label: the Game field


def published_matrix(method: str, games: Sequence[str]) -> np.ndarray:
    """The per-game means published for ``method`` (a ``Game`` field: ``der``, ``drq`` or
    ``spr``), human-normalised, as one row ``(1, len(games))``: a published table gives one
    value a game."""
    return np.array([[BY_NAME[g].normalized(getattr(BY_NAME[g], method)) for g in games]],
                    dtype=np.float64)  # fmt: skip


def refuse_unknown_arms(names: Iterable[str]) -> None:
    """Raise :class:`UserError` naming the first of ``names`` that is not an arm."""
    unknown = [a for a in names if a not in ARMS]
    if unknown:
        raise UserError(f"unknown arm {unknown[0]}: one of {', '.join(ARMS)}")


def complete_cells(
    runs: Sequence[dict[str, Any]], arms: Sequence[str]
) -> tuple[list[str], list[int]]:
    """The games and seeds that every arm has finished for all of them, so that the arms
    are compared on the same runs: the seeds every arm has run (on any game; a JSON may
    hold more seeds of one arm than of another), then the games with all of them."""
    have = {_key(r) for r in runs}
    each = [{int(r["seed"]) for r in runs if r["arm"] == a} for a in arms]
    seeds = sorted(set.intersection(*each)) if each else []
    games = [g.name for g in GAMES
             if seeds and all((g.name, a, s) in have for a in arms for s in seeds)]  # fmt: skip
    return games, seeds


def _metric_fns() -> dict[str, Callable[[np.ndarray], float]]:
    from rliable import metrics

    return {
        "IQM": metrics.aggregate_iqm,
        "median": metrics.aggregate_median,
        "mean": metrics.aggregate_mean,
        "optimality gap": metrics.aggregate_optimality_gap,
    }


@contextlib.contextmanager
def _numpy_seeded(seed: int) -> Iterator[None]:
    """numpy's global generator seeded for the block, then put back. rliable's bootstrap
    draws its resamples from that generator whatever generator it is handed, so this is
    what makes its intervals the same at every call."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def aggregates(matrix: np.ndarray, reps: int = 50_000, seed: int = 0) -> dict[str, tuple]:
    """Each metric of a ``(runs, games)`` score matrix: (point, CI low, CI high), 95%
    stratified-bootstrap percentile intervals (runs resampled within each game), rliable's."""
    from rliable import library as rly

    out = {}
    for name, fn in _metric_fns().items():
        with _numpy_seeded(seed):
            boot = rly.StratifiedBootstrap(matrix)
            low, high = boot.conf_int(fn, reps=reps, size=0.95, method="percentile")[:, 0]
        out[name] = (float(fn(matrix)), float(low), float(high))
    return out


def paired_difference(
    a: np.ndarray, b: np.ndarray, reps: int = 50_000, seed: int = 0
) -> dict[str, tuple]:
    """Each metric of ``a`` minus that of ``b`` (two ``(runs, games)`` matrices of the same
    games and seeds), with a 95% CI from one stratified bootstrap of both: the same runs
    (game and seed) drawn for the two arms, as the pairing by seed asks."""
    from rliable import library as rly

    out = {}
    for name, fn in _metric_fns().items():

        def diff(x: np.ndarray, y: np.ndarray, fn: Callable = fn) -> float:
            return float(fn(x) - fn(y))

        with _numpy_seeded(seed):
            boot = rly.StratifiedBootstrap(a, b)
            low, high = boot.conf_int(diff, reps=reps, size=0.95, method="percentile")[:, 0]
        out[name] = (diff(a, b), float(low), float(high))
    return out


def _ci(point: float, low: float, high: float, signed: bool = False) -> str:
    """A value and its interval to three decimals; ``signed`` (a difference) shows the +."""
    f = "+.3f" if signed else ".3f"
    return f"{point:{f}} [{low:{f}}, {high:{f}}]"


def _seeds_text(seeds: Sequence[int]) -> str:
    contiguous = list(seeds) == list(range(seeds[0], seeds[0] + len(seeds)))
    if contiguous and len(seeds) > 2:
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(map(str, seeds))


def paired_by_game(
    runs: Sequence[dict[str, Any]], a: str, b: str, games: Sequence[str], seeds: Sequence[int]
) -> dict[str, tuple[float, float, float]]:
    """Per game, arm ``a`` minus arm ``b`` paired by seed: the mean difference and its
    Student's t 95% interval."""
    from agent.sweep.stats import difference_ci

    by_key = _scores(runs)
    return {g: difference_ci([by_key[(g, a, s)] for s in seeds],
                             [by_key[(g, b, s)] for s in seeds], paired=True)
            for g in games}  # fmt: skip


def _decimals(scores: Iterable[float]) -> int:
    """Two decimals where all of a game's scores are under 10 in magnitude, one otherwise."""
    return 2 if max(abs(x) for x in scores) < 10 else 1


def game_rows(
    runs: Sequence[dict[str, Any]],
    arms: Sequence[str],
    games: Sequence[str],
    seeds: Sequence[int],
    paired: dict[str, dict[str, tuple[float, float, float]]] | None = None,
    published: Sequence[str] = ("DER",),
) -> list[str]:
    """The per-game table as the results page gives it: each arm's scores seed by seed and
    their mean (two decimals where a game's scores are all under 10), the ``published``
    methods' scores (labels of :data:`PUBLISHED`), and the first arm minus each other arm,
    paired by seed (mean, Student's t 95% interval, and whether it lies above zero, across
    it or below); ``paired`` is `paired_by_game`'s answer for them by the other arm, if the
    caller has it."""
    from agent.sweep.stats import verdict

    by_key = _scores(runs)
    if paired is None:
        paired = {b: paired_by_game(runs, arms[0], b, games, seeds) for b in arms[1:]}
    header = [f"{arms[0]}, seeds {_seeds_text(seeds)} (mean)", *(f"{a} (mean)" for a in arms[1:]),
              *(f"{label} as published" for label in published),
              *(f"{arms[0]} - {b}, paired: mean [95% CI]" for b in paired)]  # fmt: skip
    lines = ["| game | " + " | ".join(header) + " |", "| --- " * (len(header) + 1) + "|"]
    for g in games:
        scores = [[by_key[(g, a, s)] for s in seeds] for a in arms]
        digits = _decimals(x for arm in scores for x in arm)
        cells = [", ".join(f"{x:.{digits}f}" for x in arm) + f" ({np.mean(arm):.{digits}f})"
                 for arm in scores]  # fmt: skip
        cells += [f"{getattr(BY_NAME[g], PUBLISHED[label]):.1f}" for label in published]
        for by_game in paired.values():
            mean, low, high = by_game[g]
            cells.append(f"{mean:+.1f} [{low:+.1f}, {high:+.1f}]: {verdict(low, high)}")
        lines.append(f"| {g} | " + " | ".join(cells) + " |")
    return lines


def off_greedy_rows(
    runs: Sequence[dict[str, Any]], arms: Sequence[str], games: Sequence[str]
) -> list[str]:
    """Per game, each arm's share of training actions off its noise-free greedy ones (the
    mean over its runs that recorded it); empty where no run of ``arms`` recorded one."""
    shares: dict[tuple[str, str], list[float]] = {}
    for r in runs:
        if r["arm"] in arms and r.get("off_greedy"):
            shares.setdefault((r["game"], r["arm"]), []).append(r["off_greedy"]["mean"])
    shown = [a for a in arms if any(arm == a for _, arm in shares)]
    if not shown:
        return []
    lines = ["| game | " + " | ".join(f"{a}: off-greedy share (runs)" for a in shown) + " |",
             "| --- " * (len(shown) + 1) + "|"]  # fmt: skip
    for g in games:
        cells = [f"{np.mean(shares[(g, a)]):.4f} ({len(shares[(g, a)])})" if (g, a) in shares
                 else "" for a in shown]  # fmt: skip
        lines.append(f"| {g} | " + " | ".join(cells) + " |")
    return lines


def per_game_means(matrices: dict[str, np.ndarray], games: Sequence[str]) -> dict[str, np.ndarray]:
    """One value a game, shape (1, games): each arm's mean of its seeds (``matrices``: arm to
    its (seeds, games) normalised scores), then each published method's per-game mean as
    ``"LABEL as published"``, which has no runs to aggregate over."""
    means = {arm: m.mean(axis=0, keepdims=True) for arm, m in matrices.items()}
    return means | {f"{label} as published": published_matrix(field, games)
                    for label, field in PUBLISHED.items()}  # fmt: skip


def table(args: argparse.Namespace) -> str:
    """The report as markdown: aggregates per arm, the first arm minus each other arm
    paired (aggregates and per game, with where the first is ahead, level or behind), the
    off-greedy shares, the wall times."""
    from agent.sweep.stats import verdict

    unknown = [p for p in args.published.split(",") if p not in PUBLISHED]
    if unknown:
        raise UserError(f"--published {unknown[0]}: one of {', '.join(PUBLISHED)}")
    data = read_report(Path(args.json))
    asked = args.arms.split(",")
    runs = [r for r in data["runs"] if r["arm"] in asked]
    arms = [a for a in asked if any(r["arm"] == a for r in runs)]
    missing = [a for a in asked if a not in arms]
    refuse_unknown_arms(missing)  # an arm with runs is known
    games, seeds = complete_cells(runs, arms)
    lines = [f"{len(games)} of 26 games with every arm on seeds "
             f"{', '.join(map(str, seeds))} ({len(runs)} runs in {args.json}):",
             *(f"{a}: no runs in {args.json} yet, left out" for a in missing),
             ""]  # fmt: skip
    if not games:
        return "\n".join([*lines, "nothing to aggregate yet"])
    matrices = {a: score_matrix(runs, a, games, seeds) for a in arms}
    lines += ["| arm | " + " | ".join(METRICS) + " |", "|---" * (len(METRICS) + 1) + "|"]
    for arm in arms:
        agg = aggregates(matrices[arm], reps=args.reps)
        lines.append(f"| {arm} | " + " | ".join(_ci(*agg[m]) for m in METRICS) + " |")
    first, others = arms[0], arms[1:]
    for b in others:
        diff = paired_difference(matrices[first], matrices[b], reps=args.reps)
        cells = " | ".join(_ci(*diff[m], signed=True) for m in METRICS)
        lines.append(f"| {first} - {b}, paired | {cells} |")
    lines += ["", "| per-game means | " + " | ".join(METRICS) + " |",
              "|---" * (len(METRICS) + 1) + "|"]  # fmt: skip
    fns = _metric_fns()
    for name, row in per_game_means(matrices, games).items():
        lines.append(f"| {name} | " + " | ".join(f"{fns[m](row):.3f}" for m in METRICS) + " |")
    paired = {b: paired_by_game(runs, first, b, games, seeds) for b in others}
    lines += ["", *game_rows(runs, arms, games, seeds, paired, args.published.split(","))]
    for b, by_game in paired.items():
        verdicts: dict[str, list[str]] = {"ahead": [], "level": [], "behind": []}
        for g, (_, low, high) in by_game.items():
            verdicts[verdict(low, high)].append(g)
        lines += ["", f"{first} against {b}, per game (the paired 95% t interval over the "
                  f"seeds above, across or below zero): ahead on {len(verdicts['ahead'])} "
                  f"({', '.join(verdicts['ahead']) or 'none'}), level on "
                  f"{len(verdicts['level'])}, behind on {len(verdicts['behind'])} "
                  f"({', '.join(verdicts['behind']) or 'none'})"]  # fmt: skip
    shares = off_greedy_rows(runs, arms, games)
    if shares:
        lines += ["", "Share of training actions off the noise-free greedy ones (the floor's "
                  "and the noise's, or epsilon's), mean over each run's logs:", "", *shares]
    # Per arm: an arm's final evaluations take their own time (stuck episodes run to the cap).
    for arm in arms:
        lines += ["", *wall_times([r for r in runs if r["arm"] == arm], arm)]
    lines += ["", *machine_mix(runs, arms)]
    return "\n".join(lines)


def screen(runs: Sequence[dict[str, Any]], baseline: str = "der-epsilon") -> list[str]:
    """The screening as one grid: a row per game and seed that has a run, a column per arm
    (in ``ARMS`` order) with its final score and, where ``baseline`` ran the same game and
    seed, the human-normalised difference from it; then per arm, over the cells it shares
    with ``baseline``: their number, how many it is ahead on, and the mean difference.
    One or two seeds a game are leads, not results: no interval is given."""
    by_key = _scores(runs)
    order = {name: i for i, name in enumerate(ARMS)}
    arms = sorted({r["arm"] for r in runs}, key=lambda a: (a != baseline, order.get(a, 99), a))
    game_order = {g.name: i for i, g in enumerate(GAMES)}
    cells = sorted({(r["game"], int(r["seed"])) for r in runs},
                   key=lambda c: (game_order.get(c[0], 99), c[1]))  # fmt: skip
    digits = {g: _decimals(v for (game, _, _), v in by_key.items() if game == g)
              for g in {game for game, _ in cells}}  # fmt: skip
    deltas: dict[str, list[float]] = {a: [] for a in arms}
    lines = ["| game, seed | " + " | ".join(arms) + " |", "| --- " * (len(arms) + 1) + "|"]
    for game, seed in cells:
        base = by_key.get((game, baseline, seed))
        row = []
        for arm in arms:
            score = by_key.get((game, arm, seed))
            if score is None:
                row.append("")
                continue
            text = f"{score:,.{digits[game]}f}"
            if base is not None and arm != baseline:
                delta = BY_NAME[game].normalized(score) - BY_NAME[game].normalized(base)
                deltas[arm].append(delta)
                text += f" ({delta:+.3f})"
            row.append(text)
        lines.append(f"| {game}, {seed} | " + " | ".join(row) + " |")
    summary = []
    for arm in arms:
        d = deltas[arm]
        if arm == baseline or not d:
            summary.append("")
        else:
            ahead = sum(x > 0 for x in d)
            summary.append(f"ahead on {ahead} of {len(d)}, mean {np.mean(d):+.3f}")
    lines.append(f"| against {baseline} | " + " | ".join(summary) + " |")
    return lines


def plots(runs: Sequence[dict[str, Any]], arms: Sequence[str], out_dir: Path) -> list[Path]:
    """``curves.png`` (each game's training return against steps, the mean of the seeds
    per arm, DER's published score dashed) and ``profiles.png`` (performance profiles of
    the arms' runs beside the published per-game means of DER, DrQ and SPR)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from rliable import library as rly

    out_dir.mkdir(parents=True, exist_ok=True)
    colors = dict(zip(arms, ("tab:blue", "tab:orange", "tab:green", "tab:red"), strict=False))
    drawn = [g for g in GAMES if any(r["game"] == g.name for r in runs)]  # games with a run
    cols = min(5, max(1, len(drawn)))
    rows = max(1, -(-len(drawn) // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(max(6.0, 3.4 * cols), 2.9 * rows + 0.6),
                             squeeze=False)  # fmt: skip
    for ax, game in zip(axes.flat, drawn, strict=False):
        for arm in arms:
            curves = [r["curve"] for r in runs if r["game"] == game.name and r["arm"] == arm]
            if not curves:
                continue
            steps = sorted({c[0] for curve in curves for c in curve})
            means = [np.mean([v for curve in curves for s, v in curve if s == x]) for x in steps]
            ax.plot(steps, means, color=colors[arm], label=f"{arm} ({len(curves)} seeds)")
        ax.axhline(game.der, color="grey", linestyle="--", linewidth=1)
        ax.set_title(game.name, fontsize=10)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(drawn) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"Atari 100k, {len(drawn)} of {len(GAMES)} games: training return (mean of "
                 "seeds)\nagainst agent steps; dashed: DER as published", fontsize=10)  # fmt: skip
    fig.tight_layout()
    paths = [out_dir / "curves.png"]
    fig.savefig(paths[0], dpi=70)
    plt.close(fig)

    games, seeds = complete_cells(runs, arms)
    if games:
        taus = np.linspace(0.0, 2.0, 81)
        scores = {a: score_matrix(runs, a, games, seeds) for a in arms}
        for label, field in PUBLISHED.items():
            scores[f"{label} (published means)"] = published_matrix(field, games)
        with _numpy_seeded(0):
            profiles, cis = rly.create_performance_profile(scores, taus, reps=2000)
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for i, (name, profile) in enumerate(profiles.items()):
            color = colors.get(name, ("black", "grey", "tab:purple")[i % 3])
            style = "-" if name in arms else "--"
            ax.plot(taus, profile, style, color=color, label=name)
            if name in arms:
                ax.fill_between(taus, *cis[name], color=color, alpha=0.2)
        ax.set_xlabel("human-normalised score tau")
        ax.set_ylabel("fraction of runs above tau")
        ax.set_title(f"Performance profiles, {len(games)} games, seeds {_seeds_text(seeds)}")
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(out_dir / "profiles.png")
        fig.savefig(paths[-1], dpi=90)
        plt.close(fig)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("speed", help="a learning step of ours and of Kaixhin/Rainbow's")
    p.add_argument("--game", default="krull", help="an Atari game, as Kaixhin/Rainbow names it")
    p.add_argument("--peer", help="a checkout of Kaixhin/Rainbow (left out: ours alone)")
    p.add_argument("--shim", default=str(ROOT.parent / "shared" / "peers" / "atari_py_shim"),
                   help="the folder that maps atari_py onto ale-py")  # fmt: skip
    p.add_argument("--short", type=int, default=500, help="learning steps of the short runs")
    p.add_argument("--long", type=int, default=2500, help="learning steps of the long runs")
    p.add_argument("--arms", default="der",
                   help=f"ours with these arms' settings, the first timed against the rest "
                        f"(of {', '.join(ARMS)}), e.g. der,der-epsilon")  # fmt: skip
    p.add_argument("--repeats", type=int, default=1, help="runs of each arm (median)")
    p.add_argument("--json", help="write the figures here")
    report_json = str(ROOT / "bench" / "atari100k_report.json")
    r = sub.add_parser("report", help="run what the report misses; collect what finishes")
    r.add_argument("--seeds", default="101-103",
                   help="report seeds (never tuned on): a range (101-103) or a list (1,5); "
                        "a lone number N is a count, seeds 1..N (seed 2 alone: 2-2)")  # fmt: skip
    r.add_argument("--arms", default="der,der-epsilon", help=f"of {', '.join(ARMS)}")
    r.add_argument("--games", help="comma-separated games (default: all 26)")
    r.add_argument("--sweep", required=True, help="the sweep directory (scratch: resumable)")
    r.add_argument("--ray-address", help="local (one run per core) or HOST:PORT")
    r.add_argument("--json", default=report_json, help="the report's runs")
    r.add_argument("--set", action="append", help="key=value over every arm (smoke tests)")
    c = sub.add_parser("collect", help="add a sweep's finished runs to the report's JSON")
    c.add_argument("--sweep", required=True)
    c.add_argument("--json", default=report_json)
    for sub_parser in (r, c):
        sub_parser.add_argument("--keep-replay", action="store_true",
                                help="keep landed runs' replay buffers in their last.pt "
                                     "(0.7 GB a run), to train them on exactly")  # fmt: skip
    t = sub.add_parser("table", help="aggregates, paired difference, per-game table")
    t.add_argument("--json", default=report_json)
    t.add_argument("--arms", default="der,der-epsilon")
    t.add_argument("--reps", type=int, default=50_000, help="bootstrap resamples")
    t.add_argument("--plot-dir", help="draw curves.png and profiles.png here")
    t.add_argument("--published", default="DER",
                   help=f"the published scores beside each game's row, of {','.join(PUBLISHED)}")
    g = sub.add_parser("screen", help="the screening's grid: each arm's score per game and "
                                      "seed, and its normalised difference from a baseline")
    g.add_argument("--json", default=str(ROOT / "bench" / "atari100k_screening.json"))
    g.add_argument("--baseline", default="der-epsilon")
    args = parser.parse_args()
    try:
        run_command(args)
    except UserError as e:  # an arm or a label it does not know: one line, exit status 2
        print(f"bench.atari100k {args.command}: {e}", file=sys.stderr)
        sys.exit(2)


def run_command(args: argparse.Namespace) -> None:
    """The subcommand ``args`` name, run."""
    if args.command == "speed":
        out = speed(args)
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    elif args.command == "report":
        sys.exit(report(args))
    elif args.command == "collect":
        collect(Path(args.sweep), Path(args.json), keep_replay=args.keep_replay)
    elif args.command == "screen":
        print("\n".join(screen(read_report(Path(args.json))["runs"], args.baseline)))
    else:
        print(table(args))
        if args.plot_dir:
            runs = [r for r in read_report(Path(args.json))["runs"]
                    if r["arm"] in args.arms.split(",")]  # fmt: skip
            for path in plots(runs, args.arms.split(","), Path(args.plot_dir)):
                print(f"wrote {path}")


if __name__ == "__main__":
    main()
