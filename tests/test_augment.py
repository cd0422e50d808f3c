"""DrQ's random shift of replay batches: a replicate padding and a crop, per image, every
channel alike; its generator saved and restored; on every device and dtype."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICES

from agent.augment import RandomShift, make_augment
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
    out = RandomShift(4, "cpu", seed=0)(batch)
    assert not torch.equal(out.obs, out.next_obs)  # the same frames, other offsets
    for name in ("actions", "rewards", "dones", "discounts", "indices"):
        assert getattr(out, name) is getattr(batch, name)


def test_state_dict_round_trip_continues_the_draws() -> None:
    a = RandomShift(4, "cpu", seed=7)
    a.offsets(10)
    state = a.state_dict()
    expected = a.offsets(10)
    b = RandomShift(4, "cpu", seed=99)
    b.load_state_dict(state)
    assert torch.equal(b.offsets(10), expected)


@pytest.mark.parametrize("device", [*DEVICES, "meta"])
def test_shift_keeps_device_and_dtype(device: str) -> None:
    images = torch.zeros(3, 4, 10, 10, dtype=torch.float64, device=device)
    generator_device = "cpu" if device == "meta" else device
    out = RandomShift(2, generator_device, seed=0).shift(images)
    assert out.device.type == torch.device(device).type and out.dtype == torch.float64
    assert out.shape == images.shape


def test_make_augment_names_the_augmentation() -> None:
    assert make_augment("none", torch.device("cpu"), 1) is None
    assert isinstance(make_augment("shift", torch.device("cpu"), 1), RandomShift)
    with pytest.raises(ValueError, match="augment must be one of none, shift"):
        make_augment("crop", torch.device("cpu"), 1)
