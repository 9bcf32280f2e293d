"""Where group fine-tuning starts: the start policy (``algo.start_policy``) and the start states of
its groups (``algo.starts``), each a nested block of the group algorithms' config.

``algo.start_policy`` is what the start-policy step (:mod:`harness.start_policy`) builds before
the run: a saved policy (``file``), or a clone (behaviour cloning, ``bc``, on recorded demos or on
a LeRobot ``dataset``, after an optional state-feature pretraining, ``state_pretrain``), or fresh
weights. ``algo.starts`` is where each group's G attempts start from
(:mod:`harness.algos.group.start_states`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.config.bounds import MAX_COUNT, check_count, check_rate
from harness.config.errors import ConfigError, check

# The weights behaviour cloning hands on (harness.start_policy.bc.pretrain_bc's ``keep``)
BC_KEEP: tuple[str, ...] = ("last", "best_val_loss")
MAX_SHIFT_PAD = 64  # pixels of random shift; frames are at most 480 pixels wide
START_SOURCES: tuple[str, ...] = ("reset", "demo", "replay")
START_STATES: tuple[str, ...] = (*START_SOURCES, "mix")
# Shares of the sources when algo.starts.weights is empty: demo and replay starts always keep
# some resets, so the policy also learns the beginning of the task.
DEFAULT_START_WEIGHTS: dict[str, dict[str, float]] = {
    "reset": {"reset": 1.0},
    "demo": {"reset": 0.25, "demo": 0.75},
    "replay": {"reset": 0.5, "replay": 0.5},
    "mix": {"reset": 0.4, "demo": 0.4, "replay": 0.2},
}


@dataclass
class BCConfig:
    """``algo.start_policy.bc``: behaviour cloning of the start policy.

    Attributes:
        demos: When > 0 (and no ``file``), clone on this many scripted-expert demos at ``task.
            difficulty`` (or ``difficulty``), cached under ``<data_dir>/demos``.
        epochs: Epochs of behaviour cloning.
        lr: Its AdamW learning rate, in (0, 1].
        noise: Gaussian noise (standard deviation, in action units) injected into the executed
            actions while recording the demos, each step labelled with the expert's noise-free
            action (DART, Laskey et al. 2017); only successful demos are kept; 0 records them
            noise-free.
        difficulty: Start-state difficulty of the demos; ``None`` uses ``task.difficulty``.
        shift_pad: Random-shift augmentation of the pixels (DrQ: up to this many pixels, the
            border repeated); 0 switches it off. It never touches evaluation or rollouts.
        keep: Which weights behaviour cloning hands on: ``last`` (the last epoch's) or
            ``best_val_loss`` (the epoch with the lowest loss on the held-out demos).
    """

    demos: int = 0
    epochs: int = 40
    lr: float = 3e-3
    noise: float = 0.0
    difficulty: float | None = None
    shift_pad: int = 4
    keep: str = "last"

    def __post_init__(self) -> None:
        check_count("algo.start_policy.bc.demos", self.demos, 0)
        check_count("algo.start_policy.bc.epochs", self.epochs)
        check_rate("algo.start_policy.bc.lr", self.lr)
        check(self.noise >= 0, f"algo.start_policy.bc.noise={self.noise}; must be >= 0 (a "
                               "standard deviation in action units)")
        check(self.noise == 0 or self.demos > 0,
              f"algo.start_policy.bc.noise={self.noise} shapes the demos that algo.start_policy"
              f".bc.demos records; it needs bc.demos > 0 (not {self.demos})")
        check(self.difficulty is None or 0.0 <= self.difficulty <= 1.0,
              f"algo.start_policy.bc.difficulty={self.difficulty}; must be in [0, 1] or null")
        check_count("algo.start_policy.bc.shift_pad", self.shift_pad, 0, MAX_SHIFT_PAD)
        check(self.keep in BC_KEEP,
              f"algo.start_policy.bc.keep={self.keep!r}; choose one of {BC_KEEP}")


@dataclass
class StatePretrainConfig:
    """``algo.start_policy.state_pretrain``: before cloning a pixel policy, teach its features
    the simulator state on noisy-expert episodes (``harness.start_policy.state_pretraining``).

    Attributes:
        episodes: Noisy-expert episodes; 0 skips the pretraining.
        epochs: Its epochs.
        shift_pad: Random-shift augmentation of its frames; 0 trains on them as rendered.
    """

    episodes: int = 0
    epochs: int = 15
    shift_pad: int = 0

    def __post_init__(self) -> None:
        check_count("algo.start_policy.state_pretrain.episodes", self.episodes, 0)
        check_count("algo.start_policy.state_pretrain.epochs", self.epochs)
        check_count("algo.start_policy.state_pretrain.shift_pad", self.shift_pad, 0,
                    MAX_SHIFT_PAD)


@dataclass
class StartPolicyConfig:
    """``algo.start_policy``: the policy group fine-tuning starts from, and its KL reference.

    Attributes:
        file: A saved policy (``harness.policies.save_policy``: another run's
            ``start_policy.pt``, a clone of ``scripts/pretrain_bc.py``) to start from; the
            other fields then say how it was made (the arms of an experiment share one start).
        dataset: A LeRobotDataset v3.0 folder (``scripts/export_dataset.py``) to clone on
            instead of recording ``bc.demos``.
        bc: Behaviour cloning (:class:`BCConfig`).
        state_pretrain: State-feature pretraining of a pixel policy before it
            (:class:`StatePretrainConfig`).
    """

    file: str | None = None
    dataset: str | None = None
    bc: BCConfig = field(default_factory=BCConfig)
    state_pretrain: StatePretrainConfig = field(default_factory=StatePretrainConfig)

    def __post_init__(self) -> None:
        from harness.lerobot.reader import validate_dataset  # reads the folder; builds nothing

        check(not self.file or Path(self.file).is_file(),
              f"algo.start_policy.file={self.file!r}: no such file (a policy written by "
              "harness.policies.save_policy, e.g. a run's start_policy.pt)")
        check(not (self.dataset and self.bc.demos > 0),
              f"algo.start_policy.dataset={self.dataset!r} and algo.start_policy.bc.demos="
              f"{self.bc.demos}: clone on a dataset folder or on freshly recorded demos, not both "
              "(set algo.start_policy.bc.demos=0)")
        if self.dataset:
            try:  # every file the folder names, now: BC reads it after the run folder exists
                validate_dataset(self.dataset)
            except (OSError, ValueError) as error:
                raise ConfigError(f"algo.start_policy.dataset={self.dataset!r}: {error}") from None

    @property
    def clones(self) -> bool:
        """Whether the start is behaviour-cloned (on demos or a dataset)."""
        return self.bc.demos > 0 or bool(self.dataset)


@dataclass
class StartsConfig:
    """``algo.starts``: where each group's attempts start (``harness.algos.group.start_states``).

    Attributes:
        source: ``reset`` (fresh resets), ``demo`` (states along expert demonstrations, by a
            reverse curriculum), ``replay`` (the policy's own failed attempts, closest to
            success) or ``mix``. Evaluation always starts from fresh resets.
        weights: Share of groups per source (``reset``, ``demo``, ``replay``); when all are
            null, the default of ``source`` (``DEFAULT_START_WEIGHTS``), otherwise the sources
            given (a null one counts 0): :attr:`shares`.
        demos: Demonstrations recorded (at ``task.difficulty``) for ``demo`` starts.
        curriculum: Options of the ``success_band`` curriculum over the fraction of the
            demonstration remaining (``num_bins``, ``low``, ``high``, ``min_obs``,
            ``explore``...).
        replay_buffer: Replay starts kept (the newest).
        replay_every: Steps between the captured states of an attempt, for replay starts.
    """

    source: str = "reset"
    weights: dict[str, float | None] = field(
        default_factory=lambda: {source: None for source in START_SOURCES})
    demos: int = 20
    curriculum: dict[str, Any] = field(default_factory=lambda: {
        "num_bins": 10, "low": 0.2, "high": 0.8, "min_obs": 16, "explore": 0.1})
    replay_buffer: int = 256
    replay_every: int = 5

    def __post_init__(self) -> None:
        check(self.source in START_STATES,
              f"algo.starts.source={self.source!r}; choose one of {START_STATES}")
        weights = self._given()
        unknown = sorted(set(weights) - set(START_SOURCES))
        check(not unknown, f"algo.starts.weights has unknown sources {unknown}; the sources "
                           f"are {START_SOURCES}")
        check(all(w >= 0 for w in weights.values()) and sum(weights.values()) > 0,
              f"algo.starts.weights={weights}; weights must be >= 0 with a positive sum")
        for key in ("demos", "replay_buffer", "replay_every"):
            check_count(f"algo.starts.{key}", getattr(self, key), 1, MAX_COUNT)

    def _given(self) -> dict[str, float]:
        given = {k: v for k, v in dict(self.weights).items() if v is not None}
        return given or DEFAULT_START_WEIGHTS[self.source]

    @property
    def shares(self) -> dict[str, float]:
        """The share of groups of each source (``weights``, or the default of ``source``)."""
        weights = self._given()
        return {s: float(weights.get(s, 0.0)) for s in START_SOURCES}
