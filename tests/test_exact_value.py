"""bench/exact_value.py: the exact expected return of a greedy policy on a tabular env."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

import bench.exact_value
from agent.config_files import load_config
from agent.errors import UserError
from conftest import train_checkpoint
from envs import make_env

LEFT, DOWN, RIGHT, UP = range(4)


@pytest.fixture(scope="module")
def exact():
    return bench.exact_value


def shortest_path_table() -> np.ndarray:
    """FrozenLake 4x4 (SFFF/FHFH/FFFH/HFFG): 0 -> 4 -> 8 -> 9 -> 13 -> 14 -> 15, 6 moves."""
    table = np.full(16, LEFT)
    for state, action in {0: DOWN, 4: DOWN, 8: RIGHT, 9: DOWN, 13: RIGHT, 14: RIGHT}.items():
        table[state] = action
    return table


def test_a_deterministic_path_is_worth_its_reward_only_within_the_time_limit(exact):
    model = exact.TabularModel(gym.make("FrozenLake-v1", is_slippery=False))
    table = shortest_path_table()
    assert exact.expected_return(model, table, horizon=6) == 1.0
    assert exact.expected_return(model, table, horizon=5) == 0.0  # cut one step short
    table[9] = LEFT  # 9 -> 8 -> 9 ...: a loop that never reaches the goal
    assert exact.expected_return(model, table, horizon=100) == 0.0
    table[8] = UP  # 8 -> 4 -> 8 ...: never terminates, worth nothing, and the sum stays finite
    assert exact.expected_return(model, table, horizon=1000) == 0.0


def test_the_optimal_return_bounds_every_policy_and_is_reached_by_the_best(exact):
    model = exact.TabularModel(gym.make("FrozenLake-v1", is_slippery=False))
    assert exact.optimal_return(model, horizon=6) == 1.0  # the shortest path is 6 moves
    assert exact.optimal_return(model, horizon=5) == 0.0
    slippery = exact.TabularModel(gym.make("FrozenLake-v1"))
    best = exact.optimal_return(slippery, horizon=100)
    rng = np.random.default_rng(0)
    for _ in range(20):
        table = rng.integers(4, size=16)
        assert exact.expected_return(slippery, table, horizon=100) <= best + 1e-12
    assert 0.7 < best < 0.75  # the known optimum of slippery 4x4 is about 0.74


@pytest.mark.parametrize("env_id", ["FrozenLake-v1", "FrozenLake8x8-v1", "Taxi-v4"])
def test_the_target_of_a_tabular_env_is_within_what_a_policy_can_expect(exact, env_id):
    """The early stop waits for a confirmed mean at the target: above the optimum it
    never comes, and the run ends wherever its last updates left the policy."""
    cfg = load_config(env_id)
    env = make_env(env_id, env_kwargs=cfg.env_kwargs)
    target = cfg.target_return if cfg.target_return is not None else env.spec.reward_threshold
    best = exact.optimal_return(exact.TabularModel(env), env.spec.max_episode_steps)
    assert target <= best


def test_the_exact_return_is_what_sampled_episodes_converge_to(exact):
    """Slippery FrozenLake, a fixed table, 20,000 sampled episodes under the same 100-step
    limit: their mean is within 4 standard errors of the exact value (and the exact value
    is not trivially 0 or 1)."""
    env = gym.make("FrozenLake-v1")  # slippery, TimeLimit 100
    table = np.array([0, 3, 3, 3, 0, 0, 0, 0, 3, 1, 0, 0, 0, 2, 1, 0])
    value = exact.expected_return(exact.TabularModel(env), table, horizon=100)
    returns = np.empty(20_000)
    env.reset(seed=0)
    for k in range(len(returns)):
        state, _ = env.reset()
        total, done = 0.0, False
        while not done:
            state, reward, terminated, truncated, _ = env.step(int(table[state]))
            total += reward
            done = terminated or truncated
        returns[k] = total
    standard_error = returns.std(ddof=1) / np.sqrt(len(returns))
    assert 0.5 < value < 0.9
    assert abs(returns.mean() - value) < 4 * standard_error


def test_rewards_of_terminal_steps_count_and_the_start_distribution_weights(exact):
    """CliffWalking: -1 a step, start at 36; walking right from the start falls off the
    cliff (-100, back to the start, not terminal), so a 3-step limit gives -300."""
    env = gym.make("CliffWalking-v1")
    model = exact.TabularModel(env)
    assert model.initial[36] == 1.0
    table = np.full(model.n_states, 1)  # RIGHT in CliffWalking
    assert exact.expected_return(model, table, horizon=3) == pytest.approx(-300.0)


def test_an_env_without_a_model_is_a_user_error(exact):
    with pytest.raises(UserError, match="no transition table"):
        exact.TabularModel(gym.make("CartPole-v1"))


def test_a_state_is_seen_as_training_sees_it(exact):
    env = make_env("FrozenLake-v1")
    first, _ = env.reset(seed=0)
    np.testing.assert_array_equal(exact.state_observation(env, 0), first)  # one-hot, float32
    assert exact.state_observation(env, 0).dtype == first.dtype
    np.testing.assert_array_equal(exact.state_observation(env, 5), np.eye(16, dtype=np.float32)[5])


def test_a_checkpoint_is_valued_by_its_noise_free_greedy_actions(exact, tmp_path, capsys):
    checkpoint = train_checkpoint(tmp_path / "run", "FrozenLake-v1", 300)
    value, table = exact.exact_value_of_checkpoint("FrozenLake-v1", checkpoint)

    from agent.cli import load_policy

    q_network = load_policy(checkpoint, "FrozenLake-v1", "cpu")[-1]
    from agent.noisy import noise_disabled

    with torch.no_grad(), noise_disabled(q_network):
        expected_table = q_network(torch.eye(16)).argmax(dim=1).numpy()
    np.testing.assert_array_equal(table, expected_table)
    model = exact.TabularModel(gym.make("FrozenLake-v1"))
    assert value == exact.expected_return(model, table, horizon=100)

    assert exact.main(["--env", "FrozenLake-v1", str(checkpoint)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{value:.4f}  {checkpoint}  actions: ")


def test_the_command_line_ends_a_user_error_with_status_2(exact, capsys):
    assert exact.main(["--env", "FrozenLake-v1", "missing.pt"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: no checkpoint at missing.pt")
