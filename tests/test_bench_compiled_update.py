"""bench/compiled_update.py: the networks it times are the presets' own, and learn."""

from __future__ import annotations

import pytest
import torch

from bench import compiled_update


@pytest.mark.parametrize("name", sorted(compiled_update.NETS))
def test_each_benched_network_is_its_configs_and_makes_an_update(name: str) -> None:
    learner, batch = compiled_update.build(name, "torch")
    before = [p.detach().clone() for p in learner.q_network.parameters()]
    errors = learner.update(batch)
    assert errors.shape == (batch.obs.shape[0],) and torch.isfinite(errors).all()
    assert any(not torch.equal(a, p) for a, p in zip(before, learner.q_network.parameters(),
                                                        strict=True))  # fmt: skip
    noisy = any(n.endswith("weight_sigma") for n, _ in learner.q_network.named_parameters())
    assert noisy == (name != "drq-epsilon")
    assert (batch.weights is not None) == (name == "der")  # der's prioritized replay
