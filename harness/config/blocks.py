"""The blocks of the primary config that belong to no group: ``logger`` (with ``wandb``),
``eval``, ``verifier`` and ``detector_refresh``."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field

from harness.config.bounds import MAX_SEED, MAX_TIMESTEPS, check_count, check_rate
from harness.config.errors import check
from harness.config.seeds import TEST_SEED, VALIDATION_SEED
from tasks.config import MAX_EPISODE_STEPS

REFRESH_LABELS: tuple[str, ...] = ("claimed", "all")  # success_detectors.refresh reads the label
WANDB_MODES: tuple[str, ...] = ("online", "offline", "disabled")


@dataclass
class WandbConfig:
    """Weights & Biases, in addition to ``metrics.csv`` and TensorBoard (``logger=wandb``).

    Attributes:
        project: W&B project.
        entity: W&B team or user (``None``: the account's default).
        group: Group of the run (``None``: the name of the folder holding the run directory,
            which for a job of a sweep is the sweep folder).
        name: Name of the run (``None``: the run directory's name, ``<n>_<overrides>`` in a sweep).
        mode: ``online``, ``offline`` or ``disabled`` (``None``: ``WANDB_MODE``, else online).
        tags: Tags of the run.
    """

    project: str = "vla-rl-harness"
    entity: str | None = None
    group: str | None = None
    name: str | None = None
    mode: str | None = None
    tags: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        check(self.mode is None or self.mode in WANDB_MODES,
              f"logger.wandb.mode={self.mode!r}; choose one of {WANDB_MODES} or null")
        try:
            found = importlib.util.find_spec("wandb") is not None
        except ValueError:  # a module in sys.modules without a spec
            found = False
        check(found, "logger=wandb needs the wandb package, which cannot be imported here: "
                     "pip install wandb (or the project's cluster extras), or choose "
                     "logger=default")


@dataclass
class LoggerConfig:
    """The ``logger`` group. ``metrics.csv`` and ``summary.json`` are always written.

    Attributes:
        tensorboard: Write TensorBoard events under ``tensorboard/``.
        progress_bar: Show a progress bar.
        videos: Record evaluation episodes under ``videos/``.
        console: Print SB3's table of metrics after each log dump.
        wandb: Weights & Biases as well (``logger=wandb``); ``None``: not used.
    """

    tensorboard: bool = True
    progress_bar: bool = True
    videos: bool = True
    console: bool = False
    wandb: WandbConfig | None = None




@dataclass
class EvalConfig:
    """Deterministic evaluation on held-out seeds, in two disjoint ranges.

    Periodic evaluations (and so the choice of the ``best`` checkpoint) play the validation
    seeds ``validation_seed, validation_seed + 1, ...``; the final evaluation, and the start
    policy's evaluation it is compared with, play the test seeds ``seed, seed + 1, ...``.
    :meth:`TrainConfig.seed_ranges` lists every range a run uses and refuses overlaps. Seeds are
    in [0, 2^32 - 1], episode counts at most 10^6, ``every_steps`` at most 10^12.

    Attributes:
        every_steps: Environment steps between periodic evaluations (0: only the final one).
        episodes: Episodes per difficulty in a periodic evaluation (validation seeds).
        final_episodes: Episodes per difficulty in the final evaluation (test seeds).
        difficulties: Difficulties to evaluate; empty means ``[task.difficulty]``.
        seed: First test seed (:data:`harness.config.seeds.TEST_SEED`): these seeds give the
            reported figure and nothing else; choose recipes on the validation seeds.
        validation_seed: First validation seed.
        video_episodes: Episodes recorded to mp4 per evaluation (when the logger records videos).
        max_episode_steps: Step limit of every evaluation episode, the start policy's included
            (at most ``tasks.config.MAX_EPISODE_STEPS``, 10^6); ``None``:
            ``task.max_episode_steps``, the training attempts' limit.
    """

    every_steps: int = 10_000
    episodes: int = 20
    final_episodes: int = 100
    difficulties: list[float] = field(default_factory=list)
    seed: int = TEST_SEED
    validation_seed: int = VALIDATION_SEED
    video_episodes: int = 1
    max_episode_steps: int | None = None

    def __post_init__(self) -> None:
        check(self.max_episode_steps is None or 1 <= self.max_episode_steps <= MAX_EPISODE_STEPS,
              f"eval.max_episode_steps={self.max_episode_steps}; must be >= 1 or null, and "
              f"<= {MAX_EPISODE_STEPS}")
        for key in ("seed", "validation_seed"):
            check_count(f"eval.{key}", getattr(self, key), 0, MAX_SEED)
        check_count("eval.every_steps", self.every_steps, 0, MAX_TIMESTEPS)
        check_count("eval.video_episodes", self.video_episodes, 0)
        for key in ("episodes", "final_episodes"):
            check_count(f"eval.{key}", getattr(self, key))
        bad = [d for d in self.difficulties if not 0.0 <= d <= 1.0]
        check(not bad, f"eval.difficulties={list(self.difficulties)}; {bad} outside [0, 1]")


@dataclass
class VerifierConfig:
    """How the detector's verdict becomes the reward when ``reward=verifier``.

    Attributes:
        when: ``final`` (score the last step of an episode) or ``every_step``.
        mode: ``replace`` the dense reward (sparse reward) or ``add`` to it.
        terminate_on_detection: End the episode when the detector fires.
    """

    when: str = "final"
    mode: str = "replace"
    terminate_on_detection: bool = False

    def __post_init__(self) -> None:
        check(self.when in ("final", "every_step"),
              f"verifier.when={self.when!r}; choose one of ('final', 'every_step')")
        check(self.mode in ("replace", "add"),
              f"verifier.mode={self.mode!r}; choose one of ('replace', 'add')")


@dataclass
class DetectorRefreshConfig:
    """In-run hard-negative mining of a learned verifier (``detector_refresh``; the group trainer
    with ``detector=cnn``; :mod:`success_detectors.refresh`, docs/sim_to_real.md). Off by default.

    Attributes:
        every: Iterations between refreshes; 0 turns it off. Counts (``every``, ``buffer``,
            ``steps``, ``batch_size``) are at most 10^6.
        label: Which scored final frames get a label (the scripted check's; on a robot, a
            person's): ``claimed``, those the detector called success; ``all``, every one.
        buffer: Labelled frames kept, the oldest leaving first.
        steps: AdamW steps per refresh.
        batch_size: Frames per step.
        learning_rate: AdamW step size, in (0, 1].
        data: The detector's data file (HDF5): its train split is replayed in each batch and its
            val split chooses the threshold again; ``None``: the buffer alone, threshold kept.
        replay_fraction: Share of each batch drawn from ``data``'s train split.
        target_precision: Precision the re-chosen threshold must reach on ``data``'s val split.
        conservative_threshold: Require the precision's 95% lower bound to reach it.
        holdout: Share of the labelled frames kept out of fine-tuning, whose precision (the
            policy's own attempts) the threshold must also reach; 0: ``data`` alone chooses it.
        hard_negative_share: Share of each batch's buffer frames drawn from its hard negatives
            (claimed successes labelled failures), so that they are fitted; 0: drawn uniformly.
    """

    every: int = 0
    label: str = "claimed"
    buffer: int = 1024
    steps: int = 40
    batch_size: int = 64
    learning_rate: float = 3.0e-4
    data: str | None = None
    replay_fraction: float = 0.5
    target_precision: float = 0.98
    conservative_threshold: bool = True
    holdout: float = 0.25
    hard_negative_share: float = 0.25

    def __post_init__(self) -> None:
        check_count("detector_refresh.every", self.every, 0)
        for key in ("buffer", "steps", "batch_size"):
            check_count(f"detector_refresh.{key}", getattr(self, key))
        check(self.label in REFRESH_LABELS,
              f"detector_refresh.label={self.label!r}; choose one of {REFRESH_LABELS}")
        check_rate("detector_refresh.learning_rate", self.learning_rate)
        check(0.0 <= self.replay_fraction < 1.0,
              f"detector_refresh.replay_fraction={self.replay_fraction}; expected [0, 1)")
        check(0.0 <= self.holdout < 1.0,
              f"detector_refresh.holdout={self.holdout}; expected a share in [0, 1)")
        check(0.0 <= self.hard_negative_share <= 1.0,
              f"detector_refresh.hard_negative_share={self.hard_negative_share}; expected a "
              "share in [0, 1]")
        check(0.0 < self.target_precision <= 1.0,
              f"detector_refresh.target_precision={self.target_precision}; expected (0, 1]")
        check(self.data is None or os.path.isfile(self.data),
              f"detector_refresh.data={self.data!r} is not a file; give the detector's HDF5 "
              "data file (scripts/collect_detector_data.py) or null")
