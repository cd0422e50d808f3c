"""bench/noise_draw.py: both draws it times make fresh factorised noise in the network."""

from __future__ import annotations

import argparse

import pytest
import torch

from agent.noisy import noisy_layers
from bench import noise_draw


@pytest.mark.parametrize("name", ["cartpole", "minatar"])
def test_each_timed_draw_is_fresh_factorised_noise(name: str) -> None:
    net, draws = noise_draw.draws(name)
    layers = noisy_layers(net)
    assert layers
    for draw in draws.values():
        before = [layer.epsilon.clone() for layer in layers]
        draw()
        for layer, old in zip(layers, before, strict=True):
            assert not torch.equal(layer.epsilon, old)
            outer = torch.outer(layer.epsilon_out, layer.epsilon_in)
            assert torch.equal(layer.weight_epsilon, outer)


def test_each_draw_is_timed_per_network() -> None:
    out = noise_draw.measure(argparse.Namespace(nets="cartpole", calls=3, repeats=1))
    assert set(out["nets"]["cartpole"]) == {"numpy", "torch"}
    assert all(us > 0 for us in out["nets"]["cartpole"].values())
