"""Labelled frames for learned detectors: collection, episode-level splits, HDF5 and image folders.

**Collection** rolls out a mix of policies over a range of difficulties with
``terminate_on_success=False`` and labels every kept frame with the scripted detector (the task's
own predicate). Policies (:data:`POLICIES`):

- ``expert``: the scripted expert.
- ``noisy_expert``: the expert with Gaussian action noise (misses and wobbles).
- ``offset_goal``: the expert aiming at a point just outside the success region (cube parked
  1-3 cm beside the target, held next to the goal): near-misses that stay still.
- ``stop_short``: the expert until it is within ``hard_margin`` of success, then holding still
  (cube almost on the target, drawer almost open).
- ``decoy``: the empty gripper sent to the goal and wandering there (``push``, ``pick_place``):
  negatives where the gripper hides the goal as the object does on success.
- ``perturbed``: the expert, then random actions from a random step on (successes undone).
- ``random``: uniform random actions.

A frame is kept every ``frame_stride`` steps and, within ``hard_margin`` of the success boundary
(:func:`success_margin`, either side), at every step that moved the margin by ``NEAR_STEP``
(5 mm) or more. Frames are split into train/val/test
*by episode* (:func:`split_episodes`), then each split is class-balanced
(:func:`balance_classes`), keeping up to ``hard_fraction`` of its negatives from near-misses.

**HDF5 layout** (one file per task and camera)::

    /            attrs: format, version, task, camera, image_size, policies, config (JSON)
    /<split>/    train, val, test; datasets with one row per frame:
        pixels      uint8 (N, H, W, 3) RGB
        label       bool  (N,)   scripted success
        episode     int64 (N,)   episode id, unique across splits
        step        int32 (N,)   control step within the episode
        difficulty  float32 (N,) the episode's difficulty
        margin      float32 (N,) metres outside the success region (negative inside)
        policy      int8  (N,)   index into the ``policies`` attribute

**Image folders** (sim-to-real): ``image_dir/success/*.png|jpg`` and ``image_dir/failure/*``.
Each photo counts as its own episode when splitting, so photos of one take may land in different
splits; put takes in separate folders and train per folder if that matters.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

DATA_FORMAT = "success_detectors.frames"
DATA_VERSION = 1
SPLITS = ("train", "val", "test")
POLICIES = (
    "expert", "noisy_expert", "offset_goal", "stop_short", "decoy", "perturbed", "random",
)
DECOY_TASKS = ("push", "pick_place")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
NEAR_STEP = 0.005  # metres; about half a pixel of the front camera at 84x84
COLUMNS = ("label", "episode", "step", "difficulty", "margin", "policy")


@dataclass
class FrameSet:
    """Labelled frames, one row per frame.

    Attributes:
        pixels: ``uint8 (N, H, W, 3)`` RGB frames.
        label: ``bool (N,)`` success labels.
        episode: ``int64 (N,)`` episode ids (one id per photo for image folders).
        step: ``int32 (N,)`` control step within the episode (0 for photos).
        difficulty: ``float32 (N,)`` difficulty of the episode (NaN for photos).
        margin: ``float32 (N,)`` metres outside the success region, negative inside (NaN when
            unknown, as for photos).
        policy: ``int8 (N,)`` index into :data:`POLICIES` (-1 for photos).
        names: Optional file names of photos, for figures.
    """

    pixels: np.ndarray
    label: np.ndarray
    episode: np.ndarray
    step: np.ndarray
    difficulty: np.ndarray
    margin: np.ndarray
    policy: np.ndarray
    names: list[str] | None = None

    def __post_init__(self) -> None:
        n = len(self.pixels)
        for column in COLUMNS:
            if len(getattr(self, column)) != n:
                raise ValueError(f"FrameSet.{column} has {len(getattr(self, column))} rows; "
                                 f"pixels has {n}")

    def __len__(self) -> int:
        return len(self.pixels)

    def subset(self, index: np.ndarray) -> FrameSet:
        """The rows ``index`` (integer indices or a boolean mask)."""
        index = np.asarray(index)
        if index.dtype == bool:
            index = np.flatnonzero(index)
        names = None if self.names is None else [self.names[i] for i in index]
        return FrameSet(self.pixels[index], *(getattr(self, c)[index] for c in COLUMNS), names)

    @staticmethod
    def concatenate(parts: Sequence[FrameSet], image_shape: tuple[int, int, int]) -> FrameSet:
        """Join frame sets row-wise (an empty sequence gives an empty set of ``image_shape``)."""
        if not parts:
            return empty_frames(image_shape)
        names = None
        if all(p.names is not None for p in parts):
            names = [name for p in parts for name in p.names]
        return FrameSet(
            np.concatenate([p.pixels for p in parts]),
            *(np.concatenate([getattr(p, c) for p in parts]) for c in COLUMNS),
            names,
        )

    def class_counts(self) -> dict[str, int]:
        positives = int(np.sum(self.label))
        return {"positives": positives, "negatives": len(self) - positives}


def empty_frames(image_shape: tuple[int, int, int]) -> FrameSet:
    return FrameSet(
        np.zeros((0, *image_shape), np.uint8), np.zeros(0, bool), np.zeros(0, np.int64),
        np.zeros(0, np.int32), np.zeros(0, np.float32), np.zeros(0, np.float32),
        np.zeros(0, np.int8),
    )


# --------------------------------------------------------------------------- splits, balance
def split_episodes(
    episodes: Iterable[int], fractions: Sequence[float] = (0.7, 0.15, 0.15), seed: int = 0
) -> dict[str, np.ndarray]:
    """Assign whole episodes to train/val/test at random.

    Args:
        episodes: Episode ids (repeats allowed: one per frame).
        fractions: Shares of episodes for train, val and test; they must sum to 1.
        seed: Seed of the shuffle.

    Returns:
        ``{"train": ids, "val": ids, "test": ids}``, disjoint, every id in exactly one split.
        With at least three episodes, every split gets at least one.

    Raises:
        ValueError: Fractions not three non-negative numbers summing to 1, or no episodes.
    """
    fractions = np.asarray(fractions, dtype=float)
    if fractions.shape != (3,) or np.any(fractions < 0) or not np.isclose(fractions.sum(), 1):
        raise ValueError(f"split fractions={fractions.tolist()}; expected three shares "
                         "(train, val, test) >= 0 summing to 1")
    ids = np.unique(np.asarray(list(episodes), dtype=np.int64))
    if len(ids) == 0:
        raise ValueError("no episodes to split")
    ids = np.random.default_rng(seed).permutation(ids)
    counts = np.floor(fractions * len(ids)).astype(int)
    counts[0] = len(ids) - counts[1] - counts[2]
    if len(ids) >= 3:  # every split with a positive share gets at least one episode
        for i in (1, 2):
            if fractions[i] > 0 and counts[i] == 0 and counts[0] > 1:
                counts[i], counts[0] = 1, counts[0] - 1
    bounds = np.cumsum(counts)
    return {
        "train": np.sort(ids[:bounds[0]]),
        "val": np.sort(ids[bounds[0]:bounds[1]]),
        "test": np.sort(ids[bounds[1]:]),
    }


def split_frames(
    frames: FrameSet, fractions: Sequence[float] = (0.7, 0.15, 0.15), seed: int = 0
) -> dict[str, FrameSet]:
    """Split frames into train/val/test by episode (no episode in two splits)."""
    assignment = split_episodes(frames.episode, fractions, seed)
    return {name: frames.subset(np.isin(frames.episode, ids)) for name, ids in assignment.items()}


def balance_classes(
    frames: FrameSet, hard_margin: float, hard_fraction: float, seed: int = 0
) -> np.ndarray:
    """Indices of a class-balanced subset that keeps near-miss negatives.

    Both classes get ``n = min(#positives, #negatives)`` frames. Negatives are drawn first from
    near-misses (``0 <= margin < hard_margin``), up to ``hard_fraction * n``, then from the rest
    (and again from near-misses if the rest runs out).

    Args:
        frames: Frames with labels and margins.
        hard_margin: Metres outside the success region that still count as a near-miss.
        hard_fraction: Largest share of the kept negatives that are near-misses.
        seed: Seed of the draws.

    Returns:
        Sorted row indices.
    """
    if not 0 <= hard_fraction <= 1:
        raise ValueError(f"hard_fraction={hard_fraction}; expected a share in [0, 1]")
    rng = np.random.default_rng(seed)
    positives = np.flatnonzero(frames.label)
    negatives = np.flatnonzero(~frames.label)
    n = min(len(positives), len(negatives))
    near = frames.margin[negatives] < hard_margin  # NaN (unknown) compares False: not near
    hard, easy = rng.permutation(negatives[near]), rng.permutation(negatives[~near])
    take_hard = min(len(hard), int(round(hard_fraction * n)))
    take_easy = min(len(easy), n - take_hard)
    take_hard = min(len(hard), n - take_easy)
    chosen = np.concatenate((
        rng.choice(positives, n, replace=False), hard[:take_hard], easy[:take_easy]
    ))
    return np.sort(chosen)


# ------------------------------------------------------------------------------ collection
@dataclass(frozen=True)
class CollectConfig:
    """How to collect detector frames for one task (``conf/collect_detector_data.yaml``).

    Attributes:
        task: Task name.
        episodes: Episodes to roll out (before balancing).
        difficulty: ``[low, high]``; each episode draws its difficulty uniformly from it.
        camera: Camera to render; several joined by ``+`` (``"front+overhead"``) store their
            views side by side in each frame, for a multi-view detector.
        image_size: Side of the square frames.
        policies: Weight of each policy kind in :data:`POLICIES`; missing kinds weigh 0.
        noise: ``[low, high]`` of the Gaussian action noise of ``noisy_expert``.
        frame_stride: Keep a frame every this many steps (plus all near the success boundary).
        hard_margin: Metres from the success boundary that count as near (either side).
        hard_fraction: Largest share of kept negatives that are near-misses.
        splits: Shares of episodes for train, val and test.
        seed: Seed of everything random in the collection.
        workers: Processes rolling out episodes (1: in this process).
    """

    task: str = "push"
    episodes: int = 300
    difficulty: tuple[float, float] = (0.0, 1.0)
    camera: str = "front"
    image_size: int = 84
    policies: dict[str, float] = field(default_factory=lambda: {
        "expert": 0.15, "noisy_expert": 0.2, "offset_goal": 0.2, "stop_short": 0.1,
        "decoy": 0.15, "perturbed": 0.1, "random": 0.1,
    })
    noise: tuple[float, float] = (0.2, 0.6)
    frame_stride: int = 4
    hard_margin: float = 0.03
    hard_fraction: float = 0.5
    splits: tuple[float, float, float] = (0.7, 0.15, 0.15)
    seed: int = 0
    workers: int = 1

    @property
    def frame_shape(self) -> tuple[int, int, int]:
        """Shape of one stored frame: the views side by side."""
        from tasks.base import camera_views

        return (self.image_size, len(camera_views(self.camera)) * self.image_size, 3)

    def __post_init__(self) -> None:
        import tasks

        for name in ("difficulty", "noise", "splits"):
            object.__setattr__(self, name, tuple(float(v) for v in getattr(self, name)))
        object.__setattr__(self, "policies", {k: float(v) for k, v in self.policies.items()})
        if self.task not in tasks.TASKS:
            raise ValueError(f"task={self.task!r}; expected one of {sorted(tasks.TASKS)}")
        if int(self.episodes) < 3:
            raise ValueError(f"episodes={self.episodes}; expected >= 3 (one per split at least)")
        low, high = self.difficulty
        if not 0 <= low <= high <= 1:
            raise ValueError(f"difficulty={list(self.difficulty)}; expected 0 <= low <= high <= 1")
        unknown = sorted(set(self.policies) - set(POLICIES))
        if unknown:
            raise ValueError(f"unknown policy kind(s) {unknown}; choose from {list(POLICIES)}")
        if any(w < 0 for w in self.policies.values()) or sum(self.policies.values()) <= 0:
            raise ValueError(f"policies={self.policies}; expected weights >= 0, not all 0")
        if not 0 <= self.noise[0] <= self.noise[1]:
            raise ValueError(f"noise={list(self.noise)}; expected 0 <= low <= high")
        if int(self.frame_stride) < 1:
            raise ValueError(f"frame_stride={self.frame_stride}; expected >= 1")
        if self.hard_margin <= 0:
            raise ValueError(f"hard_margin={self.hard_margin}; expected metres > 0")
        if int(self.workers) < 1:
            raise ValueError(f"workers={self.workers}; expected >= 1")
        split_episodes(range(3), self.splits)  # validates the shares


def success_margin(env) -> float:
    """Metres by which the state misses the task's success region; negative inside it.

    Used to find near-misses (hard negatives) and near-successes, never for labels: labels come
    from the task's predicate. The drawer's margin is how far it is from ``OPEN_THRESHOLD``.
    """
    from tasks import drawer, pick_place, push, reach

    base = env.unwrapped
    task = base.task
    if task.name == "push":
        cube = task.cube_position(base)
        return float(np.linalg.norm(cube[:2] - task.state["goal"][:2]) - push.SUCCESS_RADIUS)
    if task.name == "pick_place":
        cube = base.data.xpos[task.cube_body]
        return float(np.linalg.norm(cube - task.state["goal"]) - pick_place.SUCCESS_RADIUS)
    if task.name == "reach":
        return float(np.linalg.norm(base.ee_position - task.state["goal"]) - reach.SUCCESS_RADIUS)
    if task.name == "drawer_open":
        return float(drawer.OPEN_THRESHOLD - task.opening(base))
    raise ValueError(f"no success margin defined for task {task.name!r}")


@contextmanager
def _expert_goal(env, goal: np.ndarray | None):
    """Let the scripted expert aim at ``goal`` for one action; the task's goal is put back."""
    task = env.unwrapped.task
    if goal is None:
        yield
        return
    true_goal = task.state["goal"]
    task.state["goal"] = goal
    try:
        yield
    finally:
        task.state["goal"] = true_goal


def _offset_goal(env, rng: np.random.Generator, config: CollectConfig) -> np.ndarray | None:
    """A goal displaced so that reaching it misses success by 0.3 cm .. ``hard_margin``."""
    from tasks import pick_place, push, reach

    task = env.unwrapped.task
    radius = {"push": push.SUCCESS_RADIUS, "pick_place": pick_place.SUCCESS_RADIUS,
              "reach": reach.SUCCESS_RADIUS}.get(task.name)
    if radius is None:
        return None
    direction = rng.normal(size=3)
    if task.name == "push":
        direction[2] = 0.0
    direction /= np.linalg.norm(direction)
    distance = radius + rng.uniform(0.003, config.hard_margin)
    goal = np.array(task.state["goal"], dtype=float)
    return goal + distance * direction


class _EpisodePolicy:
    """One episode's behaviour, drawn from :data:`POLICIES` (see the module docstring)."""

    def __init__(self, kind: str, env, rng: np.random.Generator, config: CollectConfig) -> None:
        import tasks

        self.kind, self.env, self.rng = kind, env, rng
        noise = rng.uniform(*config.noise) if kind == "noisy_expert" else 0.0
        self.expert = tasks.ScriptedExpert(env, noise=noise, seed=int(rng.integers(2**31)))
        task = env.unwrapped.task
        self.goal = _offset_goal(env, rng, config) if kind == "offset_goal" else None
        if kind == "offset_goal" and self.goal is None:
            self.kind = "stop_short"  # no goal to displace (drawer): stop short instead
        if kind == "decoy":
            if task.name in DECOY_TASKS:
                goal = np.asarray(task.state["goal"], dtype=float)
                height = goal[2] + rng.uniform(-0.01, 0.03)
                self.decoy = np.array([*(goal[:2] + rng.normal(0, 0.01, 2)), max(height, 0.02)])
                self.decoy_gripper = float(rng.choice([-1.0, 1.0]))
            else:  # the gripper at the goal is success (reach) or there is no goal (drawer)
                self.kind = "stop_short"
        self.stop_margin = rng.uniform(0.002, config.hard_margin)
        self.switch_step = int(rng.integers(10, env.unwrapped.max_episode_steps))
        self.holding = False
        self.gripper = -1.0

    def __call__(self, margin: float, step: int) -> np.ndarray:
        if self.kind == "random" or (self.kind == "perturbed" and step >= self.switch_step):
            return self.rng.uniform(-1, 1, 4).astype(np.float32)
        if self.kind == "stop_short" and (self.holding or 0 < margin < self.stop_margin):
            self.holding = True
            return np.array([0.0, 0.0, 0.0, self.gripper], dtype=np.float32)
        if self.kind == "decoy":
            return self._decoy_action()
        with _expert_goal(self.env, self.goal):
            action = self.expert()
        self.gripper = float(action[3])
        return action

    def _decoy_action(self) -> np.ndarray:
        """Travel high to above the goal, descend onto it, then wander there."""
        from tasks.reach import move_towards

        ee = self.env.unwrapped.ee_position
        if np.linalg.norm(ee[:2] - self.decoy[:2]) > 0.015:
            target = np.array([*self.decoy[:2], max(self.decoy[2], 0.09)])
            motion = move_towards(ee, target)
        else:
            motion = move_towards(ee, self.decoy, gain=0.5) + self.rng.normal(0, 0.3, 3)
        return np.append(np.clip(motion, -1, 1), self.decoy_gripper).astype(np.float32)


def collect_episode(env, episode: int, config: CollectConfig) -> FrameSet:
    """Roll out one episode and return its kept, labelled frames (before balancing).

    Args:
        env: A task environment made with ``terminate_on_success=False``.
        episode: Episode id; it seeds the episode, so results do not depend on ``workers``.
        config: The collection settings.
    """
    from success_detectors.scripted import ScriptedDetector

    rng = np.random.default_rng([config.seed, episode])
    weights = np.array([config.policies.get(kind, 0.0) for kind in POLICIES])
    kind = POLICIES[int(rng.choice(len(POLICIES), p=weights / weights.sum()))]
    difficulty = float(rng.uniform(*config.difficulty))
    env.reset(seed=int(rng.integers(2**31)), options={"difficulty": difficulty})
    policy = _EpisodePolicy(kind, env, rng, config)
    label_of = ScriptedDetector()
    base = env.unwrapped

    rows: dict[str, list] = {"pixels": [], "label": [], "step": [], "margin": []}
    step, done, last_margin = 0, False, np.inf
    while True:
        margin = success_margin(env)
        # Near the boundary, keep every frame that moved the margin by NEAR_STEP or more; a
        # policy holding still there would otherwise fill the set with copies of one frame.
        near = abs(margin) < config.hard_margin and abs(margin - last_margin) >= NEAR_STEP
        if step % config.frame_stride == 0 or near:
            last_margin = margin
            rows["pixels"].append(base.render_camera(config.camera, config.image_size))
            rows["label"].append(bool(label_of({"env": [env]})[0]))
            rows["step"].append(step)
            rows["margin"].append(margin)
        if done:
            break
        _, _, terminated, truncated, info = env.step(policy(margin, step))
        step += 1
        done = terminated or truncated or bool(info.get("physics_error"))
        if info.get("physics_error"):
            break  # the state was reset: later frames would be meaningless
    n = len(rows["label"])
    return FrameSet(
        pixels=np.stack(rows["pixels"]).astype(np.uint8),
        label=np.array(rows["label"], dtype=bool),
        episode=np.full(n, episode, dtype=np.int64),
        step=np.array(rows["step"], dtype=np.int32),
        difficulty=np.full(n, difficulty, dtype=np.float32),
        margin=np.array(rows["margin"], dtype=np.float32),
        policy=np.full(n, POLICIES.index(policy.kind), dtype=np.int8),
    )


def _collect_chunk(config: CollectConfig, episodes: list[int]) -> FrameSet:
    import torch

    import tasks
    from tasks.base import camera_views

    torch.set_num_threads(1)  # workers share the machine: one thread each
    # The env's own camera only matters for its observations (state here); frames come from
    # render_camera(config.camera), which also takes several views joined by "+".
    env = tasks.make(config.task, obs_mode="state", camera=camera_views(config.camera)[0],
                     image_size=config.image_size, terminate_on_success=False)
    try:
        parts = [collect_episode(env, episode, config) for episode in episodes]
    finally:
        env.close()
    return FrameSet.concatenate(parts, config.frame_shape)


def collect_frames(config: CollectConfig, progress: bool = True) -> FrameSet:
    """Roll out ``config.episodes`` episodes (in ``config.workers`` processes) and label frames."""
    from tqdm import tqdm

    episodes = list(range(config.episodes))
    chunk = max(1, min(10, config.episodes // (4 * config.workers)))
    chunks = [episodes[i:i + chunk] for i in range(0, len(episodes), chunk)]
    bar = tqdm(total=config.episodes, desc=f"collect {config.task}", unit="ep",
               disable=not progress)
    parts = []
    if config.workers == 1:
        for part in chunks:
            parts.append(_collect_chunk(config, part))
            bar.update(len(part))
    else:
        # spawn: a forked child would inherit the parent's OpenGL and thread state
        with ProcessPoolExecutor(config.workers, mp_context=get_context("spawn")) as pool:
            for part, frames in zip(chunks, pool.map(_collect_chunk, [config] * len(chunks),
                                                     chunks), strict=True):
                parts.append(frames)
                bar.update(len(part))
    bar.close()
    return FrameSet.concatenate(parts, config.frame_shape)


def build_dataset(config: CollectConfig, progress: bool = True) -> dict[str, FrameSet]:
    """Collect, split by episode and class-balance each split.

    Raises:
        ValueError: A split holds frames of one class only (too few episodes).
    """
    frames = collect_frames(config, progress)
    splits = split_frames(frames, config.splits, config.seed)
    for name, part in splits.items():
        counts = part.class_counts()
        if min(counts.values()) == 0:
            raise ValueError(
                f"the {name} split ({len(np.unique(part.episode))} episodes) has {counts}; "
                f"collect more episodes than {config.episodes} or give more weight to experts"
            )
    return {
        name: part.subset(balance_classes(part, config.hard_margin, config.hard_fraction,
                                          seed=config.seed + i))
        for i, (name, part) in enumerate(splits.items())
    }


def dataset_summary(splits: Mapping[str, FrameSet], hard_margin: float) -> dict[str, Any]:
    """Frames, episodes, classes and near-misses per split (plain values for JSON)."""
    summary = {}
    for name, part in splits.items():
        near = (~part.label) & (part.margin < hard_margin)
        summary[name] = {
            "frames": len(part), "episodes": int(len(np.unique(part.episode))),
            **part.class_counts(), "near_miss_negatives": int(np.sum(near)),
            "policies": {kind: int(np.sum(part.policy == i)) for i, kind in enumerate(POLICIES)},
        }
    return summary


# ------------------------------------------------------------------------------------ HDF5
def write_dataset(
    path: str | os.PathLike, splits: Mapping[str, FrameSet], *, task: str, camera: str,
    config: Mapping[str, Any] | None = None,
) -> Path:
    """Write the splits to an HDF5 file atomically (layout in the module docstring)."""
    import h5py

    from success_detectors.cnn import write_atomically

    missing = [name for name in SPLITS if name not in splits]
    if missing:
        raise ValueError(f"write_dataset needs splits {list(SPLITS)}; missing {missing}")
    image_shape = splits["train"].pixels.shape[1:]

    def write(temp: Path) -> None:
        with h5py.File(temp, "w") as file:
            file.attrs.update({
                "format": DATA_FORMAT, "version": DATA_VERSION, "task": task, "camera": camera,
                "image_size": int(image_shape[0]), "policies": json.dumps(list(POLICIES)),
                "config": json.dumps(dict(config or {})),
            })
            for name in SPLITS:
                part, group = splits[name], file.create_group(name)
                if len(part):
                    group.create_dataset("pixels", data=part.pixels, compression="lzf",
                                         chunks=(min(64, len(part)), *image_shape))
                else:
                    group.create_dataset("pixels", data=part.pixels)
                for column in COLUMNS:
                    group.create_dataset(column, data=getattr(part, column))

    return write_atomically(path, write)


def read_attrs(path: str | os.PathLike) -> dict[str, Any]:
    """The root attributes of a detector HDF5 file (task, camera, image_size, ...)."""
    import h5py

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"detector dataset {path} does not exist; collect one with "
                                "scripts/collect_detector_data.py")
    try:
        with h5py.File(path, "r") as file:
            attrs = dict(file.attrs)
    except OSError as error:
        raise ValueError(f"{path} is not a readable HDF5 file: {error}") from error
    if attrs.get("format") != DATA_FORMAT:
        raise ValueError(f"{path} is not a detector dataset (format {attrs.get('format')!r}, "
                         f"expected {DATA_FORMAT!r})")
    attrs["config"] = json.loads(attrs.get("config", "{}"))
    attrs["policies"] = json.loads(attrs.get("policies", "[]"))
    attrs["image_size"] = int(attrs["image_size"])
    return attrs


def read_split(path: str | os.PathLike, split: str) -> FrameSet:
    """Load one split (``train``, ``val`` or ``test``) of a detector HDF5 file into memory."""
    import h5py

    read_attrs(path)
    if split not in SPLITS:
        raise ValueError(f"split={split!r}; expected one of {list(SPLITS)}")
    with h5py.File(path, "r") as file:
        if split not in file:
            raise ValueError(f"{path} has no split {split!r}; it has {sorted(file)}")
        group = file[split]
        return FrameSet(group["pixels"][()], *(group[column][()] for column in COLUMNS))


def read_dataset(path: str | os.PathLike) -> dict[str, FrameSet]:
    """All three splits of a detector HDF5 file."""
    return {split: read_split(path, split) for split in SPLITS}


# ---------------------------------------------------------------------------- image folders
def load_image_folder(image_dir: str | os.PathLike, image_size: int) -> FrameSet:
    """Photos from ``image_dir/success/`` and ``image_dir/failure/`` as labelled RGB frames.

    Each photo is centre-cropped to a square and resized to ``image_size`` (area averaging).
    Files that are not ``.png``, ``.jpg`` or ``.jpeg`` are ignored, as are hidden files.

    Raises:
        FileNotFoundError: ``image_dir`` does not exist.
        ValueError: A class folder is missing or holds no images (one class only), no images at
            all, or an image file cannot be decoded (the file is named).
    """
    import cv2

    root = Path(image_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"image_dir {root} does not exist")
    files: dict[str, list[Path]] = {}
    ignored = 0
    for label in ("success", "failure"):
        folder = root / label
        entries = sorted(folder.iterdir()) if folder.is_dir() else []
        files[label] = [p for p in entries if p.is_file() and not p.name.startswith(".")
                        and p.suffix.lower() in IMAGE_SUFFIXES]
        ignored += sum(1 for p in entries if p.is_file()) - len(files[label])
    counts = {label: len(paths) for label, paths in files.items()}
    if sum(counts.values()) == 0:
        raise ValueError(
            f"image_dir {root} holds no images: expected {root}/success/*.png|jpg and "
            f"{root}/failure/*.png|jpg ({ignored} file(s) with other extensions ignored)"
        )
    empty = [label for label, n in counts.items() if n == 0]
    if empty:
        raise ValueError(
            f"image_dir {root} has one class only ({counts}); a detector needs images in both "
            f"{root}/success/ and {root}/failure/ (missing or empty: {empty})"
        )
    pixels, labels, names = [], [], []
    for label, paths in files.items():
        for path in paths:
            image = cv2.imread(str(path), cv2.IMREAD_COLOR)
            if image is None:
                raise ValueError(f"cannot read image {path}: not a decodable PNG/JPEG file")
            pixels.append(_square_resize(cv2.cvtColor(image, cv2.COLOR_BGR2RGB), image_size))
            labels.append(label == "success")
            names.append(f"{label}/{path.name}")
    n = len(pixels)
    return FrameSet(
        pixels=np.stack(pixels).astype(np.uint8), label=np.array(labels, dtype=bool),
        episode=np.arange(n, dtype=np.int64), step=np.zeros(n, np.int32),
        difficulty=np.full(n, np.nan, np.float32), margin=np.full(n, np.nan, np.float32),
        policy=np.full(n, -1, np.int8), names=names,
    )


def _square_resize(image: np.ndarray, size: int) -> np.ndarray:
    import cv2

    height, width = image.shape[:2]
    side = min(height, width)
    top, left = (height - side) // 2, (width - side) // 2
    crop = image[top:top + side, left:left + side]
    interpolation = cv2.INTER_AREA if side > size else cv2.INTER_LINEAR
    return cv2.resize(crop, (size, size), interpolation=interpolation)


def config_dict(config: Any) -> dict[str, Any]:
    """A dataclass config as plain values (tuples as lists) for JSON and HDF5 attributes."""
    return json.loads(json.dumps(asdict(config)))
