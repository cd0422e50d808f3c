"""Augmentations of the replay batches an update learns from: ``augment`` (a config key)
names one, applied to every sampled batch before the learner sees it, on every learner
path (numpy, autograd, the CUDA-graph update), on the batch's device.

``shift``: DrQ's random shift (Kostrikov et al. 2021, "Image augmentation is all you
need"): each image of a batch (an observation's whole frame stack), obs and next_obs
each on their own, padded by repeating its border pixels and cropped back to its size
at a random offset, up to :data:`SHIFT_PAD` pixels each way. Its generator is its
state (:meth:`RandomShift.state_dict`), saved in checkpoints for an exact resume.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from agent import streams
from agent.replay.base import Batch

__all__ = ["AUGMENTS", "SHIFT_PAD", "RandomShift", "make_augment"]

AUGMENTS = ("none", "shift")
SHIFT_PAD = 4  # DrQ's: 84x84 frames, padded to 92x92, cropped back to 84x84


class RandomShift:
    """Each image ``(C, H, W)`` of a batch shifted by a random offset of up to ``pad``
    pixels in each direction, the border pixels repeated into what comes in (as a
    replicate padding followed by a crop); every channel of an image alike.

    ``device``: where the batches and the generator live; ``seed``: the generator's.
    """

    def __init__(self, pad: int, device: torch.device | str, seed: int) -> None:
        if pad < 0:
            raise ValueError(f"pad must be >= 0, got {pad}")
        self.pad = int(pad)
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def __call__(self, batch: Batch) -> Batch:
        """``batch`` with its obs and next_obs shifted (independent offsets)."""
        return batch._replace(obs=self.shift(batch.obs), next_obs=self.shift(batch.next_obs))

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

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])


def make_augment(name: str, device: torch.device, seed: int) -> RandomShift | None:
    """The augmentation ``augment`` names (None for ``none``), its generator seeded from
    the run's ``seed`` on a stream of its own."""
    if name not in AUGMENTS:
        raise ValueError(f"augment must be one of {', '.join(AUGMENTS)}, got {name!r}")
    if name == "none":
        return None
    stream = int(np.random.SeedSequence([seed, streams.AUGMENT]).generate_state(1)[0])
    return RandomShift(SHIFT_PAD, device, stream)
