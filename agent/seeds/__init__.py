"""Many seeds in one process: networks and updates stacked along a seed axis."""

from agent.seeds.learner import SeedLearner
from agent.seeds.stacked import (
    NoiseDraw,
    StackedConv2d,
    StackedLinear,
    StackedNoisyLinear,
    seed_state_dict,
    stack_networks,
    stacked_noisy_layers,
    with_own_noise,
)

__all__ = [
    "NoiseDraw",
    "SeedLearner",
    "StackedConv2d",
    "StackedLinear",
    "StackedNoisyLinear",
    "seed_state_dict",
    "stack_networks",
    "stacked_noisy_layers",
    "with_own_noise",
]
