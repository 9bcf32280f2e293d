"""A small convolutional success classifier on camera frames, in plain PyTorch.

**Task conditioning: one model per task.** A checkpoint is trained on, and only accepted for, one
task and one camera; the model reads pixels only. This keeps the classifier small (about 40k
parameters, several thousand 84x84 frames/s on one core) and lets each task's detector be trained,
audited and replaced on its own. The price: where the image alone cannot tell the target from a
distractor (``push`` names its cube in the instruction), a distractor pushed onto the target looks
like success; the scripted data of ``scripts/collect_detector_data.py`` labels such frames negative,
so the test metrics count these errors.

Architecture: four convolutions (5x5 stride 2, 3x3 stride 2, 3x3, 3x3 stride 2) with ReLU, global
max and mean pooling (a cube on the goal is a local pattern wherever it is), and a two-layer head
giving one logit. Frames enter as ``uint8 (N, H, W, 3)`` RGB; the channel-last layout is kept in
memory (``channels_last``), which is what makes batched inference fast on a CPU.

**Checkpoint** (``torch.save`` of plain values, loaded with ``weights_only=True``): ``format``,
``version``, ``task``, ``camera``, ``image_size``, ``threshold``, ``normalisation`` (per-channel
``mean`` and ``std`` in 0..255 units), ``architecture``, ``state_dict`` and ``training`` (a summary
of how it was trained). It is written to a temporary file and renamed over the target, so a crash
never leaves a partial checkpoint where a good one was.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from success_detectors.base import SuccessDetector, check_threshold

CHECKPOINT_FORMAT = "success_detectors.cnn"
CHECKPOINT_VERSION = 1
CHECKPOINT_KEYS = (
    "format", "version", "task", "camera", "image_size", "threshold", "normalisation",
    "architecture", "state_dict",
)


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


def check_pixels(pixels: Any, image_size: int | None = None, views: int = 1) -> np.ndarray:
    """Validate a batch of frames and return it as a ``uint8 (N, H, W, 3)`` array.

    Args:
        pixels: The frames (numpy array or torch tensor).
        image_size: The side the detector expects, or ``None`` to accept any square size.
        views: Square views side by side in each frame: the width must be ``views`` x the height.

    Raises:
        ValueError: Wrong dtype (e.g. float frames), a single image without a batch axis,
            channel-first layout, a channel count other than 3, or a size the detector was not
            trained at; the message names the problem and the fix.
    """
    if isinstance(pixels, torch.Tensor):
        pixels = pixels.detach().cpu().numpy()
    pixels = np.asarray(pixels)
    shape = tuple(pixels.shape)
    if pixels.dtype != np.uint8:
        raise ValueError(
            f"pixels have dtype {pixels.dtype}; expected uint8 RGB in 0..255 as the cameras "
            "render them (do not scale or normalise frames: the detector does that itself)"
        )
    if pixels.ndim == 3 and shape[-1] == 3:
        raise ValueError(
            f"pixels have shape {shape}, a single image; expected a batch (N, H, W, 3): "
            "pass pixels[None]"
        )
    if pixels.ndim != 4:
        raise ValueError(f"pixels have shape {shape}; expected a batch (N, H, W, 3)")
    if shape[1] in (1, 3, 4) and shape[-1] not in (1, 3, 4):
        raise ValueError(
            f"pixels have shape {shape}, which looks channel-first (N, C, H, W); expected "
            "channel-last (N, H, W, 3): use pixels.transpose(0, 2, 3, 1)"
        )
    if shape[-1] != 3:
        raise ValueError(
            f"pixels have {shape[-1]} channel(s) (shape {shape}); expected RGB with 3 "
            "(drop the alpha channel or convert grey images to RGB)"
        )
    if image_size is not None and shape[1:3] != (image_size, views * image_size):
        what = f"{image_size}x{image_size} frames" if views == 1 else (
            f"{views} {image_size}x{image_size} views side by side ({image_size}x"
            f"{views * image_size}; render_camera with the detector's camera gives them)")
        raise ValueError(f"pixels are {shape[1]}x{shape[2]} (height x width); this detector was "
                         f"trained on {what} (render with image_size={image_size})")
    return pixels


class CNNDetector(SuccessDetector):
    """A learned detector on one camera's frames of one task.

    Args:
        model: The trained network.
        task: Task it was trained for.
        camera: Camera whose frames it reads.
        image_size: Side of the square frames it reads.
        threshold: Probability at or above which a frame counts as success.
        training_summary: How it was trained (plain values, kept in the checkpoint).
        batch_size: Frames per forward pass in :meth:`predict_proba`.
    """

    requires: ClassVar[tuple[str, ...]] = ("pixels",)

    def __init__(
        self,
        model: SuccessCNN,
        task: str,
        camera: str,
        image_size: int,
        threshold: float = 0.5,
        training_summary: Mapping[str, Any] | None = None,
        batch_size: int = 256,
    ) -> None:
        super().__init__(threshold=threshold, task=task, camera=camera, image_size=int(image_size))
        views = len(camera.split("+"))
        if views != model.architecture.views:
            raise ValueError(f"camera={camera!r} names {views} view(s) but the network reads "
                             f"{model.architecture.views}")
        self.model = model.eval()
        self.training_summary = dict(training_summary or {})
        self.batch_size = int(batch_size)

    def predict_proba(self, batch: Mapping[str, Any]) -> np.ndarray:
        self._require(batch)
        pixels = check_pixels(batch["pixels"], self.image_size, self.model.architecture.views)
        return predict_pixels(self.model, pixels, self.batch_size)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the checkpoint atomically; returns its path."""
        return save_checkpoint(
            path, self.model, task=self.task, camera=self.camera, image_size=self.image_size,
            threshold=self.threshold, training_summary=self.training_summary,
        )


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


def write_atomically(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Call ``write(temp_path)`` on a temporary file beside ``path``, then rename it over ``path``.

    ``os.replace`` is atomic on one filesystem, so readers see the old file or the new one, never
    a partial write. The temporary file is removed if ``write`` fails.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(handle)
    temp = Path(temp_name)
    try:
        write(temp)
        with open(temp, "rb+") as file:
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return path


def save_checkpoint(
    path: str | os.PathLike,
    model: SuccessCNN,
    *,
    task: str,
    camera: str,
    image_size: int,
    threshold: float,
    training_summary: Mapping[str, Any] | None = None,
) -> Path:
    """Write a CNN detector checkpoint atomically (see the module docstring for its keys)."""
    checkpoint = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "task": str(task),
        "camera": str(camera),
        "image_size": int(image_size),
        "threshold": check_threshold(threshold),
        "normalisation": {
            "mean": [float(v) for v in model.mean.flatten()],
            "std": [float(v) for v in model.std.flatten()],
        },
        "architecture": {**asdict(model.architecture),
                         "channels": list(model.architecture.channels)},
        "state_dict": {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()},
        "training": dict(training_summary or {}),
    }
    return write_atomically(path, lambda temp: torch.save(checkpoint, temp))


def load_detector(
    path: str | os.PathLike,
    *,
    task: str | None = None,
    camera: str | None = None,
    threshold: float | None = None,
) -> CNNDetector:
    """Load a CNN detector checkpoint and check it fits the run.

    Args:
        path: The checkpoint file.
        task: The task of the run; ``None`` accepts the checkpoint's.
        camera: The camera of the run; ``None`` accepts the checkpoint's.
        threshold: Overrides the checkpoint's threshold (chosen at training time) when given.

    Raises:
        FileNotFoundError: No file at ``path``.
        ValueError: The file is corrupt or truncated, is not a CNN detector checkpoint, lacks
            keys, or was trained for another task or camera; the message names which.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"detector checkpoint {path} does not exist; train one with "
            "scripts/train_detector.py or point detector.checkpoint at an existing file"
        )
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several types for damaged files
        raise ValueError(
            f"{path} is not a readable detector checkpoint (it may be truncated or corrupt): "
            f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        ) from error
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != CHECKPOINT_FORMAT:
        found = checkpoint.get("format") if isinstance(checkpoint, dict) else type(checkpoint)
        raise ValueError(
            f"{path} is not a CNN success-detector checkpoint (format {found!r}, expected "
            f"{CHECKPOINT_FORMAT!r})"
        )
    missing = [key for key in CHECKPOINT_KEYS if key not in checkpoint]
    if missing:
        raise ValueError(f"detector checkpoint {path} lacks key(s) {missing}")
    if checkpoint["version"] > CHECKPOINT_VERSION:
        raise ValueError(
            f"detector checkpoint {path} has version {checkpoint['version']}; this code reads "
            f"up to {CHECKPOINT_VERSION}"
        )
    if task is not None and checkpoint["task"] != task:
        raise ValueError(
            f"detector checkpoint {path} was trained for task {checkpoint['task']!r}, not "
            f"{task!r}; train one per task (the CNN reads no task id)"
        )
    if camera is not None and checkpoint["camera"] != camera:
        raise ValueError(
            f"detector checkpoint {path} was trained on camera {checkpoint['camera']!r}, not "
            f"{camera!r}; set detector.camera={checkpoint['camera']} or train on {camera!r}"
        )
    normalisation = checkpoint["normalisation"]
    model = SuccessCNN(
        Architecture(**checkpoint["architecture"]),
        mean=tuple(normalisation["mean"]), std=tuple(normalisation["std"]),
    )
    try:
        model.load_state_dict(checkpoint["state_dict"])
    except RuntimeError as error:
        raise ValueError(
            f"detector checkpoint {path}: weights do not fit its architecture: {error}"
        ) from error
    return CNNDetector(
        model, task=checkpoint["task"], camera=checkpoint["camera"],
        image_size=checkpoint["image_size"],
        threshold=checkpoint["threshold"] if threshold is None else threshold,
        training_summary=checkpoint.get("training"),
    )
