"""MinAtar and MiniGrid by their bare ids: registration, observations, episodes, errors."""

from __future__ import annotations

import builtins
import json
import re
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from agent import cli
from agent.checkpoint import load_checkpoint
from agent.config_files import load_config
from agent.errors import UserError
from agent.networks import MinAtarCNN
from agent.train import build_agent, train
from agent.usage import install_hint
from envs import check_env_id, episode_seed, inspect_env, make_env, make_vector_env

pytest.importorskip("minatar")
pytest.importorskip("minigrid")

MINATAR_GAMES = ["Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders"]
MINATAR_CHANNELS = {"Asterix": 4, "Breakout": 4, "Freeway": 7, "Seaquest": 10, "SpaceInvaders": 6}

# A few hundred steps: learning, evaluation, checkpoints all happen (configs/minatar.yaml
# or configs/default.yaml below these overrides).
TINY = {
    "total_steps": 400,
    "learning_starts": 100,
    "random_starts": 100,
    "buffer_size": 1_000,
    "train_freq": 2,
    "eval_interval": 200,
    "eval_episodes": 2,
    "confirm_episodes": 2,
    "log_interval": 100,
    "checkpoint_interval": 200,
    "target_update_interval": 100,
    "device": "cpu",
}


def _block_import(monkeypatch: pytest.MonkeyPatch, package: str) -> None:
    """Imports of ``package`` fail as they do where it is not installed."""
    real_import = builtins.__import__

    def fake_import(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == package or name.startswith(package + "."):
            raise ModuleNotFoundError(f"No module named {package!r}", name=package)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    for module in [m for m in list(__import__("sys").modules) if m.split(".")[0] == package]:
        monkeypatch.delitem(__import__("sys").modules, module)


def _unregister(monkeypatch: pytest.MonkeyPatch, prefix: str) -> None:
    for env_id in [i for i in gym.registry if i.startswith(prefix)]:
        monkeypatch.delitem(gym.registry, env_id)


# --- MinAtar ---


@pytest.mark.parametrize("game", MINATAR_GAMES)
def test_every_minatar_game_by_its_bare_id(game: str) -> None:
    full = inspect_env(f"MinAtar/{game}-v0")
    minimal = inspect_env(f"MinAtar/{game}-v1")
    channels = MINATAR_CHANNELS[game]
    assert full.obs_shape == (channels, 10, 10) and full.obs_dtype == "bool"
    assert full.n_actions == 6 and 1 < minimal.n_actions <= 6
    assert full.reward_threshold is None


def test_minatar_ids_register_on_first_use_with_a_module_prefix_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _unregister(monkeypatch, "MinAtar/")
    check_env_id("minatar:MinAtar/Breakout-v0")  # importing minatar alone registers nothing
    assert "MinAtar/Breakout-v1" in gym.registry


def test_minatar_grid_is_channel_first_and_matches_the_game_state() -> None:
    env = make_env("MinAtar/Breakout-v0")
    obs, _ = env.reset(seed=3)
    game = env.unwrapped.game
    np.testing.assert_array_equal(obs, game.state().transpose(2, 0, 1))
    obs, *_ = env.step(1)
    np.testing.assert_array_equal(obs, game.state().transpose(2, 0, 1))
    env.close()


def _play(env: gym.Env, seed: int, actions: list[int]) -> list[np.ndarray]:
    obs, _ = env.reset(seed=seed)
    seen = [obs]
    for action in actions:
        obs, _, terminated, truncated, _ = env.step(action)
        seen.append(obs)
        if terminated or truncated:
            break
    return seen


def test_a_minatar_episode_depends_on_its_seed_and_actions_only() -> None:
    """MinAtar's sticky actions repeat the last action of the episode before unless reset."""
    actions = [int(a) for a in np.random.default_rng(0).integers(0, 6, size=60)]
    fresh = _play(make_env("MinAtar/SpaceInvaders-v0"), 7, actions)
    used = make_env("MinAtar/SpaceInvaders-v0")
    _play(used, 1, [3] * 40)  # ends on action 3: a sticky repeat would replay it
    again = _play(used, 7, actions)
    assert len(fresh) == len(again)
    for a, b in zip(fresh, again, strict=True):
        np.testing.assert_array_equal(a, b)


def test_minatar_without_the_extra_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _unregister(monkeypatch, "MinAtar/")
    _block_import(monkeypatch, "minatar")
    hint = re.escape(install_hint("minatar"))
    with pytest.raises(UserError, match=f"minatar extra .*{hint}"):
        check_env_id("MinAtar/Breakout-v0")


def test_minatar_ids_take_configs_minatar_yaml() -> None:
    cfg = load_config("MinAtar/Asterix-v0")
    assert cfg.hidden_sizes == [128] and cfg.total_steps == 1_000_000
    assert cfg.env_kwargs.get("max_episode_steps")  # registered without a time limit
    # Explicit settings still win over the family file.
    assert load_config("MinAtar/Asterix-v0", overrides={"lr": 0.01}).lr == 0.01


def _train(tmp_path: Path, env_id: str, name: str = "run", **overrides: Any) -> Path:
    cfg = load_config(env_id, overrides={**TINY, **overrides})
    train(cfg, tmp_path / name, progress=False, echo=lambda _: None)
    return tmp_path / name


def test_minatar_trains_on_the_minatar_cnn_with_the_cpu_fast_paths(tmp_path: Path) -> None:
    cfg = load_config("MinAtar/Seaquest-v0", overrides=TINY)
    agent = build_agent(cfg, inspect_env(cfg.env_id, cfg.env_kwargs), torch.device("cpu"), 1)
    assert isinstance(agent.q_network.torso, MinAtarCNN)
    assert agent.learner.backend == "numpy"
    agent.selector(np.zeros((1, 10, 10, 10), dtype=bool))
    assert agent.selector.backend == "numpy"
    run_dir = _train(tmp_path, "MinAtar/Seaquest-v0")
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "finished" and result["updates"] > 0
    data = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert tuple(data["obs_shape"]) == (10, 10, 10) and data["obs_dtype"] == "bool"


def test_minatar_resume_is_exact(tmp_path: Path) -> None:
    """train 2N == train N, resume, train N, across episodes with sticky actions."""
    overrides = {"save_buffer": True, "checkpoint_interval": 10_000, "eval_interval": 0}
    straight = _train(tmp_path, "MinAtar/Breakout-v0", "a", **overrides, total_steps=600)
    _train(tmp_path, "MinAtar/Breakout-v0", "b", **overrides, total_steps=300)
    data = load_checkpoint(tmp_path / "b" / "checkpoints" / "last.pt")
    cfg = load_config("MinAtar/Breakout-v0", overrides={**TINY, **overrides, "total_steps": 600})
    train(cfg, tmp_path / "b", checkpoint=data, progress=False, echo=lambda _: None)
    a = load_checkpoint(straight / "checkpoints" / "last.pt")
    b = load_checkpoint(tmp_path / "b" / "checkpoints" / "last.pt")
    for key in a["q_network"]:
        assert torch.equal(a["q_network"][key], b["q_network"][key]), key
    assert a["counters"] == b["counters"] and a["counters"]["episodes"] > 1


def test_minatar_checkpoint_evaluates_exports_and_records(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run_dir = _train(tmp_path, "MinAtar/Breakout-v1")
    last = run_dir / "checkpoints" / "last.pt"
    # No --env: the checkpoint's own env.
    assert cli.main(["--eval", str(last), "--episodes", "3", "--json", "--device", "cpu"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["env"] == "MinAtar/Breakout-v1" and report["episodes"] == 3
    assert 0.0 <= report["success_rate"] <= 1.0
    assert cli.main(["--export", str(last), "--format", "torch"]) == 0
    assert last.with_suffix(".pt2").is_file()
    pytest.importorskip("moviepy")
    video_dir = tmp_path / "videos"
    args = ["--eval", str(last), "--episodes", "1", "--video", str(video_dir), "--device", "cpu"]
    assert cli.main(args) == 0
    assert len(list(video_dir.glob("*.mp4"))) == 1


# --- MiniGrid ---


def test_minigrid_view_is_one_hot_channels_of_minigrids_own_codes() -> None:
    from minigrid.core.constants import COLOR_TO_IDX, OBJECT_TO_IDX

    spec = inspect_env("MiniGrid-DoorKey-5x5-v0")
    assert spec.obs_shape == (21, 7, 7) and spec.obs_dtype == "bool" and spec.n_actions == 7
    env = make_env("MiniGrid-DoorKey-5x5-v0")
    raw_env = gym.make("MiniGrid-DoorKey-5x5-v0")
    seed = episode_seed(1, 0, 0)
    obs, _ = env.reset(seed=seed)
    raw, _ = raw_env.reset(seed=seed)
    objects, colours = len(OBJECT_TO_IDX), len(COLOR_TO_IDX)
    for action in (0, 2, 1, 2, 3):
        codes = raw["image"]  # (7, 7, 3): object, colour, state
        assert (obs.sum(axis=0) == 3).all()  # three bits a cell: object, colour, state
        for name in ("wall", "empty", "key", "door", "unseen"):
            kind = OBJECT_TO_IDX[name]
            np.testing.assert_array_equal(obs[kind], codes[:, :, 0] == kind)
        for colour in range(colours):
            np.testing.assert_array_equal(obs[objects + colour], codes[:, :, 1] == colour)
        for state in range(3):
            np.testing.assert_array_equal(obs[objects + colours + state], codes[:, :, 2] == state)
        obs, *_ = env.step(action)
        raw, *_ = raw_env.step(action)
    env.close()
    raw_env.close()


def test_minigrid_training_evaluation_and_video_see_the_same_observations() -> None:
    vec = make_vector_env("MiniGrid-DoorKey-5x5-v0", 2)
    single = make_env("MiniGrid-DoorKey-5x5-v0")
    video = make_env("MiniGrid-DoorKey-5x5-v0", render_mode="rgb_array")
    obs_vec, _ = vec.reset(seed=[11, 12])
    obs_single, _ = single.reset(seed=11)
    obs_video, _ = video.reset(seed=11)
    for action in (2, 0, 2, 1, 2):
        np.testing.assert_array_equal(obs_vec[0], obs_single)
        np.testing.assert_array_equal(obs_single, obs_video)
        obs_vec, *_ = vec.step(np.array([action, action]))
        obs_single, *_ = single.step(action)
        obs_video, *_ = video.step(action)
    assert video.render().ndim == 3
    for env in (vec, single, video):
        env.close()


def test_minigrid_without_the_extra_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _unregister(monkeypatch, "MiniGrid-")
    _block_import(monkeypatch, "minigrid")
    hint = re.escape(install_hint("minigrid"))
    with pytest.raises(UserError, match=f"minigrid extra .*{hint}"):
        check_env_id("MiniGrid-DoorKey-5x5-v0")


def test_minigrid_trains_and_reports_a_success_rate(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run_dir = _train(tmp_path, "MiniGrid-Empty-5x5-v0")
    assert json.loads((run_dir / "result.json").read_text())["updates"] > 0
    last = run_dir / "checkpoints" / "last.pt"
    assert cli.main(["--eval", str(last), "--episodes", "4", "--json", "--device", "cpu"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["env"] == "MiniGrid-Empty-5x5-v0"
    assert 0.0 <= report["success_rate"] <= 1.0


def test_a_user_wrapper_replaces_the_minigrid_encoding_when_it_changes_the_dict() -> None:
    spec = inspect_env("MiniGrid-Empty-5x5-v0", wrappers=["minigrid.wrappers:ImgObsWrapper"])
    # The raw (7, 7, 3) codes, small uint8 image: scaled to [0, 1] for the MinAtar CNN.
    assert spec.obs_shape == (3, 7, 7) and spec.obs_dtype == "float32"
    full = make_env("MiniGrid-Empty-5x5-v0", wrappers=["minigrid.wrappers:FullyObsWrapper"])
    assert full.observation_space.shape == (21, 5, 5)  # the whole grid, encoded like the view
    full.reset(seed=0)
    for _ in range(4):  # every direction of the agent, its cell's state channel
        obs, *_ = full.step(0)  # turn left
        x, y = full.unwrapped.agent_pos
        assert obs[-4 + full.unwrapped.agent_dir, x, y]
    full.close()


# --- unknown ids ---


def test_an_unknown_id_in_a_known_family_names_close_ids() -> None:
    with pytest.raises(UserError, match="did you mean MinAtar/Breakout"):
        check_env_id("MinAtar/Breakot-v0")


def test_an_unknown_id_suggests_naming_the_module_that_registers_it() -> None:
    with pytest.raises(UserError, match=r"package\.module:Env-v0"):
        check_env_id("SomeLab/Gridworld-v3")


def test_a_module_prefix_that_registers_nothing_says_so() -> None:
    with pytest.raises(UserError, match=r"importing 'json' did not register 'Foo-v0'.*no ids"):
        check_env_id("json:Foo-v0")
