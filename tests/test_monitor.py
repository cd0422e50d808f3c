"""Monitor metrics: the exploration probes (action disagreement, Q gap) and their logging."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import envs.testing  # noqa: F401  (registers the NoisyDQN/ test envs)
from agent.config_files import load_config
from agent.monitor import action_disagreement, exploration_stats, q_gap
from agent.networks import QNetwork
from agent.noisy import noisy_layers
from agent.train import train


def _net(n_actions: int = 4, sigma0: float = 0.5, dueling: bool = False, **kw) -> QNetwork:
    torch.manual_seed(0)
    return QNetwork((3,), n_actions, (16, 16), sigma0=sigma0, dueling=dueling, **kw)


def _obs(n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(n, 3, generator=torch.Generator().manual_seed(1), dtype=dtype)


def test_no_noise_means_no_disagreement() -> None:
    q = _net(sigma0=0.0)
    generator = torch.Generator().manual_seed(0)
    assert action_disagreement(q, _obs(256), draws=8, generator=generator) == 0.0
    assert action_disagreement(_net(noisy_layers="none"), _obs(8)) == 0.0


@pytest.mark.parametrize(("n_actions", "dueling"), [(4, False), (3, True)])
def test_noise_that_swamps_the_values_changes_most_actions(n_actions: int, dueling: bool) -> None:
    q = _net(n_actions, dueling=dueling)
    with torch.no_grad():
        for layer in noisy_layers(q):
            layer.weight_mu.zero_()
            layer.bias_mu.zero_()
            layer.weight_sigma.fill_(10.0)
            layer.bias_sigma.fill_(10.0)
    # Noise-free Q is 0 for every action (greedy: action 0); noisy argmax is uniform.
    generator = torch.Generator().manual_seed(0)
    value = action_disagreement(q, _obs(2000), draws=1000, generator=generator)
    assert value == pytest.approx(1 - 1 / n_actions, abs=0.06)


def test_probes_leave_noise_switches_and_rng_streams_as_they_were() -> None:
    q = _net()
    layers = noisy_layers(q)
    layers[0].noise_enabled = False  # a switch the caller set stays set
    before = [(lay.epsilon.clone(), lay.weight_epsilon.clone()) for lay in layers]
    pointers = [(lay.epsilon.data_ptr(), lay.weight_epsilon.data_ptr()) for lay in layers]
    torch_rng, np_rng = torch.get_rng_state(), np.random.get_state()
    obs = _obs(64)
    with torch.no_grad():
        q_before = q(obs)
    stats = exploration_stats(q, obs, draws=4, seed=7)
    assert set(stats) == {"exploration/action_disagreement", "exploration/q_gap"}
    assert 0.0 <= stats["exploration/action_disagreement"] <= 1.0
    assert stats["exploration/q_gap"] > 0.0
    for lay, (eps, weight_eps), ptrs in zip(layers, before, pointers, strict=True):
        assert torch.equal(lay.epsilon, eps) and torch.equal(lay.weight_epsilon, weight_eps)
        assert (lay.epsilon.data_ptr(), lay.weight_epsilon.data_ptr()) == ptrs
    assert [lay.noise_enabled for lay in layers] == [False] + [True] * (len(layers) - 1)
    assert torch.equal(torch.get_rng_state(), torch_rng)
    assert all(np.array_equal(a, b) for a, b in zip(np.random.get_state(), np_rng, strict=True))
    with torch.no_grad():
        assert torch.equal(q(obs), q_before)
    # The same seed gives the same value; the noise really is fresh per seed.
    assert exploration_stats(q, obs, draws=4, seed=7) == stats
    values = {exploration_stats(q, obs, draws=4, seed=s)["exploration/action_disagreement"]
              for s in range(10)}  # fmt: skip
    assert len(values) > 1
    assert "exploration/action_disagreement" not in exploration_stats(q, obs, draws=4, seed=7,
                                                                      noisy=False)  # fmt: skip


@pytest.mark.gpu
def test_probes_on_cuda_keep_the_noise_buffers_and_cuda_rng() -> None:
    q = _net().to("cuda")
    layers = noisy_layers(q)
    before = [(lay.epsilon.clone(), lay.epsilon.data_ptr()) for lay in layers]
    cuda_rng = torch.cuda.get_rng_state()
    stats = exploration_stats(q, _obs(64), draws=4, seed=3)  # CPU batch: moved at the boundary
    assert 0.0 <= stats["exploration/action_disagreement"] <= 1.0
    assert torch.equal(torch.cuda.get_rng_state(), cuda_rng)
    for lay, (eps, ptr) in zip(layers, before, strict=True):
        assert torch.equal(lay.epsilon, eps) and lay.epsilon.data_ptr() == ptr


def test_q_gap_is_the_mean_top_two_margin_of_the_mean_weights() -> None:
    q = _net(dtype=torch.float64)
    obs = _obs(32, torch.float64)
    with torch.no_grad():
        for layer in noisy_layers(q):
            layer.noise_enabled = False
        values = q(obs).sort(dim=1, descending=True).values
    assert q_gap(q, obs) == pytest.approx((values[:, 0] - values[:, 1]).mean().item())
    assert q_gap(_net(n_actions=1), _obs(4)) == 0.0


def test_training_logs_the_exploration_scalars(tmp_path: Path) -> None:
    cfg = load_config(
        "NoisyDQN/Cue-v0",
        overrides={
            "total_steps": 300,
            "learning_starts": 64,
            "batch_size": 32,
            "log_interval": 100,
            "eval_interval": 0,
            "device": "cpu",
        },
    )
    train(cfg, tmp_path, progress=False, echo=lambda *_: None)
    acc = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    acc.Reload()
    disagreement = acc.Scalars("exploration/action_disagreement")
    assert [e.step for e in disagreement] == [100, 200, 300]
    assert all(0.0 <= e.value <= 1.0 for e in disagreement)
    assert [e.step for e in acc.Scalars("exploration/q_gap")] == [100, 200, 300]


def test_the_probe_draws_its_noise_without_writing_the_acting_noise() -> None:
    torch.manual_seed(0)
    q = QNetwork((4,), 3, (16,), noisy_layers="all")
    acting = [b for layer in noisy_layers(q) for b in layer.buffers()]
    versions = [b._version for b in acting]
    action_disagreement(q, torch.randn(64, 4), draws=4, generator=torch.Generator())
    assert [b._version for b in acting] == versions


# Killed outright (SIGKILL) at step 700 with its events on disk: its last.pt is from step
# 400, so steps 401-700 are logged twice, once by the killed run and once after --resume.
KILLED_AFTER_LOGGING = """
import os, signal, sys
from agent.cli import entry
from agent.monitor import Monitor
scalars = Monitor.scalars
def scalars_then_die(self, step, values):
    scalars(self, step, values)
    if step >= 700:
        self.writer.flush()
        os.kill(os.getpid(), signal.SIGKILL)
Monitor.scalars = scalars_then_die
sys.argv = ["run.py", *sys.argv[1:]]
entry()
"""


def _episodes_logged(run_dir: Path) -> list[tuple[int, float]]:
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars("charts/episodic_return")]


def test_a_resumed_run_hides_what_the_killed_run_logged_after_its_checkpoint(
    tmp_path: Path,
) -> None:
    root = Path(__file__).resolve().parent.parent
    args = ["--env", "CartPole-v1", "--seed", "3", "--total-steps", "1200", "--no-progress",
            "--set", "checkpoint_interval=400", "--set", "log_interval=100",
            "--set", "eval_interval=0"]  # fmt: skip
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    subprocess.run([sys.executable, "run.py", *args, "--run-dir", str(whole)], cwd=root,
                   check=True, capture_output=True)  # fmt: skip
    died = subprocess.run([sys.executable, "-c", KILLED_AFTER_LOGGING, *args, "--run-dir",
                           str(killed)], cwd=root, capture_output=True)  # fmt: skip
    assert died.returncode == -9
    assert max(step for step, _ in _episodes_logged(killed)) > 400  # logged past last.pt
    subprocess.run([sys.executable, "run.py", "--resume", str(killed), "--no-progress"],
                   cwd=root, check=True, capture_output=True)  # fmt: skip

    # TensorBoard's own reader shows each episode once: the same curve as a run never killed.
    assert _episodes_logged(killed) == _episodes_logged(whole)
