"""A detector as the verifier of an environment, with its error rates under the acting policy.

A learned verifier's false positives are what a policy learns to exploit, so the wrapper compares
every verdict with the scripted ground truth ``info["is_success"]`` and counts agreements and
disagreements; :meth:`VerifierWrapper.error_rates` gives them as ``detector/...`` metrics for the
run loop to log.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from success_detectors.base import SuccessDetector

WHEN = ("final", "every_step")
MODES = ("replace", "add")


@dataclass
class DetectorCounts:
    """Verdicts against ground truth. Counts from several environments add up with ``+``."""

    true_positives: int = 0
    false_positives: int = 0
    true_negatives: int = 0
    false_negatives: int = 0

    def record(self, verdict: bool, truth: bool) -> None:
        if verdict and truth:
            self.true_positives += 1
        elif verdict:
            self.false_positives += 1
        elif truth:
            self.false_negatives += 1
        else:
            self.true_negatives += 1

    def __add__(self, other: DetectorCounts) -> DetectorCounts:
        return DetectorCounts(
            self.true_positives + other.true_positives,
            self.false_positives + other.false_positives,
            self.true_negatives + other.true_negatives,
            self.false_negatives + other.false_negatives,
        )

    def error_rates(self) -> dict[str, float]:
        """``detector/`` metrics; a rate whose denominator is 0 is NaN (nothing to measure)."""
        tp, fp = self.true_positives, self.false_positives
        tn, fn = self.true_negatives, self.false_negatives
        total = tp + fp + tn + fn

        def ratio(a: int, b: int) -> float:
            return a / b if b else math.nan

        return {
            "detector/evaluations": float(total),
            "detector/true_positives": float(tp),
            "detector/false_positives": float(fp),
            "detector/true_negatives": float(tn),
            "detector/false_negatives": float(fn),
            "detector/false_positive_rate": ratio(fp, fp + tn),
            "detector/false_negative_rate": ratio(fn, fn + tp),
            "detector/precision": ratio(tp, tp + fp),
            "detector/recall": ratio(tp, tp + fn),
            "detector/accuracy": ratio(tp + tn, total),
            "detector/detected_success_rate": ratio(tp + fp, total),
            "detector/true_success_rate": ratio(tp + fn, total),
        }


class VerifierWrapper(gym.Wrapper):
    """Scores an environment with a success detector and audits it against the ground truth.

    When the detector is queried (``when``), ``info["verifier_success"]`` (bool) and
    ``info["verifier_probability"]`` are added beside the untouched ground truth
    ``info["is_success"]``, the reward becomes (``mode="replace"``) or gains (``"add"``) the
    verdict as 0/1, and the verdict is counted against the ground truth.

    Args:
        env: A task environment (possibly wrapped).
        detector: The verifier. Image detectors see ``camera`` frames at their own size: the
            observation's ``pixels`` when camera and size match, else a fresh render.
        when: ``"final"``: query once, on the step that ends the episode (terminated or
            truncated); other steps keep the env reward under ``"add"`` and get 0 under
            ``"replace"``. ``"every_step"``: query on every step.
        mode: ``"replace"`` the env reward with the verdict, or ``"add"`` the verdict to it.
        terminate_on_detection: End the episode (``terminated``) when the detector fires;
            needs ``when="every_step"``.
        camera: Camera the detector reads; defaults to the detector's own, else the env's.

    Raises:
        ValueError: Unknown ``when``/``mode``, termination asked with ``when="final"``, a
            detector made for another task or camera than the env offers, or one trained on
            frames of that camera mounted elsewhere (:meth:`SuccessDetector.check_camera_mounts`;
            a checkpoint that records no mounts is let through with a warning).
    """

    def __init__(
        self,
        env: gym.Env,
        detector: SuccessDetector,
        when: str = "final",
        mode: str = "replace",
        terminate_on_detection: bool = False,
        camera: str | None = None,
    ) -> None:
        super().__init__(env)
        if when not in WHEN:
            raise ValueError(f"when={when!r}; expected one of {WHEN}")
        if mode not in MODES:
            raise ValueError(f"mode={mode!r}; expected one of {MODES}")
        if terminate_on_detection and when != "every_step":
            raise ValueError("terminate_on_detection=True needs when='every_step' "
                             "(with when='final' the episode has already ended)")
        from tasks.rendering import camera_views  # the env is a task env: tasks is loaded

        base = env.unwrapped
        task = base.task.name
        if detector.task is not None and detector.task != task:
            raise ValueError(f"detector was made for task {detector.task!r}; this env runs "
                             f"{task!r}")
        self.camera = camera or detector.camera or base.config.camera
        if detector.camera is not None and self.camera != detector.camera:
            raise ValueError(f"detector reads camera {detector.camera!r}; camera={self.camera!r} "
                             "was asked for")
        if "pixels" in detector.requires and \
                not set(camera_views(self.camera)) <= set(base.camera_names):
            raise ValueError(f"camera={self.camera!r} is not in this env; it has "
                             f"{list(base.camera_names)}")
        if "pixels" in detector.requires:
            detector.check_camera_mounts(base.camera_mounts(self.camera))
        if detector.task is not None and base.config.terminate_on_success:
            warnings.warn(
                "the env ends episodes on ground-truth success (terminate_on_success=True), so "
                "the episode length tells the policy what the verifier should; make the task "
                "with terminate_on_success=False and use terminate_on_detection=True",
                stacklevel=2,
            )
        self.detector = detector
        self.when = when
        self.mode = mode
        self.terminate_on_detection = terminate_on_detection
        self.counts = DetectorCounts()

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self.when == "every_step" or terminated or truncated:
            probability = float(self.detector.predict_proba(self._batch(obs))[0])
            verdict = probability >= self.detector.threshold
            info = dict(info)
            info["verifier_success"] = bool(verdict)
            info["verifier_probability"] = probability
            self.counts.record(verdict, bool(info["is_success"]))
            reward = float(verdict) + (float(reward) if self.mode == "add" else 0.0)
            if verdict and self.terminate_on_detection:
                terminated = True
        elif self.mode == "replace":
            reward = 0.0
        return obs, reward, terminated, truncated, info

    def _batch(self, obs: Any) -> dict[str, Any]:
        batch: dict[str, Any] = {"env": [self.env]}
        if "pixels" in self.detector.requires:
            base = self.env.unwrapped
            size = self.detector.image_size or base.config.image_size
            pixels = obs.get("pixels") if isinstance(obs, dict) else None
            same_view = self.camera == base.config.camera and pixels is not None \
                and pixels.shape[:2] == (size, size)
            frame = pixels if same_view else base.render_camera(self.camera, size)
            batch["pixels"] = np.asarray(frame)[None]
        return batch

    def error_rates(self, reset: bool = False) -> dict[str, float]:
        """The verifier's ``detector/`` metrics since the last reset of the counts.

        Args:
            reset: Zero the counts afterwards (to log one interval at a time).
        """
        rates = self.counts.error_rates()
        if reset:
            self.counts = DetectorCounts()
        return rates
