"""agent/exploration.py: the exploration policy on top of the selector's actions."""

from __future__ import annotations

import numpy as np
import pytest

from agent.exploration import Exploration


def _noisy(noisy_epsilon: float, random_starts: int = 0, seed: int = 0) -> Exploration:
    return Exploration("noisy", 4, np.random.default_rng(seed), total_steps=10_000,
                       random_starts=random_starts, noisy_epsilon=noisy_epsilon)


def test_the_warm_up_plays_uniformly_then_the_policy_acts() -> None:
    explore = _noisy(0.0, random_starts=1_000)
    policy = np.zeros(8, dtype=np.int64)  # the selector always picks action 0
    warm = np.concatenate([explore(policy, step)[0] for step in range(0, 1_000, 8)])
    assert np.bincount(warm, minlength=4).min() > 0.2 * len(warm)  # about a quarter each
    actions, explored = explore(policy, 1_000)
    assert (actions == 0).all() and explored is None  # no floor: the noise alone


def test_the_floor_replaces_a_share_of_actions_and_marks_exactly_those() -> None:
    explore = _noisy(0.2)
    policy = np.zeros(10_000, dtype=np.int64)
    actions, explored = explore(policy, 0)
    changed = actions != policy
    np.testing.assert_array_equal(explored, changed)
    # A random action is the policy's own one time in four.
    assert changed.mean() == pytest.approx(0.2 * 3 / 4, abs=0.015)
    assert explore.scalars() == {"charts/epsilon": 0.2}
    assert _noisy(0.0).scalars() == {}


def test_epsilon_decays_linearly_over_its_fraction_of_the_run_and_marks_nothing() -> None:
    explore = Exploration("epsilon", 4, np.random.default_rng(0), total_steps=10_000,
                          epsilon_start=1.0, epsilon_end=0.1, epsilon_fraction=0.5)
    policy = np.zeros(20_000, dtype=np.int64)
    for step, epsilon in ((0, 1.0), (2_500, 0.55), (5_000, 0.1), (9_000, 0.1)):
        actions, explored = explore(policy, step)
        assert explore.scalars() == {"charts/epsilon": pytest.approx(epsilon)}
        assert (actions != 0).mean() == pytest.approx(epsilon * 3 / 4, abs=0.015)
        assert explored is None  # epsilon-greedy is the policy: nothing to cut


def test_the_same_stream_gives_the_same_actions() -> None:
    policy = np.zeros(64, dtype=np.int64)
    a, b = _noisy(0.3, random_starts=10, seed=5), _noisy(0.3, random_starts=10, seed=5)
    for step in (0, 64, 128):
        np.testing.assert_array_equal(a(policy, step)[0], b(policy, step)[0])
