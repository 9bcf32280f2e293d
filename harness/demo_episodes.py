"""One demo of an HDF5 demo file: an expert episode recorded in the environment, written into
its ``demo_<i>`` group and read back (the layout is :mod:`harness.demos`'s)."""

from __future__ import annotations

import os
from typing import Any

import h5py
import numpy as np

import tasks
from harness_common import checksums


def record_episode(
    env: tasks.ManipulationEnv, seed: int, difficulty: float, noise: float,
    label: str = "executed",
) -> dict[str, Any]:
    """One scripted-expert episode from ``reset(seed=seed)``, its noise seeded by ``seed``.

    Args:
        env: The environment, reset here.
        seed: Seed of the reset and of the expert's noise.
        difficulty: Reset difficulty.
        noise: Std of the Gaussian noise on the expert's actions.
        label: ``"executed"`` or ``"expert"`` (see :func:`harness.demos.collect_demos`).

    Returns:
        ``obs`` (key -> ``(T, ...)`` array), ``actions`` (by ``label``), ``rewards``, ``dones``,
        ``snapshots`` (one uint8 array per step) and ``success``; with ``label="expert"`` also
        ``executed_actions``.
    """
    expert = tasks.ScriptedExpert(env, noise=noise, seed=seed)
    obs, info = env.reset(seed=seed, options={"difficulty": float(difficulty)})
    observations: dict[str, list[np.ndarray]] = {key: [] for key in obs}
    actions, executed_actions, rewards, dones, snapshots = [], [], [], [], []
    done = False
    while not done:
        clean, action = expert.act()
        for key, value in obs.items():
            observations[key].append(value)
        snapshots.append(np.frombuffer(tasks.snapshot_to_bytes(env.snapshot()), np.uint8))
        obs, reward, terminated, truncated, info = env.step(action)
        done = terminated or truncated
        actions.append(clean if label == "expert" else action)
        executed_actions.append(action)
        rewards.append(reward)
        dones.append(done)
    return {
        "obs": {key: np.stack(values) for key, values in observations.items()},
        "actions": np.asarray(actions, dtype=np.float32),
        "rewards": np.asarray(rewards, dtype=np.float32),
        "dones": np.asarray(dones, dtype=np.uint8),
        "snapshots": snapshots,
        "success": bool(info["is_success"]),
        **({"executed_actions": np.asarray(executed_actions, dtype=np.float32)}
           if label == "expert" else {}),
    }


def write_episode(group: h5py.Group, episode: dict[str, Any], seed: int) -> None:
    """Store an episode of :func:`record_episode` in its ``demo_<i>`` group, with its seed and
    each dataset's checksum (:func:`harness_common.checksums.stamp`)."""
    for key, array in episode["obs"].items():
        # Images dominate the file size and compress well; small vectors are not worth it.
        compression = "gzip" if array.dtype == np.uint8 else None
        dataset = group.create_dataset(f"obs/{key}", data=array, compression=compression)
        checksums.stamp(dataset, array)
    for key in ("actions", "executed_actions", "rewards", "dones"):
        if key in episode:
            checksums.stamp(group.create_dataset(key, data=episode[key]), episode[key])
    snapshots = group.create_dataset("snapshots", (len(episode["snapshots"]),),
                                     dtype=h5py.vlen_dtype(np.uint8))
    for t, snapshot in enumerate(episode["snapshots"]):
        snapshots[t] = snapshot
    checksums.stamp(snapshots, episode["snapshots"])
    group.attrs["num_samples"] = len(episode["actions"])
    group.attrs["success"] = episode["success"]
    group.attrs["seed"] = seed


def read_episode(group: h5py.Group, keys: list[str]) -> dict[str, Any]:
    """The arrays of ``keys`` and the attributes of a ``demo_<i>`` group (unverified: see
    :func:`verify_episode`)."""
    return {
        "obs": {key: group["obs"][key][()] for key in keys},
        "actions": group["actions"][()],
        "rewards": group["rewards"][()],
        "dones": group["dones"][()],
        "success": bool(group.attrs["success"]),
        "seed": int(group.attrs["seed"]),
    }


def verify_episode(group: h5py.Group, episode: dict[str, Any], path: str | os.PathLike,
                   fix: str) -> None:
    """Check the arrays :func:`read_episode` read from ``group`` against their checksums.

    Raises:
        harness_common.checksums.ChecksumError: Naming the file and the damaged dataset.
    """
    arrays = {**{f"obs/{key}": array for key, array in episode["obs"].items()},
              **{key: episode[key] for key in ("actions", "rewards", "dones")}}
    for name, array in arrays.items():
        checksums.verify(group[name], array, path, fix)
