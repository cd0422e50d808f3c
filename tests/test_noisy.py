"""NoisyLinear: initialisation, factorised noise, in-place buffers, devices and dtypes."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICES, OpRecorder
from torch import nn

from agent.noisy import (
    NoisyLinear,
    noise_disabled,
    noisy_layers,
    reset_noise,
    set_noise,
    signed_sqrt_,
    store_factors,
)
from agent.numpy_backend import NumpyForward


@pytest.mark.parametrize("device", DEVICES)
def test_init_ranges(device: str) -> None:
    torch.manual_seed(0)
    layer = NoisyLinear(50, 30, sigma0=0.4, device=device)
    bound = 1 / math.sqrt(50)
    for mu in (layer.weight_mu, layer.bias_mu):
        assert mu.min() >= -bound and mu.max() <= bound
        # Uniform over the whole range, not a constant or a narrow band.
        assert mu.max() - mu.min() > bound
    torch.testing.assert_close(layer.weight_sigma, torch.full_like(layer.weight_sigma, 0.4 * bound))
    torch.testing.assert_close(layer.bias_sigma, torch.full_like(layer.bias_sigma, 0.4 * bound))
    assert {n for n, _ in layer.named_parameters()} == {
        "weight_mu",
        "weight_sigma",
        "bias_mu",
        "bias_sigma",
    }


def test_noise_is_factorised_rank_one() -> None:
    layer = NoisyLinear(7, 5)
    layer.reset_noise()
    eps_w = layer.weight_epsilon
    assert torch.linalg.matrix_rank(eps_w) == 1
    # The bias noise is the output factor; the weight noise is its outer product
    # with the input factor.
    torch.testing.assert_close(layer.bias_epsilon, layer.epsilon_out)
    torch.testing.assert_close(eps_w, torch.outer(layer.epsilon_out, layer.epsilon_in))
    # Each factor is f(x) = sgn(x) sqrt(|x|): its square is |x|, so f(x)^2 is folded-normal.
    assert (layer.epsilon_in.abs() > 0).all()


def test_noise_statistics_match_f_of_standard_normal() -> None:
    layer = NoisyLinear(20_000, 1)
    gen = torch.Generator().manual_seed(1)
    layer.reset_noise(gen)
    e = layer.epsilon_in
    # E[f(x)^2] = E|x| = sqrt(2/pi) for x ~ N(0, 1); f is odd, so E[f(x)] = 0.
    assert abs(e.pow(2).mean().item() - math.sqrt(2 / math.pi)) < 0.02
    assert abs(e.mean().item()) < 0.02
    # E[f(x)^4] = E[x^2] = 1.
    assert abs(e.pow(4).mean().item() - 1.0) < 0.05


def test_reset_noise_is_fresh_and_keeps_addresses() -> None:
    layer = NoisyLinear(6, 4)
    buffers = dict(layer.named_buffers())
    ptrs = {n: b.data_ptr() for n, b in buffers.items()}
    before = {n: b.clone() for n, b in buffers.items()}
    layer.reset_noise()
    for name, buf in layer.named_buffers():
        assert buf is buffers[name], f"{name} was reassigned"
        assert buf.data_ptr() == ptrs[name], f"{name} moved"
        assert not torch.equal(buf, before[name]), f"{name} was not resampled"


def test_generator_makes_noise_reproducible() -> None:
    a, b = NoisyLinear(5, 3), NoisyLinear(5, 3)
    a.reset_noise(torch.Generator().manual_seed(7))
    b.reset_noise(torch.Generator().manual_seed(7))
    torch.testing.assert_close(a.weight_epsilon, b.weight_epsilon, rtol=0, atol=0)


def test_scaled_noise_is_the_same_draw_scaled() -> None:
    full, half = NoisyLinear(5, 3), NoisyLinear(5, 3)
    full.reset_noise(torch.Generator().manual_seed(3))
    half.reset_noise(torch.Generator().manual_seed(3), scale=0.5)
    torch.testing.assert_close(half.weight_epsilon, 0.5 * full.weight_epsilon)
    torch.testing.assert_close(half.bias_epsilon, 0.5 * full.bias_epsilon)
    assert torch.equal(half.epsilon_in, full.epsilon_in)  # one factor scaled, not both


def test_every_path_stores_the_same_noise_from_the_same_normals() -> None:
    # A lone layer's draw and a seed axis of layers (the stacked seeds) turn the same
    # standard normals into the same bits, through signed_sqrt_ and store_factors.
    def generator(seed: int) -> torch.Generator:
        return torch.Generator().manual_seed(seed)

    normals = torch.stack(
        [torch.empty(5 + 4, dtype=torch.float64).normal_(generator=generator(s)) for s in range(3)]
    )
    factors = signed_sqrt_(normals.clone())
    stacked_eps = torch.empty(3, 9, dtype=torch.float64)
    stacked_w = torch.empty(3, 4, 5, dtype=torch.float64)
    store_factors(factors, stacked_eps, stacked_w, 5, scale=0.5)
    for seed in range(3):
        layer = NoisyLinear(5, 4, dtype=torch.float64)
        layer.reset_noise(generator(seed), scale=0.5)
        assert torch.equal(layer.epsilon, stacked_eps[seed])
        assert torch.equal(layer.weight_epsilon, stacked_w[seed])
        assert torch.equal(layer.weight_epsilon, torch.outer(layer.epsilon_out, layer.epsilon_in))
    # f(x) = sgn(x) sqrt(|x|), elementwise.
    assert torch.equal(factors, normals.sign() * normals.abs().sqrt())
    # The numpy acting path draws its normals and f() with numpy (torch's vectorised sqrt
    # may differ in the last bit), then stores them the same way.
    layer = NoisyLinear(5, 4, dtype=torch.float64)
    NumpyForward.build(nn.Sequential(layer), np.random.default_rng(4)).resample()
    numpy_normals = torch.from_numpy(np.random.default_rng(4).standard_normal(9))
    torch.testing.assert_close(layer.epsilon, signed_sqrt_(numpy_normals), rtol=1e-15, atol=0)
    assert torch.equal(layer.weight_epsilon, torch.outer(layer.epsilon_out, layer.epsilon_in))


def test_forward_matches_formula_and_gradients_reach_mu_and_sigma() -> None:
    torch.manual_seed(0)
    layer = NoisyLinear(5, 3)
    x = torch.randn(8, 5)
    y = layer(x)
    w = layer.weight_mu + layer.weight_sigma * torch.outer(layer.epsilon_out, layer.epsilon_in)
    b = layer.bias_mu + layer.bias_sigma * layer.epsilon_out
    torch.testing.assert_close(y, x @ w.T + b)
    y.square().sum().backward()
    for p in layer.parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0


def test_noise_off_is_the_mean_linear_map_and_deterministic() -> None:
    layer = NoisyLinear(5, 3)
    x = torch.randn(4, 5)
    with noise_disabled(layer):
        y1 = layer(x)
        layer.reset_noise()
        y2 = layer(x)
        # Independent of train()/eval().
        layer.eval()
        y3 = layer(x)
    torch.testing.assert_close(y1, F.linear(x, layer.weight_mu, layer.bias_mu))
    torch.testing.assert_close(y1, y2, rtol=0, atol=0)
    torch.testing.assert_close(y1, y3, rtol=0, atol=0)
    assert layer.noise_enabled, "the context manager restores the switch"
    assert not torch.allclose(layer(x), y1)


def test_set_noise_and_helpers_cover_a_whole_network() -> None:
    net = torch.nn.Sequential(NoisyLinear(3, 4), torch.nn.ReLU(), NoisyLinear(4, 2))
    assert len(noisy_layers(net)) == 2
    set_noise(net, False)
    assert not any(m.noise_enabled for m in noisy_layers(net))
    set_noise(net, True)
    before = [m.weight_epsilon.clone() for m in noisy_layers(net)]
    reset_noise(net)
    assert all(
        not torch.equal(b, m.weight_epsilon) for b, m in zip(before, noisy_layers(net), strict=True)
    )


def test_state_dict_round_trip() -> None:
    src = NoisyLinear(4, 3)
    buf = io.BytesIO()
    torch.save(src.state_dict(), buf)
    buf.seek(0)
    dst = NoisyLinear(4, 3)
    ptrs = {n: t.data_ptr() for n, t in dst.state_dict().items()}
    dst.load_state_dict(torch.load(buf, weights_only=True))
    x = torch.randn(2, 4)
    torch.testing.assert_close(dst(x), src(x), rtol=0, atol=0)
    # load_state_dict copies in place: a captured graph would stay valid.
    assert {n: t.data_ptr() for n, t in dst.state_dict().items()} == ptrs


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_dtype_is_kept_everywhere(dtype: torch.dtype) -> None:
    layer = NoisyLinear(6, 4, dtype=dtype)
    layer.reset_noise()
    y = layer(torch.randn(3, 6, dtype=dtype))
    assert y.dtype == dtype
    for t in [*layer.parameters(), *layer.buffers()]:
        assert t.dtype == dtype
    moved = NoisyLinear(6, 4).to(dtype)
    moved.reset_noise()
    assert all(b.dtype == dtype for b in moved.buffers())


def test_meta_device_proves_no_hard_coded_device() -> None:
    layer = NoisyLinear(6, 4).to(torch.device("meta"))
    with OpRecorder() as rec:
        layer.reset_noise()
        y = layer(torch.empty(3, 6, device="meta"))
    assert y.device.type == "meta"
    for t in [*layer.parameters(), *layer.buffers()]:
        assert t.device.type == "meta"
    assert rec.ops_leaving("meta") == []
    # Built directly on meta too.
    direct = NoisyLinear(6, 4, device="meta")
    direct.reset_noise()
    assert all(b.device.type == "meta" for b in direct.buffers())


def test_no_host_sync_in_reset_and_forward() -> None:
    layer = NoisyLinear(6, 4)
    x = torch.randn(3, 6)
    with OpRecorder() as rec:
        layer.reset_noise()
        layer(x)
    assert rec.syncing_ops() == set(), rec.syncing_ops()
    assert "aten.normal_" in rec.ops, "noise must be drawn by torch on the layer's device"


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="positive sizes"):
        NoisyLinear(0, 3)
    with pytest.raises(ValueError, match="sigma0"):
        NoisyLinear(3, 3, sigma0=-1.0)


@pytest.mark.gpu
def test_cuda_noise_is_drawn_on_cuda_and_keeps_addresses() -> None:
    layer = NoisyLinear(8, 4, device="cuda")
    ptrs = [b.data_ptr() for b in layer.buffers()]
    with OpRecorder() as rec:
        layer.reset_noise()
        y = layer(torch.randn(2, 8, device="cuda"))
    assert y.device.type == "cuda"
    assert all(b.device.type == "cuda" for b in layer.buffers())
    assert [b.data_ptr() for b in layer.buffers()] == ptrs
    assert rec.ops_leaving("cuda") == []
    assert rec.syncing_ops() == set()


@pytest.mark.gpu
def test_cuda_layer_rejects_cpu_input_loudly() -> None:
    layer = NoisyLinear(8, 4, device="cuda")
    with pytest.raises(RuntimeError, match="device"):
        layer(torch.randn(2, 8))


@pytest.mark.parametrize("device", DEVICES)
def test_moved_layer_draws_noise_where_it_was_moved(device: str) -> None:
    layer = NoisyLinear(8, 4).to(device)
    layer.reset_noise()
    eps = layer.weight_epsilon
    assert eps.device.type == device and layer.epsilon.device.type == device
    assert bool(layer.epsilon.ne(0).all())
    # Rank one, in the buffer's own precision: each float32 product is rounded, so
    # the matrix is rank one to float32's tolerance, not to float64's.
    assert torch.linalg.matrix_rank(eps) == 1
    assert torch.equal(eps, torch.outer(layer.epsilon_out, layer.epsilon_in))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rows", [1, 2])
def test_factorised_forward_of_a_few_rows_is_the_same_function(
    rows: int, dtype: torch.dtype
) -> None:
    # A large layer and a few rows take the factorised form (no noisy weight matrix):
    # same values and the same gradients as the materialised formula, in any dtype, on
    # meta, with no host sync.
    from agent.noisy import FACTORISED_MAX_ROWS, FACTORISED_MIN_WEIGHTS

    torch.manual_seed(0)
    layer = NoisyLinear(512, 256, dtype=dtype)
    assert layer.weight_mu.numel() >= FACTORISED_MIN_WEIGHTS
    factorised = rows <= FACTORISED_MAX_ROWS
    x = torch.randn(rows, 512, dtype=dtype)
    with OpRecorder() as rec:
        y = layer(x)
    matmuls = sum(op in ("aten.mm", "aten.addmm") for op in rec.ops)
    assert matmuls == (2 if factorised else 1)  # factorised: mean and noise, no noisy matrix
    assert rec.syncing_ops() == set()
    w = layer.weight_mu + layer.weight_sigma * torch.outer(layer.epsilon_out, layer.epsilon_in)
    b = layer.bias_mu + layer.bias_sigma * layer.epsilon_out
    expected = x @ w.T + b
    tol = {} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(y, expected, **tol)
    # The reference is built from the parameters too, so autograd gives its gradients.
    params = list(layer.parameters())
    grads = torch.autograd.grad(y.square().sum(), params)
    ref_grads = torch.autograd.grad(expected.square().sum(), params)
    grad_tol = {} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-4}
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, **grad_tol)
    meta = NoisyLinear(512, 256, device="meta")
    assert meta(torch.empty(rows, 512, device="meta")).device.type == "meta"
