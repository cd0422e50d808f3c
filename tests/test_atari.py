"""Atari support: the frame replay (tested on a fake image env, no ale-py needed), reward
clipping and terminal-on-life-loss in the loop, ALE preprocessing, and a Pong smoke run."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import envs.testing  # noqa: F401  (registers the NoisyDQN/ test envs)
from agent.checkpoint import load_checkpoint
from agent.config_files import load_config
from agent.errors import UserError
from agent.replay.frames import FrameReplayBuffer
from agent.replay import Batch, ReplayBuffer
from agent.train import train
from agent.usage import install_hint

ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- helpers
def frames_vector_env(num_envs: int, padding: str = "reset", **kwargs) -> gym.vector.VectorEnv:
    """Small (4, 8, 8) frame stacks of FrameEnv, autoreset disabled as in training."""
    from gymnasium.wrappers import FrameStackObservation

    from envs.testing import FrameEnv

    def make() -> gym.Env:
        return FrameStackObservation(FrameEnv(size=8, **kwargs), 4, padding_type=padding)

    return gym.vector.SyncVectorEnv(
        [make] * num_envs, autoreset_mode=gym.vector.AutoresetMode.DISABLED
    )


def same(a: Batch, b: Batch) -> bool:
    """Every field equal (on the CPU), absent fields absent from both."""
    return all(
        (x is None and y is None) or torch.equal(x.cpu(), y.cpu())
        for x, y in zip(a, b, strict=True)
    )


def drive(
    buffers,
    num_envs: int,
    steps: int,
    seed: int = 0,
    life_loss: bool = True,
    p_explored: float = 0.0,
    **kw,
):
    """Step a frames vector env like agent/train.py does and add every step to ``buffers``.

    A lost life is passed as terminated (the env is *not* reset), as the loop does with
    terminal_on_life_loss. With ``p_explored``, that share of steps is marked as a random
    action (``explored``). Returns the number of transitions added.
    """
    venv = frames_vector_env(num_envs, **kw)
    rng = np.random.default_rng(seed)
    marks = np.random.default_rng(seed + 1)  # its own stream: the steps do not depend on it
    obs, info = venv.reset(seed=[seed * 100 + i for i in range(num_envs)])
    lives = info["lives"].copy()
    for _ in range(steps):
        actions = rng.integers(3, size=num_envs)
        next_obs, rewards, terminated, truncated, info = venv.step(actions)
        term = terminated | (info["lives"] < lives) if life_loss else terminated
        lives = info["lives"].copy()
        explored = marks.random(num_envs) < p_explored if p_explored else None
        for buf in buffers:
            buf.add(obs, actions, rewards, next_obs, term, truncated, explored)
        done = terminated | truncated
        if done.any():
            draws = rng.integers(1 << 30, size=num_envs)
            seeds = [int(s) if d else None for s, d in zip(draws, done, strict=True)]
            next_obs, info = venv.reset(seed=seeds, options={"reset_mask": done})
            lives = np.where(info["_lives"], info["lives"], lives)
        obs = next_obs
    venv.close()
    return steps * num_envs


def transitions(batch: Batch) -> dict[bytes, tuple]:
    """Transitions keyed by their obs bytes (unique: frames hold random pixels)."""
    out = {}
    for i in range(len(batch.actions)):
        key = batch.obs[i].numpy().tobytes() + bytes([int(batch.actions[i])])
        out[key] = (
            batch.next_obs[i].numpy().tobytes(),
            round(float(batch.rewards[i]), 5),
            float(batch.dones[i]),
            round(float(batch.discounts[i]), 6),
        )
    return out


def all_of(buf) -> Batch:
    if isinstance(buf, FrameReplayBuffer):
        return buf.gather(buf.stored_slots())
    return buf.gather(torch.arange(len(buf)))


# --------------------------------------------------------------------------- frame replay
@pytest.mark.parametrize("n_step", [1, 3])
@pytest.mark.parametrize("padding", ["reset", "zero"])
@pytest.mark.parametrize("truncate", [False, True])
def test_frame_replay_equals_full_observation_replay(n_step, padding, truncate) -> None:
    """Every stack rebuilt from single frames equals the env's own stacked observation:
    across episode starts, life losses (terminal without reset) and n-step windows."""
    shape = (4, 8, 8)
    full = ReplayBuffer(20_000, shape, np.uint8, device="cpu", n_step=n_step, num_envs=3)
    frames = FrameReplayBuffer(20_000, shape, np.uint8, device="cpu", n_step=n_step, num_envs=3)
    drive([full, frames], 3, 300, padding=padding, truncate=truncate)
    assert len(frames) == len(full) > 800
    assert transitions(all_of(frames)) == transitions(all_of(full))
    # The reset stack ([f0] * 4) costs one frame, so about one frame per step is stored.
    if padding == "reset":
        assert frames._count.sum() < 1.1 * 900 + 3 * 60


def test_frame_replay_cuts_n_step_windows_at_explored_actions_as_full_replay_does() -> None:
    shape = (4, 8, 8)
    full = ReplayBuffer(20_000, shape, np.uint8, device="cpu", n_step=3, num_envs=3)
    frames = FrameReplayBuffer(20_000, shape, np.uint8, device="cpu", n_step=3, num_envs=3)
    drive([full, frames], 3, 300, padding="reset", p_explored=0.2)
    uncut = ReplayBuffer(20_000, shape, np.uint8, device="cpu", n_step=3, num_envs=3)
    drive([uncut], 3, 300, padding="reset")  # the same steps without the marks
    assert len(frames) == len(full) > len(uncut)  # a cut emits its windows early
    assert transitions(all_of(frames)) == transitions(all_of(full))


@pytest.mark.parametrize("n_step", [1, 3])
def test_frame_replay_ring_wrap_around(n_step) -> None:
    """A small ring overwritten many times keeps only correct, recent transitions."""
    shape = (4, 8, 8)
    full = ReplayBuffer(20_000, shape, np.uint8, device="cpu", n_step=n_step, num_envs=3)
    frames = FrameReplayBuffer(150, shape, np.uint8, device="cpu", n_step=n_step, num_envs=3)
    drive([full, frames], 3, 400, padding="reset")
    assert frames._count.min() > 5 * frames.slots_per_env  # wrapped several times
    stored = transitions(all_of(frames))
    expected = transitions(all_of(full))
    assert 100 <= len(stored) <= 150 and len(stored) == len(frames)
    for key, value in stored.items():
        assert expected[key] == value
    # Sampling draws only stored transitions, reproducibly.
    a = frames.sample(64, torch.Generator().manual_seed(3))
    b = frames.sample(64, torch.Generator().manual_seed(3))
    assert same(a, b)
    for key, value in transitions(a).items():
        assert stored[key] == value


def test_frame_replay_of_observations_that_are_not_stacks() -> None:
    """Random images (no shared frames) still come back exactly, at C frames a step."""
    rng = np.random.default_rng(0)
    shape = (3, 6, 6)
    full = ReplayBuffer(1_000, shape, np.uint8, device="cpu", n_step=2, num_envs=2)
    frames = FrameReplayBuffer(1_000, shape, np.uint8, device="cpu", n_step=2, num_envs=2)
    obs = rng.integers(0, 256, (2, *shape), dtype=np.uint8)
    for t in range(60):
        nxt = rng.integers(0, 256, (2, *shape), dtype=np.uint8)
        end = np.array([t % 7 == 6, t % 11 == 10])
        for buf in (full, frames):
            buf.add(obs, np.array([t % 3, 1]), np.array([1.0, -1.0]), nxt, end, ~end & (t % 5 == 4))
        obs = rng.integers(0, 256, (2, *shape), dtype=np.uint8) if end.any() else nxt
    assert transitions(all_of(frames)) == transitions(all_of(full))


def test_frame_replay_state_dict_round_trip() -> None:
    shape = (4, 8, 8)
    a = FrameReplayBuffer(120, shape, np.uint8, device="cpu", n_step=3, num_envs=2)
    drive([a], 2, 150, seed=1)
    blob = io.BytesIO()
    torch.save(a.state_dict(), blob)
    blob.seek(0)
    b = FrameReplayBuffer(120, shape, np.uint8, device="cpu", n_step=3, num_envs=2)
    b.load_state_dict(torch.load(blob, weights_only=True))
    assert len(a) == len(b)
    # Both continue identically (pending n-step windows and frame streams included).
    drive([a, b], 2, 50, seed=2)
    assert transitions(all_of(a)) == transitions(all_of(b))
    ga, gb = (
        a.sample(16, torch.Generator().manual_seed(0)),
        b.sample(16, torch.Generator().manual_seed(0)),
    )
    assert same(ga, gb)
    other = FrameReplayBuffer(120, shape, np.uint8, device="cpu", n_step=1, num_envs=2)
    with pytest.raises(ValueError, match="n_step"):
        other.load_state_dict(a.state_dict())


def test_frame_replay_batches_land_on_the_learners_device_not_a_fixed_one() -> None:
    # meta: no data, but every op runs; a batch built on a hard-coded device would fail.
    buf = FrameReplayBuffer(400, (4, 8, 8), np.uint8, device="meta", n_step=2, num_envs=2)
    drive([buf], 2, 40)
    assert all(t.device.type == "meta" for t in buf.sample(8).learned)
    assert buf.sample(8).indices.device.type == "cpu"  # drawn on the host


def test_frame_replay_memory_per_transition() -> None:
    shape = (4, 84, 84)
    frames = FrameReplayBuffer(1_000, shape, np.uint8, device="cpu")
    full = ReplayBuffer(1_000, shape, np.uint8, device="cpu")
    assert frames.bytes_per_transition < 84 * 84 + 100
    assert full.bytes_per_transition > 2 * 4 * 84 * 84
    batch = FrameReplayBuffer(100, (4, 8, 8), np.uint8, device="cpu")
    assert batch.obs_dtype == torch.uint8


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"obs_shape": (4, 8, 8), "obs_dtype": np.float32}, "integer frames"),
        ({"obs_shape": (8,)}, r"\(C, H, W\)"),
        ({"obs_shape": (4, 8, 8), "capacity": 10}, "needs at least"),
        ({"obs_shape": (4, 8, 8), "storage_device": "meta"}, "storage_device"),
        ({"obs_shape": (4, 8, 8), "storage_device": "meta", "device": "meta"}, "CUDA device"),
    ],
)
def test_frame_replay_bad_construction(kwargs, match) -> None:
    args = {"capacity": 1_000, "obs_dtype": np.uint8, "device": "cpu", **kwargs}
    with pytest.raises(ValueError, match=match):
        FrameReplayBuffer(**args)


# --------------------------------------------------------------------------- the loop
IMAGE_RUN = {
    "total_steps": 400,
    "num_envs": 2,
    "learning_starts": 200,
    "batch_size": 8,
    "train_freq": 8,
    "buffer_size": 2_000,
    "hidden_sizes": [32],
    "eval_interval": 0,
    "eval_episodes": 2,
    "confirm_episodes": 0,
    "log_interval": 200,
    "checkpoint_interval": 10_000,
    "save_buffer": True,
    "n_step": 1,
    "device": "cpu",
}


def test_loop_clips_rewards_and_ends_bootstrapping_on_life_loss(tmp_path: Path) -> None:
    cfg = load_config(
        "envs.testing:NoisyDQN/Frames-v0",
        overrides={**IMAGE_RUN, "clip_rewards": True, "terminal_on_life_loss": True},
    )
    result = train(cfg, tmp_path / "run", progress=False, echo=lambda _: None)
    assert result.status == "finished" and result.final_eval_return is not None
    data = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    state = data["replay"]
    assert "frames" in state  # the loop picked the frame replay for uint8 stacks
    valid = state["valid"]
    rewards, dones = state["rewards"][valid], state["dones"][valid]
    assert set(rewards.tolist()) == {-1.0, 1.0}  # clipped: the env pays 2.0 and -0.5
    # Logged returns are the raw score: sums of 2.0 and -0.5.
    acc = EventAccumulator(str(tmp_path / "run"), size_guidance={"scalars": 0})
    acc.Reload()
    returns = [e.value for e in acc.Scalars("charts/episodic_return")]
    lengths = [e.value for e in acc.Scalars("charts/episodic_length")]
    assert any(r % 1 == 0.5 for r in returns)
    episodes = len(returns)
    # Every episode ends terminated, and loses a life every 4 steps (keeping the last):
    # more dones than episodes, i.e. life losses were terminal for the replay.
    lives_lost = sum(min((int(n) - 1) // 4, 2) for n in lengths)
    assert lives_lost > 0
    assert int(dones.sum()) >= episodes + lives_lost - 4  # a few may have been overwritten
    # Rebuilt next stacks continue through a life loss: the step pixel keeps counting.
    frames, obs_idx, next_idx = state["frames"], state["obs_idx"][valid], state["next_idx"][valid]
    steps_obs = frames[obs_idx[:, -1]][:, 0, 0].long()
    steps_next = frames[next_idx[:, -1]][:, 0, 0].long()
    assert torch.equal(steps_next, steps_obs + 1)


def test_life_loss_needs_lives(tmp_path: Path) -> None:
    cfg = load_config(
        "envs.testing:NoisyDQN/Cue-v0",
        overrides={**IMAGE_RUN, "terminal_on_life_loss": True, "hidden_sizes": [8]},
    )
    with pytest.raises(UserError, match="terminal_on_life_loss needs an env"):
        train(cfg, tmp_path / "run", progress=False, echo=lambda _: None)


def test_frame_replay_switch_and_resume(tmp_path: Path) -> None:
    """frame_replay=false falls back to full observations; a resumed run is exact."""
    base = {**IMAGE_RUN, "clip_rewards": True, "terminal_on_life_loss": True}
    off = load_config("envs.testing:NoisyDQN/Frames-v0", overrides={**base, "frame_replay": False})
    train(off, tmp_path / "off", progress=False, echo=lambda _: None)
    assert "obs" in load_checkpoint(tmp_path / "off" / "checkpoints" / "last.pt")["replay"]

    straight = load_config("envs.testing:NoisyDQN/Frames-v0", overrides=base)
    train(straight, tmp_path / "a", progress=False, echo=lambda _: None)
    half = load_config("envs.testing:NoisyDQN/Frames-v0", overrides={**base, "total_steps": 240})
    train(half, tmp_path / "b", progress=False, echo=lambda _: None)
    data = load_checkpoint(tmp_path / "b" / "checkpoints" / "last.pt")
    assert "lives" in data["envs"]
    notes: list[str] = []
    train(straight, tmp_path / "b", checkpoint=data, progress=False, echo=notes.append)
    assert not any("afresh" in n for n in notes)
    a = load_checkpoint(tmp_path / "a" / "checkpoints" / "last.pt")
    b = load_checkpoint(tmp_path / "b" / "checkpoints" / "last.pt")
    for key in a["q_network"]:
        assert torch.equal(a["q_network"][key], b["q_network"][key]), key
    assert torch.equal(a["replay"]["valid"], b["replay"]["valid"])


@pytest.mark.parametrize("backend", ["numpy", "torch", "compile"])
def test_augmented_batches_train_and_resume_exactly(tmp_path: Path, backend: str) -> None:
    """augment: shift on every learner path: the shift changes what is learned, and a run
    resumed halfway (the augmentation's generator in last.pt) is the straight run."""
    base = {**IMAGE_RUN, "learner_backend": backend, "train_freq": 2, "torso": "der"}
    env = "envs.testing:NoisyDQN/Frames-v0"
    plain = load_config(env, overrides=base)
    train(plain, tmp_path / "plain", progress=False, echo=lambda _: None)
    shifted = load_config(env, overrides={**base, "augment": "shift"})
    train(shifted, tmp_path / "a", progress=False, echo=lambda _: None)
    half = load_config(env, overrides={**base, "augment": "shift", "total_steps": 300})
    train(half, tmp_path / "b", progress=False, echo=lambda _: None)
    data = load_checkpoint(tmp_path / "b" / "checkpoints" / "last.pt")
    assert "augment" in data
    train(shifted, tmp_path / "b", checkpoint=data, progress=False, echo=lambda _: None)
    p, a, b = (
        load_checkpoint(tmp_path / d / "checkpoints" / "last.pt") for d in ("plain", "a", "b")
    )
    assert json.loads((tmp_path / "a" / "result.json").read_text())["learner_backend"] == backend
    for key in a["q_network"]:
        assert torch.equal(a["q_network"][key], b["q_network"][key]), key
    assert any(not torch.equal(a["q_network"][k], p["q_network"][k]) for k in a["q_network"])
    assert torch.equal(a["augment"]["generator"], b["augment"]["generator"])


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_intensity_noise_trains_resumes_exactly_and_its_default_moves_nothing(
    tmp_path: Path, backend: str
) -> None:
    """intensity_scale on both learner paths, after a shift: it changes what is learned,
    a run resumed halfway is the straight run, and intensity_scale=0 is the shift alone
    to the bit."""
    base = {**IMAGE_RUN, "learner_backend": backend, "train_freq": 2, "torso": "der",
            "augment": "shift"}  # fmt: skip
    env = "envs.testing:NoisyDQN/Frames-v0"
    runs = {"shift": {}, "zero": {"intensity_scale": 0.0}, "a": {"intensity_scale": 0.05}}
    for name, extra in runs.items():
        train(load_config(env, overrides={**base, **extra}), tmp_path / name, progress=False,
              echo=lambda _: None)  # fmt: skip
    half = load_config(env, overrides={**base, "intensity_scale": 0.05, "total_steps": 300})
    train(half, tmp_path / "b", progress=False, echo=lambda _: None)
    data = load_checkpoint(tmp_path / "b" / "checkpoints" / "last.pt")
    whole = load_config(env, overrides={**base, "intensity_scale": 0.05})
    train(whole, tmp_path / "b", checkpoint=data, progress=False, echo=lambda _: None)
    shift, zero, a, b = (load_checkpoint(tmp_path / d / "checkpoints" / "last.pt")
                         for d in ("shift", "zero", "a", "b"))  # fmt: skip
    for key in a["q_network"]:
        assert torch.equal(a["q_network"][key], b["q_network"][key]), key
        assert torch.equal(zero["q_network"][key], shift["q_network"][key]), key
    assert any(not torch.equal(a["q_network"][k], shift["q_network"][k]) for k in a["q_network"])


# --------------------------------------------------------------------------- ALE
def test_missing_atari_extra_is_one_line(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['ale_py'] = None\n"
        "from agent import cli\n"
        f"sys.exit(cli.main(['--env', 'ALE/Pong-v5', '--run-dir', {str(tmp_path / 'r')!r}]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and install_hint("atari") in lines[0], proc.stderr


def test_ale_preprocessing() -> None:
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    from envs import inspect_env, make_env

    for env_id, sticky in (("ALE/Pong-v5", 0.25), ("PongNoFrameskip-v4", 0.0)):
        spec = inspect_env(env_id)
        assert spec.obs_shape == (4, 84, 84) and spec.obs_dtype == "uint8"
        env = make_env(env_id)
        ale_env = env.unwrapped
        assert ale_env._frameskip == 1  # AtariPreprocessing skips (with max-pooling)
        assert float(ale_env.ale.getFloat("repeat_action_probability")) == pytest.approx(sticky)
        names = []
        e = env
        while isinstance(e, gym.Wrapper):
            names.append(type(e).__name__)
            e = e.env
        assert "AtariPreprocessing" in names and "FrameStackObservation" in names
        pre = next(w for w in _wrappers(env) if type(w).__name__ == "AtariPreprocessing")
        assert pre.frame_skip == 4 and not pre.terminal_on_life_loss and pre.noop_max == 30
        env.close()
    # Real Pong frames through the frame replay come back exactly.
    full = ReplayBuffer(2_000, (4, 84, 84), np.uint8, device="cpu", n_step=3, num_envs=2)
    frames = FrameReplayBuffer(2_000, (4, 84, 84), np.uint8, device="cpu", n_step=3, num_envs=2)
    from envs import make_vector_env

    venv = make_vector_env("ALE/Pong-v5", 2)
    obs, _ = venv.reset(seed=[1, 2])
    rng = np.random.default_rng(0)
    for _ in range(150):
        actions = rng.integers(6, size=2)
        nxt, r, te, tr, _ = venv.step(actions)
        for buf in (full, frames):
            buf.add(obs, actions, r, nxt, te, tr)
        obs = nxt
    venv.close()
    assert transitions(all_of(frames)) == transitions(all_of(full))


def test_atari_frames_equal_the_preprocessing_of_rgb_screens() -> None:
    """The ALE env under the preprocessing observes grayscale screens (cheaper per frame):
    the stacks, rewards and episode ends are those of gymnasium's reference pipeline on
    an RGB ALE env, step for step through resets; env_kwargs can still ask for RGB."""
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    from envs import make_env

    ours = make_env("BreakoutNoFrameskip-v4")
    reference = FrameStackObservation(
        AtariPreprocessing(gym.make("BreakoutNoFrameskip-v4", frameskip=1), noop_max=30),
        4, padding_type="reset")  # fmt: skip
    assert reference.unwrapped.observation_space.shape == (210, 160, 3)
    assert ours.unwrapped.observation_space.shape == (210, 160)  # what user wrappers see
    rng = np.random.default_rng(0)
    a, _ = ours.reset(seed=3)
    b, _ = reference.reset(seed=3)
    episodes = 0
    for action in rng.integers(4, size=600):
        assert np.array_equal(a, b)
        a, ra, ta, ua, _ = ours.step(int(action))
        b, rb, tb, ub, _ = reference.step(int(action))
        assert (ra, ta, ua) == (rb, tb, ub)
        if ta or ua:
            episodes += 1
            a, _ = ours.reset(seed=10 + episodes)
            b, _ = reference.reset(seed=10 + episodes)
    assert np.array_equal(a, b) and episodes >= 1
    ours.close()
    reference.close()
    rgb = make_env("BreakoutNoFrameskip-v4", env_kwargs={"obs_type": "rgb"})
    assert rgb.unwrapped.observation_space.shape == (210, 160, 3)
    assert rgb.reset(seed=3)[0].shape == (4, 84, 84)
    rgb.close()


def test_the_der_preset_plays_the_atari_100k_protocol() -> None:
    """No sticky actions (even on a v5 id), the 27,000-step cap (a truncation), 1-30
    no-op frames at reset drawn from the episode's seed."""
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    from envs import make_env

    cfg = load_config("ALE/Breakout-v5", "der")
    env = make_env(cfg.env_id, env_kwargs=cfg.env_kwargs)
    ale = env.unwrapped.ale
    assert ale.getFloat("repeat_action_probability") == 0.0
    assert ale.getInt("max_num_frames_per_episode") == 108_000  # 27,000 steps of 4 frames
    noops = set()
    for seed in range(10):
        env.reset(seed=seed)
        noops.add(ale.getEpisodeFrameNumber())
    env.close()
    assert noops <= set(range(1, 31)) and len(noops) > 3
    # A cap of 200 frames on a game that lasts longer (NOOP never launches the ball).
    kwargs = {**cfg.env_kwargs, "max_num_frames_per_episode": 200}
    capped = make_env("BreakoutNoFrameskip-v4", env_kwargs=kwargs)
    capped.reset(seed=0)
    for steps in range(1, 60):  # noqa: B007
        _, _, terminated, truncated, _ = capped.step(0)
        if terminated or truncated:
            break
    capped.close()
    assert truncated and not terminated and 42 <= steps <= 50


@pytest.mark.parametrize("vector", ["sync", "ale"])
def test_a_lost_life_ends_bootstrapping_in_replay_only_on_a_real_game(
    tmp_path: Path, vector: str
) -> None:
    """Breakout under random play, on gymnasium's pipeline or ale-py's vector env: replay's
    dones outnumber the games, whose returns and lengths are whole games of five lives."""
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    cfg = load_config("BreakoutNoFrameskip-v4", "der", overrides={
        "total_steps": 600, "learning_starts": 600, "exploration": "epsilon",
        "noisy_layers": "none", "epsilon_start": 1.0, "epsilon_end": 1.0, "buffer_size": 2000,
        "n_step": 1, "final_episodes": 1, "eval_envs": 1, "eval_epsilon": 1.0,
        "vector": vector,
    })  # fmt: skip
    train(cfg, tmp_path / "run", progress=False, echo=lambda _: None)
    state = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["replay"]
    dones = int(state["dones"][state["valid"]].sum())
    acc = EventAccumulator(str(tmp_path / "run"), size_guidance={"scalars": 0})
    acc.Reload()
    games = len(acc.Scalars("charts/episodic_length"))
    assert games >= 1 and dones >= 5 * games  # each game: four lives lost, then the last
    assert set(state["rewards"][state["valid"]].unique().tolist()) <= {0.0, 1.0}  # clipped


@pytest.mark.parametrize("preset", ["der-shift", "der-shift-epsilon"])
def test_the_shift_presets_train_on_a_real_game(tmp_path: Path, preset: str) -> None:
    """Each augmented preset as shipped, shortened: 300 steps of Breakout, an update a step
    from 200 on, one capped evaluation episode. The noisy one keeps its noisy layers under
    a floor of 1% random actions; its ablation has none and ends its epsilon at 1%."""
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    cfg = load_config("BreakoutNoFrameskip-v4", preset, overrides={
        "total_steps": 300, "learning_starts": 200, "buffer_size": 1000, "final_episodes": 1,
        "eval_envs": 1, "log_interval": 100, "checkpoint_interval": 100_000,
        "env_kwargs": {"repeat_action_probability": 0.0, "max_num_frames_per_episode": 400},
    })  # fmt: skip
    assert cfg.augment == "shift"
    result = train(cfg, tmp_path / "run", progress=False, echo=lambda _: None)
    assert result.status == "finished" and result.updates == 101
    weights = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["q_network"]
    assert any(k.endswith("weight_sigma") for k in weights) == (preset == "der-shift")
    acc = EventAccumulator(str(tmp_path / "run"), size_guidance={"scalars": 0})
    acc.Reload()
    assert acc.Scalars("charts/epsilon")[-1].value == pytest.approx(0.01)


def test_der_floor_trains_on_a_real_game_under_its_floor(tmp_path: Path) -> None:
    """The third report's preset as shipped, shortened: 300 steps of Breakout, an update a
    step from 200 on. It keeps der's noisy layers, logs its floor of 1% and the share of
    actions off the noise-free greedy ones that the report records."""
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    cfg = load_config("BreakoutNoFrameskip-v4", "der-floor", overrides={
        "total_steps": 300, "learning_starts": 200, "buffer_size": 1000, "final_episodes": 1,
        "eval_envs": 1, "log_interval": 100, "checkpoint_interval": 100_000,
        "env_kwargs": {"repeat_action_probability": 0.0, "max_num_frames_per_episode": 400},
    })  # fmt: skip
    assert cfg.noisy_epsilon == 0.01 and cfg.exploration == "noisy" and cfg.augment == "none"
    result = train(cfg, tmp_path / "run", progress=False, echo=lambda _: None)
    assert result.status == "finished" and result.updates == 101
    weights = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["q_network"]
    assert any(k.endswith("weight_sigma") for k in weights)
    acc = EventAccumulator(str(tmp_path / "run"), size_guidance={"scalars": 0})
    acc.Reload()
    assert [e.value for e in acc.Scalars("charts/epsilon")] == pytest.approx([0.01] * 3)
    shares = [e.value for e in acc.Scalars("exploration/off_greedy_fraction")]
    assert shares and all(0.0 <= x <= 1.0 for x in shares)


def _wrappers(env: gym.Env) -> list[gym.Env]:
    out = []
    while isinstance(env, gym.Wrapper):
        out.append(env)
        env = env.env
    return out


def test_atari_smoke_trains_checkpoints_and_evaluates(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    import json

    from agent import cli

    run_dir = tmp_path / "pong"
    args = [
        "--env", "ALE/Pong-v5", "--run-dir", str(run_dir), "--no-progress",
        "--total-steps", "1200", "--device", "cpu", "--num-envs", "2",
        "--set", "learning_starts=1000", "--set", "batch_size=8", "--set", "train_freq=8",
        "--set", "buffer_size=4000", "--set", "eval_interval=0", "--set", "eval_episodes=1",
        "--set", "confirm_episodes=0", "--set", "log_interval=200",
        "--set", "checkpoint_interval=100000",
    ]  # fmt: skip
    assert cli.main(args) == 0
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "finished" and result["global_step"] == 1200
    assert result["updates"] == (1200 - 1000) // 8 + 1
    assert -21 <= result["final_eval_return"] <= 21
    ckpt = run_dir / "checkpoints" / "last.pt"
    data = load_checkpoint(ckpt)
    assert data["obs_shape"] == [4, 84, 84] and data["config"]["clip_rewards"]
    capsys.readouterr()
    eval_args = ["--env", "ALE/Pong-v5", "--eval", str(ckpt), "--episodes", "1", "--json"]
    code = cli.main([*eval_args, "--device", "cpu"])
    assert code == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["episodes"] == 1 and -21 <= report["mean_return"] <= 21


@pytest.mark.gpu
def test_frame_replay_pinned_path_matches_cpu() -> None:
    shape = (4, 8, 8)
    cpu = FrameReplayBuffer(400, shape, np.uint8, device="cpu", n_step=3, num_envs=2)
    gpu = FrameReplayBuffer(400, shape, np.uint8, device="cuda", n_step=3, num_envs=2)
    assert gpu.pinned and not cpu.pinned
    drive([cpu, gpu], 2, 300)
    for seed in range(3):  # back-to-back non-blocking samples, then compare
        a = cpu.sample(32, torch.Generator().manual_seed(seed))
        b = gpu.sample(32, torch.Generator().manual_seed(seed))
        assert all(t.device.type == "cuda" for t in b.learned)
        assert same(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("alpha", [None, 0.5], ids=["uniform", "prioritized"])
def test_frames_on_the_gpu_give_the_host_buffers_batches(alpha: float | None) -> None:
    shape = (4, 8, 8)
    kwargs = dict(n_step=3, num_envs=2, alpha=alpha)
    cpu = FrameReplayBuffer(400, shape, np.uint8, device="cpu", **kwargs)
    gpu = FrameReplayBuffer(400, shape, np.uint8, device="cuda", storage_device="cuda", **kwargs)
    assert not gpu.pinned
    drive([cpu, gpu], 2, 300)
    for seed in range(3):
        a = cpu.sample(32, torch.Generator().manual_seed(seed), beta=0.4)
        b = gpu.sample(32, torch.Generator().manual_seed(seed), beta=0.4)
        assert all(t.device.type == "cuda" for t in b.learned)
        assert b.indices.device.type == "cpu"  # drawn on the host
        assert same(a, b)
        errors = torch.rand(32, generator=torch.Generator().manual_seed(seed))
        cpu.update_priorities(a.indices, errors)
        gpu.update_priorities(b.indices, errors.cuda())
    # Saved from the GPU, the frames load into a host buffer, which goes on the same way.
    blob = io.BytesIO()
    torch.save(gpu.state_dict(), blob)
    blob.seek(0)
    back = FrameReplayBuffer(400, shape, np.uint8, device="cpu", **kwargs)
    back.load_state_dict(torch.load(blob, map_location="cpu", weights_only=True))
    drive([cpu, back, gpu], 2, 50, seed=3)
    assert transitions(all_of(cpu)) == transitions(all_of(back))
    assert same(all_of(cpu), all_of(gpu))


@pytest.mark.gpu
def test_frames_on_the_gpu_train_and_say_where_they_are(tmp_path: Path) -> None:
    base = {**IMAGE_RUN, "device": "cuda", "replay_storage": "device", "clip_rewards": True,
            "terminal_on_life_loss": True}  # fmt: skip
    cfg = load_config("envs.testing:NoisyDQN/Frames-v0", overrides=base)
    notes: list[str] = []
    result = train(cfg, tmp_path / "run", progress=False, echo=notes.append)
    assert result.status == "finished" and result.updates > 0
    assert any("GPU memory" in note for note in notes), notes
    ran = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert ran["replay_storage"] == "device"
    saved = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["replay"]
    assert saved["frames"].device.type == "cpu" and int(saved["valid"].sum()) > 0


AUGMENTED_RUN = {**IMAGE_RUN, "torso": "der", "train_freq": 2, "augment": "shift",
                 "intensity_scale": 0.05, "learner_backend": "torch"}  # fmt: skip


def _augmented_runs(tmp_path: Path, base: dict) -> dict[str, dict[str, torch.Tensor]]:
    """The online weights after an eager, a captured, and a shift-only (no intensity) run."""
    env = "envs.testing:NoisyDQN/Frames-v0"
    runs = {}
    for name, extra in {"eager": {"capture_graph": False}, "captured": {},
                        "shift alone": {"intensity_scale": 0.0}}.items():  # fmt: skip
        result = train(load_config(env, overrides={**base, **extra}), tmp_path / name,
                       progress=False, echo=lambda _: None)  # fmt: skip
        assert result.status == "finished" and result.updates > 0
        runs[name] = load_checkpoint(tmp_path / name / "checkpoints" / "last.pt")["q_network"]
    return runs


def test_shifted_and_intensity_noised_batches_reach_the_update_seam_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The captured update copies each batch into static buffers made from the first: float
    batches (intensity noise) must arrive whole, not cast to frames. On the CPU the capture
    seam's eager stand-in runs that orchestration, so the two runs agree to the bit."""
    import agent.setup as setup_module
    from agent.acting.graph import capture_eager

    monkeypatch.setattr(setup_module, "update_capture",
                        lambda device, on: capture_eager if on else None)  # fmt: skip
    runs = _augmented_runs(tmp_path, AUGMENTED_RUN)
    assert all(torch.equal(runs["captured"][k], runs["eager"][k]) for k in runs["eager"])
    assert any(not torch.equal(runs["captured"][k], runs["shift alone"][k])
               for k in runs["captured"])  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_shifted_and_intensity_noised_batches_train_on_the_captured_update(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above with a real CUDA graph. cuDNN's default convolution gradients sum with
    atomics in no fixed order, so two eager runs of this torso already differ in the last
    bits, and Adam spreads that over a run: deterministic algorithms make the comparison
    about the batches alone."""
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    runs = _augmented_runs(tmp_path, {**AUGMENTED_RUN, "device": "cuda"})
    for key, value in runs["eager"].items():
        torch.testing.assert_close(runs["captured"][key], value, rtol=1e-4, atol=1e-5)
    assert any(not torch.allclose(runs["captured"][k], runs["shift alone"][k])
               for k in runs["captured"])  # fmt: skip
