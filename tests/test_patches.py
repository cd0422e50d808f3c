"""Patch convolutions (a stride equal to the kernel): the patches as F.unfold cuts them,
their adjoint, and which convolutions read disjoint patches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from agent.numpy_backend.patches import patch_conv_geometry, patches, unpatch


@pytest.mark.parametrize("shape", [(3, 4, 84, 84), (2, 3, 27, 31), (1, 2, 10, 10)])
@pytest.mark.parametrize("dtype", [np.uint8, np.float32, np.float64])
def test_patches_are_unfold_s_in_the_weight_s_order(shape: tuple[int, ...], dtype: type) -> None:
    k = 5
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, shape).astype(dtype)
    b, c, h, w = shape
    got = patches(x, k, channels_last=False)
    assert got.shape == (b, h // k, w // k, c * k * k) and got.dtype == x.dtype
    # unfold: (B, C*k*k, L) in the (C, k, k) order of a convolution's weight
    expected = F.unfold(torch.from_numpy(x).double(), k, stride=k)
    assert np.array_equal(got.reshape(b, -1, c * k * k).transpose(0, 2, 1), expected.numpy())


@pytest.mark.parametrize("shape", [(3, 16, 16, 32), (2, 11, 7, 3)])
def test_channels_last_patches_are_ordered_kernel_then_channel(shape: tuple[int, ...]) -> None:
    k = 5
    x = np.random.default_rng(1).standard_normal(shape)
    b, h, w, c = shape
    got = patches(x, k, channels_last=True)
    expected = F.unfold(torch.from_numpy(x).permute(0, 3, 1, 2), k, stride=k)  # (C, k, k) order
    expected = expected.reshape(b, c, k, k, -1).permute(0, 4, 2, 3, 1)  # -> (L, k, k, C)
    assert np.array_equal(got, expected.reshape(b, h // k, w // k, k * k * c).numpy())


@pytest.mark.parametrize("channels_last", [False, True])
def test_unpatch_is_the_adjoint_of_patches(channels_last: bool) -> None:
    """<patches(x), g> == <x, unpatch(g)>, and the dropped rows and columns get zeros."""
    rng = np.random.default_rng(2)
    shape = (2, 12, 13, 3) if channels_last else (2, 3, 12, 13)
    x = rng.standard_normal(shape)
    p = patches(x, 5, channels_last)
    g = rng.standard_normal(p.shape)
    back = unpatch(g, 5, shape, channels_last)
    assert back.shape == shape
    assert np.isclose((p * g).sum(), (x * back).sum(), rtol=1e-12)
    dropped = back[:, 10:] if channels_last else back[:, :, 10:]
    assert not dropped.any()


def test_patch_geometry_is_a_square_kernel_with_its_own_stride_and_nothing_else() -> None:
    assert patch_conv_geometry(nn.Conv2d(4, 8, 5, stride=5)) == 5
    assert patch_conv_geometry(nn.Conv2d(4, 8, 2, stride=2, bias=False)) == 2
    for conv in (
        nn.Conv2d(4, 8, 5, stride=4),
        nn.Conv2d(4, 8, 5, stride=5, padding=1),
        nn.Conv2d(4, 8, 5, stride=5, dilation=2),
        nn.Conv2d(4, 8, 5, stride=5, groups=4),
        nn.Conv2d(4, 8, (5, 3), stride=(5, 3)),
        nn.Linear(4, 8),
    ):
        assert patch_conv_geometry(conv) is None, conv
