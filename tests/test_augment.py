"""Augmentations of replay batches. DrQ's random shift: a replicate padding and a crop,
per image, every channel alike. Intensity noise: one factor per image, clipped. Their
generator saved and restored; on every device and dtype."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICES

from agent.augment import Augmentation, RandomShift, intensity, make_augment
from agent.replay import Batch


def _padded_crops(images: torch.Tensor, offsets: torch.Tensor, pad: int) -> torch.Tensor:
    """The definition: pad every image by repeating its border, crop at pad + offset."""
    padded = F.pad(images.double(), (pad, pad, pad, pad), mode="replicate")
    h, w = images.shape[-2:]
    return torch.stack([
        padded[i, :, pad + dy : pad + dy + h, pad + dx : pad + dx + w]
        for i, (dy, dx) in enumerate(offsets.tolist())
    ]).to(images.dtype)  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32, torch.float64])
def test_a_shift_is_a_replicate_padding_and_a_crop_at_each_image_s_offset(
    dtype: torch.dtype,
) -> None:
    images = torch.randint(0, 256, (16, 4, 21, 17)).to(dtype)
    shift = RandomShift(4, "cpu", seed=3)
    offsets = RandomShift(4, "cpu", seed=3).offsets(16)  # the draws shift() will make
    assert offsets.abs().max() <= 4 and offsets.dtype == torch.int64
    assert torch.equal(shift.shift(images), _padded_crops(images, offsets, 4))


def test_offsets_cover_the_padding_differ_per_image_and_follow_the_seed() -> None:
    offsets = RandomShift(4, "cpu", seed=0).offsets(4000)
    assert set(offsets.flatten().tolist()) == set(range(-4, 5))  # every offset, no other
    assert len({tuple(o) for o in offsets.tolist()}) > 50  # not one offset for the batch
    assert torch.equal(offsets, RandomShift(4, "cpu", seed=0).offsets(4000))
    assert not torch.equal(offsets, RandomShift(4, "cpu", seed=1).offsets(4000))
    unmoved = torch.arange(2 * 3 * 5 * 5.0).reshape(2, 3, 5, 5)
    assert torch.equal(RandomShift(0, "cpu", seed=0).shift(unmoved), unmoved)


def test_obs_and_next_obs_move_independently_and_the_rest_stays() -> None:
    frames = torch.randint(0, 256, (32, 2, 12, 12), dtype=torch.uint8)
    batch = Batch(frames, torch.zeros(32, dtype=torch.int64), torch.ones(32), frames.clone(),
                  torch.zeros(32), torch.ones(32), torch.arange(32), None)  # fmt: skip
    out = Augmentation("cpu", 0, pad=4)(batch)
    assert not torch.equal(out.obs, out.next_obs)  # the same frames, other offsets
    for name in ("actions", "rewards", "dones", "discounts", "indices"):
        assert getattr(out, name) is getattr(batch, name)


def test_state_dict_round_trip_continues_the_draws() -> None:
    a = Augmentation("cpu", 7, pad=4)
    a.shift.offsets(10)
    state = a.state_dict()
    expected = a.shift.offsets(10)
    b = Augmentation("cpu", 99, pad=4)
    b.load_state_dict(state)
    assert torch.equal(b.shift.offsets(10), expected)


@pytest.mark.parametrize("device", [*DEVICES, "meta"])
def test_shift_keeps_device_and_dtype(device: str) -> None:
    images = torch.zeros(3, 4, 10, 10, dtype=torch.float64, device=device)
    generator_device = "cpu" if device == "meta" else device
    out = RandomShift(2, generator_device, seed=0).shift(images)
    assert out.device.type == torch.device(device).type and out.dtype == torch.float64
    assert out.shape == images.shape


def test_make_augment_names_the_augmentation() -> None:
    assert make_augment("none", torch.device("cpu"), 1) is None
    shift = make_augment("shift", torch.device("cpu"), 1)
    assert isinstance(shift, Augmentation) and shift.shift is not None
    assert shift.intensity_scale == 0
    alone = make_augment("none", torch.device("cpu"), 1, intensity_scale=0.05)
    assert alone is not None and alone.shift is None and alone.intensity_scale == 0.05
    with pytest.raises(ValueError, match="augment must be one of none, shift"):
        make_augment("crop", torch.device("cpu"), 1)


def test_intensity_multiplies_each_image_by_one_plus_its_clipped_draw() -> None:
    # A case by hand: scale 0.5 on images of ones, so each image is its factor. Draws
    # beyond +-2 are clipped: the factors stay in [1 - 2 * 0.5, 1 + 2 * 0.5] = [0, 2].
    images = torch.ones(2000, 2, 3, 3, dtype=torch.uint8)
    n = torch.randn((2000, 1, 1, 1), generator=torch.Generator().manual_seed(5))
    out = intensity(images, 0.5, torch.Generator().manual_seed(5))
    assert out.dtype == torch.float32 and out.shape == images.shape
    expected = 1 + 0.5 * n.clamp(-2, 2)
    assert torch.equal(out, expected.expand_as(out))  # every channel and pixel alike
    assert out.min() == 0.0 and out.max() == 2.0  # some draws were beyond +-2
    frames = torch.randint(0, 256, (4, 2, 3, 3), dtype=torch.uint8)
    scaled = intensity(frames, 0.05, torch.Generator().manual_seed(1))
    factor = (1 + 0.05 * torch.randn((4, 1, 1, 1), generator=torch.Generator().manual_seed(1))
              .clamp(-2, 2))  # fmt: skip
    assert torch.equal(scaled, frames.float() * factor)  # 0-255 frames stay 0-255, scaled


def test_a_shift_without_intensity_draws_what_the_shift_alone_draws() -> None:
    frames = torch.randint(0, 256, (32, 2, 12, 12), dtype=torch.uint8)
    batch = Batch(frames, torch.zeros(32, dtype=torch.int64), torch.ones(32), frames.clone(),
                  torch.zeros(32), torch.ones(32), torch.arange(32), None)  # fmt: skip
    ours, alone = Augmentation("cpu", 3, pad=4), RandomShift(4, "cpu", seed=3)
    for _ in range(3):
        a = ours(batch)
        b_obs, b_next = alone.shift(batch.obs), alone.shift(batch.next_obs)  # obs first
        assert torch.equal(a.obs, b_obs) and torch.equal(a.next_obs, b_next)
    with_noise = Augmentation("cpu", 3, pad=4, intensity_scale=0.05)(batch)
    assert with_noise.obs.dtype == torch.float32
    assert not torch.equal(with_noise.obs, Augmentation("cpu", 3, pad=4)(batch).obs.float())


def test_an_augmentation_with_intensity_resumes_its_draws() -> None:
    images = torch.randint(0, 256, (8, 2, 10, 10), dtype=torch.uint8)
    a = Augmentation("cpu", 7, pad=4, intensity_scale=0.05)
    a.images(images)
    state = a.state_dict()
    expected = a.images(images)
    b = Augmentation("cpu", 99, pad=4, intensity_scale=0.05)
    b.load_state_dict(state)
    assert torch.equal(b.images(images), expected)
    with pytest.raises(ValueError, match="intensity_scale must be >= 0"):
        Augmentation("cpu", 0, intensity_scale=-0.1)


@pytest.mark.parametrize("device", [*DEVICES, "meta"])
def test_intensity_keeps_device_and_float_dtype(device: str) -> None:
    images = torch.zeros(3, 4, 10, 10, dtype=torch.float64, device=device)
    generator = torch.Generator("cpu" if device == "meta" else device).manual_seed(0)
    out = intensity(images, 0.05, generator)
    assert out.device.type == torch.device(device).type and out.dtype == torch.float64
    assert out.shape == images.shape
