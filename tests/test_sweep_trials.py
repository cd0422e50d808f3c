"""agent/sweep/trials.py: the grid x seeds product, each trial's config checked up front."""

from __future__ import annotations

import pytest

from agent.errors import UserError
from agent.sweep.cli import parse_grid
from agent.sweep.trials import build_trials


def test_build_trials_crosses_grid_and_seeds() -> None:
    grid = parse_grid(["sigma0=0.1,0.5", "hidden_sizes=[32],[64,64]"])
    trials = build_trials("CartPole-v1", None, {"total_steps": 2000}, [1, 2], grid)
    assert len(trials) == 8
    assert len({t.run_dir for t in trials}) == 8
    assert trials[0].run_dir == "sigma0=0.1_hidden_sizes=32/seed_1"
    assert trials[0].name == "sigma0=0.1 hidden_sizes=[32] seed=1"
    assert trials[-1].config["hidden_sizes"] == [64, 64] and trials[-1].config["seed"] == 2
    assert all(t.config["total_steps"] == 2000 for t in trials)
    assert [t.run_dir for t in build_trials("CartPole-v1", None, {}, [3], {})] == ["seed_3"]


def test_build_trials_validates_every_grid_point_first() -> None:
    with pytest.raises(UserError, match="grid point batch_size=100000: invalid config"):
        build_trials("CartPole-v1", None, {}, [1], {"batch_size": [32, 100_000]})
