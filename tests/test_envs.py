"""Environment construction: id checks, space checks, disabled autoreset, episode seeds."""

from __future__ import annotations

import numpy as np
import pytest

import envs.testing  # noqa: F401  (registers the NoisyDQN/ test envs)
from agent.errors import UserError
from envs import check_env_id, episode_seed, inspect_env, make_vector_env


def test_unknown_id_suggests_close_ids() -> None:
    with pytest.raises(
        UserError, match=r"unknown environment id 'CartPol-v1': did you mean .*CartPole-v1"
    ):
        check_env_id("CartPol-v1")
    with pytest.raises(UserError, match="unknown environment id"):
        check_env_id("Zzzzzzzz-v9")


def test_module_prefixed_ids() -> None:
    check_env_id("envs.testing:NoisyDQN/Cue-v0")
    with pytest.raises(UserError, match="cannot import the module"):
        check_env_id("no_such_module_xyz:Foo-v0")


def test_space_checks() -> None:
    spec = inspect_env("CartPole-v1")
    assert spec.obs_shape == (4,) and spec.n_actions == 2 and spec.obs_dtype == "float32"
    assert spec.reward_threshold == 475.0 and spec.max_episode_steps == 500
    with pytest.raises(UserError, match="Box action space; Noisy DQN needs a Discrete"):
        inspect_env("Pendulum-v1")
    with pytest.raises(UserError, match="observation space"):
        inspect_env("Blackjack-v1")


def test_vector_env_reports_termination_with_the_real_final_observation() -> None:
    envs = make_vector_env("NoisyDQN/Cue-v0", 2)
    obs, _ = envs.reset(seed=[1, 2])
    for t in range(5):
        obs, _, terminated, truncated, _ = envs.step(np.array([1, 0]))
        assert not truncated.any()
        assert terminated.all() == (t == 4)
    # The final observation (steps left = 0), not a reset one.
    assert np.allclose(obs[:, 1], 0.0)
    # Autoreset is disabled: the caller resets only the ended envs.
    obs, _ = envs.reset(seed=[3, None], options={"reset_mask": np.array([True, False])})
    assert obs[0, 1] == 1.0 and obs[1, 1] == 0.0
    envs.close()


def test_vector_env_reports_truncation() -> None:
    envs = make_vector_env("NoisyDQN/CueTruncated-v0", 3)
    envs.reset(seed=0)
    for t in range(7):
        _, _, terminated, truncated, _ = envs.step(np.zeros(3, dtype=np.int64))
        assert not terminated.any()
        assert truncated.all() == (t == 6)
    envs.close()


def test_bad_vector_arguments() -> None:
    with pytest.raises(UserError, match="num_envs"):
        make_vector_env("CartPole-v1", 0)
    with pytest.raises(UserError, match="vector must be"):
        make_vector_env("CartPole-v1", 1, vector="threads")


def test_episode_seeds_are_distinct_and_reproducible() -> None:
    seeds = {
        episode_seed(1, env, ep, stream)
        for env in range(4)
        for ep in range(50)
        for stream in (0, 1)
    }
    assert len(seeds) == 400
    assert episode_seed(1, 2, 3) == episode_seed(1, 2, 3)
    assert episode_seed(1, 2, 3) != episode_seed(2, 2, 3)


def test_an_episode_is_a_function_of_its_seed_and_actions() -> None:
    envs_a = make_vector_env("CartPole-v1", 1)
    envs_b = make_vector_env("CartPole-v1", 1)
    oa, _ = envs_a.reset(seed=[episode_seed(0, 0, 5)])
    ob, _ = envs_b.reset(seed=[episode_seed(0, 0, 5)])
    rng = np.random.default_rng(0)
    for _ in range(20):
        a = rng.integers(2, size=1)
        oa, *_ = envs_a.step(a)
        ob, *_ = envs_b.step(a)
    assert np.array_equal(oa, ob)


def test_varied_test_envs_end_at_seed_dependent_lengths() -> None:
    envs = make_vector_env("NoisyDQN/CueVariedTruncated-v0", 4)
    envs.reset(seed=[10, 11, 12, 13])
    lengths = [e.unwrapped.length for e in envs.envs]
    assert len(set(lengths)) > 1 and all(2 <= n <= 9 for n in lengths)
    ended_at = np.zeros(4, dtype=int)
    for t in range(1, 10):
        _, _, terminated, truncated, _ = envs.step(np.zeros(4, dtype=np.int64))
        assert not terminated.any()
        ended_at[truncated & (ended_at == 0)] = t
        if truncated.any():  # autoreset is disabled: reset the ended ones ourselves
            envs.reset(options={"reset_mask": truncated})
    assert ended_at.tolist() == lengths
    envs.close()


def test_atari_ids_get_dqn_preprocessing() -> None:
    from envs import is_atari

    assert not is_atari("CartPole-v1") and not is_atari("envs.testing:NoisyDQN/Frames-v0")
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    for env_id in ("ALE/Pong-v5", "PongNoFrameskip-v4", "Pong-v4"):
        check_env_id(env_id)
        assert is_atari(env_id)
    spec = inspect_env("Pong-v4")  # frameskip (2, 5) by the id: rebuilt with 1, skip 4
    assert spec.obs_shape == (4, 84, 84) and spec.obs_dtype == "uint8" and spec.n_actions == 6
