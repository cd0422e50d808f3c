"""The `wrappers` config key: users' gymnasium wrappers by import path, on every env of a run."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import envs.testing  # noqa: F401  (registers the NoisyDQN/ test envs)
from agent import cli
from agent.config_files import load_config, parse_set
from agent.errors import UserError
from agent.train import train
from envs import inspect_env, make_env, make_vector_env


class Doubled(gym.RewardWrapper):
    """A user's own wrapper, with a keyword argument."""

    def __init__(self, env: gym.Env, factor: float = 2.0) -> None:
        super().__init__(env)
        self.factor = factor

    def reward(self, reward: float) -> float:
        return self.factor * float(reward)


def make_text_observations(env: gym.Env) -> gym.Env:
    """A factory function (not a class) whose env has no fixed-size observations."""
    space = gym.spaces.Text(4)
    return gym.wrappers.TransformObservation(env, lambda obs: "abcd", space)


def not_a_wrapper(env: gym.Env) -> str:
    return "nope"


HERE = "test_wrappers"


def test_wrappers_apply_in_order_with_their_keyword_arguments() -> None:
    wrappers = [
        {f"{HERE}:Doubled": {"factor": 3.0}},
        "gymnasium.wrappers:TimeAwareObservation",
    ]
    env = make_env("CartPole-v1", wrappers=wrappers)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (5,)  # the time step appended to CartPole's 4 numbers
    _, reward, *_ = env.step(0)
    assert reward == 3.0
    env.close()
    assert inspect_env("CartPole-v1", wrappers=wrappers).obs_shape == (5,)


def test_training_evaluation_and_video_envs_all_get_them(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    overrides = parse_set(
        [
            "total_steps=300",
            "learning_starts=100",
            "random_starts=100",
            "eval_interval=100",
            "eval_episodes=2",
            "confirm_episodes=2",
            "device=cpu",
            f"wrappers=[{{{HERE}:Doubled: {{factor: 10}}}}]",
        ]
    )
    cfg = load_config("CartPole-v1", overrides=overrides)
    assert cfg.wrappers == [{f"{HERE}:Doubled": {"factor": 10}}]
    vec = make_vector_env("CartPole-v1", 2, wrappers=cfg.wrappers)
    vec.reset(seed=[1, 2])
    _, rewards, *_ = vec.step(np.array([0, 1]))
    assert rewards.tolist() == [10.0, 10.0]
    vec.close()
    result = train(cfg, tmp_path / "run", progress=False, echo=lambda _: None)
    # Periodic evaluations ran on wrapped envs: every step pays 10.
    assert all(value % 10 == 0 and value >= 10 for _, value in result.eval_curve)
    last = tmp_path / "run" / "checkpoints" / "last.pt"
    assert cli.main(["--eval", str(last), "--episodes", "2", "--json", "--device", "cpu"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["mean_return"] == 10 * report["mean_length"]


@pytest.mark.parametrize(
    ("wrapper", "message"),
    [
        ("gymnasium.wrappers.TimeAwareObservation", "must be named as module:Class"),
        ("no_such_module_xyz:Thing", "cannot import 'no_such_module_xyz'"),
        ("gymnasium.wrappers:NoSuchWrapper", "has no 'NoSuchWrapper'"),
        ("gymnasium.spaces:Box", "is not a gymnasium wrapper"),
        ("math:pi", "is not a class or function"),
        (f"{HERE}:not_a_wrapper", "returned str, not a gymnasium env"),
        ({f"{HERE}:Doubled": {"facter": 2}}, "with {'facter': 2} failed"),
        ({f"{HERE}:Doubled": 2}, "must be 'module:Class' or"),
        (f"{HERE}:make_text_observations", "cannot be flattened into a fixed-size vector"),
    ],
)
def test_a_bad_wrapper_is_a_user_error_naming_it(wrapper: object, message: str) -> None:
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace("{", r"\{")):
        inspect_env("CartPole-v1", wrappers=[wrapper])


def test_a_bad_wrapper_on_the_command_line_ends_in_one_line(
    capsys: pytest.CaptureFixture,
) -> None:
    code = cli.main(["--env", "CartPole-v1", "--set", "wrappers=[nope.nothing:Here]"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "cannot import 'nope" in err
