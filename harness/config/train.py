"""The primary config, :class:`TrainConfig`, with its blocks ``logger``, ``eval`` and ``verifier``
and the checks that span groups (policy against algorithm and observations, seed ranges, ...)."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from harness import curriculum as curricula
from harness.config.adr import AdrConfig
from harness.config.algos import AlgoConfig
from harness.config.curriculum import CurriculumConfig
from harness.config.errors import ConfigError, check
from harness.config.policy import POLICIES_BY_FAMILY, POLICY_OBS_KEY, PolicyConfig
from harness.config.task import OBS_MODE_KEYS, TaskOptions
from harness.demos import MAX_TRIES_PER_DEMO

REWARDS: tuple[str, ...] = ("auto", "dense", "verifier")
REFRESH_LABELS: tuple[str, ...] = ("claimed", "all")  # success_detectors.refresh reads the label
# Seeds of the start states of group-trainer iterations: (seed + 1) * TRAIN_SEED_STRIDE + counter.
TRAIN_SEED_STRIDE = 10_000_000
MAX_RESAMPLE_ROUNDS = 4  # rounds of zero_signal=resample per iteration
# The success band weighs bins by 1 - p^G - (1-p)^G; SB3 plays single episodes, not groups.
SB3_BAND_GROUP_SIZE = 8
STATE_PRETRAIN_SEED = 3_000_000  # noisy-expert episodes of start_policy.pretrain_state_features
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
    :meth:`TrainConfig.seed_ranges` lists every range a run uses and refuses overlaps.

    Attributes:
        every_steps: Environment steps between periodic evaluations (0: only the final one).
        episodes: Episodes per difficulty in a periodic evaluation (validation seeds).
        final_episodes: Episodes per difficulty in the final evaluation (test seeds).
        difficulties: Difficulties to evaluate; empty means ``[task.difficulty]``.
        seed: First test seed.
        validation_seed: First validation seed.
        video_episodes: Episodes recorded to mp4 per evaluation (when the logger records videos).
        max_episode_steps: Step limit of every evaluation episode, the start policy's included;
            ``None``: ``task.max_episode_steps``, the training attempts' limit.
    """

    every_steps: int = 10_000
    episodes: int = 20
    final_episodes: int = 100
    difficulties: list[float] = field(default_factory=list)
    seed: int = 1_000_000
    validation_seed: int = 2_000_000
    video_episodes: int = 1
    max_episode_steps: int | None = None

    def __post_init__(self) -> None:
        check(self.max_episode_steps is None or self.max_episode_steps >= 1,
              f"eval.max_episode_steps={self.max_episode_steps}; must be >= 1 or null")
        for key in ("seed", "validation_seed", "every_steps", "video_episodes"):
            check(getattr(self, key) >= 0, f"eval.{key}={getattr(self, key)}; must be >= 0")
        for key in ("episodes", "final_episodes"):
            check(getattr(self, key) >= 1, f"eval.{key}={getattr(self, key)}; must be >= 1")
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
        every: Iterations between refreshes; 0 turns it off.
        label: Which scored final frames get a label (the scripted check's; on a robot, a
            person's): ``claimed``, those the detector called success; ``all``, every one.
        buffer: Labelled frames kept, the oldest leaving first.
        steps: AdamW steps per refresh.
        batch_size: Frames per step.
        learning_rate: AdamW step size.
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
        check(self.every >= 0, f"detector_refresh.every={self.every}; must be >= 0 (0: off)")
        for key in ("buffer", "steps", "batch_size"):
            check(getattr(self, key) >= 1,
                  f"detector_refresh.{key}={getattr(self, key)}; must be >= 1")
        check(self.label in REFRESH_LABELS,
              f"detector_refresh.label={self.label!r}; choose one of {REFRESH_LABELS}")
        check(self.learning_rate > 0,
              f"detector_refresh.learning_rate={self.learning_rate}; must be > 0")
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


@dataclass
class TrainConfig:
    """Everything one training run needs (the primary config, ``conf/train.yaml``).

    Attributes:
        task: Task and its environment options.
        algo: Algorithm and its hyper-parameters.
        policy: Network.
        curriculum: Difficulty sampler of training episodes.
        detector: The detector group (``success_detectors.make``); used when ``reward=verifier``.
        logger: Outputs.
        eval: Periodic and final evaluation.
        verifier: How the detector gives the reward.
        detector_refresh: In-run hard-negative mining of a learned verifier (group trainer).
        adr: Automatic domain randomisation of training episodes (off by default; never
            evaluation's).
        seed: Seed of the algorithm, the networks and the training environments.
        total_timesteps: Environment steps to train for (a resumed run counts from its start).
        max_minutes: Stop training after this wall-clock time (``None``: no limit).
        n_envs: Parallel training environments (subprocesses when > 1).
        checkpoint_every_steps: Steps between ``checkpoints/latest`` saves (also saved at the end).
        resume: Continue the run in this run directory from ``checkpoints/latest``.
        overwrite: Start afresh in a run directory that holds an earlier run which cannot be
            resumed (no ``checkpoints/latest``): its files are moved to
            ``replaced/<time>/`` inside it first, never deleted. Without it such a directory
            is refused.
        reward: ``dense`` (the task's reward terms) or ``verifier`` (the detector's verdict);
            ``auto`` resolves to ``dense`` for SB3 and ``verifier`` for the group algorithms,
            which score each attempt by the verifier's binary verdict and refuse ``dense``.
        device: Torch device of the networks: ``cpu``, ``cuda``, ``cuda:N``, ``mps`` or
            ``auto`` (the first available of cuda, mps, cpu).
        torch_threads: Torch threads of the main process (workers always use one).
    """

    task: TaskOptions = field(default_factory=TaskOptions)
    algo: AlgoConfig = MISSING
    policy: PolicyConfig = MISSING
    curriculum: CurriculumConfig = MISSING
    detector: dict[str, Any] = field(default_factory=dict)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    verifier: VerifierConfig = field(default_factory=VerifierConfig)
    detector_refresh: DetectorRefreshConfig = field(default_factory=DetectorRefreshConfig)
    adr: AdrConfig = field(default_factory=AdrConfig)
    seed: int = 0
    total_timesteps: int = 100_000
    max_minutes: float | None = None
    n_envs: int = 1
    checkpoint_every_steps: int = 10_000
    resume: bool = False
    overwrite: bool = False
    reward: str = "auto"
    device: str = "cpu"
    torch_threads: int = 1

    def __post_init__(self) -> None:
        from harness.policies import resolve_device  # imports torch: here, not at import
        for name, value in _numbers(self):
            check(math.isfinite(value), f"{name}={value}; must be a finite number")
        check(self.total_timesteps >= 1, f"total_timesteps={self.total_timesteps}; must be >= 1")
        check(self.n_envs >= 1, f"n_envs={self.n_envs}; must be >= 1")
        check(self.torch_threads >= 1, f"torch_threads={self.torch_threads}; must be >= 1")
        check(self.checkpoint_every_steps >= 1,
              f"checkpoint_every_steps={self.checkpoint_every_steps}; must be >= 1")
        check(self.max_minutes is None or self.max_minutes > 0,
              f"max_minutes={self.max_minutes}; must be > 0 or null")
        check(self.seed >= 0, f"seed={self.seed}; must be >= 0")
        check(self.reward in REWARDS, f"reward={self.reward!r}; choose one of {REWARDS}")
        check(self.device == "auto" or self.device.split(":")[0] in ("cpu", "cuda", "mps"),
              f"device={self.device!r}; expected cpu, cuda, cuda:N, mps or auto")
        try:
            resolve_device(self.device)
        except ValueError as error:
            raise ConfigError(str(error)) from None
        if self.reward == "auto":
            self.reward = "verifier" if self.algo.family == "group" else "dense"
        check(self.reward == "verifier" or self.algo.family == "sb3",
              f"reward={self.reward!r} with algo={self.algo.name!r}: group algorithms score "
              "each attempt by the verifier's binary verdict; use reward=verifier (their "
              "default) with detector=scripted (ground truth) or detector=cnn")
        learned = (self.detector or {}).get("name", "scripted") != "scripted"
        check(not learned or self.reward == "verifier",
              f"detector={self.detector.get('name')!r} is only read with reward=verifier; "
              f"reward={self.reward!r} would ignore it")
        if self.reward == "verifier":
            self._check_detector()
        if self.algo.family == "group":
            default = VerifierConfig()
            check(self.verifier == default,
                  f"verifier={dataclasses.asdict(self.verifier)} with algo={self.algo.name!r}: "
                  "the group trainer scores the last frame of each attempt (verifier.when="
                  "final) and the verdict is the reward (verifier.mode=replace), without "
                  "ending episodes on a detection; these verifier options are SB3's")
        check(self.detector_refresh.every == 0 or (
                  self.algo.family == "group" and self.reward == "verifier"
                  and (self.detector or {}).get("name") == "cnn"),
              f"detector_refresh.every={self.detector_refresh.every} refreshes a learned "
              f"verifier during a group-trainer run; this run has algo={self.algo.name!r}, "
              f"reward={self.reward!r}, detector={(self.detector or {}).get('name')!r} (use a "
              "group algorithm with reward=verifier detector=cnn, or detector_refresh.every=0)")
        self._check_policy()
        self._check_batch()
        self._check_curriculum()
        self._check_seed_ranges()
        self.adr.check(self.task.name, self.task.imperfections)

    def _check_detector(self) -> None:
        import success_detectors  # imports torch: here, not at import
        check(bool(self.detector.get("name")),
              f"reward=verifier needs a detector with a name (e.g. detector=scripted); "
              f"got detector={self.detector}")
        # The scripted predicate would pick the frame the learned detector then scores.
        check(self.detector["name"] == "scripted" or not self.task.terminate_on_success,
              f"task.terminate_on_success=true with detector={self.detector['name']!r}: the "
              "episode would end on the simulator's ground-truth success, so the frame the "
              "learned detector scores is chosen by the ground truth it replaces; set "
              "task.terminate_on_success=false (SB3 can end episodes on the detector with "
              "verifier.when=every_step verifier.terminate_on_detection=true)")
        try:
            success_detectors.make(dict(self.detector), task=self.task.name)
        except (ValueError, FileNotFoundError) as error:
            raise ConfigError(f"detector: {error}") from None

    def _check_policy(self) -> None:
        family, policy, obs_mode = self.algo.family, self.policy.name, self.task.obs_mode
        allowed = POLICIES_BY_FAMILY[family]
        check(policy in allowed,
              f"policy={policy!r} cannot be trained by algo={self.algo.name!r}; "
              f"{family} algorithms take policy in {allowed}")
        needed = POLICY_OBS_KEY[policy]
        check(needed in OBS_MODE_KEYS[obs_mode],
              f"policy={policy!r} reads {needed!r} observations, which task.obs_mode="
              f"{obs_mode!r} does not give; use task.obs_mode in "
              f"{[m for m, keys in OBS_MODE_KEYS.items() if needed in keys]}")
        check(family == "group" or not getattr(self.policy, "normalize_state", False),
              f"policy.normalize_state=true is read by the group trainer's MLP token policy, "
              f"not by algo={self.algo.name!r} (SB3's MlpPolicy); leave it false")

    def _check_batch(self) -> None:
        rollout = getattr(self.algo, "n_steps", 0) * self.n_envs
        batch_size = getattr(self.algo, "batch_size", None)
        if self.algo.name in ("ppo", "trpo"):
            check(batch_size <= rollout,
                  f"algo.batch_size={batch_size} exceeds a rollout of algo.n_steps="
                  f"{self.algo.n_steps} x n_envs={self.n_envs} = {rollout} steps")

    def _check_curriculum(self) -> None:
        try:
            curricula.make(self.curriculum.name, **self.curriculum_params())
        except ValueError as error:
            raise ConfigError(f"curriculum: {error}") from None

    def curriculum_params(self) -> dict[str, Any]:
        """Keyword parameters of ``harness.curriculum.make`` (without ``seed``): the group file's
        fields, with the success band's G taken from ``algo.group_size`` (one value, so the
        band weighs bins by the groups the trainer really plays)."""
        group_size = getattr(self.algo, "group_size", SB3_BAND_GROUP_SIZE)
        return self.curriculum.params(self.task.difficulty, group_size)

    def seed_ranges(self) -> dict[str, list[int]]:
        """Every range of ``reset`` seeds this run plays, as ``{name: [first, stop)}``.

        ``train``: start states of training (group trainer: one seed per snapshotted start
        state; SB3: the first reset of each environment, later resets continue its RNG, and
        ``train_resumed`` the reseeding of a resumed run);
        ``demo``: scripted-expert demos of ``algo.bc_demos`` (at most ``MAX_TRIES_PER_DEMO``
        attempts per demo); ``state_pretrain``: noisy-expert episodes of the state-feature
        pretraining; ``validation``: periodic evaluations; ``test``: the final evaluation and the
        start policy's. :meth:`_check_seed_ranges` refuses any overlap.
        """
        algo, ranges = self.algo, {}
        if algo.family == "group":
            first = (self.seed + 1) * TRAIN_SEED_STRIDE
            by_iterations = algo.iterations * algo.num_start_states * MAX_RESAMPLE_ROUNDS
            by_steps = -(-self.total_timesteps // algo.group_size) + \
                algo.num_start_states * MAX_RESAMPLE_ROUNDS
            ranges["train"] = [first, first + min(by_iterations, by_steps)]
            if not algo.init_policy and algo.bc_demos > 0:
                ranges["demo"] = [0, MAX_TRIES_PER_DEMO * algo.bc_demos]
                if algo.state_pretrain_episodes > 0 and self.task.obs_mode != "state":
                    first = STATE_PRETRAIN_SEED + self.seed * 10_000
                    ranges["state_pretrain"] = [first, first + algo.state_pretrain_episodes]
        else:
            ranges["train"] = [self.seed, self.seed + self.n_envs]
            first = (self.seed + 1) * TRAIN_SEED_STRIDE  # a resumed run reseeds its envs here
            ranges["train_resumed"] = [first, first + self.total_timesteps + self.n_envs]
        if self.eval.every_steps:
            ranges["validation"] = [self.eval.validation_seed,
                                    self.eval.validation_seed + self.eval.episodes]
        ranges["test"] = [self.eval.seed, self.eval.seed + self.eval.final_episodes]
        return ranges

    def _check_seed_ranges(self) -> None:
        ranges = sorted(self.seed_ranges().items(), key=lambda item: item[1][0])
        for (name_a, (_, stop_a)), (name_b, (first_b, _)) in zip(ranges, ranges[1:],
                                                                  strict=False):
            check(stop_a <= first_b,
                  f"seed ranges overlap: {name_a} plays reset seeds "
                  f"{dict(ranges)[name_a]} (first, stop) and {name_b} plays "
                  f"{dict(ranges)[name_b]}; a start state must not be both trained on and "
                  "evaluated on: change seed, eval.seed or eval.validation_seed")


def _numbers(node: Any, prefix: str = "") -> list[tuple[str, float]]:
    """Every float of a config tree (dataclasses, dicts, lists) with its dotted name."""
    if dataclasses.is_dataclass(node):
        items = [(f.name, getattr(node, f.name)) for f in dataclasses.fields(node)]
    elif isinstance(node, dict):
        items = list(node.items())
    elif isinstance(node, (list, tuple)):
        items = [(str(i), v) for i, v in enumerate(node)]
    else:
        return [(prefix.rstrip("."), float(node))] if isinstance(node, float) else []
    found = []
    for key, value in items:
        found += _numbers(value, f"{prefix}{key}.")
    return found
