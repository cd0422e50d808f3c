"""Classic control: our default command, its epsilon-greedy ablation and SB3, in one run.

    python -m bench.suite --seeds 101-110 --sb3-seeds 3 --jobs 2 --plot-dir docs/img/

For each of CartPole-v1, Acrobot-v1 and MountainCar-v0 (the default ``--envs``), or any
other registered gymnasium id with discrete actions given to ``--envs`` (the
generality check: envs with no YAML of their own, which run on ``configs/default.yaml``
alone), every seed a separate process, timed as a whole (start-up included; with
``--together`` the seeds of an env and agent are one ``run.py --seeds`` process instead):

* ``noisy``: ``python run.py --env ENV --seed S`` — the shipped configs, nothing else
  (``--config FILE`` and ``--set`` add to both of our agents; ``--config
  configs/default.yaml`` runs an env that has a YAML on the default config instead).
* ``epsilon``: the same command with ``--set exploration=epsilon --set
  noisy_layers=none``: the same network and learner without noise, epsilon-greedy.
* ``sb3`` (when stable-baselines3 is installed, for the three envs above only):
  SB3's DQN with the rl-zoo3 2.9.2 hyperparameters for the env (``bench/cartpole.py``
  runs it), for the zoo's step budget.

The threshold of an env is the one in ``THRESHOLD`` (the three above), else the
``target_return`` of the env's own YAML (the early stop's target: Taxi-v4's, whose
registered threshold no policy can expect), else gymnasium's registered ``reward_threshold``;
an env with none (Blackjack-v1) gets no solve rate and no steps to solve, only the
final returns. Each env's header says which config files its runs used. After the
per-env tables, one table compares the default command with its epsilon-greedy ablation
env by env (is the noise at least as good as its own epsilon-greedy ablation?):
solve rates, median steps to solve, and the final-return IQM, with 95% bootstrap CIs of
the differences (noisy minus epsilon, seeds resampled within each agent).

"Solved" = the final policy's noise-free 100-episode mean reaches the env's
reward threshold (ours stop early once a 10-episode evaluation reaches it and a
100-episode one confirms it, so their final policy is the confirmed one). "Steps to
solve" = env steps at the first periodic evaluation at or above the threshold (ours:
10 episodes every ``eval_interval`` of the config; SB3: 10 episodes every
``SB3_EVAL_EVERY`` steps). Its median and IQR are over all seeds, a seed that never
got there counting as infinitely slow. IQM and its 95% bootstrap CI are over the final
100-episode returns (agent.sweep's statistics). Wall-clock is the whole command; for
SB3 the time of its periodic evaluations (ours are part of the training loop and
counted) is subtracted, which favours SB3. With ``--jobs 2`` two processes run at a
time on a 2-core machine, so every agent is timed under the same load.

A 100-episode final return has a standard error of about 0.05 on FrozenLake and 0.1 on
Blackjack, as large as the gaps between the agents there. ``--final-episodes N``
evaluates every final policy of ours once more (``python run.py --eval
checkpoints/last.pt --episodes N``, noise-free) and compares the agents on those means
too: every run plays the same N episodes (the evaluation seeds do not depend on the
run), so the two agents of a seed are also compared seed by seed. ``--from-json FILE``
takes the runs of an earlier ``--json`` instead of training (their run directories must
still exist), e.g. to add ``--final-episodes`` to a finished run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agent.config_files import env_config_file, load_config, presets
from agent.setup import cpu_name
from agent.sweep.stats import bootstrap_ci, difference_ci, iqm
from bench.cartpole import SB3_ZOO as SB3_ZOO_CARTPOLE
from bench.cartpole import ROOT, parse_seeds, run_ours, run_sb3, timed_run_py

__all__ = ["plot"]

# rl-zoo3 2.9.2 hyperparams/dqn.yml (n_timesteps is the step budget).
SB3_ZOO = {
    "CartPole-v1": (50_000, SB3_ZOO_CARTPOLE),
    "Acrobot-v1": (100_000, {
        "learning_rate": 6.3e-4,
        "batch_size": 128,
        "buffer_size": 50_000,
        "learning_starts": 0,
        "gamma": 0.99,
        "target_update_interval": 250,
        "train_freq": 4,
        "gradient_steps": -1,
        "exploration_fraction": 0.12,
        "exploration_final_eps": 0.1,
        "policy_kwargs": {"net_arch": [256, 256]},
    }),
    "MountainCar-v0": (120_000, {
        "learning_rate": 4e-3,
        "batch_size": 128,
        "buffer_size": 10_000,
        "learning_starts": 1_000,
        "gamma": 0.98,
        "target_update_interval": 600,
        "train_freq": 16,
        "gradient_steps": 8,
        "exploration_fraction": 0.2,
        "exploration_final_eps": 0.07,
        "policy_kwargs": {"net_arch": [256, 256]},
    }),
}
SB3_EVAL_EVERY = {"CartPole-v1": 1_000, "Acrobot-v1": 5_000, "MountainCar-v0": 5_000}
THRESHOLD = {"CartPole-v1": 475.0, "Acrobot-v1": -100.0, "MountainCar-v0": -110.0}
EPSILON = ["--set", "exploration=epsilon", "--set", "noisy_layers=none"]
AGENTS = ("noisy (ours, default command)", "epsilon-greedy (ours, same config)",
          "sb3 DQN (rl-zoo3)")


def threshold_of(env_id: str) -> tuple[float | None, str]:
    """The return that counts as solved on ``env_id`` (None: no threshold), and where it
    comes from; raises ``UserError`` for an id that is not registered."""
    if env_id in THRESHOLD:
        return THRESHOLD[env_id], "the classic-control goal"
    import gymnasium as gym

    from envs import check_env_id

    check_env_id(env_id)  # registers MinAtar and MiniGrid ids, as run.py does
    target = load_config(env_id).target_return  # null in default.yaml: the env's YAML set it
    if target is not None:
        return target, f"target_return of configs/{env_config_file(env_id).name}"
    registered = gym.spec(env_id).reward_threshold
    if registered is None:
        return None, "none registered"
    return float(registered), "registered reward_threshold"


def config_used(env_id: str, overrides: list[str] | None = None,
                config_file: str | None = None) -> str:
    """Which config files ``python run.py --env ENV_ID`` resolves, then the suite's
    --config and --set, in the order they apply (later wins)."""
    env_file = env_config_file(env_id)
    if env_file is None:
        used = "configs/default.yaml alone (no YAML of its own)"
    else:
        used = f"configs/default.yaml < configs/{env_file.name}"
    if config_file is not None:
        used += f" < --config {config_file}"
    return used + "".join(f" < --set {kv}" for kv in overrides or [])


def our_args(agent: str, overrides: list[str], config_file: str | None = None) -> list[str]:
    """The arguments after ``--env ENV --seed S`` of one of our agents: the suite's
    --config and --set for both, then the ablation's own (last, so that its noise
    stays off)."""
    args = ["--config", config_file] if config_file is not None else []
    args += [a for kv in overrides for a in ("--set", kv)]
    return args + (EPSILON if agent == AGENTS[1] else [])


def first_reach(curve: list, threshold: float) -> float:
    return next((float(step) for step, value in curve if value >= threshold), math.inf)


def compare(threshold: float | None, noisy: list[dict], epsilon: list[dict]) -> dict:
    """Does the noisy agent do at least as well as its epsilon-greedy ablation?

    Point estimates decide (solve rate, then final-return IQM: noisy must not be behind
    on either); the 95% bootstrap CIs of the differences say whether a gap is beyond the
    seed-to-seed noise. Steps to solve (median over all seeds, never = infinitely slow)
    are reported beside the verdict, not in it.
    """
    fn = [r["final_eval_return"] for r in noisy]
    fe = [r["final_eval_return"] for r in epsilon]
    out: dict = {"iqm": (iqm(fn), iqm(fe)), "iqm_diff": iqm(fn) - iqm(fe),
                 "iqm_diff_ci": difference_ci(fn, fe, "iqm")[1:]}
    behind, significant, ahead = [], [], []
    if threshold is not None:
        sn = [float(f >= threshold) for f in fn]
        se = [float(f >= threshold) for f in fe]
        out["solved"] = (int(sum(sn)), len(sn), int(sum(se)), len(se))
        rate_diff = sum(sn) / len(sn) - sum(se) / len(se)
        _, lo, hi = difference_ci(sn, se, "mean")
        out["solved_diff_ci"] = (lo, hi)
        if rate_diff < 0:
            behind.append("solve rate")
            if hi < 0:
                significant.append("solve rate")
        elif rate_diff > 0:
            ahead.append("solve rate")
        out["steps"] = tuple(
            _quantile(sorted(first_reach(r["eval_curve"], threshold) for r in res), 0.5)
            for res in (noisy, epsilon))
    lo, hi = out["iqm_diff_ci"]
    if out["iqm_diff"] < 0:
        behind.append("final-return IQM")
        if hi < 0:
            significant.append("final-return IQM")
    elif out["iqm_diff"] > 0:
        ahead.append("final-return IQM")
    if not behind:
        verdict = "noisy >= epsilon"
        if ahead:
            verdict += f" (ahead on {', '.join(ahead)})"
    elif significant:
        verdict = f"noisy < epsilon ({', '.join(behind)}; beyond the 95% CI)"
    else:
        verdict = f"noisy < epsilon ({', '.join(behind)}; within the 95% CI)"
    out["verdict"] = verdict
    return out


def fmt_steps(x: float) -> str:
    return "never" if math.isinf(x) else f"{x:,.0f}"


def fmt_return(x: float, scale: float) -> str:
    """Returns with as many decimals as the env's scale needs (FrozenLake: 0 to 1)."""
    digits = 0 if scale >= 50 else 1 if scale >= 5 else 2
    return f"{x:.{digits}f}"


def summarise(threshold: float | None, results: list[dict], sb3_wall: float | None) -> dict:
    finals = [r["final_eval_return"] for r in results]
    scale = max(abs(f) for f in finals) if finals else 0.0
    lo, hi = bootstrap_ci(finals)
    wall = statistics.median(r["wall_s"] for r in results)
    row = {
        "solved": "-", "steps": "-", "reached": None,
        "iqm": f"{iqm(finals):.{1 if scale >= 5 else 3}f} "
               f"[{lo:.{1 if scale >= 5 else 3}f}, {hi:.{1 if scale >= 5 else 3}f}]",
        "wall": wall,
        "ratio": None if sb3_wall is None else sb3_wall / wall,
        "finals": " ".join(fmt_return(f, scale) for f in finals),
    }
    if threshold is not None:
        solved = sum(f is not None and f >= threshold for f in finals)
        reach = sorted(first_reach(r["eval_curve"], threshold) for r in results)
        q25, med, q75 = (_quantile(reach, q) for q in (0.25, 0.5, 0.75))
        row.update(solved=f"{solved}/{len(results)}",
                   steps=f"{fmt_steps(med)} ({fmt_steps(q25)}-{fmt_steps(q75)})",
                   reached=sum(not math.isinf(x) for x in reach))
    return row


def _quantile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolation quantile that tolerates inf (a seed that never solved)."""
    pos = q * (len(sorted_values) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    a, b = sorted_values[lo], sorted_values[hi]
    if lo == hi or a == b:
        return a
    if math.isinf(b):
        return math.inf
    return a + (b - a) * (pos - lo)


def plot(env_id: str, curves: dict[str, list[list]], budget: int, path: Path,
         threshold: float | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 4.2))
    grid = np.linspace(0, budget, 201)[1:]
    for name, runs in curves.items():
        values = []
        for curve in runs:
            steps = np.array([s for s, _ in curve] or [0])
            rets = np.array([v for _, v in curve] or [np.nan])
            # After an early stop the policy is kept: carry its last evaluation forward.
            idx = np.clip(np.searchsorted(steps, grid, side="right") - 1, 0, None)
            values.append(np.where(grid >= steps[0], rets[idx], np.nan))
        arr = np.array(values)
        with warnings.catch_warnings():  # before an agent's first evaluation: all NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            med = np.nanmedian(arr, axis=0)
            lo, hi = np.nanpercentile(arr, 25, axis=0), np.nanpercentile(arr, 75, axis=0)
        seeds = f"{len(runs)} seed" + ("s" if len(runs) > 1 else "")
        ax.plot(grid, med, label=f"{name} (median, IQR band, {seeds})")
        ax.fill_between(grid, lo, hi, alpha=0.2)
    if threshold is not None:
        ax.axhline(threshold, color="gray", ls="--", lw=1)
    ax.set_xlabel("environment steps")
    ax.set_ylabel("noise-free evaluation return")
    ax.set_title(env_id)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def evaluate_final(env_id: str, result: dict, episodes: int) -> float:
    """Mean return of a run's final policy on ``episodes`` noise-free episodes (``--eval``).

    The episode seeds are ``--eval``'s default stream, the same for every run."""
    checkpoint = Path(result["run_dir"]) / "checkpoints" / "last.pt"
    cmd = [sys.executable, "run.py", "--env", env_id, "--eval", str(checkpoint),
           "--episodes", str(episodes), "--json"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"evaluating {checkpoint} failed: {proc.stderr[-2000:]}")
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["mean_return"])


def paired(noisy: list[float], epsilon: list[float]) -> tuple[int, int, int]:
    """Seeds on which noisy's value is higher, equal, lower than epsilon's (same seed order)."""
    pairs = list(zip(noisy, epsilon, strict=True))
    return (sum(a > b for a, b in pairs), sum(a == b for a, b in pairs),
            sum(a < b for a, b in pairs))


def print_comparison(envs: list[str], thresholds: dict[str, tuple[float | None, str]],
                     results: dict[str, dict[str, list[dict]]],
                     title: str = "The default command against its epsilon-greedy ablation",
                     paired_by_seed: bool = False, config_file: str | None = None) -> None:
    """One row per env (:func:`comparison_row`): the default command against its ablation."""
    rows = [comparison_row(env_id, thresholds[env_id][0], results[env_id], paired_by_seed,
                           config_file) for env_id in envs]
    print(f"\n### {title}\n")
    print("| " + " | ".join(rows[0]) + " |")
    print("|---" * len(rows[0]) + "|")
    for row in rows:
        print("| " + " | ".join(row.values()) + " |")


def comparison_row(env_id: str, threshold: float | None, agents: dict[str, list[dict]],
                   paired_by_seed: bool = False, config_file: str | None = None
                   ) -> dict[str, str]:
    """The cells of one env's row, by column.

    ``paired_by_seed`` adds how many seeds the noisy run beat, tied or lost to the
    epsilon-greedy run of the same seed (meaningful where both played the same episodes).
    ``config_file`` (the suite's --config) is named in the config column after the env's
    own YAML.
    """
    noisy, epsilon = agents[AGENTS[0]], agents[AGENTS[1]]
    c = compare(threshold, noisy, epsilon)
    scale = max(abs(r["final_eval_return"]) for res in agents.values() for r in res)
    d = 1 if scale >= 5 else 3
    lo, hi = c["iqm_diff_ci"]
    if threshold is None:
        solved_cell = steps_cell = rate_cell = "- (no threshold)"
    else:
        sn, nn, se, ne = c["solved"]
        solved_cell = f"{sn}/{nn} / {se}/{ne}"
        steps_cell = f"{fmt_steps(c['steps'][0])} / {fmt_steps(c['steps'][1])}"
        rlo, rhi = c["solved_diff_ci"]
        rate_cell = f"{sn / nn - se / ne:+.2f} [{rlo:+.2f}, {rhi:+.2f}]"
    config = "default.yaml" if env_config_file(env_id) is None else \
        env_config_file(env_id).name
    if config_file is not None:
        config += f" < --config {config_file}"
    row = {
        "env": env_id,
        "config": config,
        "seeds solved, noisy / epsilon": solved_cell,
        "median steps to solve, noisy / epsilon": steps_cell,
        "final return IQM, noisy / epsilon": f"{c['iqm'][0]:.{d}f} / {c['iqm'][1]:.{d}f}",
        "IQM difference [95% CI]": f"{c['iqm_diff']:+.{d}f} [{lo:+.{d}f}, {hi:+.{d}f}]",
        "solve-rate difference [95% CI]": rate_cell,
    }
    if paired_by_seed:
        higher, equal, lower = paired([r["final_eval_return"] for r in noisy],
                                      [r["final_eval_return"] for r in epsilon])
        row["seeds noisy higher / equal / lower"] = f"{higher} / {equal} / {lower}"
    row["verdict"] = c["verdict"]
    return row


def run_together(seeds: list[int], extra: list[str], workdir: Path, env_id: str) -> list[dict]:
    """``python run.py --env ENV --seeds S1,S2,... [extra]``: the seeds in one process (no
    Ray), timed as a whole; each seed's ``wall_s`` is its share of the process's."""
    run_dir = workdir / "together"
    wall = timed_run_py(["--env", env_id, "--seeds", ",".join(map(str, seeds)), "--no-progress",
                         "--run-dir", str(run_dir), *extra], f"seeds {seeds}")  # fmt: skip
    results = [json.loads((run_dir / f"seed_{s}" / "result.json").read_text()) for s in seeds]
    for result in results:
        result["wall_s"] = wall / len(seeds)
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--envs", default=",".join(THRESHOLD),
                   help="comma-separated gymnasium ids with discrete actions (default: "
                        "the three above)")
    p.add_argument("--seeds", default="101-110", help="our seeds, e.g. 101-110 or 1,2,3")
    p.add_argument("--sb3-seeds", type=int, default=3, help="first N of --seeds for SB3 (0: none)")
    p.add_argument("--no-ablation", action="store_true", help="skip the epsilon-greedy runs")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override for both of our agents, e.g. update_noise=0 "
                        "(repeatable; named in each env's header)")
    p.add_argument("--config", metavar="FILE|PRESET",
                   help="a YAML file of overrides for both of our agents (or a preset's name: "
                        "rainbow), applied after the "
                        "env's own YAML (configs/default.yaml: the default config on an env "
                        "that has a YAML)")
    p.add_argument("--jobs", type=int, default=2, help="processes at a time")
    p.add_argument("--together", action="store_true",
                   help="our seeds of an env and agent as one process (run.py --seeds), "
                        "each seed's wall time its share of the process's")
    p.add_argument("--plot-dir", type=Path, help="write <env>.png learning curves here")
    p.add_argument("--json", type=Path, help="write every per-seed result here")
    p.add_argument("--final-episodes", type=int, default=0,
                   help="also evaluate each final policy of ours on N more episodes (0: no)")
    p.add_argument("--from-json", type=Path,
                   help="take the runs from an earlier --json instead of training")
    args = p.parse_args()
    # our agents' overrides, as typed
    with_set = (f" --config {args.config}" if args.config else "") + \
        "".join(f" --set {kv}" for kv in args.set)
    envs = args.envs.split(",")
    thresholds: dict[str, tuple[float | None, str]] = {}
    for env_id in envs:
        try:
            thresholds[env_id] = threshold_of(env_id)
        except Exception as e:  # gymnasium's NameNotFound, DeprecatedEnv, ...
            p.error(f"env {env_id}: {e}")
    # run.py runs from the repository root: pass the file as an absolute path.
    config_file = None
    if args.config:
        if args.config in presets():  # a preset's name, as run.py takes it
            config_file = args.config
        elif not Path(args.config).is_file():
            p.error(f"--config {args.config}: no such file, nor a preset ({', '.join(presets())})")
        else:
            config_file = str(Path(args.config).resolve())
    seeds = parse_seeds(args.seeds)
    workdir = Path(tempfile.mkdtemp(prefix="bench_suite_"))
    try:
        import stable_baselines3  # noqa: F401

        sb3_seeds = seeds[: args.sb3_seeds]
    except ImportError:
        sb3_seeds = []
        print("stable-baselines3 is not installed: no SB3 rows (pip install -e '.[bench]')")

    # One queue for everything. SB3's runs are spread among ours, so that a change in
    # the machine's load during the run hits every agent alike.
    jobs: list[tuple[str, str, int]] = []
    for env_id in envs:
        ours: list[tuple[str, str, Any]] = []
        for s in [tuple(seeds)] if args.together else seeds:
            ours.append((env_id, AGENTS[0], s))
            if not args.no_ablation:
                ours.append((env_id, AGENTS[1], s))
        sb3 = [(env_id, AGENTS[2], s) for s in sb3_seeds] if env_id in SB3_ZOO else []
        stride = -(-len(ours) // max(len(sb3), 1))  # ceil
        for i, job in enumerate(sb3):
            jobs.append(job)
            jobs += ours[i * stride : (i + 1) * stride]
        jobs += ours[len(sb3) * stride :]

    def run(job: tuple[str, str, Any]) -> dict | list[dict]:
        env_id, agent, seed = job
        where = workdir / env_id / agent.split()[0]
        if isinstance(seed, tuple):
            group = run_together(list(seed), our_args(agent, args.set, config_file), where,
                                 env_id)
            finals = " ".join(f"{r['final_eval_return']:.1f}" for r in group)
            print(f"{env_id} | {agent} | seeds {seed[0]}-{seed[-1]} together: finals {finals}, "
                  f"{group[0]['wall_s'] * len(group):.1f} s", flush=True)
            return group
        if agent == AGENTS[2]:
            steps, hyper = SB3_ZOO[env_id]
            r = run_sb3(seed, where, env_id, hyper, steps, SB3_EVAL_EVERY[env_id], 10)
            r["wall_s"] -= r["periodic_eval_s"]
        else:
            r = run_ours(seed, our_args(agent, args.set, config_file), where, env_id)
        print(f"{env_id} | {agent} | seed {seed}: final {r['final_eval_return']:.1f}, "
              f"{r['global_step']} steps, {r['wall_s']:.1f} s", flush=True)
        return r

    start = time.perf_counter()
    results: dict[str, dict[str, list[dict]]] = {e: {} for e in envs}
    if args.from_json:
        earlier = json.loads(args.from_json.read_text())
        for env_id in envs:
            results[env_id] = earlier[env_id]
        jobs = [(e, a, 0) for e in envs for a, res in results[e].items() for _ in res]
    else:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            done = list(pool.map(run, jobs))
        for (env_id, agent, _), r in zip(jobs, done, strict=True):
            results[env_id].setdefault(agent, []).extend(r if isinstance(r, list) else [r])
    if args.final_episodes:
        ours = [(e, r) for e in envs for a in AGENTS[:2] for r in results[e].get(a, [])]

        def final(item: tuple[str, dict]) -> None:
            env_id, r = item
            r["final_more_episodes"] = args.final_episodes
            r["final_more_return"] = evaluate_final(env_id, r, args.final_episodes)

        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            list(pool.map(final, ours))
    total_min = (time.perf_counter() - start) / 60
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))

    cpu = cpu_name()
    where = f"runs from {args.from_json}" if args.from_json else \
        f"seeds {args.seeds} (SB3: first {len(sb3_seeds)})"
    print(f"\n{where}, jobs={args.jobs}, {os.cpu_count()} CPUs ({cpu}), {len(jobs)} runs "
          f"in {total_min:.0f} min" + (f" (with {args.final_episodes:,} more episodes of "
                                      "each final policy)" if args.final_episodes else ""))
    for env_id in envs:
        agents = {a: results[env_id][a] for a in AGENTS if a in results[env_id]}
        sb3 = agents.get(AGENTS[2])
        sb3_wall = statistics.median(r["wall_s"] for r in sb3) if sb3 else None
        threshold, why = thresholds[env_id]
        if threshold is None:
            print(f"\n### {env_id} (no threshold: {why}; final returns only)\n")
        else:
            source = "" if env_id in THRESHOLD else f", {why}"
            print(f"\n### {env_id} (solved: 100-episode noise-free mean >= {threshold:g}"
                  f"{source})\n")
        print(f"config: {config_used(env_id, args.set, args.config)}\n")
        print("| agent | seeds solved | steps to solve, median (IQR) | final return, IQM "
              "[95% CI] | median wall-clock (s) | SB3 / this | final 100-episode returns |")
        print("|---|---|---|---|---|---|---|")
        for name, res in agents.items():
            row = summarise(threshold, res, sb3_wall)
            ratio = "-" if row["ratio"] is None else f"{row['ratio']:.1f}x"
            print(f"| {name} | {row['solved']} | {row['steps']} | {row['iqm']} | "
                  f"{row['wall']:.1f} | {ratio} | {row['finals']} |")
        if args.final_episodes:
            print(f"\nfinal policies on {args.final_episodes:,} more episodes, seed by seed:")
            for name in AGENTS[:2]:
                if name in agents:
                    more = [r["final_more_return"] for r in agents[name]]
                    scale = max(abs(x) for x in more)
                    print(f"- {name}: {' '.join(fmt_return(x, scale) for x in more)}"
                          if scale >= 5 else
                          f"- {name}: {' '.join(f'{x:.3f}' for x in more)}")
        if args.plot_dir:
            args.plot_dir.mkdir(parents=True, exist_ok=True)
            budget = max(max((s for s, _ in r["eval_curve"]), default=0)
                         for res in agents.values() for r in res)
            path = args.plot_dir / f"{env_id}.png"
            plot(env_id, {(n if n == AGENTS[2] else n.replace(")", f"{with_set})", 1)):
                          [r["eval_curve"] for r in res] for n, res in agents.items()},
                 budget, path, threshold)
            print(f"\nplot: {path}")
    if not args.no_ablation:
        print_comparison(envs, thresholds, results,
                         title=f"The default command{with_set} against its epsilon-greedy "
                               "ablation", config_file=args.config)
    if args.final_episodes and not args.no_ablation:
        # The same comparison on the N-episode means of the final policies.
        more = {e: {a: [{**r, "final_eval_return": r["final_more_return"]}
                        for r in results[e][a]] for a in AGENTS[:2]} for e in envs}
        print_comparison(envs, thresholds, more, paired_by_seed=True, config_file=args.config,
                         title=f"The same, the final policies on {args.final_episodes:,} "
                               "more episodes (the same episodes for every run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
