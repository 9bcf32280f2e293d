"""The network of the CNN detector: a small convolutional success classifier, in plain PyTorch.

Architecture: four convolutions (5x5 stride 2, 3x3 stride 2, 3x3, 3x3 stride 2) with ReLU, global
max and mean pooling (a cube on the goal is a local pattern wherever it is), and a two-layer head
giving one logit. Frames enter as ``uint8 (N, H, W, 3)`` RGB; the channel-last layout is kept in
memory (``channels_last``), which is what makes batched inference fast on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn


@dataclass(frozen=True)
class Architecture:
    """Layer sizes of :class:`SuccessCNN`.

    Attributes:
        channels: Output channels of the four convolutions.
        keypoints: Spatial-softmax keypoints read off the stride-4 features (0: none).
        hidden: Width of the two hidden layers of the head.
        margin_head: A second head regressing the signed distance to the success boundary
            (:meth:`SuccessCNN.forward_with_margin`). Trained where the simulator gives that
            distance, it teaches the features to measure how far the object is from success,
            which a binary label says little about near the boundary. Inference ignores it.
        views: Square camera views side by side in each frame (``camera="front+overhead"``
            gives 2): the same convolutions read each view, and the head reads the features of
            all of them, so one view can see what the gripper hides from the other.
    """

    channels: tuple[int, int, int, int] = (16, 32, 32, 64)
    keypoints: int = 16
    hidden: int = 128
    margin_head: bool = False
    views: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "channels", tuple(int(c) for c in self.channels))
        if len(self.channels) != 4 or min(self.channels) < 1:
            raise ValueError(f"channels={self.channels}; expected four positive integers")
        if int(self.keypoints) < 0:
            raise ValueError(f"keypoints={self.keypoints}; expected an integer >= 0")
        if int(self.hidden) < 1:
            raise ValueError(f"hidden={self.hidden}; expected a positive integer")
        if int(self.views) < 1:
            raise ValueError(f"views={self.views}; expected a positive integer")


def _conv(in_channels: int, out_channels: int, kernel: int, stride: int) -> list[nn.Module]:
    return [nn.Conv2d(in_channels, out_channels, kernel, stride, padding=kernel // 2),
            nn.ReLU(inplace=True)]


class SpatialSoftmax(nn.Module):
    """Feature maps ``(N, K, H, W)`` -> expected image coordinates in [-1, 1] and the peak of each
    map, ``(N, 3K)`` (Levine et al. 2016, "End-to-end training of deep visuomotor policies").

    The expectation locates a feature to a fraction of a pixel, which is what telling a cube on
    the goal from one a centimetre beside it needs (about one pixel at 84x84).
    """

    def __init__(self) -> None:
        super().__init__()
        self.log_temperature = nn.Parameter(torch.zeros(()))

    def forward(self, maps: torch.Tensor) -> torch.Tensor:
        n, k, h, w = maps.shape
        flat = maps.reshape(n, k, h * w)
        weights = torch.softmax(flat / self.log_temperature.exp(), dim=-1).view(n, k, h, w)
        ys = torch.linspace(-1, 1, h, device=maps.device)
        xs = torch.linspace(-1, 1, w, device=maps.device)
        x = (weights.sum(dim=2) * xs).sum(dim=-1)
        y = (weights.sum(dim=3) * ys).sum(dim=-1)
        return torch.cat((x, y, flat.amax(dim=-1)), dim=1)


class SuccessCNN(nn.Module):
    """``uint8 (N, H, W, 3)`` frames -> success logits ``(N,)``.

    Args:
        architecture: Layer sizes.
        mean: Per-channel mean of the training frames, 0..255 units.
        std: Per-channel standard deviation of the training frames, 0..255 units.
    """

    def __init__(
        self,
        architecture: Architecture | None = None,
        mean: tuple[float, float, float] = (127.5, 127.5, 127.5),
        std: tuple[float, float, float] = (64.0, 64.0, 64.0),
    ) -> None:
        super().__init__()
        self.architecture = arch = architecture or Architecture()
        c = arch.channels
        self.trunk = nn.Sequential(*_conv(3, c[0], 5, 2), *_conv(c[0], c[1], 3, 2),
                                   *_conv(c[1], c[2], 3, 1))
        self.pooled = nn.Sequential(*_conv(c[2], c[3], 3, 2))
        features = 2 * c[3]
        self.keypoints = None
        if arch.keypoints:
            self.keypoints = nn.Sequential(nn.Conv2d(c[2], arch.keypoints, 1), SpatialSoftmax())
            features += 3 * arch.keypoints
        features *= arch.views
        self.head = nn.Sequential(
            nn.Linear(features, arch.hidden), nn.ReLU(inplace=True),
            nn.Linear(arch.hidden, arch.hidden), nn.ReLU(inplace=True),
            nn.Linear(arch.hidden, 1),
        )
        self.margin_head = None
        if arch.margin_head:
            self.margin_head = nn.Sequential(
                nn.Linear(features, arch.hidden), nn.ReLU(inplace=True),
                nn.Linear(arch.hidden, 1),
            )
        for module in self.modules():
            # He initialisation: PyTorch's default shrinks the signal layer by layer, which
            # leaves this net on a flat loss for the first epochs.
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
                nn.init.zeros_(module.bias)
        # Not in the state dict: the checkpoint's ``normalisation`` entry is the one copy.
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1),
                             persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1),
                             persistent=False)
        self.to(memory_format=torch.channels_last)

    def _features(self, pixels: torch.Tensor) -> torch.Tensor:
        views = self.architecture.views
        if views > 1:  # (N, H, V*W, 3) -> (N*V, H, W, 3): every view through the same trunk
            n, h, w, _ = pixels.shape
            pixels = pixels.reshape(n, h, views, w // views, 3).transpose(1, 2)
            pixels = pixels.reshape(n * views, h, w // views, 3)
        x = pixels.permute(0, 3, 1, 2).float()  # a channels_last view of the NHWC frames
        x = self.trunk((x - self.mean) / self.std)
        pooled = self.pooled(x)
        parts = [pooled.amax(dim=(2, 3)), pooled.mean(dim=(2, 3))]
        if self.keypoints is not None:
            parts.append(self.keypoints(x))
        features = torch.cat(parts, dim=1)
        return features.reshape(len(features) // views, -1)  # the views' features side by side

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """Logits ``(N,)`` for ``uint8`` (or float 0..255) frames ``(N, H, W, 3)``."""
        return self.head(self._features(pixels)).squeeze(1)

    def forward_with_margin(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``(N,)`` and predicted margins ``(N,)`` in centimetres (needs ``margin_head``)."""
        if self.margin_head is None:
            raise ValueError("this SuccessCNN has no margin head (architecture.margin_head)")
        features = self._features(pixels)
        return self.head(features).squeeze(1), self.margin_head(features).squeeze(1)


def predict_pixels(model: SuccessCNN, pixels: np.ndarray, batch_size: int = 256) -> np.ndarray:
    """Success probabilities ``float64 (N,)`` of validated ``uint8 (N, H, W, 3)`` frames."""
    model.eval()
    if len(pixels) == 0:
        return np.zeros(0, dtype=np.float64)
    out = []
    with torch.inference_mode():
        for start in range(0, len(pixels), batch_size):
            chunk = torch.from_numpy(np.ascontiguousarray(pixels[start:start + batch_size]))
            out.append(torch.sigmoid(model(chunk)).double().numpy())
    return np.concatenate(out)
