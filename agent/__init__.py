"""Noisy DQN: the algorithm (noisy layers, Q-networks, replay, acting, learning, checkpoints)."""

__version__ = "0.1.0"
