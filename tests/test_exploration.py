"""agent/exploration.py: the exploration policy on top of the selector's actions."""

from __future__ import annotations

from typing import Any

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


def test_der_floors_share_of_replaced_actions_is_its_floor_times_1_minus_1_over_a() -> None:
    """--config der-floor on an 18-action game: a random action replaces the policy's on
    0.01 x (1 - 1/18) of steps, within four binomial standard deviations."""
    from agent.config_files import load_config

    cfg = load_config("KrullNoFrameskip-v4", "der-floor")
    explore = Exploration(cfg.exploration, 18, np.random.default_rng(3),
                          total_steps=cfg.total_steps, random_starts=cfg.random_starts,
                          noisy_epsilon=cfg.noisy_epsilon)  # fmt: skip
    policy = np.full(16, 7, dtype=np.int64)
    replaced = np.concatenate([explore(policy, step)[1] for step in range(0, 400_000, 16)])
    share, expected = replaced.mean(), 0.01 * (1 - 1 / 18)
    assert abs(share - expected) < 4 * np.sqrt(expected * (1 - expected) / len(replaced))


def test_epsilon_decays_linearly_over_its_fraction_of_the_run_and_marks_nothing() -> None:
    explore = Exploration("epsilon", 4, np.random.default_rng(0), total_steps=10_000,
                          epsilon_start=1.0, epsilon_end=0.1, epsilon_fraction=0.5)
    policy = np.zeros(20_000, dtype=np.int64)
    for step, epsilon in ((0, 1.0), (2_500, 0.55), (5_000, 0.1), (9_000, 0.1)):
        actions, explored = explore(policy, step)
        assert explore.scalars() == {"charts/epsilon": pytest.approx(epsilon)}
        assert (actions != 0).mean() == pytest.approx(epsilon * 3 / 4, abs=0.015)
        assert explored is None  # epsilon-greedy is the policy: nothing to cut


def _epsilon(step: int, **kwargs: Any) -> float:
    explore = Exploration("epsilon", 4, np.random.default_rng(0), **kwargs)
    explore(np.zeros(1, dtype=np.int64), step)
    return explore.epsilon


def test_epsilon_holds_its_start_until_the_decay_starts_then_falls_over_its_steps() -> None:
    """DrQ(epsilon)'s schedule (Dopamine's linearly_decaying_epsilon): 1 until step 1,600,
    then linearly to 0.01 over 5,000 steps (0.05 of 100k), then 0.01."""
    drq = {"total_steps": 100_000, "epsilon_start": 1.0, "epsilon_end": 0.01,
           "epsilon_fraction": 0.05, "epsilon_decay_start": 1_600}  # fmt: skip
    for step in (0, 1, 800, 1_599, 1_600):
        assert _epsilon(step, **drq) == 1.0
    for step in (1_601, 2_850, 4_100, 6_599):
        assert _epsilon(step, **drq) == pytest.approx(1.0 - 0.99 * (step - 1_600) / 5_000)
    for step in (6_600, 6_601, 50_000, 99_999):
        assert _epsilon(step, **drq) == pytest.approx(0.01)


@pytest.mark.parametrize(("start", "end", "fraction", "total"),
                         [(1.0, 0.05, 0.1, 150_000), (1.0, 0.01, 0.05, 100_000),
                          (0.5, 0.1, 1.0, 777), (0.9, 0.0, 0.3, 10)])  # fmt: skip
def test_a_decay_from_step_0_is_the_schedule_of_before_to_the_bit(
    start: float, end: float, fraction: float, total: int
) -> None:
    """epsilon_decay_start 0 (the default) gives exactly the old formula's floats."""

    def before(step: int) -> float:  # linear_schedule as it was
        duration = fraction * total
        return end + (start - end) * max(0.0, 1.0 - step / max(duration, 1.0))

    settings = {"total_steps": total, "epsilon_start": start, "epsilon_end": end,
                "epsilon_fraction": fraction}  # fmt: skip
    for step in sorted({0, 1, 3, total // 7, total // 3, int(fraction * total), total - 1}):
        assert _epsilon(step, **settings) == before(step)
        assert _epsilon(step, **settings, epsilon_decay_start=0) == before(step)


def test_the_same_stream_gives_the_same_actions() -> None:
    policy = np.zeros(64, dtype=np.int64)
    a, b = _noisy(0.3, random_starts=10, seed=5), _noisy(0.3, random_starts=10, seed=5)
    for step in (0, 64, 128):
        np.testing.assert_array_equal(a(policy, step)[0], b(policy, step)[0])


def test_the_noise_schedule_draws_every_interval_or_only_after_a_restart() -> None:
    from agent.exploration import NoiseSchedule

    every_third = NoiseSchedule(3)
    assert [every_third.due() for _ in range(7)] == [True, False, False, True, False, False, True]
    held = NoiseSchedule(None)
    assert [held.due() for _ in range(4)] == [True, False, False, False]
    held.restart()
    assert [held.due() for _ in range(2)] == [True, False]
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="noise_interval"):
            NoiseSchedule(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("interval", "on_repeat", "after_episode", "after_repeat"),
    [(1, True, True, True), ("episode", False, True, False), ("episode", True, True, True),
     (5, True, False, True), (5, False, False, False)],
)  # fmt: skip
def test_fresh_noise_after_an_episode_end_or_a_repeat_as_the_policy_says(
    interval: int | str, on_repeat: bool, after_episode: bool, after_repeat: bool
) -> None:
    """Noise drawn afresh at the first step; then per interval, at episode ends for
    per-episode noise, on repeats for held noise with noise_on_repeat. (An interval of 1
    draws every step anyway.)"""
    explore = Exploration("noisy", 4, np.random.default_rng(0), total_steps=100,
                          noise_interval=interval, noise_on_repeat=on_repeat)  # fmt: skip
    assert explore.fresh_noise()
    explore.fresh_noise()  # a second step: fresh only at an interval of 1
    explore.episode_ended()
    assert explore.fresh_noise() == (after_episode or interval == 1)
    explore.fresh_noise()
    explore.repeated()
    assert explore.fresh_noise() == (after_repeat or interval == 1)
    assert explore.watches_repeats == (interval != 1 and on_repeat)


def test_epsilon_greedy_never_draws_noise_and_its_state_round_trips() -> None:
    explore = Exploration("epsilon", 4, np.random.default_rng(0), total_steps=100)
    assert not any(explore.fresh_noise() for _ in range(5)) and not explore.noisy
    noisy = Exploration("noisy", 4, np.random.default_rng(3), total_steps=100,
                        noise_interval=5, noisy_epsilon=0.5)  # fmt: skip
    policy = np.zeros(16, dtype=np.int64)
    noisy.fresh_noise()
    noisy(policy, 0)
    state = noisy.state_dict()
    expected = ([noisy.fresh_noise() for _ in range(6)], noisy(policy, 1)[0])
    again = Exploration("noisy", 4, np.random.default_rng(99), total_steps=100,
                        noise_interval=5, noisy_epsilon=0.5)  # fmt: skip
    again.load_state_dict(state)
    got = ([again.fresh_noise() for _ in range(6)], again(policy, 1)[0])
    assert got[0] == expected[0] and np.array_equal(got[1], expected[1])


def test_the_off_greedy_share_counts_the_played_actions_unlike_the_greedy_ones() -> None:
    """Worked by hand: 2 of 4 actions off at step 100, 1 of 4 at step 104: 3 of 8; the
    warm-up's steps are not the policy's and are not counted; each log starts afresh."""
    explore = _noisy(0.0, random_starts=100)
    greedy = np.array([0, 1, 2, 3])
    explore.off_greedy(np.array([3, 3, 3, 3]), greedy, 96)  # in the warm-up
    assert "exploration/off_greedy_fraction" not in explore.scalars()
    explore.off_greedy(np.array([1, 0, 2, 3]), greedy, 100)  # envs 0 and 1 off
    explore.off_greedy(np.array([0, 1, 2, 0]), greedy, 104)  # env 3 off
    assert explore.scalars()["exploration/off_greedy_fraction"] == 3 / 8
    explore.off_greedy(greedy, greedy, 108)
    assert explore.scalars()["exploration/off_greedy_fraction"] == 0.0
