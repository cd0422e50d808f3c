"""``vector: ale``: ale-py's AtariVectorEnv under the protocol of the gymnasium pipeline
(envs/ale_vector.py): the same frames, episode ends and resets, and a run trained on it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from agent.checkpoint import load_checkpoint
from agent.config_files import load_config
from agent.errors import UserError
from agent.train import train

pytest.importorskip("ale_py")
pytest.importorskip("cv2")

from envs import make, make_atari, make_vector_env


def test_without_no_ops_the_frames_are_the_gymnasium_pipelines_to_the_bit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the no-ops off (the one thing each pipeline draws from its own generator), two
    copies under random actions give the frames, rewards, lives and episode ends of two
    ``make_atari`` envs, step for step, through partial resets: the same shape, dtype,
    stacking order (oldest first) and padding of a new episode's stack."""
    monkeypatch.setattr(make, "ATARI_NOOP_MAX", 0)
    kwargs = {"max_num_frames_per_episode": 800}  # episodes end within the test
    ale = make_vector_env("BreakoutNoFrameskip-v4", 2, "ale", kwargs)
    refs = [make_atari("BreakoutNoFrameskip-v4", env_kwargs=kwargs) for _ in range(2)]
    assert ale.single_observation_space == refs[0].observation_space
    obs, info = ale.reset(seed=[1, 2])
    assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
    for i, ref in enumerate(refs):
        assert np.array_equal(obs[i], ref.reset(seed=i + 1)[0])
    rng = np.random.default_rng(0)
    ends = 0
    for _ in range(400):
        actions = rng.integers(4, size=2)
        obs, rewards, terminated, truncated, info = ale.step(actions)
        for i, ref in enumerate(refs):
            o, r, te, tr, ref_info = ref.step(int(actions[i]))
            assert np.array_equal(obs[i], o)
            assert (rewards[i], terminated[i], truncated[i]) == (r, te, tr)
            assert info["lives"][i] == ref_info["lives"]
        done = terminated | truncated
        if done.any():
            ends += int(done.sum())
            seeds = [100 + ends + i if d else None for i, d in enumerate(done)]
            obs, _ = ale.reset(seed=seeds, options={"reset_mask": done})
            for i in np.flatnonzero(done):
                assert np.array_equal(obs[i], refs[i].reset(seed=seeds[i])[0])
    assert ends >= 2  # resets were exercised
    ale.close()
    for ref in refs:
        ref.close()


def test_episodes_end_as_the_protocol_says() -> None:
    """A lost life is not an episode end (the loop makes it terminal in training only),
    a game over is; the frame cap truncates at a quarter of its frames; rewards are raw."""
    ale = make_vector_env("BreakoutNoFrameskip-v4", 1, "ale",
                          {"max_num_frames_per_episode": 400})  # fmt: skip
    ale.reset(seed=[0])
    for steps in range(1, 200):  # noqa: B007  (NOOP never launches the ball: no life lost)
        _, _, terminated, truncated, info = ale.step(np.array([0]))
        if terminated[0] or truncated[0]:
            break
    assert truncated[0] and not terminated[0] and steps == 100
    assert info["lives"][0] == 5
    ale.close()
    game = make_vector_env("BreakoutNoFrameskip-v4", 1, "ale")
    game.reset(seed=[0])
    lives, rewards, rng = [5], [], np.random.default_rng(1)
    while True:
        _, reward, terminated, truncated, info = game.step(rng.integers(4, size=1))
        rewards.append(float(reward[0]))
        if info["lives"][0] < lives[-1]:
            lives.append(int(info["lives"][0]))
            if lives[-1] > 0:
                assert not terminated[0]  # a life lost, the game goes on
        if terminated[0] or truncated[0]:
            break
    game.close()
    assert terminated[0] and lives == [5, 4, 3, 2, 1, 0]
    assert set(rewards) <= {0.0, 1.0, 4.0, 7.0}  # Breakout's raw brick values, unclipped


def test_no_ops_come_from_the_episodes_seed() -> None:
    """Up to 30 no-op frames at reset, drawn from the reset's seed: the same seed replays
    the same episode start, other seeds start elsewhere."""
    ale = make_vector_env("PongNoFrameskip-v4", 2, "ale")
    noops, firsts = set(), {}
    for seed in range(8):
        obs, info = ale.reset(seed=[seed, seed])
        assert np.array_equal(obs[0], obs[1])  # one seed, one start
        noops.add(int(info["episode_frame_number"][0]))
        firsts[seed] = obs[0].copy()
    obs, _ = ale.reset(seed=[3, 4_000_000_000], options={"reset_mask": np.array([True, False])})
    assert np.array_equal(obs[0], firsts[3])
    ale.close()
    assert noops <= set(range(31)) and len(noops) > 3


def test_the_id_and_env_kwargs_set_sticky_actions_and_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A v5 id's sticky actions and its cap, as the gymnasium pipeline takes them; the der
    preset's env_kwargs turn them off and keep 27,000 steps."""
    import ale_py.vector_env

    real, seen = ale_py.vector_env.AtariVectorEnv, {}

    def recording(game: str, num_envs: int, **options: object) -> object:
        seen.update(options, game=game)
        return real(game, num_envs, **options)

    monkeypatch.setattr(ale_py.vector_env, "AtariVectorEnv", recording)
    make_vector_env("ALE/Breakout-v5", 1, "ale").close()
    assert seen["game"] == "breakout" and seen["repeat_action_probability"] == 0.25
    assert seen["max_num_frames_per_episode"] == 108_000 and seen["frameskip"] == 4
    assert seen["noop_max"] == 30 and seen["stack_num"] == 4 and seen["maxpool"]
    assert not seen["episodic_life"] and not seen["reward_clipping"]
    assert not seen["use_fire_reset"]
    der = load_config("ALE/Breakout-v5", "der")
    make_vector_env(der.env_id, 1, "ale", der.env_kwargs).close()
    assert seen["repeat_action_probability"] == 0.0
    assert seen["max_num_frames_per_episode"] == 108_000


@pytest.mark.parametrize(
    ("env_id", "vector_kwargs", "match"),
    [
        ("CartPole-v1", {}, "steps ALE games only.*--set vector=sync"),
        ("PongNoFrameskip-v4", {"env_kwargs": {"mode": 1}},
         "no equivalent of env_kwargs key 'mode'.*remove it, or --set vector=async"),
        ("PongNoFrameskip-v4", {"env_kwargs": {"frameskip": 2}},
         "cannot set frameskip.*remove it from env_kwargs"),
        ("PongNoFrameskip-v4", {"wrappers": ["gymnasium.wrappers:RecordEpisodeStatistics"]},
         "cannot apply wrappers.*--set vector=async"),
    ],
)  # fmt: skip
def test_what_vector_ale_cannot_do_is_one_line_with_the_fix(
    env_id: str, vector_kwargs: dict, match: str
) -> None:
    with pytest.raises(UserError, match=match) as e:
        make_vector_env(env_id, 2, "ale", **vector_kwargs)
    assert "\n" not in str(e.value)


def test_a_der_run_trains_and_evaluates_on_it(tmp_path: Path) -> None:
    """The der preset with vector and eval_vector ale: two envs, learning, the final
    evaluation on the vector's copies; a resume continues, its episodes started afresh."""
    cfg = load_config("BreakoutNoFrameskip-v4", "der", overrides={
        "total_steps": 500, "num_envs": 2, "learning_starts": 300, "buffer_size": 2000,
        "vector": "ale", "eval_vector": "ale", "final_episodes": 2, "eval_envs": 2,
        "checkpoint_interval": 250, "log_interval": 250,
        "env_kwargs": {"repeat_action_probability": 0.0, "max_num_frames_per_episode": 2000},
    })  # fmt: skip
    said: list[str] = []
    result = train(cfg, tmp_path / "run", progress=False, echo=said.append)
    assert result.status == "finished" and result.global_step == 500
    assert result.updates == 500 - 300 + 1 and result.final_eval_return is not None
    saved = json.loads((tmp_path / "run" / "result.json").read_text())
    assert saved["final_eval_return"] == result.final_eval_return
    checkpoint = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    longer = dataclasses.replace(cfg, total_steps=700)
    resumed = train(longer, tmp_path / "run", checkpoint=checkpoint, progress=False,
                    echo=said.append)  # fmt: skip
    assert resumed.status == "finished" and resumed.global_step == 700
    assert resumed.updates == 700 - 300 + 1


def test_vector_ale_is_a_choice_of_the_config() -> None:
    cfg = load_config("PongNoFrameskip-v4", "der", overrides={"vector": "ale"})
    assert cfg.vector == "ale"
    with pytest.raises(UserError, match="vector"):
        load_config("PongNoFrameskip-v4", "der", overrides={"vector": "threads"})
    venv = make_vector_env("PongNoFrameskip-v4", 1, "ale")
    assert isinstance(venv, gym.vector.VectorEnv)
    venv.close()

