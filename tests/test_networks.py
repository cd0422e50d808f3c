"""QNetwork: shapes, noisy layer selection, dueling, CNN torso, devices and dtypes."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import DEVICES, OpRecorder

from agent.networks import DataEfficientCNN, MinAtarCNN, NatureCNN, QNetwork, resolve_torso
from agent.noisy import NoisyLinear, noise_disabled, noisy_layers

def _cfg_id(cfg: dict) -> str:
    duel = cfg.get("dueling", False) and cfg.get("dueling_streams", "hidden")
    return f"{cfg['obs_shape']}-{cfg['hidden_sizes']}-duel{duel}-{cfg.get('torso', 'auto')}"


CONFIGS = [
    {"obs_shape": (4,), "hidden_sizes": (16, 16)},
    {"obs_shape": (4,), "hidden_sizes": (16, 16), "dueling": True},
    {"obs_shape": (4,), "hidden_sizes": (16,), "dueling": True},
    {"obs_shape": (2, 36, 36), "hidden_sizes": (32,), "input_scale": 255.0},
    {"obs_shape": (2, 36, 36), "hidden_sizes": (32,), "dueling": True, "input_scale": 255.0},
    {"obs_shape": (4, 10, 10), "hidden_sizes": (32,)},  # the MinAtar CNN
    {"obs_shape": (3, 7, 5), "hidden_sizes": (8,), "dueling": True},
    {"obs_shape": (4,), "hidden_sizes": (16, 16), "dueling": True, "dueling_streams": "linear"},
    # Revisiting Rainbow's MinAtar network: the streams read the convolution's features.
    {"obs_shape": (4, 10, 10), "hidden_sizes": (), "dueling": True, "dueling_streams": "linear"},
    # Data-efficient Rainbow's torso.
    {"obs_shape": (4, 84, 84), "hidden_sizes": (16,), "dueling": True, "torso": "der",
     "input_scale": 255.0},
]


def _obs(obs_shape: tuple[int, ...], batch: int, device: str = "cpu") -> torch.Tensor:
    if len(obs_shape) == 3 and obs_shape[1] < 36:  # MinAtar's bool grids
        return torch.rand(batch, *obs_shape, device=device) < 0.2
    if len(obs_shape) == 3:
        return torch.randint(0, 256, (batch, *obs_shape), dtype=torch.uint8, device=device)
    return torch.randn(batch, *obs_shape, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cfg", CONFIGS, ids=_cfg_id)
def test_output_shape_and_device(cfg: dict, device: str) -> None:
    net = QNetwork(n_actions=3, device=device, **cfg)
    q = net(_obs(cfg["obs_shape"], 5, device))
    assert q.shape == (5, 3)
    assert q.device.type == device
    assert q.dtype == torch.float32


def test_noisy_layer_selection() -> None:
    all_noisy = QNetwork((4,), 2, (8, 8), noisy_layers="all")
    assert len(noisy_layers(all_noisy)) == 3
    assert not any(isinstance(m, torch.nn.Linear) for m in all_noisy.modules())
    last = QNetwork((4,), 2, (8, 8), noisy_layers="last")
    assert len(noisy_layers(last)) == 1
    assert noisy_layers(last)[0].out_features == 2
    plain = QNetwork((4,), 2, (8, 8), noisy_layers="none")
    assert noisy_layers(plain) == [] and not plain.is_noisy
    plain.reset_noise()  # a no-op, not an error
    duel_last = QNetwork((4,), 2, (8, 8), dueling=True, noisy_layers="last")
    assert sorted(m.out_features for m in noisy_layers(duel_last)) == [1, 2]
    # Convolutions are never noisy.
    cnn = QNetwork((2, 36, 36), 2, (8,))
    assert all(not isinstance(m, NoisyLinear) for m in cnn.torso.modules())


def test_linear_dueling_streams_share_every_hidden_layer() -> None:
    hidden = QNetwork((4,), 3, (8, 6), dueling=True, noisy_layers="last")
    linear = QNetwork((4,), 3, (8, 6), dueling=True, dueling_streams="linear",
                      noisy_layers="last")  # fmt: skip

    def linears(module: torch.nn.Module) -> list[tuple[int, int]]:
        return [(m.in_features, m.out_features) for m in module.modules()
                if isinstance(m, (torch.nn.Linear, NoisyLinear))]  # fmt: skip

    assert linears(hidden.head) == [(4, 8)]
    assert linears(hidden.value) == [(8, 6), (6, 1)]
    assert linears(linear.head) == [(4, 8), (8, 6)]
    assert linears(linear.value) == [(6, 1)] and linears(linear.advantage) == [(6, 3)]
    # noisy_layers="last": the output layer of each stream, whichever layout.
    assert sorted(m.out_features for m in noisy_layers(linear)) == [1, 3]
    all_noisy = QNetwork((4,), 3, (8, 6), dueling=True, dueling_streams="linear")
    assert len(noisy_layers(all_noisy)) == 4
    # With no hidden layer the streams read the torso's features.
    bare = QNetwork((4, 10, 10), 3, (), dueling=True, dueling_streams="linear")
    assert linears(bare) == [(bare.torso.out_features, 1), (bare.torso.out_features, 3)]


@pytest.mark.parametrize("streams", ["hidden", "linear"])
def test_dueling_head_subtracts_mean_advantage(streams: str) -> None:
    net = QNetwork((4,), 3, (8, 8), dueling=True, dueling_streams=streams)  # type: ignore[arg-type]
    x = torch.randn(6, 4)
    q = net(x)
    features = net.head(x)
    v, a = net.value(features), net.advantage(features)
    torch.testing.assert_close(q, v + a - a.mean(dim=1, keepdim=True))
    # The mean over actions of Q is V: advantages are identifiable.
    torch.testing.assert_close(q.mean(dim=1, keepdim=True), v)


def test_reset_noise_resets_every_noisy_layer_in_place() -> None:
    net = QNetwork((4,), 2, (8, 8), dueling=True)
    layers = noisy_layers(net)
    ptrs = [b.data_ptr() for b in net.buffers()]
    before = [m.weight_epsilon.clone() for m in layers]
    net.reset_noise()
    assert [b.data_ptr() for b in net.buffers()] == ptrs
    for b, m in zip(before, layers, strict=True):
        assert not torch.equal(b, m.weight_epsilon)


def test_refresh_finds_noisy_layers_put_in_after_construction() -> None:
    # reset_noise walks a list found at construction (it is on the hot path); a network
    # whose layers were swapped afterwards (folded for export, stacked) looks again.
    net = QNetwork((4,), 2, (8,), noisy_layers="none")
    net.head[2] = NoisyLinear(8, 2)
    before = net.head[2].weight_epsilon.clone()
    net.refresh_noisy_layers()
    assert net.is_noisy
    net.reset_noise()
    assert not torch.equal(before, net.head[2].weight_epsilon)
    net.head[2] = torch.nn.Linear(8, 2)
    net.refresh_noisy_layers()
    assert not net.is_noisy


def test_noise_changes_output_unless_disabled() -> None:
    net = QNetwork((4,), 2, (8, 8))
    x = torch.randn(3, 4)
    y1 = net(x)
    net.reset_noise()
    assert not torch.allclose(y1, net(x))
    with noise_disabled(net):
        z1 = net(x)
        net.reset_noise()
        torch.testing.assert_close(net(x), z1, rtol=0, atol=0)


def test_frames_are_divided_by_the_input_scale_and_refused_without_one() -> None:
    net = QNetwork((2, 36, 36), 2, (8,), input_scale=255.0)
    plain = QNetwork((2, 36, 36), 2, (8,))
    plain.load_state_dict(net.state_dict())
    frames = torch.randint(0, 256, (3, 2, 36, 36), dtype=torch.uint8)
    with noise_disabled(net), noise_disabled(plain):
        # the same float ops as dividing first: bit for bit
        assert torch.equal(net(frames), plain(frames.float() / 255.0))
        with pytest.raises(ValueError, match="uint8 frames into a convolutional torso need"):
            plain(frames)  # 0-255 values would go in unscaled
    vectors = QNetwork((4,), 2, (8,))  # an MLP takes uint8 vectors as numbers
    assert vectors(torch.zeros(1, 4, dtype=torch.uint8)).shape == (1, 2)
    with pytest.raises(ValueError, match="input_scale must be > 0"):
        QNetwork((4,), 2, input_scale=0.0)


def test_target_copy_is_independent() -> None:
    net = QNetwork((4,), 2, (8,))
    target = copy.deepcopy(net)
    assert len(target._noisy) == 2 and all(
        a is not b for a, b in zip(target._noisy, net._noisy, strict=True)
    )
    target.reset_noise()
    assert not torch.equal(target._noisy[0].weight_epsilon, net._noisy[0].weight_epsilon)


@pytest.mark.parametrize("cfg", CONFIGS, ids=_cfg_id)
def test_meta_device_everything_stays_on_meta(cfg: dict) -> None:
    net = QNetwork(n_actions=3, **cfg).to(torch.device("meta"))
    with OpRecorder() as rec:
        net.reset_noise()
        q = net(_obs(cfg["obs_shape"], 2, "meta"))
    assert q.device.type == "meta" and q.shape == (2, 3)
    assert all(t.device.type == "meta" for t in [*net.parameters(), *net.buffers()])
    assert rec.ops_leaving("meta") == []


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("cfg", CONFIGS, ids=_cfg_id)
def test_dtype_everywhere(cfg: dict, dtype: torch.dtype) -> None:
    net = QNetwork(n_actions=3, **cfg).to(dtype)
    net.reset_noise()
    q = net(_obs(cfg["obs_shape"], 2))  # float32 vectors or uint8 frames in, converted inside
    assert q.dtype == dtype
    assert all(t.dtype == dtype for t in [*net.parameters(), *net.buffers()])


def test_no_host_sync_in_reset_and_forward() -> None:
    net = QNetwork((4,), 2, (8, 8), dueling=True)
    x = torch.randn(3, 4)
    with OpRecorder() as rec:
        net.reset_noise()
        net(x).argmax(dim=1)
    assert rec.syncing_ops() == set()


def test_gradients_reach_every_parameter() -> None:
    net = QNetwork((2, 36, 36), 3, (8,), dueling=True, input_scale=255.0)
    q = net(_obs((2, 36, 36), 4))
    # A random weighting: a plain sum would cancel the mean-subtracted advantages.
    (q * torch.randn_like(q)).sum().backward()
    for name, p in net.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_small_images_get_minatars_torso_and_large_ones_the_nature_cnn() -> None:
    small = QNetwork((6, 10, 10), 5, (128,), noisy_layers="last")
    assert isinstance(small.torso, MinAtarCNN) and small.torso.out_features == 16 * 8 * 8
    conv = small.torso.conv
    assert (conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride) == (
        6, 16, (3, 3), (1, 1)
    )
    assert [m.in_features for m in noisy_layers(small)] == [128]  # the output layer
    assert QNetwork((6, 10, 10), 5, (128,), noisy_layers="all").head[0].in_features == 1024
    assert isinstance(QNetwork((2, 36, 36), 3, (8,)).torso, NatureCNN)
    # bool grids are read as 0/1, as their float equivalents
    grids = torch.rand(3, 6, 10, 10) < 0.3
    with noise_disabled(small):
        torch.testing.assert_close(small(grids), small(grids.float()))


def test_the_der_torso_is_two_convolutions_with_their_kernel_as_stride_over_scaled_frames() -> None:
    net = QNetwork((4, 84, 84), 6, (256,), torso="der", dueling=True, noisy_layers="all",
                   input_scale=255.0)  # fmt: skip
    assert isinstance(net.torso, DataEfficientCNN) and net.torso.out_features == 576
    c1, c2 = net.torso.convs[0], net.torso.convs[2]
    assert (c1.in_channels, c1.out_channels, c1.kernel_size, c1.stride) == (4, 32, (5, 5), (5, 5))
    assert (c2.in_channels, c2.out_channels, c2.kernel_size, c2.stride) == (32, 64, (5, 5), (5, 5))
    assert [(m.in_features, m.out_features) for m in noisy_layers(net)] == [
        (576, 256), (256, 1), (576, 256), (256, 6)
    ]  # fmt: skip
    frames = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    with noise_disabled(net):
        # 0-255 frames in any dtype are divided by input_scale before the torso
        torch.testing.assert_close(net(frames), net(frames.float()))
        features = net.torso(frames.float() / 255.0)
        value, adv = net.value(features), net.advantage(features)
        torch.testing.assert_close(net(frames), value + adv - adv.mean(dim=1, keepdim=True))


def test_the_torso_key_picks_by_shape_or_refuses_one_that_does_not_fit() -> None:
    assert resolve_torso((4,)) == "mlp"
    assert resolve_torso((6, 10, 10)) == "minatar"
    assert resolve_torso((4, 84, 84)) == "nature"
    assert resolve_torso((4, 84, 84), "der") == "der" and resolve_torso((2, 25, 30), "der")
    assert resolve_torso((4, 84, 84), "minatar") == "minatar"
    least = "images of at least"
    refused = [
        ((4,), "der", f"{least} 25x25"),
        ((4, 24, 84), "der", f"{least} 25x25"),
        ((4, 30, 30), "nature", f"{least} 36x36"),
        ((4, 84, 84), "mlp", "vector observations"),
        ((4,), "minatar", f"{least} 3x3"),
    ]
    for shape, torso, what in refused:
        with pytest.raises(ValueError, match=f"torso {torso} takes {what}.*torso=auto"):
            resolve_torso(shape, torso)
    with pytest.raises(ValueError, match="torso must be one of"):
        resolve_torso((4,), "resnet")
    assert isinstance(QNetwork((4, 84, 84), 2, (8,), torso="minatar").torso, MinAtarCNN)


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="vectors"):
        QNetwork((2, 3), 2)
    with pytest.raises(ValueError, match="n_actions"):
        QNetwork((4,), 0)
    with pytest.raises(ValueError, match="noisy_layers"):
        QNetwork((4,), 2, noisy_layers="some")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="3x3"):
        QNetwork((1, 2, 20), 2)
    with pytest.raises(ValueError, match="dueling_streams"):
        QNetwork((4,), 2, dueling=True, dueling_streams="none")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="hidden layer"):
        QNetwork((4,), 2, (), dueling=True)


@pytest.mark.gpu
def test_cuda_network_rejects_cpu_input_loudly() -> None:
    net = QNetwork((4,), 2, device="cuda")
    with pytest.raises(RuntimeError, match="device"):
        net(torch.randn(2, 4))
