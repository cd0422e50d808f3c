"""Episode bookkeeping (agent/episodes.py): returns, lengths, seeds, lives, exact restore."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import envs.testing  # noqa: F401  (registers the test envs)
from agent.episodes import Episodes
from envs import episode_seed, make_env, make_vector_env

ENV = "envs.testing:NoisyDQN/CueVaried-v0"  # episode lengths 2..9, drawn from the reset seed


def _play(episodes: Episodes, envs, steps: int, obs: np.ndarray, rng: np.random.Generator):
    """Drive ``envs`` like the training loop; returns (obs, finished episodes)."""
    finished = []
    for _ in range(steps):
        actions = rng.integers(2, size=episodes.num_envs)
        obs, rewards, terminated, truncated, info = envs.step(actions)
        episodes.step(actions, rewards, info)
        done = terminated | truncated
        if done.any():
            obs, ended = episodes.finish(envs, done)
            finished += ended
    return obs, finished


def test_returns_and_lengths_match_each_episode_played_alone() -> None:
    envs = make_vector_env(ENV, 3)
    episodes = Episodes(3, seed=5)
    obs = episodes.reset(envs)
    _, finished = _play(episodes, envs, 40, obs, np.random.default_rng(0))
    assert finished and episodes.index.sum() == len(finished)
    # Every episode was reset with its own seed: its length is the one that seed draws.
    lengths = sorted(length for _, length in finished)
    expected = []
    for i in range(3):
        env = make_env(ENV)
        for k in range(int(episodes.index[i])):
            env.reset(seed=episode_seed(5, i, k))
            expected.append(env.unwrapped.length)
    assert lengths == sorted(expected)
    assert all(0 <= ret <= length for ret, length in finished)


def test_restore_rebuilds_the_current_episodes_exactly() -> None:
    rng = np.random.default_rng(1)
    envs = make_vector_env(ENV, 2)
    episodes = Episodes(2, seed=3)
    obs, _ = _play(episodes, envs, 11, episodes.reset(envs), rng)
    state = episodes.state_dict(obs)
    assert all(isinstance(v, torch.Tensor) for v in (state["ep_index"], state["obs"]))

    fresh_envs = make_vector_env(ENV, 2)
    restored = Episodes(2, seed=3)
    restored_obs = restored.restore(fresh_envs, state, echo=pytest.fail)
    np.testing.assert_array_equal(restored_obs, obs)
    np.testing.assert_array_equal(restored.returns, episodes.returns)
    np.testing.assert_array_equal(restored.lengths, episodes.lengths)
    assert restored.actions == episodes.actions
    # Both continue identically.
    a, fa = _play(episodes, envs, 10, obs, np.random.default_rng(2))
    b, fb = _play(restored, fresh_envs, 10, restored_obs, np.random.default_rng(2))
    np.testing.assert_array_equal(a, b)
    assert fa == fb


def test_restore_that_cannot_replay_starts_new_episodes_and_says_so() -> None:
    envs = make_vector_env(ENV, 2)
    episodes = Episodes(2, seed=3)
    obs, _ = _play(episodes, envs, 5, episodes.reset(envs), np.random.default_rng(1))
    state = episodes.state_dict(obs + 1.0)  # the saved observations do not replay
    notes: list[str] = []
    restored = Episodes(2, seed=3)
    restored.restore(make_vector_env(ENV, 2), state, echo=notes.append)
    assert len(notes) == 1 and "start afresh" in notes[0]
    np.testing.assert_array_equal(restored.index, episodes.index + 1)
    assert restored.actions == [[], []] and not restored.returns.any()


def test_lives_are_tracked_and_a_lost_life_is_reported() -> None:
    envs = make_vector_env("envs.testing:NoisyDQN/Frames-v0", 1)
    episodes = Episodes(1, seed=0)
    episodes.reset(envs)
    assert episodes.lives is not None
    lost = []
    for _ in range(4):
        actions = np.zeros(1, dtype=np.int64)
        _, rewards, terminated, truncated, info = envs.step(actions)
        assert not (terminated | truncated).any()
        lost.append(bool(episodes.step(actions, rewards, info)[0]))
    assert lost == [False, False, False, True]  # one life every 4 steps


LAKE = "FrozenLake-v1"  # with is_slippery=False: deterministic, and a wall keeps you in place


def _lake(n: int):  # type: ignore[no-untyped-def]
    return make_vector_env(LAKE, n, env_kwargs={"is_slippery": False})


def test_observe_flags_an_observation_seen_earlier_in_the_same_episode() -> None:
    envs = _lake(2)
    episodes = Episodes(2, seed=0, watch_repeats=True)
    episodes.reset(envs)
    left, down = np.array([0, 0]), np.array([1, 1])
    # From the start corner, left walks into the wall: the same cell again.
    obs, *_ = envs.step(left)
    assert episodes.observe(obs)
    obs, *_ = envs.step(down)  # a new cell
    assert not episodes.observe(obs)
    # A new episode starts with nothing seen: the start cell is no repeat of the last one's.
    obs, _ = episodes.finish(envs, np.array([True, True]))
    assert not episodes.observe(obs)
    # Without watch_repeats nothing is kept or flagged.
    plain = Episodes(2, seed=0)
    plain.reset(envs)
    obs, *_ = envs.step(left)
    assert not plain.observe(obs) and plain.seen == [set(), set()]


def test_a_restored_run_flags_the_same_repeats() -> None:
    rng = np.random.default_rng(4)
    envs, episodes = _lake(2), Episodes(2, seed=1, watch_repeats=True)
    obs = episodes.reset(envs)
    for _ in range(3):
        actions = rng.integers(4, size=2)
        obs, rewards, terminated, truncated, info = envs.step(actions)
        episodes.step(actions, rewards, info)
        if (terminated | truncated).any():
            obs, _ = episodes.finish(envs, terminated | truncated)
        episodes.observe(obs)
    restored = Episodes(2, seed=1, watch_repeats=True)
    restored_obs = restored.restore(_lake(2), episodes.state_dict(obs), echo=pytest.fail)
    assert restored.seen == episodes.seen  # rebuilt from the replayed episode
    np.testing.assert_array_equal(restored_obs, obs)
