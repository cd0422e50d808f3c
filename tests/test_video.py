"""Video: `run.py --eval ... --video DIR` writes real mp4 files of whole episodes, headless.

These tests record through the `video` extra's own dependencies and skip only without
moviepy (the extra not installed at all; CI installs it through `dev`). pygame is *not*
skipped on: an installed extra that lacks a renderer must fail here, as it failed users.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from agent import cli
from agent.usage import install_hint
from conftest import train_checkpoint
from envs import episode_seed, make_env

# The episodes of `run.py --eval` come from seed stream 2 (see agent/evaluate.py).
EVAL_STREAM = 2


@pytest.fixture(autouse=True)
def headless(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")


@pytest.fixture(scope="module")
def cartpole_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_checkpoint(tmp_path_factory.mktemp("cartpole") / "run", "CartPole-v1", 1_000)


def _frames(path: Path) -> np.ndarray:
    """Every frame of an mp4, decoded by ffmpeg (not counted from its metadata)."""
    imageio_ffmpeg = pytest.importorskip("imageio_ffmpeg")
    reader = imageio_ffmpeg.read_frames(str(path))
    meta = next(reader)
    width, height = meta["size"]
    return np.stack([np.frombuffer(f, np.uint8).reshape(height, width, 3) for f in reader])


def _first_screen(env_id: str, seed: int) -> np.ndarray:
    """What the env shows after the reset of the first evaluation episode."""
    env = make_env(env_id, render_mode="rgb_array")
    env.reset(seed=episode_seed(seed, 0, 0, stream=EVAL_STREAM))
    frame = env.render()
    env.close()
    return frame


def _eval_with_video(
    env_id: str, checkpoint: Path, video_dir: Path, episodes: int, capsys
) -> tuple[dict, list[Path]]:
    args = ["--env", env_id, "--eval", str(checkpoint), "--episodes", str(episodes)]
    args += ["--video", str(video_dir), "--json", "--device", "cpu", "--seed", "5"]
    assert cli.main(args) == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return report, sorted(video_dir.glob("*.mp4"))


def test_cartpole_video_holds_every_frame_of_every_episode(
    tmp_path: Path, cartpole_checkpoint: Path, capsys: pytest.CaptureFixture
) -> None:
    pytest.importorskip("moviepy")
    report, videos = _eval_with_video(
        "CartPole-v1", cartpole_checkpoint, tmp_path / "videos", 2, capsys
    )

    assert [v.name for v in videos] == ["rl-video-episode-0.mp4", "rl-video-episode-1.mp4"]
    clips = [_frames(v) for v in videos]
    # One frame at reset and one per step: episode lengths + 1 frames per video.
    assert sum(len(c) for c in clips) == round(report["mean_length"] * 2) + 2
    for clip in clips:
        assert clip.shape[1:] == (400, 600, 3)  # CartPole's screen
        assert np.abs(clip[0].astype(int) - clip[-1]).mean() > 0.5  # the pole moved
    # The video is the env's own screen of the first episode (h264 is lossy: close, not equal).
    screen = _first_screen("CartPole-v1", 5)
    assert np.abs(clips[0][0].astype(int) - screen).mean() < 3


def test_atari_video_shows_the_game_screen(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("moviepy")
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    # 100 steps, no update: an untrained policy plays one short game.
    checkpoint = train_checkpoint(tmp_path / "run", "ALE/Pong-v5", 100)
    report, videos = _eval_with_video("ALE/Pong-v5", checkpoint, tmp_path / "videos", 1, capsys)

    assert len(videos) == 1
    clip = _frames(videos[0])
    assert len(clip) == report["mean_length"] + 1
    # The full-colour 210x160 game screen, not the 84x84 grayscale observation the agent sees.
    assert clip.shape[1:] == (210, 160, 3)
    screen = _first_screen("ALE/Pong-v5", 5)
    assert np.abs(clip[0].astype(int) - screen).mean() < 3


def test_every_captured_frame_is_in_the_file(tmp_path: Path) -> None:
    # Always pushing left ends these CartPole episodes after 11 and 10 steps: 12 and 11
    # frames, lengths whose last frame moviepy 2.2's writer drops (it writes 11 and 10).
    pytest.importorskip("moviepy")
    from envs.video import video_env

    env = video_env("CartPole-v1", tmp_path / "videos")
    lengths = []
    for seed in (0, 1):
        env.reset(seed=seed)
        steps, done = 0, False
        while not done:
            _, _, terminated, truncated, _ = env.step(0)
            steps, done = steps + 1, terminated or truncated
        lengths.append(steps)
    env.close()
    videos = sorted((tmp_path / "videos").glob("*.mp4"))
    assert [len(_frames(v)) for v in videos] == [n + 1 for n in lengths] == [12, 11]


def test_missing_renderer_is_one_line_naming_the_video_extra(
    tmp_path: Path,
    cartpole_checkpoint: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("moviepy")
    checkpoint = cartpole_checkpoint
    # A fresh install without pygame: `import pygame` fails inside gymnasium's render().
    monkeypatch.setitem(sys.modules, "pygame", None)
    video_dir = tmp_path / "videos"
    code = cli.main(["--env", "CartPole-v1", "--eval", str(checkpoint), "--video", str(video_dir)])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "pygame" in lines[0] and install_hint("video") in lines[0]
    assert not video_dir.exists()  # failed before writing anything


def test_missing_moviepy_is_one_line_naming_the_video_extra(
    tmp_path: Path,
    cartpole_checkpoint: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checkpoint = cartpole_checkpoint
    monkeypatch.setitem(sys.modules, "moviepy", None)
    code = cli.main(
        ["--env", "CartPole-v1", "--eval", str(checkpoint), "--video", str(tmp_path / "v")]
    )
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1
    assert install_hint("video") in lines[0]


def test_unwritable_video_directory_is_one_line(
    tmp_path: Path, cartpole_checkpoint: Path, capsys: pytest.CaptureFixture
) -> None:
    pytest.importorskip("moviepy")
    checkpoint = cartpole_checkpoint
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    code = cli.main(
        ["--env", "CartPole-v1", "--eval", str(checkpoint), "--video", str(not_a_dir / "v")]
    )
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1
    assert "cannot write videos" in lines[0]


def test_video_takes_the_env_from_the_checkpoint_without_env(
    tmp_path: Path, cartpole_checkpoint: Path, capsys: pytest.CaptureFixture
) -> None:
    pytest.importorskip("moviepy")
    video_dir = tmp_path / "videos"
    args = ["--eval", str(cartpole_checkpoint), "--episodes", "1", "--video", str(video_dir),
            "--json", "--device", "cpu"]
    assert cli.main(args) == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["env"] == "CartPole-v1"
    assert [v.name for v in video_dir.glob("*.mp4")] == ["rl-video-episode-0.mp4"]


def test_a_second_video_into_the_same_folder_keeps_the_first_and_prints_no_raw_codes(
    tmp_path: Path,
    cartpole_checkpoint: Path,
    capsys: pytest.CaptureFixture,
    recwarn: pytest.WarningsRecorder,
) -> None:
    pytest.importorskip("moviepy")
    video_dir = tmp_path / "videos"
    args = ["--eval", str(cartpole_checkpoint), "--episodes", "1", "--video", str(video_dir),
            "--device", "cpu"]  # fmt: skip
    assert cli.main(args) == 0, capsys.readouterr().err
    first = {p.name: p.read_bytes() for p in video_dir.glob("*.mp4")}
    assert len(first) == 1
    capsys.readouterr()
    assert cli.main([*args, "--seed", "7"]) == 0  # another episode, into the same folder
    out, err = capsys.readouterr()
    now = {p.name: p.read_bytes() for p in video_dir.glob("*.mp4")}
    assert len(now) == 2 and {name: now[name] for name in first} == first  # kept as it was
    (new,) = set(now) - set(first)
    assert new in out  # the line names what this evaluation wrote
    shown = out + err + "".join(str(w.message) for w in recwarn)
    assert "\x1b[" not in shown  # no terminal colour codes (gymnasium's warning)
