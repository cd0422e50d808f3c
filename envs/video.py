"""Record episodes as mp4 files: gymnasium's ``RecordVideo`` over ``make_env``, exact frames.

The env is built by :func:`envs.make_env`, as for training and evaluation, with
``render_mode="rgb_array"``: the video shows the env's own screen (for Atari the
full-colour game, not the agent's 84x84 input). Needs the ``video`` extra.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.wrappers import RecordVideo

from agent.errors import UserError
from agent.usage import install_hint
from envs.make import ATARI_FRAME_SKIP, is_atari, make_env
from envs.wrappers import WrapperSpec

__all__ = ["EpisodeRecorder", "displayable", "free_prefix", "video_env"]

# Frames smaller than this (MinAtar draws its 10x10 grid as 10x10 pixels) are enlarged.
MIN_VIDEO_SIZE = 160


def displayable(frame: np.ndarray) -> np.ndarray:
    """An RGB frame as uint8, enlarged by whole pixels to at least ``MIN_VIDEO_SIZE`` a side.

    Float frames (MinAtar's, colours in [0, 1]) are scaled to 0-255; uint8 frames of
    that size and up are returned as they are.
    """
    if frame.dtype != np.uint8:
        frame = (np.clip(frame, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    factor = -(-MIN_VIDEO_SIZE // max(frame.shape[:2]))  # ceil
    if factor > 1:
        frame = np.repeat(np.repeat(frame, factor, axis=0), factor, axis=1)
    return frame


class EpisodeRecorder(RecordVideo):
    """``RecordVideo`` that hands its frames to ffmpeg itself (imageio-ffmpeg).

    gymnasium writes through moviepy's ``ImageSequenceClip``, which (moviepy 2.2) loses
    the last frame of some episodes: its duration is a float sum of n times 1/fps, and
    ``int(duration * fps)`` frames are written, n - 1 for n = 11 to 14, 279 or 501 at
    50 fps (a test here counts the decoded frames). It also finds each frame by a
    linear scan over all of them, quadratic in the episode's length. Here every
    captured frame is written, once, in order. Triggers and capture stay gymnasium's.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.written: list[Path] = []
        """The mp4 files this recorder wrote, in order."""

    def stop_recording(self) -> None:
        import imageio_ffmpeg

        if self.recorded_frames:
            height, width = displayable(self.recorded_frames[0]).shape[:2]
            path = Path(self.video_folder) / f"{self._video_name}.mp4"
            self.written.append(path)
            writer = imageio_ffmpeg.write_frames(
                str(path),
                (width, height),
                fps=self.frames_per_sec,
                macro_block_size=2,  # H.264 in yuv420p needs even sizes; others stay as they are
                ffmpeg_log_level="error",
            )
            writer.send(None)  # start ffmpeg
            for frame in self.recorded_frames:
                writer.send(np.ascontiguousarray(displayable(frame)))
            writer.close()
        self.recorded_frames = []
        self.recording = False
        self._video_name = None


def free_prefix(video_dir: Path, prefix: str = "rl-video") -> str:
    """The name prefix of a recording into ``video_dir`` that no file there has:
    ``rl-video`` (``rl-video-episode-0.mp4``, ...) in a new folder, else ``rl-video-2``,
    ``rl-video-3``, ...: a second recording into a folder keeps the first one's videos."""
    taken = {p.name for p in video_dir.glob("*.mp4")} if video_dir.is_dir() else set()
    candidate, n = prefix, 1
    while any(name.startswith(f"{candidate}-episode-") for name in taken):
        n += 1
        candidate = f"{prefix}-{n}"
    return candidate


def video_env(
    env_id: str,
    video_dir: str | Path,
    *,
    env_kwargs: Mapping[str, Any] | None = None,
    wrappers: Sequence[WrapperSpec] | None = None,
) -> gym.Env:
    """``make_env(env_id)`` rendering ``rgb_array`` frames, every episode recorded as an mp4.

    A missing renderer or writer is a :class:`UserError` naming the ``video`` extra,
    raised before anything is written. Videos already in ``video_dir`` stay: this
    recording's names start with another prefix (:func:`free_prefix`); its files are
    the recorder's ``written``.
    """
    try:
        import imageio_ffmpeg  # noqa: F401  (writes the files)
        import moviepy  # noqa: F401  (RecordVideo insists on it)
    except ImportError as e:
        raise UserError(
            f"--video needs the video extra ({e.name} is missing): {install_hint('video')}"
        ) from None
    # rgb_array frames are drawn off-screen: no window, so no display. Without this, SDL
    # (pygame) on a headless machine prints "error: XDG_RUNTIME_DIR is invalid ...".
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    env = None
    try:
        # gymnasium raises DependencyNotInstalled (no pygame, ...) at make or at the first
        # render: render one frame now, before anything is written. Evaluation resets with
        # its own seeds afterwards, so this reset changes nothing.
        env = make_env(env_id, render_mode="rgb_array", env_kwargs=env_kwargs, wrappers=wrappers)
        env.reset()
        env.render()
    except gym.error.DependencyNotInstalled as e:
        if env is not None:
            env.close()
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(
            f"--video cannot render {env_id}: {reason}; install the video extra: "
            f"{install_hint('video')}"
        ) from None
    # ALE declares 30 fps, but one agent step is frame_skip frames of a 60 Hz console:
    # real time is 60 / frame_skip frames per second.
    fps = 60 // ATARI_FRAME_SKIP if is_atari(env_id) else None
    try:
        with warnings.catch_warnings():
            # Its "Overwriting existing videos" (in raw colour codes) is not so: the name
            # prefix below is one that no file of the folder has.
            warnings.filterwarnings("ignore", message=".*Overwriting existing videos")
            return EpisodeRecorder(
                env, str(video_dir), episode_trigger=lambda _: True, fps=fps,
                disable_logger=True, name_prefix=free_prefix(Path(video_dir)),
            )  # fmt: skip
    except OSError as e:
        env.close()
        raise UserError(
            f"cannot write videos to {video_dir} ({e.strerror or e}): pass another --video DIR"
        ) from None
