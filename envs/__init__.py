"""Environment construction: gymnasium ids, vector envs, Atari preprocessing, per-episode seeds,
test envs."""

from envs.make import (
    MIN_IMAGE_SIZE,
    EnvSpec,
    adapt_observations,
    check_env_id,
    episode_seed,
    inspect_env,
    is_atari,
    make_atari,
    make_env,
    make_vector_env,
)

__all__ = [
    "MIN_IMAGE_SIZE",
    "EnvSpec",
    "adapt_observations",
    "check_env_id",
    "episode_seed",
    "inspect_env",
    "is_atari",
    "make_atari",
    "make_env",
    "make_vector_env",
]
