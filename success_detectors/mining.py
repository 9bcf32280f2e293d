"""Hard-negative mining: the frames of fresh rollouts that a trained detector calls success while
the scripted predicate says failure go back into its training split (HIL-SERL's loop).

The loop is collect, train, mine (:func:`mine_hard_negatives`), append to the training split
(:func:`append_to_train`), retrain on the enlarged file, and mine again with the new detector to
see how many false positives are left. Rollouts come from the episode policies of
:mod:`success_detectors.episode_policies` at chosen weights, or from a trained policy's run
(``policy_run``), whose own near-misses are what RL would learn to exploit.

**Bookkeeping.** Mined episodes get ids above every id in the data file and land in ``train``
only; ``val`` and ``test`` are copied unchanged, so the threshold is still chosen, and the
detector still measured, on the episodes held out at collection. Each round is recorded in the
file's ``mining`` attribute (checkpoint, threshold, episode ids, counts).

**Camera mounts.** The fresh frames are rendered by this code's cameras, so the data file and
the checkpoint must record the mounts this code builds (a mismatch is an error; a file or
checkpoint that records none passes with a warning); the enlarged file keeps the data file's.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from success_detectors.collection import CollectConfig, collect_episode, record_episode
from success_detectors.episode_policies import POLICIES
from success_detectors.frames import FrameSet
from success_detectors.metrics import ratio_or_nan

COUNTS = ("episodes", "frames", "true_positives", "false_positives", "true_negatives",
          "false_negatives", "added")

# policy_run -> (task, its task options, observation -> action). Loading a run's policy is the
# harness's job, a floor above this package: the caller passes the loader
# (scripts/mine_hard_negatives.py passes harness.checkpoints'); it must be picklable (a
# module-level function) for workers > 1.
PolicyLoader = Callable[[str], tuple[str, dict[str, Any], Callable[[Any], np.ndarray]]]


@dataclass(frozen=True)
class MineConfig:
    """One round of hard-negative mining (``conf/mine_hard_negatives.yaml``).

    Attributes:
        checkpoint: The detector whose false positives are mined.
        data: The detector data file it was trained on; the mined frames join its train split.
        out: The enlarged file; ``None``: ``<data stem>_mined.h5`` beside ``data``.
        episodes: Rollouts to scan.
        policies: Weights of the episode policies that roll out (ignored with ``policy_run``).
        policy_run: A trained policy's run directory or checkpoint (``scripts/evaluate.py``
            accepts the same); its greedy rollouts replace the episode policies. Needs a
            :data:`PolicyLoader`.
        difficulty: ``[low, high]``; each episode draws its difficulty uniformly from it.
        noise: ``[low, high]`` of the action noise of ``noisy_expert``.
        hard_margin: Metres from the success boundary that count as near (episode policies).
        frame_stride: Scan a frame every this many steps.
        max_per_episode: Most false positives kept from one episode, spread evenly over its
            false positives (consecutive frames are near copies).
        threshold: Verdict threshold; ``None`` uses the checkpoint's.
        seed: Seed of the rollouts; the episode ids differ from the collection's anyway.
        workers: Processes rolling out episodes.
    """

    checkpoint: str
    data: str
    out: str | None = None
    episodes: int = 200
    policies: dict[str, float] = field(default_factory=lambda: {
        "noisy_expert": 0.3, "offset_goal": 0.25, "stop_short": 0.15, "decoy": 0.15,
        "perturbed": 0.15,
    })
    policy_run: str | None = None
    difficulty: tuple[float, float] = (0.0, 1.0)
    noise: tuple[float, float] = (0.2, 0.6)
    hard_margin: float = 0.03
    frame_stride: int = 1
    max_per_episode: int = 8
    threshold: float | None = None
    seed: int = 1
    workers: int = 1

    def __post_init__(self) -> None:
        for name in ("episodes", "frame_stride", "max_per_episode", "workers"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name}={getattr(self, name)}; expected an integer >= 1")
        object.__setattr__(self, "policies", {k: float(v) for k, v in self.policies.items()})
        unknown = sorted(set(self.policies) - set(POLICIES))
        if unknown:
            raise ValueError(f"unknown policy kind(s) {unknown}; choose from {list(POLICIES)}")
        if self.threshold is not None and not 0 < self.threshold <= 1:
            raise ValueError(f"threshold={self.threshold}; expected (0, 1] or null")

    @property
    def out_path(self) -> Path:
        """Where the enlarged file goes."""
        if self.out:
            return Path(self.out)
        data = Path(self.data)
        return data.with_name(f"{data.stem}_mined{data.suffix}")


@dataclass
class MiningResult:
    """What one round found: the kept false positives and the counts over every scanned frame
    (``true_positives`` ... ``false_negatives`` at the detector's threshold, ``added``)."""

    frames: FrameSet
    counts: dict[str, int]

    def rates(self) -> dict[str, float]:
        """``detector/…`` rates of the scanned frames (NaN where a denominator is 0)."""
        c = self.counts
        negatives = c["false_positives"] + c["true_negatives"]
        return {
            "detector/false_positive_rate": ratio_or_nan(c["false_positives"], negatives),
            "detector/precision": ratio_or_nan(c["true_positives"],
                                               c["true_positives"] + c["false_positives"]),
            "detector/recall": ratio_or_nan(c["true_positives"],
                                            c["true_positives"] + c["false_negatives"]),
        }


def keep_false_positives(frames: FrameSet, probs: np.ndarray, threshold: float,
                         max_per_episode: int) -> np.ndarray:
    """Rows of ``frames`` the detector calls success (``probs >= threshold``) whose label is
    failure, at most ``max_per_episode`` per episode, spread evenly over each episode's.

    Returns:
        Sorted row indices.
    """
    false_pos = np.flatnonzero((probs >= threshold) & ~frames.label)
    kept = []
    for episode in np.unique(frames.episode[false_pos]):
        rows = false_pos[frames.episode[false_pos] == episode]
        if len(rows) > max_per_episode:
            rows = rows[np.round(np.linspace(0, len(rows) - 1, max_per_episode)).astype(int)]
        kept.append(rows)
    return np.sort(np.concatenate(kept)) if kept else np.zeros(0, np.int64)


def stepwise(policy_fn: Callable[[Any], np.ndarray]) -> Callable[[Any, float, int], np.ndarray]:
    """``record_episode``'s ``act`` from a policy function that answers one action or a chunk
    ``(k, action_dim)`` of them: the chunk's actions are played one per step, and an episode's
    first step (``step == 0``) drops what the previous episode left."""
    queue: list[np.ndarray] = []

    def act(obs: Any, _margin: float, step: int) -> np.ndarray:
        if step == 0:
            queue.clear()
        if not queue:
            actions = np.asarray(policy_fn(obs))
            queue.extend(actions if actions.ndim == 2 else [actions])
        return queue.pop(0)
    return act


def _rollout_source(config: MineConfig, task: str, camera: str, image_size: int,
                    policy_loader: PolicyLoader | None):
    """The env and ``run(env, episode) -> FrameSet`` of one worker."""
    import tasks
    from tasks.rendering import camera_views

    # With policy_run only the recording settings of this config are read (camera, size,
    # stride), not its policies.
    collect = CollectConfig(
        task=task, camera=camera, image_size=image_size,
        policies=config.policies if config.policy_run is None else {"expert": 1.0},
        difficulty=config.difficulty, noise=config.noise, frame_stride=config.frame_stride,
        hard_margin=config.hard_margin, seed=config.seed,
    )
    if config.policy_run is None:
        env = tasks.make(collect.task, obs_mode="state", camera=camera_views(camera)[0],
                         image_size=image_size, terminate_on_success=False)
        return env, lambda env, episode: collect_episode(env, episode, collect)

    run_task, options, policy_fn = policy_loader(config.policy_run)
    if run_task != task:
        raise ValueError(f"policy_run {config.policy_run} plays {run_task!r}; the detector is "
                         f"for {task!r}")
    env = tasks.make(task, **{**options, "terminate_on_success": False})

    def run(env, episode: int) -> FrameSet:
        rng = np.random.default_rng([config.seed, episode])
        difficulty = float(rng.uniform(*config.difficulty))
        obs, _ = env.reset(seed=int(rng.integers(2**31)), options={"difficulty": difficulty})
        return record_episode(env, stepwise(policy_fn), collect,
                              episode=episode, difficulty=difficulty, policy_index=-1, obs=obs)

    return env, run


def _mine_chunk(config: MineConfig, episodes: list[int],
                policy_loader: PolicyLoader | None) -> MiningResult:
    import torch

    from success_detectors.cnn import load_detector

    torch.set_num_threads(1)  # workers share the machine: one thread each
    detector = load_detector(config.checkpoint, threshold=config.threshold)
    env, run = _rollout_source(config, detector.task, detector.camera, detector.image_size,
                               policy_loader)
    parts, counts = [], dict.fromkeys(COUNTS, 0)
    try:
        for episode in episodes:
            frames = run(env, episode)
            probs = detector.predict_proba({"pixels": frames.pixels})
            called = probs >= detector.threshold
            counts["episodes"] += 1
            counts["frames"] += len(frames)
            counts["true_positives"] += int(np.sum(called & frames.label))
            counts["false_positives"] += int(np.sum(called & ~frames.label))
            counts["true_negatives"] += int(np.sum(~called & ~frames.label))
            counts["false_negatives"] += int(np.sum(~called & frames.label))
            kept = frames.subset(keep_false_positives(frames, probs, detector.threshold,
                                                      config.max_per_episode))
            counts["added"] += len(kept)
            parts.append(kept)
    finally:
        env.close()
    shape = (detector.image_size, detector.model.architecture.views * detector.image_size, 3)
    return MiningResult(FrameSet.concatenate(parts, shape), counts)


def mine_hard_negatives(config: MineConfig, first_episode: int, progress: bool = True,
                        policy_loader: PolicyLoader | None = None) -> MiningResult:
    """Roll out ``config.episodes`` fresh episodes, ids from ``first_episode`` on, and keep the
    frames the detector calls success while the scripted predicate says failure.

    Args:
        config: The round's settings.
        first_episode: Id of the first rollout; above every id of the data file, so that the
            mined episodes are new and can join the train split alone.
        progress: Show a progress bar.
        policy_loader: Loads ``config.policy_run``'s policy (required with it).

    Raises:
        ValueError: ``config.policy_run`` without a ``policy_loader``, or a checkpoint trained
            on frames of its camera mounted elsewhere than this code mounts it.
    """
    from tqdm import tqdm

    from success_detectors.cnn import load_detector
    from success_detectors.data import camera_mounts

    if config.policy_run is not None and policy_loader is None:
        raise ValueError(f"policy_run={config.policy_run!r} needs a policy_loader "
                         "(scripts/mine_hard_negatives.py passes the harness's)")
    detector = load_detector(config.checkpoint)
    detector.check_camera_mounts(camera_mounts(detector.task, detector.camera))

    episodes = list(range(first_episode, first_episode + config.episodes))
    chunk = max(1, min(10, config.episodes // (4 * config.workers)))
    chunks = [episodes[i:i + chunk] for i in range(0, len(episodes), chunk)]
    bar = tqdm(total=config.episodes, desc="mine", unit="ep", disable=not progress)
    results = []
    if config.workers == 1:
        for part in chunks:
            results.append(_mine_chunk(config, part, policy_loader))
            bar.update(len(part))
    else:
        # spawn: a forked child would inherit the parent's OpenGL and thread state
        with ProcessPoolExecutor(config.workers, mp_context=get_context("spawn")) as pool:
            for part, result in zip(chunks, pool.map(_mine_chunk, [config] * len(chunks), chunks,
                                                     [policy_loader] * len(chunks)),
                                    strict=True):
                results.append(result)
                bar.update(len(part))
    bar.close()
    counts = {key: sum(r.counts[key] for r in results) for key in COUNTS}
    shape = results[0].frames.pixels.shape[1:]
    return MiningResult(FrameSet.concatenate([r.frames for r in results], shape), counts)


def append_to_train(data: str | os.PathLike, out: str | os.PathLike, mined: FrameSet,
                    record: dict[str, Any]) -> Path:
    """Write ``data`` to ``out`` with ``mined`` appended to its train split (val and test as
    they were), ``record`` appended to its ``mining`` attribute and its camera mounts kept.

    Raises:
        ValueError: A mined episode id already in the file (it could be a val or test episode),
            or frames of another shape than the file's.
    """
    from success_detectors.data import read_attrs, read_dataset, write_dataset

    attrs, splits = read_attrs(data), read_dataset(data)
    used = np.concatenate([part.episode for part in splits.values()])
    clash = np.intersect1d(np.unique(mined.episode), used)
    if len(clash):
        raise ValueError(f"mined episode ids {clash[:5].tolist()} are already in {data}; mined "
                         "episodes must be new so that they cannot leak into val or test")
    shape = splits["train"].pixels.shape[1:]
    if len(mined) and mined.pixels.shape[1:] != shape:
        raise ValueError(f"mined frames are {mined.pixels.shape[1:]}; {data} holds {shape}")
    splits["train"] = FrameSet.concatenate([splits["train"], mined], shape)
    return write_dataset(out, splits, task=attrs["task"], camera=attrs["camera"],
                         config=attrs["config"], mining=[*attrs.get("mining", []), record],
                         camera_mounts=attrs["camera_mounts"])


def first_new_episode(data: str | os.PathLike) -> int:
    """One above the largest episode id in a detector data file."""
    from success_detectors.data import read_dataset

    ids = [part.episode.max() for part in read_dataset(data).values() if len(part)]
    return int(max(ids)) + 1 if ids else 0


def mine_round(config: MineConfig, progress: bool = True,
               report: Callable[[str], None] = print,
               policy_loader: PolicyLoader | None = None) -> tuple[MiningResult, Path]:
    """Mine with ``config`` and write the enlarged file; returns the result and its path.

    ``policy_loader`` loads ``config.policy_run``'s policy (:func:`mine_hard_negatives`).

    Raises:
        ValueError: The checkpoint's task, camera or image size differ from the data file's, or
            the data file or checkpoint records camera mounts other than this code's.
    """
    from success_detectors.cnn import load_detector
    from success_detectors.data import config_dict, read_attrs
    from success_detectors.training import check_data_mounts

    attrs = read_attrs(config.data)
    detector = load_detector(config.checkpoint, task=str(attrs["task"]),
                             camera=str(attrs["camera"]), threshold=config.threshold)
    if detector.image_size != attrs["image_size"]:
        raise ValueError(f"{config.checkpoint} reads {detector.image_size}px frames; "
                         f"{config.data} holds {attrs['image_size']}px")
    check_data_mounts(config.data, detector.task, detector.camera)
    first = first_new_episode(config.data)
    result = mine_hard_negatives(config, first, progress, policy_loader)
    record = {
        **config_dict(replace(config, threshold=detector.threshold)),
        "episode_ids": [first, first + config.episodes - 1], **result.counts,
    }
    out = append_to_train(config.data, config.out_path, result.frames, record)
    report(f"added {len(result.frames)} false positives of {config.checkpoint} to the train "
           f"split; wrote {out}")
    return result, out
