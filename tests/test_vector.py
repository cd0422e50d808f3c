"""Vector environments in the training loop: per-env episode accounting, truncation,
sync == async, and resume of an async run (episodes restart with a note)."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import envs.testing  # noqa: F401  (registers the NoisyDQN/ test envs)
from agent.checkpoint import load_checkpoint
from agent.config_files import load_config
from agent.train import train
from envs import episode_seed

RUN = {
    "total_steps": 300,
    "learning_starts": 60,
    "batch_size": 16,
    "train_freq": 3,
    "buffer_size": 5_000,
    "hidden_sizes": [16],
    "eval_interval": 0,
    "eval_episodes": 2,
    "confirm_episodes": 0,
    "log_interval": 100,
    "checkpoint_interval": 10_000,
    "save_buffer": True,
    "n_step": 1,
    "device": "cpu",
}


def _scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def expected_episode_ends(env_id: str, seed: int, num_envs: int, total_steps: int) -> list:
    """(global step, length) of every episode end, in the loop's order (step, then env).

    CueVaried episodes have a length drawn from their reset seed, whatever the actions.
    """
    ends = []
    env = gym.make(env_id)
    for i in range(num_envs):
        t, k = 0, 0
        while True:
            env.reset(seed=episode_seed(seed, i, k))
            length = env.unwrapped.length
            t += length
            if t * num_envs > total_steps:
                break
            ends.append((t * num_envs, i, length))
            k += 1
    env.close()
    return [(step, float(length)) for step, _, length in sorted(ends)]


@pytest.mark.parametrize("env_name", ["CueVaried-v0", "CueVariedTruncated-v0"])
def test_each_env_keeps_its_own_episodes(tmp_path: Path, env_name: str) -> None:
    """3 envs whose episodes end at different, known steps: every episode is logged once
    with its own length and return, and replay holds exactly the real transitions."""
    env_id = f"NoisyDQN/{env_name}"
    cfg = load_config(f"envs.testing:{env_id}", overrides={**RUN, "num_envs": 3})
    train(cfg, tmp_path / "run", progress=False, echo=lambda _: None)
    lengths = _scalars(tmp_path / "run", "charts/episodic_length")
    assert lengths == expected_episode_ends(env_id, cfg.seed, 3, 300)
    returns = _scalars(tmp_path / "run", "charts/episodic_return")
    assert all(0 <= r <= n for (_, r), (_, n) in zip(returns, lengths, strict=True))

    state = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["replay"]
    size = state["size"]
    obs, next_obs, dones = state["obs"][:size], state["next_obs"][:size], state["dones"][:size]
    assert size == 300  # n_step 1: one transition per env step, no fake reset transition
    # Steps left (obs[:, 1] * length) drop by one within an episode: no transition links
    # the final observation of one episode to the first of the next.
    assert (next_obs[:, 1] < obs[:, 1]).all()
    final = next_obs[:, 1] == 0  # the true final observation, not a reset one
    assert int(final.sum()) == len(lengths)  # every episode end within the 300 steps
    truncated = env_name.endswith("Truncated-v0")
    # Termination stops bootstrapping; truncation bootstraps from the final observation.
    assert torch.equal(dones.bool(), final & (not truncated))


def test_sync_and_async_vector_envs_give_the_same_run(tmp_path: Path) -> None:
    overrides = {**RUN, "num_envs": 2, "save_buffer": False}
    runs = {}
    for kind in ("sync", "async"):
        cfg = load_config(
            "envs.testing:NoisyDQN/CueVaried-v0", overrides={**overrides, "vector": kind}
        )
        train(cfg, tmp_path / kind, progress=False, echo=lambda _: None)
        runs[kind] = _scalars(tmp_path / kind, "charts/episodic_return")
    assert runs["sync"] == runs["async"] and len(runs["sync"]) > 20


def test_async_resume_restarts_episodes_with_a_note(tmp_path: Path) -> None:
    overrides = {**RUN, "num_envs": 2, "vector": "async"}
    first = load_config(
        "envs.testing:NoisyDQN/CueVaried-v0", overrides={**overrides, "total_steps": 151}
    )
    train(first, tmp_path / "run", progress=False, echo=lambda _: None)
    data = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    step = int(data["counters"]["global_step"])
    assert step == 152  # vector steps of 2 envs overshoot an odd total
    ep_index = data["envs"]["ep_index"].numpy()
    notes: list[str] = []
    resumed = load_config("envs.testing:NoisyDQN/CueVaried-v0", overrides=overrides)
    result = train(resumed, tmp_path / "run", checkpoint=data, progress=False, echo=notes.append)
    assert any("resumed episodes start afresh" in n for n in notes)
    assert result.status == "finished" and result.global_step == 300
    after = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    # The interrupted episodes were abandoned: each env moved on to a new episode number.
    assert (after["envs"]["ep_index"].numpy() > ep_index).all()
    # Episodes logged after the resume are whole ones of the new seeds (lengths 2..9).
    later = [n for s, n in _scalars(tmp_path / "run", "charts/episodic_length") if s > step]
    assert later and all(2 <= n <= 9 for n in later)
    assert np.isfinite([p.float().sum().item() for p in after["q_network"].values()]).all()
