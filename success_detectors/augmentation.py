"""Training-time image augmentation of the CNN detector: random shift (DrQ) and colour jitter."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F


@dataclass(frozen=True)
class Augmentation:
    """Training-time image augmentation.

    Attributes:
        shift: Pixels of random translation (replicate padding, then a random crop).
        brightness: Largest brightness offset, as a share of 255.
        contrast: Largest relative contrast change.
        channel_gain: Largest relative change of each colour channel's gain.
    """

    shift: int = 4
    brightness: float = 0.08
    contrast: float = 0.15
    channel_gain: float = 0.05

    def __call__(self, pixels: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Augment ``uint8 (B, H, W, 3)`` frames; returns float frames in 0..255, same layout."""
        x = pixels.float()
        batch, height, width, _ = x.shape
        if self.shift > 0:
            # Views side by side (width a multiple of height) are shifted independently, so
            # no view borrows columns of its neighbour.
            views = width // height if width % height == 0 else 1
            x = x.reshape(batch, height, views, width // views, 3).transpose(1, 2)
            x = x.reshape(batch * views, height, width // views, 3)
            s, view_width = self.shift, width // views
            padded = F.pad(x.permute(0, 3, 1, 2), (s, s, s, s), mode="replicate")
            offsets = torch.randint(0, 2 * s + 1, (batch * views, 2), generator=generator)
            x = torch.stack([
                padded[i, :, dy:dy + height, dx:dx + view_width]
                for i, (dy, dx) in enumerate(offsets.tolist())
            ]).permute(0, 2, 3, 1)
            x = x.reshape(batch, views, height, view_width, 3).transpose(1, 2)
            x = x.reshape(batch, height, width, 3)
        uniform = torch.rand(batch, 5, generator=generator) * 2 - 1
        brightness = (self.brightness * 255 * uniform[:, 0]).view(batch, 1, 1, 1)
        contrast = (1 + self.contrast * uniform[:, 1]).view(batch, 1, 1, 1)
        gain = (1 + self.channel_gain * uniform[:, 2:5]).view(batch, 1, 1, 3)
        mean = x.mean(dim=(1, 2, 3), keepdim=True)
        x = ((x - mean) * contrast + mean) * gain + brightness
        return x.clamp_(0, 255).contiguous(memory_format=torch.contiguous_format)
