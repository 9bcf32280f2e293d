"""Collection of labelled frames for learned detectors.

Collection rolls out a mix of episode policies (:mod:`success_detectors.episode_policies`) over a
range of difficulties with ``terminate_on_success=False`` and labels every kept frame with the
scripted detector (the task's own predicate). A frame is kept every ``frame_stride`` steps and,
within ``hard_margin`` of the success boundary (the task's :func:`success_margin`, either side),
at every step that moved the margin by ``NEAR_STEP`` (5 mm) or more. Frames are then split by
episode and class-balanced (:mod:`success_detectors.frames`); :mod:`success_detectors.data`
writes them to HDF5.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from typing import Any

import numpy as np

from success_detectors.episode_policies import POLICIES, EpisodePolicy
from success_detectors.frames import FrameSet, balance_classes, split_episodes, split_frames

NEAR_STEP = 0.005  # metres; about half a pixel of the front camera at 84x84


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
        randomization: The ``randomization`` block of the collection's environments
            (:class:`tasks.RandomizationConfig` fields; empty: none), e.g. a visual domain held
            out of training (``conf/visual_domain/held_out.yaml``).
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
    randomization: dict[str, Any] = field(default_factory=dict)

    @property
    def frame_shape(self) -> tuple[int, int, int]:
        """Shape of one stored frame: the views side by side."""
        from tasks.rendering import camera_views

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
        object.__setattr__(self, "randomization", dict(self.randomization))
        tasks.TaskConfig.from_options(self.task, {"randomization": self.randomization})


def success_margin(env) -> float:
    """Metres by which the state misses the task's success region; negative inside it.

    The task's own :meth:`~tasks.task.Task.success_margin` (wrappers are looked through). Used to
    find near-misses (hard negatives) and near-successes, never for labels: labels come from the
    task's predicate.
    """
    base = env.unwrapped
    return base.task.success_margin(base)


def collect_episode(env, episode: int, config: CollectConfig) -> FrameSet:
    """Roll out one episode of a policy drawn from ``config.policies`` and return its kept,
    labelled frames (before balancing).

    Args:
        env: A task environment made with ``terminate_on_success=False``.
        episode: Episode id; it seeds the episode, so results do not depend on ``workers``.
        config: The collection settings.
    """
    rng = np.random.default_rng([config.seed, episode])
    weights = np.array([config.policies.get(kind, 0.0) for kind in POLICIES])
    kind = POLICIES[int(rng.choice(len(POLICIES), p=weights / weights.sum()))]
    difficulty = float(rng.uniform(*config.difficulty))
    env.reset(seed=int(rng.integers(2**31)), options={"difficulty": difficulty})
    policy = EpisodePolicy(kind, env, rng, config.noise, config.hard_margin)
    return record_episode(env, lambda _obs, margin, step: policy(margin, step), config,
                          episode=episode, difficulty=difficulty,
                          policy_index=POLICIES.index(policy.kind))


def record_episode(env, act: Callable[[Any, float, int], np.ndarray], config: CollectConfig,
                   *, episode: int, difficulty: float, policy_index: int,
                   obs: Any = None) -> FrameSet:
    """Step an already reset ``env`` with ``act`` to the episode's end, keeping labelled frames.

    A frame is kept every ``config.frame_stride`` steps and, within ``config.hard_margin`` of
    the success boundary, whenever the margin moved by :data:`NEAR_STEP`; its label is the
    scripted detector's verdict on the same state.

    Args:
        env: A task environment made with ``terminate_on_success=False``, already reset.
        act: ``(observation, margin, step) -> action``.
        config: Camera, image size, ``frame_stride`` and ``hard_margin`` are read.
        episode: Episode id written with each frame.
        difficulty: The episode's difficulty, written with each frame.
        policy_index: Index into :data:`POLICIES` (-1 for a policy that is none of them).
        obs: The observation ``reset`` returned, passed to ``act`` at step 0.
    """
    from success_detectors.scripted import ScriptedDetector

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
        obs, _, terminated, truncated, info = env.step(act(obs, margin, step))
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
        policy=np.full(n, policy_index, dtype=np.int8),
    )


def _collect_chunk(config: CollectConfig, episodes: list[int]) -> FrameSet:
    import torch

    import tasks
    from tasks.rendering import camera_views

    torch.set_num_threads(1)  # workers share the machine: one thread each
    # The env's own camera only matters for its observations (state here); frames come from
    # render_camera(config.camera), which also takes several views joined by "+".
    env = tasks.make(config.task, obs_mode="state", camera=camera_views(config.camera)[0],
                     image_size=config.image_size, terminate_on_success=False,
                     randomization=config.randomization)
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

    A split whose share is 0 stays empty: ``splits=[0, 0, 1]`` makes a test-only file, such as
    a visual domain held out of training.

    Raises:
        ValueError: A split with a share holds frames of one class only (too few episodes).
    """
    frames = collect_frames(config, progress)
    splits = split_frames(frames, config.splits, config.seed)
    for (name, part), share in zip(splits.items(), config.splits, strict=True):
        counts = part.class_counts()
        if share == 0 and len(part) == 0:
            continue
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
