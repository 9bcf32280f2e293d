"""Scripted-expert demonstrations in HDF5, in robomimic's layout.

One file holds the episodes of one task under one set of environment options::

    /                            attrs: checksums ("sha256": every dataset below carries the
                                 SHA-256 of its contents as its ``sha256`` attribute; absent in
                                 files written before checksums, see :func:`load_demos`)
    data/                        attrs: env_args (JSON), total (steps over all demos),
                                 format_version (2; files without it are version 1)
        demo_0/                  attrs: num_samples, success, seed
            obs/<key>            (T, ...) one dataset per observation key, as the env returns it
            actions              (T, 4) float32, the action to learn: the one executed (the
                                 expert's plus its noise), or with label "expert" the
                                 expert's own noise-free action (DART)
            executed_actions     (T, 4) float32, label "expert" only: the action executed
            rewards              (T,) float32
            dones                (T,) uint8, 1 on the step that ended the episode
            snapshots            (T,) variable-length uint8: the exact snapshot the observation
                                 obs[t] was taken in (tasks.snapshot_to_bytes; version 2 on)
        demo_1/ ...

``obs[t]`` is the observation the action ``actions[t]`` was chosen on. ``env_args`` is
``{"env_name": task, "env_kwargs": {...}, "collection": {...}}``: :func:`rebuild_env` turns it back
into the environment the demos came from, so a policy trained on them is evaluated on the same
observations. Files recorded for reuse (the demos a run clones its start policy from) are cached in
:func:`demo_cache_dir`.

Readers verify what they read against the checksums and refuse a damaged file by name
(:class:`harness_common.checksums.ChecksumError`) rather than rebuild it: a flipped bit points
at failing storage or a stray writer that a person should see, and other runs may be reading
the same cached file. Deleting the file makes the next run record it again.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from tqdm import tqdm

import tasks
from harness.demo_episodes import read_episode, record_episode, verify_episode, write_episode
from harness_common import checksums
from harness_common.files import atomic_path
from harness_common.paths import data_dir

ACTION_DIM = 4  # dx, dy, dz, gripper: the action space of every task
DEMO_LABELS: tuple[str, ...] = ("executed", "expert")  # what a demo's ``actions`` hold
MAX_TRIES_PER_DEMO = 10  # with only_successes, attempts allowed per demo asked for
_DEMO_NAME = re.compile(r"demo_(\d+)")
REBUILD_HINT = ("delete it and record it again (a run records its cached demos again when the "
                "file is missing; scripts/collect_demos.py writes a file of your own)")


def demo_cache_dir() -> Path:
    """The folder where recorded demos are cached for reuse: ``<data_dir>/demos``
    (:func:`harness_common.paths.data_dir`: ``HARNESS_DATA``, else a checkout's ``data/``, else
    the user's data folder). Every reader and writer of the cache asks here.

    Returns:
        The folder (it may not exist yet).
    """
    return data_dir() / "demos"


@dataclass(frozen=True)
class Demos:
    """Demonstrations of one file, concatenated over episodes (``N`` steps in all).

    Attributes:
        obs: Observation key -> ``(N, ...)`` array, dtypes as the environment returns them.
        actions: ``(N, action_dim)`` float32 executed actions.
        rewards: ``(N,)`` float32.
        dones: ``(N,)`` bool, true on each episode's last step.
        episode_ids: ``(N,)`` int64, index of the step's episode in ``[0, num_episodes)``.
        successes: ``(num_episodes,)`` bool, the episode ended in success.
        seeds: ``(num_episodes,)`` int64, the ``reset`` seed of each episode.
        env_args: The file's ``env_args`` (see :func:`rebuild_env`).
    """

    obs: dict[str, np.ndarray]
    actions: np.ndarray
    rewards: np.ndarray
    dones: np.ndarray
    episode_ids: np.ndarray
    successes: np.ndarray
    seeds: np.ndarray
    env_args: dict[str, Any]

    @property
    def num_episodes(self) -> int:
        return len(self.successes)

    def __len__(self) -> int:
        return len(self.actions)


def rebuild_env(env_args: dict[str, Any] | str, **overrides: Any) -> tasks.ManipulationEnv:
    """The environment a demo file was recorded in.

    Args:
        env_args: The ``env_args`` of a demo file, as a dict or its JSON string.
        **overrides: Arguments of :func:`tasks.make` replacing the recorded ones, e.g.
            ``render_mode="rgb_array"`` for videos or ``max_episode_steps=200``.

    Returns:
        ``tasks.make(env_args["env_name"], **env_args["env_kwargs"], **overrides)``.

    Raises:
        ValueError: ``env_args`` lacks ``env_name`` or ``env_kwargs``, or an option is invalid.
    """
    if isinstance(env_args, str):
        env_args = json.loads(env_args)
    missing = [key for key in ("env_name", "env_kwargs") if key not in env_args]
    if missing:
        raise ValueError(f"env_args lacks {missing}; got keys {sorted(env_args)}")
    return tasks.make(env_args["env_name"], **{**env_args["env_kwargs"], **overrides})


def collect_demos(
    path: str | os.PathLike, task: str, episodes: int, noise: float = 0.0,
    obs_mode: str = "pixels_state", camera: str = "front", image_size: int = 84,
    difficulty: float = 1.0, seed: int = 0, only_successes: bool = True,
    max_episode_steps: int | None = None, env_options: Mapping[str, Any] | None = None,
    progress: bool = True, label: str = "executed",
) -> dict[str, Any]:
    """Record scripted-expert episodes of ``task`` into an HDF5 file at ``path``.

    Attempt ``i`` starts from ``reset(seed=seed + i, options={"difficulty": difficulty})`` and its
    expert's noise generator is seeded with the same number, so each demo can be replayed from its
    ``seed`` attribute alone. The file is written to a temporary name beside ``path`` and moved
    into place at the end: an interrupted collection never leaves a partial file behind.

    Args:
        path: Output file; its folder is created.
        task: A name in :data:`tasks.TASKS`.
        episodes: Demos to record. With ``only_successes``, failed attempts are dropped and
            retried on the next seed, up to ``MAX_TRIES_PER_DEMO * episodes`` attempts.
        noise: Standard deviation of Gaussian noise on the expert's actions (the noisy, clipped
            action is what is executed and recorded).
        obs_mode: ``"state"``, ``"pixels"`` or ``"pixels_state"``.
        camera: Camera of the pixel observations.
        image_size: Side of the pixel observations.
        difficulty: Start-state difficulty in [0, 1].
        seed: Seed of the first attempt.
        only_successes: Keep only successful episodes; otherwise keep all and mark each one's
            ``success`` attribute.
        max_episode_steps: Override of the task's episode limit.
        env_options: Further options of :func:`tasks.make` that change what is recorded, e.g.
            ``terminate_on_success``, ``randomization``, ``reward_weights``,
            ``render_quality``; stored in ``env_args`` with the others. Dataclass values
            (a ``RandomizationConfig``) are stored as dicts.
        progress: Show a progress bar.
        label: Which action ``actions`` holds: ``"executed"`` (the noisy action that was
            executed) or ``"expert"`` (the expert's noise-free action in the state the noise led
            to, with the executed one in ``executed_actions``: DART's noise injection, Laskey et
            al. 2017, which teaches a cloned policy to recover from its own drift).

    Returns:
        ``{"path", "episodes", "attempts", "steps", "expert_success_rate"}``: demos kept,
        attempts made, steps stored and the expert's success over all attempts.

    Raises:
        ValueError: ``episodes < 1``, an invalid task option, an ``env_options`` key that has
            its own argument here, or an option value that JSON cannot store.
        RuntimeError: With ``only_successes``, the expert did not succeed ``episodes`` times
            within the attempts allowed; nothing is written.
    """
    if episodes < 1:
        raise ValueError(f"episodes={episodes}; must be >= 1")
    env_args = _demo_env_args(task, noise=noise, obs_mode=obs_mode, camera=camera,
                              image_size=image_size, difficulty=difficulty, seed=seed,
                              only_successes=only_successes,
                              max_episode_steps=max_episode_steps, env_options=env_options,
                              label=label)
    env_args_json = json.dumps(env_args)  # _demo_env_args made sure it can
    env = rebuild_env(env_args)
    path = Path(path)
    bar = tqdm(total=episodes, desc=f"demos {task}", disable=not progress, leave=False)
    try:
        with atomic_path(path) as tmp_name, h5py.File(tmp_name, "w") as f:
            data = f.create_group("data")
            tally = _record_demos(data, env, task, episodes, env_args["collection"],
                                  difficulty, bar)
            data.attrs["env_args"] = env_args_json
            data.attrs["total"] = tally.steps
            data.attrs["format_version"] = DEMO_FORMAT_VERSION
            checksums.mark(f)
    finally:
        bar.close()
        env.close()
    return {"path": str(path), "episodes": tally.kept, "attempts": tally.attempts,
            "steps": tally.steps, "expert_success_rate": tally.successes / tally.attempts}


def _demo_env_args(
    task: str, noise: float, obs_mode: str, camera: str, image_size: int, difficulty: float,
    seed: int, only_successes: bool, max_episode_steps: int | None,
    env_options: Mapping[str, Any] | None, label: str,
) -> dict[str, Any]:
    """The ``env_args`` of a demo file from :func:`collect_demos`'s arguments, checked."""
    if label not in DEMO_LABELS:
        raise ValueError(f"label={label!r}; choose one of {DEMO_LABELS}")
    env_kwargs = {
        "obs_mode": obs_mode,
        "camera": camera,
        "image_size": int(image_size),
        "difficulty": float(difficulty),
        "max_episode_steps": max_episode_steps,
    }
    extra = {key: asdict(value) if is_dataclass(value) else value
             for key, value in (env_options or {}).items()}
    clash = sorted(set(extra) & set(env_kwargs))
    if clash:
        raise ValueError(f"env_options {clash} have their own arguments of collect_demos; "
                         "pass them there")
    env_kwargs.update(extra)
    env_args = {
        "env_name": task,
        "env_kwargs": env_kwargs,
        "collection": {"noise": float(noise), "seed": int(seed), "only_successes": only_successes,
                       **({"label": label} if label != "executed" else {})},
    }
    try:  # before recording, not after every episode has been rendered
        json.dumps(env_args)
    except TypeError as error:
        raise ValueError(f"env_options cannot be stored in the demo file: {error}") from None
    return env_args


@dataclass
class _Tally:
    """Demos kept, attempts made, successes among them and steps stored so far."""

    kept: int = 0
    attempts: int = 0
    successes: int = 0
    steps: int = 0


def _record_demos(data: h5py.Group, env: tasks.ManipulationEnv, task: str, episodes: int,
                  collection: Mapping[str, Any], difficulty: float, bar: tqdm) -> _Tally:
    """Record attempts on seeds ``seed, seed + 1, ...`` into ``demo_<i>`` groups of ``data``
    until ``episodes`` are kept or the attempts allowed are spent (see :func:`collect_demos`).

    Raises:
        RuntimeError: Fewer than ``episodes`` demos were kept.
    """
    seed, noise, only_successes = (collection[key] for key in ("seed", "noise", "only_successes"))
    label = collection.get("label", "executed")
    max_attempts = MAX_TRIES_PER_DEMO * episodes if only_successes else episodes
    tally = _Tally()
    while tally.kept < episodes and tally.attempts < max_attempts:
        episode_seed = seed + tally.attempts
        episode = record_episode(env, episode_seed, difficulty, noise, label)
        tally.attempts += 1
        tally.successes += episode["success"]
        if only_successes and not episode["success"]:
            continue
        write_episode(data.create_group(f"demo_{tally.kept}"), episode, episode_seed)
        tally.kept += 1
        tally.steps += len(episode["actions"])
        bar.update(1)
    if tally.kept < episodes:
        raise RuntimeError(
            f"the {task} expert (noise={noise}, difficulty={difficulty}) succeeded in"
            f" {tally.successes} of {tally.attempts} attempts, short of the {episodes} demos"
            " asked for; lower the noise or the difficulty"
        )
    return tally


DEMO_FORMAT_VERSION = 2  # 2: a snapshot per step (start states for the group trainer)


def load_demo_snapshots(path: str | os.PathLike) -> list[list[bytes]]:
    """The snapshot of every step of every demo in ``path``, episode by episode.

    Returns:
        ``snapshots[e][t]``: the bytes of :func:`tasks.snapshot_to_bytes` for step ``t`` of
        episode ``e`` (``tasks.snapshot_from_bytes`` turns them back, checking their digest).

    Raises:
        FileNotFoundError: No file at ``path``.
        ValueError: A file of format version 1, which holds no snapshots (re-record it with
            ``scripts/collect_demos.py``), or a damaged one (a
            :class:`~harness_common.checksums.ChecksumError` when its snapshots do not match
            their checksums).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no demo file at {path}")
    with h5py.File(path, "r") as f:
        data = f["data"]
        version = int(data.attrs.get("format_version", 1))
        if version < 2:
            raise ValueError(f"{path} is a demo file of format version {version}, which holds "
                             "no snapshots; record it again with scripts/collect_demos.py "
                             f"(format version {DEMO_FORMAT_VERSION})")
        checked = checksums.is_checksummed(f)
        names = sorted(data, key=lambda name: int(name.split("_")[1]))
        snapshots = []
        for name in names:
            steps = data[name]["snapshots"][()]
            if checked:
                checksums.verify(data[name]["snapshots"], steps, path, REBUILD_HINT)
            snapshots.append([bytes(step.tobytes()) for step in steps])
    if not checked:
        checksums.adopt_legacy(path, "demo file")
    return snapshots


def load_demos(path: str | os.PathLike, keys: list[str] | tuple[str, ...] | None = None) -> Demos:
    """Read a demo file written by :func:`collect_demos`, concatenating its episodes in order.

    Every array read is verified against its checksum; a file written before checksums is
    accepted unchecked once and given them (:func:`harness_common.checksums.adopt_legacy`).

    Args:
        path: The HDF5 file.
        keys: Observation keys to load (all when ``None``); loading only ``state`` skips the
            images.

    Returns:
        The demonstrations.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: The file is not HDF5, lacks the ``data`` group, its attributes or any demo,
            a requested key is missing, or a demo's arrays disagree in length.
        harness_common.checksums.ChecksumError: A ``ValueError``: an array read does not match
            its checksum (the file and dataset are named).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no demo file at {path}")
    try:
        f = h5py.File(path, "r")
    except OSError as error:
        raise ValueError(f"{path} is not a readable HDF5 demo file: {error}") from error
    with f:
        if "data" not in f or "env_args" not in f["data"].attrs:
            raise ValueError(f"{path} has no 'data' group with an 'env_args' attribute")
        data = f["data"]
        try:
            env_args = json.loads(data.attrs["env_args"])
        except (TypeError, ValueError) as error:
            raise ValueError(f"{path}: the 'env_args' attribute of 'data' is not JSON "
                             f"({error})") from None
        names = sorted(
            (name for name in data if _DEMO_NAME.fullmatch(name)),
            key=lambda name: int(name[len("demo_"):]),
        )
        if not names:
            raise ValueError(f"{path} holds no demo_<i> groups under 'data'")
        available = sorted(data[names[0]]["obs"])
        wanted = available if keys is None else list(keys)
        unknown = sorted(set(wanted) - set(available))
        if unknown:
            raise ValueError(f"{path} has no observation key(s) {unknown}; it has {available}")
        try:
            episodes = [read_episode(data[name], wanted) for name in names]
        except (KeyError, OSError) as error:
            raise ValueError(f"{path} is damaged: {error}; {REBUILD_HINT}") from error
        for name, episode in zip(names, episodes, strict=True):
            _check_episode(path, name, episode)
        checked = checksums.is_checksummed(f)
        if checked:
            for name, episode in zip(names, episodes, strict=True):
                verify_episode(data[name], episode, path, REBUILD_HINT)
    if not checked:
        checksums.adopt_legacy(path, "demo file")
    return Demos(
        obs={key: np.concatenate([e["obs"][key] for e in episodes]) for key in wanted},
        actions=np.concatenate([e["actions"] for e in episodes]).astype(np.float32),
        rewards=np.concatenate([e["rewards"] for e in episodes]).astype(np.float32),
        dones=np.concatenate([e["dones"] for e in episodes]).astype(bool),
        episode_ids=np.concatenate(
            [np.full(len(e["actions"]), i, dtype=np.int64) for i, e in enumerate(episodes)]
        ),
        successes=np.array([e["success"] for e in episodes], dtype=bool),
        seeds=np.array([e["seed"] for e in episodes], dtype=np.int64),
        env_args=env_args,
    )


def _check_episode(path: Path, name: str, episode: dict[str, Any]) -> None:
    """Refuse a demo whose arrays disagree in length or whose actions are not ``(steps, 4)``
    finite numbers (naming ``path`` and the demo)."""
    lengths = {len(a) for a in (*episode["obs"].values(), episode["actions"],
                                episode["rewards"], episode["dones"])}
    if len(lengths) != 1:
        raise ValueError(f"{path}: arrays of {name} disagree in length ({sorted(lengths)})")
    actions = np.asarray(episode["actions"])
    if actions.ndim != 2 or actions.shape[1] != ACTION_DIM:
        raise ValueError(f"{path}: {name}/actions has shape {actions.shape}; expected "
                         f"(steps, {ACTION_DIM})")
    if actions.dtype.kind not in "iuf" or not np.isfinite(actions).all():
        raise ValueError(f"{path}: {name}/actions holds non-finite or non-numeric values")
