"""The DrQ(epsilon) presets: drq-epsilon holds what Dopamine's DrQ_eps.gin sets, key by
key; drq-noisy is the same with noisy layers in place of epsilon; the network each builds;
a short run of each on a real game."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

from agent import cli
from agent.checkpoint import load_checkpoint
from agent.config_files import load_config, presets
from agent.noisy import NoisyLinear
from agent.setup import build_q_network
from agent.train import train

GAME = "BreakoutNoFrameskip-v4"

# Written from google/dopamine's dopamine/labs/atari_100k/configs/DrQ_eps.gin, and the
# Dopamine code it leaves a setting to, one line of the source each.
DRQ_EPSILON = {
    # JaxFullRainbowAgent's network, FullRainbowNetwork: the Nature convolutions, one
    # Dense(512), a Dense value stream and a Dense advantage stream over it.
    "torso": "nature",
    "hidden_sizes": [512],
    "dueling": True,  # JaxFullRainbowAgent.dueling = True
    "dueling_streams": "linear",
    "noisy_layers": "none",  # JaxFullRainbowAgent.noisy = False
    "distributional": False,  # JaxFullRainbowAgent.distributional = False; num_atoms = 1
    "double_dqn": True,  # JaxFullRainbowAgent.double_dqn = True
    "n_step": 10,  # JaxDQNAgent.update_horizon = 10
    "gamma": 0.99,  # JaxDQNAgent.gamma = 0.99
    "learning_starts": 1_600,  # JaxDQNAgent.min_replay_history = 1_600
    "train_freq": 1,  # JaxDQNAgent.update_period = 1; num_updates_per_train_step = 1
    "batch_size": 32,  # ReplayBuffer.batch_size = 32
    "target_update_interval": 1,  # JaxDQNAgent.target_update_period = 1
    "tau": 1.0,  # _sync_weights copies the online parameters
    "prioritized_replay": False,  # JaxFullRainbowAgent.replay_scheme = 'uniform'
    "loss": "huber",  # mse_loss=False: losses.huber_loss, delta 1
    "huber_delta": 1.0,
    "max_grad_norm": None,  # create_optimizer: optax.adam, nothing clips
    "lr": 0.0001,  # create_optimizer.learning_rate = 0.0001
    "adam_eps": 0.00015,  # create_optimizer.eps = 0.00015
    "augment": "shift",  # Atari100kRainbowAgent.data_augmentation = True: pad 4, crop
    "intensity_scale": 0.05,  # _intensity_aug(scale=0.05)
    "exploration": "epsilon",  # epsilon_fn = linearly_decaying_epsilon
    "epsilon_start": 1.0,  # linearly_decaying_epsilon begins at 1
    "epsilon_decay_start": "learning_starts",  # its warmup_steps: min_replay_history
    "epsilon_end": 0.01,  # JaxDQNAgent.epsilon_train = 0.01
    "epsilon_fraction": 0.05,  # JaxDQNAgent.epsilon_decay_period = 5_000, of 100k
    "random_starts": 0,  # no warm-up but the schedule's epsilon of 1
    "eval_epsilon": 0.001,  # JaxDQNAgent.epsilon_eval = 0.001
    "total_steps": 100_000,  # Runner.num_iterations = 10 x Runner.training_steps = 10_000
    "final_episodes": 100,  # MaxEpisodeEvalRunner.num_eval_episodes = 100
    # sticky_actions = False; Runner.max_steps_per_episode = 27_000 (agent steps)
    "env_kwargs": {"repeat_action_probability": 0.0, "max_num_frames_per_episode": 108_000},
    "terminal_on_life_loss": True,  # AtariPreprocessing.terminal_on_life_loss = True
    "clip_rewards": True,  # the runner's clip_rewards=True
    "buffer_size": 100_000,  # ReplayBuffer.max_capacity = 1_000_000: holds every step
}
# JaxFullRainbowAgent.noisy = True on the same gin file: NoisyNetwork layers (sigma
# 0.1 / sqrt(fan_in)) for the 512 and both streams, fresh noise at each step, and
# zero_epsilon in training; the floor is undecided until the tuning seeds run.
DRQ_NOISY = {**DRQ_EPSILON, "exploration": "noisy", "noisy_layers": "all", "sigma0": 0.1,
             "noise_interval": 1, "noisy_epsilon": 0.0}  # fmt: skip
PRESETS = {"drq-epsilon": DRQ_EPSILON, "drq-noisy": DRQ_NOISY}


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_each_preset_has_the_gin_files_settings_and_changes_nothing_else(preset: str) -> None:
    cfg = load_config(GAME, preset).to_dict()
    for key, value in PRESETS[preset].items():
        assert cfg[key] == value, key
    # What it changes from der is what the gin file sets: der supplies the protocol only.
    der = load_config(GAME, "der").to_dict()
    assert {k for k in der if der[k] != cfg[k]} <= set(PRESETS[preset])


def test_drq_noisy_is_drq_epsilon_with_noisy_layers_in_place_of_epsilon() -> None:
    epsilon = load_config(GAME, "drq-epsilon").to_dict()
    noisy = load_config(GAME, "drq-noisy").to_dict()
    assert {k: noisy[k] for k in epsilon if epsilon[k] != noisy[k]} == {
        "exploration": "noisy", "noisy_layers": "all"}


def test_the_presets_are_listed_by_help_and_by_an_unknown_preset(
    capsys: pytest.CaptureFixture,
) -> None:
    assert {"drq-epsilon", "drq-noisy"} <= set(presets())
    help_text = " ".join(cli.build_parser().format_help().split())
    assert all(name in help_text.replace("- ", "-") for name in presets())
    assert cli.main(["--env", "CartPole-v1", "--config", "drq"]) == 2
    assert ", drq-epsilon, drq-noisy, " in capsys.readouterr().err


def _layers(module: nn.Module, kind: type) -> list[nn.Module]:
    return [m for m in module.modules() if isinstance(m, kind)]


def test_drq_epsilon_builds_the_nature_cnn_a_512_layer_and_linear_dueling_heads() -> None:
    cfg = load_config(GAME, "drq-epsilon")
    net = build_q_network(cfg, (4, 84, 84), 4, torch.device("cpu"), "uint8")
    convs = [(c.in_channels, c.out_channels, c.kernel_size, c.stride, c.padding)
             for c in _layers(net.torso, nn.Conv2d)]  # fmt: skip
    assert convs == [(4, 32, (8, 8), (4, 4), (0, 0)), (32, 64, (4, 4), (2, 2), (0, 0)),
                     (64, 64, (3, 3), (1, 1), (0, 0))]  # fmt: skip
    shared = [(m.in_features, m.out_features) for m in _layers(net.head, nn.Linear)]
    assert shared == [(64 * 7 * 7, 512)]
    assert [type(m) for m in net.head] == [nn.Linear, nn.ReLU]
    assert [(m.in_features, m.out_features) for m in _layers(net.value, nn.Linear)] == [(512, 1)]
    heads = [(m.in_features, m.out_features) for m in _layers(net.advantage, nn.Linear)]
    assert heads == [(512, 4)]
    assert not net.is_noisy and not _layers(net, NoisyLinear) and net.num_atoms == 1
    frames = torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8)
    assert net(frames).shape == (2, 4)  # action values, not C51 logits


def test_drq_noisy_makes_the_512_layer_and_both_streams_noisy() -> None:
    cfg = load_config(GAME, "drq-noisy")
    net = build_q_network(cfg, (4, 84, 84), 4, torch.device("cpu"), "uint8")
    noisy = [(m.in_features, m.out_features) for m in _layers(net, NoisyLinear)]
    assert noisy == [(64 * 7 * 7, 512), (512, 1), (512, 4)] and net.num_atoms == 1
    assert not [m for m in _layers(net, nn.Linear) if not isinstance(m, NoisyLinear)]


def _expected_epsilon(step: int, start: int, decay: float) -> float:
    """The value logged at ``step``: the schedule at the step before it (the last action)."""
    return max(0.01, 1.0 - 0.99 * max(step - 1 - start, 0) / decay)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_the_drq_presets_train_on_a_real_game(tmp_path: Path, preset: str) -> None:
    """Each preset as shipped, shortened: 300 steps of Breakout, an update a step from 200
    on, one capped evaluation episode. drq-epsilon logs epsilon 1 until learning starts,
    then its linear fall to 0.01 over 0.05 of the run (15 steps); drq-noisy keeps noisy
    layers and has no epsilon to log."""
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    cfg = load_config(GAME, preset, overrides={
        "total_steps": 300, "learning_starts": 200, "buffer_size": 1000, "final_episodes": 1,
        "eval_envs": 1, "log_interval": 5, "checkpoint_interval": 100_000,
        "env_kwargs": {"repeat_action_probability": 0.0, "max_num_frames_per_episode": 400},
    })  # fmt: skip
    result = train(cfg, tmp_path / "run", progress=False, echo=lambda _: None)
    assert result.status == "finished" and result.updates == 101
    weights = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["q_network"]
    assert any(k.endswith("weight_sigma") for k in weights) == (preset == "drq-noisy")
    acc = EventAccumulator(str(tmp_path / "run"), size_guidance={"scalars": 0})
    acc.Reload()
    if preset == "drq-noisy":
        assert "charts/epsilon" not in acc.Tags()["scalars"]
        return
    logged = [(e.step, e.value) for e in acc.Scalars("charts/epsilon")]
    assert [step for step, _ in logged] == list(range(5, 301, 5))
    assert all(value == 1.0 for step, value in logged if step <= 200)
    falling = [value for step, value in logged if 200 < step <= 220]
    assert falling[0] < 1.0 and falling == sorted(falling, reverse=True) and falling[-1] < 0.1
    for step, value in logged:
        assert value == pytest.approx(_expected_epsilon(step, 200, 0.05 * 300)), step
