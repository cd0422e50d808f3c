"""Augmentations of the replay batches an update learns from, applied to every sampled
batch before the learner sees it, on every learner path (numpy, autograd, the CUDA-graph
update), on the batch's device (:class:`Augmentation`): ``augment`` (a config key) names
a shift, ``intensity_scale`` (another) adds intensity noise after it.

``shift``: DrQ's random shift (Kostrikov et al. 2021, "Image augmentation is all you
need"): each image of a batch (an observation's whole frame stack), obs and next_obs
each on their own, padded by repeating its border pixels and cropped back to its size
at a random offset, up to :data:`SHIFT_PAD` pixels each way.

Intensity: each image multiplied by ``1 + scale * clip(n, -2, 2)``, one ``n ~ N(0, 1)``
per image, as SPR (Schwarzer et al. 2021) and DrQ(epsilon) (Agarwal et al. 2021) use it
with a scale of 0.05. The result is floats (0-255 frames stay 0-255, times the factor):
the network scales them as it scales frames.

Both draw from one generator, the augmentation's state
(:meth:`Augmentation.state_dict`), saved in checkpoints for an exact resume; without
intensity noise a shift draws exactly the offsets :class:`RandomShift` alone draws.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from agent import streams
from agent.replay.base import Batch

__all__ = ["AUGMENTS", "SHIFT_PAD", "Augmentation", "RandomShift", "intensity", "make_augment"]

AUGMENTS = ("none", "shift")
SHIFT_PAD = 4  # DrQ's: 84x84 frames, padded to 92x92, cropped back to 84x84


class RandomShift:
    """Each image ``(C, H, W)`` of a batch shifted by a random offset of up to ``pad``
    pixels in each direction, the border pixels repeated into what comes in (as a
    replicate padding followed by a crop); every channel of an image alike. The shift
    step of :class:`Augmentation`, which applies it to batches and saves its generator.

    ``device``: where the batches and the generator live; ``seed``: the generator's.
    """

    def __init__(self, pad: int, device: torch.device | str, seed: int) -> None:
        if pad < 0:
            raise ValueError(f"pad must be >= 0, got {pad}")
        self.pad = int(pad)
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def offsets(self, batch_size: int) -> torch.Tensor:
        """``(batch_size, 2)`` offsets (rows, columns) in ``[-pad, pad]``, the next draws,
        on the generator's device."""
        span = 2 * self.pad + 1
        return torch.randint(0, span, (batch_size, 2), generator=self.generator,
                             device=self.generator.device) - self.pad  # fmt: skip

    def shift(self, images: torch.Tensor) -> torch.Tensor:
        """``images`` ``(B, C, H, W)`` (any dtype), each moved by its own offset."""
        if images.dim() != 4:
            raise ValueError(f"RandomShift takes images (B, C, H, W), got {tuple(images.shape)}")
        b, c, h, w = images.shape
        offsets = self.offsets(b).to(images.device)  # no copy where the generator lives
        rows = (torch.arange(h, device=images.device) + offsets[:, :1]).clamp_(0, h - 1)
        cols = (torch.arange(w, device=images.device) + offsets[:, 1:]).clamp_(0, w - 1)
        index = (rows[:, :, None] * w + cols[:, None, :]).reshape(b, 1, h * w)  # (B, 1, H*W)
        flat = images.reshape(b, c, h * w)
        return flat.gather(2, index.expand(b, c, h * w)).reshape(b, c, h, w)


def intensity(images: torch.Tensor, scale: float, generator: torch.Generator) -> torch.Tensor:
    """``images`` ``(B, C, H, W)`` as floats, each multiplied by ``1 + scale * clip(n, -2, 2)``
    with its own ``n ~ N(0, 1)`` (the next ``B`` draws of ``generator``)."""
    if images.dim() != 4:
        raise ValueError(f"intensity takes images (B, C, H, W), got {tuple(images.shape)}")
    n = torch.randn((images.shape[0], 1, 1, 1), generator=generator, dtype=torch.float32,
                    device=generator.device)  # fmt: skip
    factor = n.clamp_(-2.0, 2.0).mul_(scale).add_(1.0).to(images.device)
    x = images if images.is_floating_point() else images.float()
    return x * factor.to(x.dtype)


class Augmentation:
    """A shift (``pad``, or None for none) then intensity noise (``intensity_scale``, 0 for
    none) of every image of a batch, obs and next_obs each on their own, all drawn from
    one generator on ``device``, seeded with ``seed``."""

    def __init__(
        self, device: torch.device | str, seed: int, pad: int | None = None,
        intensity_scale: float = 0.0,
    ) -> None:  # fmt: skip
        if intensity_scale < 0:
            raise ValueError(f"intensity_scale must be >= 0, got {intensity_scale}")
        self.shift = None if pad is None else RandomShift(pad, device, seed)
        self.generator = (
            self.shift.generator if self.shift is not None
            else torch.Generator(device=device).manual_seed(seed)
        )  # fmt: skip
        self.intensity_scale = float(intensity_scale)

    def __call__(self, batch: Batch) -> Batch:
        """``batch`` with its obs and next_obs augmented (independent draws, obs first)."""
        return batch._replace(obs=self.images(batch.obs), next_obs=self.images(batch.next_obs))

    def images(self, images: torch.Tensor) -> torch.Tensor:
        """``images`` ``(B, C, H, W)`` shifted, then scaled, as this augmentation does."""
        if self.shift is not None:
            images = self.shift.shift(images)
        if self.intensity_scale > 0:
            images = intensity(images, self.intensity_scale, self.generator)
        return images

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])


def make_augment(
    name: str, device: torch.device, seed: int, intensity_scale: float = 0.0
) -> Augmentation | None:
    """The augmentation ``augment`` names with ``intensity_scale``'s noise after it (None for
    ``none`` without noise), its generator seeded from the run's ``seed`` on a stream of
    its own."""
    if name not in AUGMENTS:
        raise ValueError(f"augment must be one of {', '.join(AUGMENTS)}, got {name!r}")
    if name == "none" and intensity_scale == 0:
        return None
    stream = int(np.random.SeedSequence([seed, streams.AUGMENT]).generate_state(1)[0])
    pad = SHIFT_PAD if name == "shift" else None
    return Augmentation(device, stream, pad, intensity_scale)
