"""Environment construction: gymnasium ids, vector envs, Atari preprocessing, per-episode seeds,
test envs."""

from envs.make import (
    EnvSpec,
    check_env_id,
    episode_seed,
    inspect_env,
    is_atari,
    make_atari,
    make_env,
    make_vector_env,
)

__all__ = [
    "EnvSpec",
    "check_env_id",
    "episode_seed",
    "inspect_env",
    "is_atari",
    "make_atari",
    "make_env",
    "make_vector_env",
]
