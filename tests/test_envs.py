"""Environment construction: id checks, space checks and observation adaptation, env_kwargs,
disabled autoreset, episode seeds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import envs.testing  # noqa: F401  (registers the NoisyDQN/ test envs)
from agent.errors import UserError
from envs import (
    adapt_observations,
    check_env_id,
    episode_seed,
    inspect_env,
    make_env,
    make_vector_env,
)

ROOT = Path(__file__).resolve().parent.parent


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
    with pytest.raises(UserError, match=r"NoisyDQN/Text-v0: observation space Text.* cannot be"):
        inspect_env("NoisyDQN/Text-v0")


class _Static(gym.Env):
    """Observations sampled from ``space`` (seeded): for the adaptation rules of any space."""

    def __init__(self, space: gym.Space) -> None:
        self.observation_space = space
        self.action_space = gym.spaces.Discrete(2)
        self.last_raw: Any = None

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.observation_space.seed(seed)
        self.last_raw = self.observation_space.sample()
        return self.last_raw, {}

    def step(self, action: int) -> tuple[Any, float, bool, bool, dict]:
        self.last_raw = self.observation_space.sample()
        return self.last_raw, 0.0, False, False, {}


def _box(shape: tuple[int, ...], dtype: Any = np.float32) -> gym.spaces.Box:
    return gym.spaces.Box(0, 255, shape=shape, dtype=dtype)


def _one_hot(n: int, i: int) -> np.ndarray:
    return np.eye(n, dtype=np.float32)[i]


S = gym.spaces


@pytest.mark.parametrize(
    ("space", "shape", "dtype", "expected"),
    [
        (_box((5,)), (5,), "float32", lambda o: o),
        (_box((7,), np.uint8), (7,), "uint8", lambda o: o),
        (_box((3, 40, 50), np.uint8), (3, 40, 50), "uint8", lambda o: o),  # channel-first
        (_box((40, 50, 3), np.uint8), (3, 40, 50), "uint8", lambda o: o.transpose(2, 0, 1)),
        (_box((84, 84, 4), np.uint8), (4, 84, 84), "uint8", lambda o: o.transpose(2, 0, 1)),
        (_box((36, 40), np.uint8), (1, 36, 40), "uint8", lambda o: o[None]),  # one gray frame
        (_box((3, 4)), (12,), "float32", np.ravel),  # a small grid, not an image
        (_box((40, 40)), (1600,), "float32", np.ravel),  # float rank 2: not a frame
        (  # a small image (MinAtar CNN): uint8 pixels scaled to [0, 1]
            _box((8, 8, 3), np.uint8),
            (3, 8, 8),
            "float32",
            lambda o: o.transpose(2, 0, 1).astype(np.float32) / np.float32(255),
        ),
        (  # MinAtar's grids: bool channels stay bool
            gym.spaces.Box(0, 1, shape=(10, 10, 4), dtype=bool),
            (4, 10, 10),
            "bool",
            lambda o: o.transpose(2, 0, 1),
        ),
        (_box((2, 2, 3), np.uint8), (12,), "uint8", np.ravel),  # under 3x3: flattened
        (  # a stack of RGB frames, e.g. FrameStackObservation over a channel-last env
            _box((4, 40, 50, 3), np.uint8),
            (12, 40, 50),
            "uint8",
            lambda o: o.transpose(0, 3, 1, 2).reshape(12, 40, 50),
        ),
        (_box((4, 1, 40, 40), np.uint8), (4, 40, 40), "uint8", lambda o: o.reshape(4, 40, 40)),
        (_box((2, 3, 4, 5)), (6, 4, 5), "float32", lambda o: o.reshape(6, 4, 5)),  # small
        (_box((2, 3, 2, 5)), (60,), "float32", np.ravel),  # rank 4, but under 3x3
        (_box((2, 1, 36, 36, 1), np.uint8), (2592,), "uint8", np.ravel),
        (_box(()), (1,), "float32", np.ravel),
        (S.Discrete(4), (4,), "float32", lambda o: _one_hot(4, o)),
        (S.Discrete(3, start=-1), (3,), "float32", lambda o: _one_hot(3, o + 1)),
        (
            S.MultiDiscrete([3, 2]),
            (5,),
            "float32",
            lambda o: np.concatenate([_one_hot(3, o[0]), _one_hot(2, o[1])]),
        ),
        (S.MultiBinary(3), (3,), "float32", lambda o: o.astype(np.float32)),
        (
            S.Tuple((S.Discrete(32), S.Discrete(11), S.Discrete(2))),  # Blackjack's
            (45,),
            "float32",
            lambda o: np.concatenate([_one_hot(32, o[0]), _one_hot(11, o[1]), _one_hot(2, o[2])]),
        ),
        (
            S.Dict({"a": S.Discrete(2), "b": _box((2,))}),
            (4,),
            "float32",
            lambda o: np.concatenate([_one_hot(2, o["a"]), o["b"]]),
        ),
    ],
    ids=lambda v: str(v) if isinstance(v, gym.Space) else "",
)
def test_observation_adaptation_rules(
    space: gym.Space, shape: tuple, dtype: str, expected: Any
) -> None:
    env = adapt_observations(_Static(space))
    assert env.observation_space.shape == shape
    assert np.dtype(env.observation_space.dtype).name == dtype
    obs, _ = env.reset(seed=3)
    for _ in range(3):
        assert obs.shape == shape and obs.dtype == np.dtype(dtype)
        assert env.observation_space.contains(obs)
        assert np.array_equal(obs, expected(env.unwrapped.last_raw))
        obs, *_ = env.step(0)


@pytest.mark.parametrize(
    "space",
    [
        S.Text(5),
        S.Sequence(S.Discrete(3)),
        S.Graph(node_space=S.Discrete(3), edge_space=None),
        S.Tuple((S.Discrete(2), S.Text(3))),
        S.OneOf((S.Discrete(2), S.Discrete(3))),
    ],
    ids=lambda s: type(s).__name__,
)
def test_observations_that_cannot_be_flattened_are_a_user_error(space: gym.Space) -> None:
    with pytest.raises(UserError, match="cannot be flattened into a fixed-size vector"):
        adapt_observations(_Static(space))


@pytest.mark.parametrize(
    ("env_id", "n"),
    [("FrozenLake-v1", 16), ("CliffWalking-v1", 48), ("Taxi-v4", 500), ("Blackjack-v1", 45)],
)
def test_discrete_toy_text_envs_get_one_hot_observations(env_id: str, n: int) -> None:
    spec = inspect_env(env_id)
    assert spec.obs_shape == (n,) and spec.obs_dtype == "float32"
    env = make_env(env_id)
    obs, _ = env.reset(seed=0)
    assert obs.sum() == (3 if env_id == "Blackjack-v1" else 1)  # one-hot (per part)
    raw = env.unwrapped.s if env_id != "Blackjack-v1" else None
    if raw is not None:
        assert obs[int(raw)] == 1.0
    env.close()


@pytest.mark.parametrize("kind", ["MultiDiscrete", "Tuple", "Grid", "ImageHWC"])
def test_training_evaluation_and_video_see_the_same_adapted_observations(kind: str) -> None:
    """The vector env (training), make_env (evaluation) and the render-mode env (--video)."""
    env_id = f"NoisyDQN/{kind}-v0"
    spec = inspect_env(env_id)
    expected = {"MultiDiscrete": (5,), "Tuple": (7,), "Grid": (12,), "ImageHWC": (3, 40, 40)}
    assert spec.obs_shape == expected[kind]
    vec = make_vector_env(env_id, 2)
    single = make_env(env_id)
    video = make_env(env_id, render_mode="rgb_array")
    obs_vec, _ = vec.reset(seed=[11, 12])
    obs_single, _ = single.reset(seed=11)
    obs_video, _ = video.reset(seed=11)
    for action in (0, 1, 1, 0, 1):  # to the episode's end (t = 5)
        assert obs_vec.shape == (2, *spec.obs_shape) and obs_vec.dtype == spec.obs_dtype
        assert np.array_equal(obs_vec[0], obs_single) and np.array_equal(obs_single, obs_video)
        raw = single.unwrapped.last_raw
        if kind == "ImageHWC":
            assert np.array_equal(obs_single, raw.transpose(2, 0, 1))
        elif kind == "Grid":
            assert np.array_equal(obs_single, raw.ravel())
        assert video.render().shape == (8, 8, 3)
        obs_vec, *_ = vec.step(np.array([action, action]))
        obs_single, *_ = single.step(action)
        obs_video, *_ = video.step(action)
    for env in (vec, single, video):
        env.close()


def test_env_kwargs_reach_every_env() -> None:
    spec = inspect_env("MountainCar-v0", {"goal_velocity": 0.02})
    assert spec.obs_shape == (2,)
    env = make_env("MountainCar-v0", env_kwargs={"goal_velocity": 0.02})
    assert env.unwrapped.goal_velocity == 0.02
    vec = make_vector_env("MountainCar-v0", 2, env_kwargs={"goal_velocity": 0.03})
    assert [e.unwrapped.goal_velocity for e in vec.envs] == [0.03, 0.03]
    vec.close()
    video = make_env("FrozenLake-v1", render_mode="rgb_array", env_kwargs={"map_name": "8x8"})
    assert video.observation_space.shape == (64,) and video.render_mode == "rgb_array"
    # gymnasium.make's own keywords work too: a time limit for an env without one.
    assert inspect_env("CliffWalking-v1", {"max_episode_steps": 50}).max_episode_steps == 50


def test_env_kwargs_the_env_rejects_are_user_errors() -> None:
    with pytest.raises(
        UserError,
        match=r"FrozenLake-v1 does not accept env_kwargs key 'slippery' \(did you mean is_slip",
    ):
        inspect_env("FrozenLake-v1", {"slippery": True})
    with pytest.raises(UserError, match=r"key 'foo' \(it takes sutton_barto_reward\)"):
        make_vector_env("CartPole-v1", 2, env_kwargs={"foo": 1})
    with pytest.raises(UserError, match=r"rejected env_kwargs \{'map_name': '9x9'\}"):
        make_env("FrozenLake-v1", env_kwargs={"map_name": "9x9"})


def test_frozenlake_trains_and_evaluates_from_the_command_line(tmp_path: Path) -> None:
    """End to end in a real process: one-hot observations, env_kwargs, checkpoint, --eval."""
    run_dir = tmp_path / "run"
    common = {"cwd": ROOT, "capture_output": True, "text": True, "timeout": 120}
    settings = [
        "learning_starts=100", "batch_size=16", "eval_interval=200", "eval_episodes=2",
        "confirm_episodes=2", "log_interval=100", "env_kwargs={map_name: 8x8}",
    ]  # fmt: skip
    train = subprocess.run(
        [sys.executable, "run.py", "--env", "FrozenLake-v1", "--total-steps", "400",
         "--device", "cpu", "--run-dir", str(run_dir), "--no-progress",
         *(a for s in settings for a in ("--set", s))],
        **common,
    )  # fmt: skip
    assert train.returncode == 0, train.stderr
    assert "map_name: 8x8" in (run_dir / "config.yaml").read_text()
    ev = subprocess.run(
        [sys.executable, "run.py", "--env", "FrozenLake-v1", "--eval",
         str(run_dir / "checkpoints" / "last.pt"), "--episodes", "3", "--json"],
        **common,
    )  # fmt: skip
    assert ev.returncode == 0, ev.stderr
    assert '"episodes": 3' in ev.stdout.splitlines()[-1]


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
    # env_kwargs reach the ALE env under the preprocessing; frameskip stays the wrapper's.
    env = make_env("ALE/Pong-v5", env_kwargs={"repeat_action_probability": 0.0})
    assert env.observation_space.shape == (4, 84, 84)
    assert env.unwrapped.spec.kwargs["repeat_action_probability"] == 0.0
    env.close()
    with pytest.raises(UserError, match="env_kwargs cannot set frameskip for Atari ids"):
        make_env("ALE/Pong-v5", env_kwargs={"frameskip": 4})


def test_a_missing_env_dependency_is_one_line_naming_the_smallest_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An install without Box2D: gymnasium's Box2D envs fail to import, as they do there
    # (the modules imported already are forgotten for the while).
    monkeypatch.setitem(sys.modules, "Box2D", None)
    for name in [m for m in sys.modules if m.startswith("gymnasium.envs.box2d")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(UserError, match="LunarLander-v3") as info:
        inspect_env("LunarLander-v3")
    line = str(info.value)
    # gymnasium[box2d] installs a ready-built wheel: no swig step before it.
    assert 'pip install "gymnasium[box2d]"' in line and "swig" not in line and "\n" not in line


def _tiny_run(env_id: str, run_dir: Path) -> Path:
    from agent.config_files import load_config
    from agent.train import train

    overrides = {
        "total_steps": 100, "learning_starts": 32, "batch_size": 32, "buffer_size": 1000,
        "eval_interval": 0, "log_interval": 50, "hidden_sizes": [16], "device": "cpu",
    }  # fmt: skip
    train(load_config(env_id, overrides=overrides), run_dir, progress=False, echo=lambda *_: None)
    return run_dir / "checkpoints" / "last.pt"


def test_video_records_episodes_of_the_adapted_env(tmp_path: Path) -> None:
    pytest.importorskip("moviepy")
    from agent import cli

    env_id = "envs.testing:NoisyDQN/ImageHWC-v0"  # channel-last images, transposed
    checkpoint = _tiny_run(env_id, tmp_path / "run")
    videos = tmp_path / "videos"
    args = ["--env", env_id, "--eval", str(checkpoint), "--episodes", "2", "--video", str(videos)]
    assert cli.main(args) == 0
    assert len(list(videos.glob("*.mp4"))) == 2


def test_video_of_an_env_that_cannot_render_here_is_a_user_error(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    pytest.importorskip("moviepy")
    try:
        import pygame  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("pygame is installed: FrozenLake renders")
    from agent import cli

    checkpoint = _tiny_run("FrozenLake-v1", tmp_path / "run")
    args = ["--env", "FrozenLake-v1", "--eval", str(checkpoint), "--video", str(tmp_path / "v")]
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("error: --video cannot render FrozenLake-v1: pygame is not installed")
