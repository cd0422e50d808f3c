"""What a trained Atari agent does: the figures behind a diagnosis of where its noise
loses (docs/research/log.md), for runs of the noisy agent and its epsilon-greedy ablation.

    python -m bench.diagnose RUN_DIR [RUN_DIR ...] [--episodes 10] [--max-steps N] [--out DIR]

For each run directory (a finished ``run.py`` run of an ALE game):

* **training**, from its events and its ``last.pt``: episode lengths and returns early
  and late, sigma per noisy layer at the start and the end, the off-greedy share
  (``exploration/off_greedy_fraction``) and the noise's action disagreement on replay
  states, and the action frequencies of the replay buffer (the run's last
  ``buffer_size`` steps, when ``last.pt`` kept it);
* **evaluation**, ``--episodes`` episodes of the final policy on the final evaluation's
  protocol (noise off, ``eval_epsilon``) through ``vector: ale``: lengths, how many ran
  to the frame cap, the action frequencies, and, in games with FIRE, how many lives
  were followed by a FIRE press within 100 steps (a lost ball in Breakout comes back
  only on FIRE); on a sample of those states, how often a fresh noise sample changes
  the greedy action.

Prints one markdown table per part, writes ``diagnosis.json`` and, with matplotlib
(the bench extra), ``diagnosis.png`` (sigma and the off-greedy share over training, the
action frequencies of training and evaluation) into ``--out``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

__all__ = ["evaluate_policy", "training_figures"]

FIRE_WITHIN = 100  # steps after a lost life in which FIRE counts as relaunching


def _scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(run_dir.glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return {tag: sorted(values) for tag, values in out.items()}


def _window_mean(values: list[tuple[int, float]], low: float, high: float) -> float | None:
    picked = [v for s, v in values if low <= s < high]
    return float(np.mean(picked)) if picked else None


def training_figures(run_dir: Path, total_steps: int) -> dict[str, Any]:
    """The training part: events and the replay's actions."""
    from agent.checkpoint import load_checkpoint

    scalars = _scalars(run_dir)
    early, late = (0, total_steps * 0.2), (total_steps * 0.8, total_steps + 1)
    out: dict[str, Any] = {}
    for tag, name in (("charts/episodic_length", "episode_length"),
                      ("charts/episodic_return", "episode_return"),
                      ("exploration/off_greedy_fraction", "off_greedy"),
                      ("exploration/action_disagreement", "action_disagreement"),
                      ("exploration/q_gap", "q_gap")):  # fmt: skip
        values = scalars.get(tag, [])
        out[name] = {"early": _window_mean(values, *early), "late": _window_mean(values, *late)}
    sigma = {tag.split("/")[1]: values for tag, values in scalars.items()
             if tag.startswith("noise/") and tag.endswith("sigma_mean")}  # fmt: skip
    out["sigma"] = {layer: {"start": v[0][1], "end": v[-1][1]} for layer, v in sigma.items()}
    out["curves"] = {"sigma": sigma, "off_greedy": scalars.get("exploration/off_greedy_fraction",
                                                               [])}  # fmt: skip
    last = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    replay = last.get("replay")
    if replay is not None:
        actions = replay["actions"][replay["valid"]].numpy()
        out["replay_actions"] = np.bincount(actions, minlength=int(last["n_actions"])).tolist()
    return out


def evaluate_policy(
    run_dir: Path, episodes: int, seed: int = 0, max_steps: int | None = None
) -> dict[str, Any]:
    """The evaluation part: ``episodes`` episodes of ``last.pt``'s policy, noise off, with
    its run's ``eval_epsilon``, recorded step by step; ``max_steps`` cuts an episode there
    (counted as capped), where the game's own cap would take too long."""
    import gymnasium as gym

    from agent.acting import ActionSelector
    from agent.policies import load_policy
    from agent.monitor import action_disagreement
    from envs import make_vector_env

    _, cfg, spec, _, q_network = load_policy(run_dir / "checkpoints" / "last.pt", None, "cpu")
    copies = min(episodes, 10)
    envs = make_vector_env(spec.env_id, copies, "ale", cfg.env_kwargs)
    probe = gym.make(spec.env_id.rpartition(":")[2])
    meanings = probe.unwrapped.get_action_meanings()
    probe.close()
    fire = meanings.index("FIRE") if "FIRE" in meanings else None
    greedy = ActionSelector(q_network, spec.obs_shape, copies, noise=False, seed=seed)
    rng = np.random.default_rng(seed)
    playing = list(range(copies))  # the episode each copy plays, -1 when done
    started = copies
    obs, info = envs.reset(seed=[seed * 1000 + k for k in range(copies)])
    lives = np.asarray(info["lives"]).copy()
    counts = np.zeros(spec.n_actions, dtype=np.int64)
    lengths, returns, capped = [0] * episodes, [0.0] * episodes, [False] * episodes
    since_loss = [None] * copies  # steps since this copy's last lost life, until FIRE
    relaunched, losses = 0, 0
    states: list[np.ndarray] = []
    step = 0
    while any(k >= 0 for k in playing):
        actions = greedy(obs)
        random = rng.random(copies) < cfg.eval_epsilon
        actions = np.where(random, rng.integers(spec.n_actions, size=copies), actions)
        if step % 10 == 0 and len(states) < 2048:
            states.extend(obs[i].copy() for i, k in enumerate(playing) if k >= 0)
        obs, rewards, terminated, truncated, info = envs.step(actions)
        step += 1
        new_lives = np.asarray(info["lives"])
        cut = np.array([max_steps is not None and k >= 0 and lengths[k] + 1 >= max_steps
                        for k in playing])  # fmt: skip
        truncated = truncated | cut
        ended = terminated | truncated
        for i, k in enumerate(playing):
            if k < 0:
                continue
            counts[actions[i]] += 1
            lengths[k] += 1
            returns[k] += float(rewards[i])
            if fire is not None:
                if since_loss[i] is not None:
                    since_loss[i] += 1
                    if actions[i] == fire and since_loss[i] <= FIRE_WITHIN:
                        relaunched += 1
                        since_loss[i] = None
                    elif since_loss[i] > FIRE_WITHIN:
                        since_loss[i] = None
                if new_lives[i] < lives[i] and not ended[i]:
                    losses += 1
                    since_loss[i] = 0
            if ended[i]:
                capped[k] = bool(truncated[i] and not terminated[i])
                since_loss[i] = None
        lives = new_lives.copy()
        if ended.any():
            for i in np.flatnonzero(ended):
                playing[i] = started if started < episodes and playing[i] >= 0 else -1
                started += playing[i] >= 0
            obs, info = envs.reset(seed=[seed * 1000 + playing[i] if ended[i] else None
                                         for i in range(copies)],
                                   options={"reset_mask": ended})  # fmt: skip
            lives = np.where(ended, np.asarray(info["lives"]), lives)
    envs.close()
    generator = torch.Generator().manual_seed(seed)
    disagreement = action_disagreement(q_network, torch.from_numpy(np.stack(states)),
                                       draws=32, generator=generator)  # fmt: skip
    return {
        "episodes": episodes, "mean_return": float(np.mean(returns)),
        "mean_length": float(np.mean(lengths)), "capped": int(sum(capped)),
        "actions": counts.tolist(), "action_meanings": meanings,
        "lives_lost": losses, "fire_after_loss": relaunched if fire is not None else None,
        "noise_changes_greedy": disagreement,
    }  # fmt: skip


def _share(counts: list[int]) -> list[float]:
    total = max(1, sum(counts))
    return [c / total for c in counts]


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--max-steps", type=int, help="cut evaluation episodes there")
    parser.add_argument("--out", type=Path, default=Path("bench/results/diagnosis"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    found: dict[str, dict[str, Any]] = {}
    for run_dir in args.runs:
        result = json.loads((run_dir / "result.json").read_text())
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        arm = f"{config['env_id']} {config['exploration']} seed {config['seed']}"
        found[arm] = {"score": result.get("final_eval_return"),
                      "training": training_figures(run_dir, config["total_steps"]),
                      "evaluation": evaluate_policy(run_dir, args.episodes,
                                                    max_steps=args.max_steps)}  # fmt: skip
    print("| run | score | episode length early / late | sigma per layer, start -> end | "
          "off-greedy early / late | action disagreement early / late |")
    print("|---|---|---|---|---|---|")
    for arm, f in found.items():
        t = f["training"]
        sigma = ", ".join(f"{k} {v['start']:.3f}->{v['end']:.3f}" for k, v in t["sigma"].items())
        print(f"| {arm} | {_fmt(f['score'], 1)} | {_fmt(t['episode_length']['early'], 0)} / "
              f"{_fmt(t['episode_length']['late'], 0)} | {sigma or '-'} | "
              f"{_fmt(t['off_greedy']['early'])} / {_fmt(t['off_greedy']['late'])} | "
              f"{_fmt(t['action_disagreement']['early'])} / "
              f"{_fmt(t['action_disagreement']['late'])} |")  # fmt: skip
    print("\n| run | eval return | eval length | capped | lives lost, then FIRE within "
          f"{FIRE_WITHIN} | noise changes greedy | actions, replay | actions, evaluation |")
    print("|---|---|---|---|---|---|---|---|")
    for arm, f in found.items():
        e, t = f["evaluation"], f["training"]
        names = e["action_meanings"]

        def shares(counts: list[int], names: list[str] = names) -> str:
            return " ".join(f"{n} {s:.2f}" for n, s in zip(names, _share(counts), strict=True))

        fire = "-" if e["fire_after_loss"] is None else f"{e['lives_lost']}, {e['fire_after_loss']}"
        print(f"| {arm} | {e['mean_return']:.1f} | {e['mean_length']:.0f} | {e['capped']} of "
              f"{e['episodes']} | {fire} | {e['noise_changes_greedy']:.3f} | "
              f"{shares(t['replay_actions']) if 'replay_actions' in t else '-'} | "
              f"{shares(e['actions'])} |")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "diagnosis.json").write_text(json.dumps(found, indent=1) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for arm, f in found.items():
        for layer, values in f["training"]["curves"]["sigma"].items():
            axes[0].plot(*zip(*values, strict=True), label=f"{arm}: {layer}")
        if f["training"]["curves"]["off_greedy"]:
            axes[1].plot(*zip(*f["training"]["curves"]["off_greedy"], strict=True), label=arm)
    width = 0.8 / max(1, 2 * len(found))
    for j, (arm, f) in enumerate(found.items()):
        e, t = f["evaluation"], f["training"]
        x = np.arange(len(e["actions"]))
        if "replay_actions" in t:
            axes[2].bar(x + 2 * j * width, _share(t["replay_actions"]), width,
                        label=f"{arm}: replay")  # fmt: skip
        axes[2].bar(x + (2 * j + 1) * width, _share(e["actions"]), width, label=f"{arm}: eval")
        axes[2].set_xticks(x, e["action_meanings"], rotation=60, fontsize=7)
    axes[0].set(title="sigma (mean |sigma|) per noisy layer", xlabel="env steps")
    axes[1].set(title="off-greedy share of actions played", xlabel="env steps")
    axes[2].set(title="action frequencies")
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(args.out / "diagnosis.png", dpi=110)


if __name__ == "__main__":
    main()
