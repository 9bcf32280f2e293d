"""Success detectors: did the attempt succeed? The binary verifier of RL fine-tuning.

``success_detectors.make(cfg)`` builds one from a Hydra group ``conf/detector/``:

- ``scripted``: the task's own predicate on the simulator state (:mod:`success_detectors.scripted`).
- ``cnn``: a learned classifier on camera frames (:mod:`success_detectors.cnn`), trained by
  ``scripts/train_detector.py`` on frames labelled by the scripted detector or on photos.

:class:`~success_detectors.wrappers.VerifierWrapper` puts a detector in an environment's loop and
counts its false positives and negatives against ``info["is_success"]``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harness_common import kernels as _kernels

_kernels.activate()  # HARNESS_KERNELS=portable: the same kernels on any processor type

from success_detectors.base import SuccessDetector, check_threshold  # noqa: E402
from success_detectors.cnn import CNNDetector, check_pixels, load_detector
from success_detectors.scripted import ScriptedDetector
from success_detectors.wrappers import DetectorCounts, VerifierWrapper


@dataclass(frozen=True)
class ScriptedConfig:
    """``conf/detector/scripted.yaml``.

    Attributes:
        name: ``"scripted"``.
        threshold: Verdict threshold (probabilities are 0 or 1, so any value in (0, 1] works).
    """

    name: str = "scripted"
    threshold: float = 0.5

    def __post_init__(self) -> None:
        check_threshold(self.threshold)


@dataclass(frozen=True)
class CNNConfig:
    """``conf/detector/cnn.yaml``.

    Attributes:
        name: ``"cnn"``.
        checkpoint: Path of a checkpoint from ``scripts/train_detector.py``.
        threshold: Verdict threshold; ``None`` uses the one chosen at training time.
        camera: Camera the run feeds the detector; ``None`` accepts the checkpoint's. A value
            different from the checkpoint's is an error.
    """

    name: str = "cnn"
    checkpoint: str | None = None
    threshold: float | None = None
    camera: str | None = None

    def __post_init__(self) -> None:
        if not self.checkpoint:
            raise ValueError("detector=cnn needs detector.checkpoint=<path to a .pt file from "
                             "scripts/train_detector.py>")
        if self.threshold is not None:
            check_threshold(self.threshold)


CONFIGS: dict[str, type] = {"scripted": ScriptedConfig, "cnn": CNNConfig}


def _as_dict(cfg: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return dataclasses.asdict(cfg)
    if isinstance(cfg, Mapping):  # omegaconf's DictConfig is one too
        return dict(cfg)
    raise TypeError(f"detector config is a {type(cfg).__name__}; expected a mapping or dataclass")


def make(cfg: Any, task: str | None = None) -> SuccessDetector:
    """Build the detector a config names.

    Args:
        cfg: A mapping, ``DictConfig`` or dataclass with ``name`` (``"scripted"`` or ``"cnn"``)
            and that detector's fields (:class:`ScriptedConfig`, :class:`CNNConfig`).
        task: The run's task, checked against a CNN checkpoint's; ``None`` skips the check.

    Raises:
        ValueError: Unknown name (the choices are listed), unknown fields, bad values, or a
            checkpoint for another task or camera.
        FileNotFoundError: A CNN checkpoint path that does not exist.
    """
    fields = _as_dict(cfg)
    name = fields.get("name")
    if name not in CONFIGS:
        raise ValueError(f"unknown detector name={name!r}; choose one of {sorted(CONFIGS)}")
    allowed = {f.name for f in dataclasses.fields(CONFIGS[name])}
    unknown = sorted(set(fields) - allowed)
    if unknown:
        raise ValueError(f"unknown field(s) {unknown} for detector {name!r}; allowed: "
                         f"{sorted(allowed)}")
    config = CONFIGS[name](**fields)
    if isinstance(config, ScriptedConfig):
        return ScriptedDetector(threshold=config.threshold)
    return load_detector(config.checkpoint, task=task, camera=config.camera,
                         threshold=config.threshold)


__all__ = [
    "CNNConfig", "CNNDetector", "DetectorCounts", "ScriptedConfig", "ScriptedDetector",
    "SuccessDetector", "VerifierWrapper", "check_pixels", "load_detector", "make",
]
