"""Where each group of the group trainer starts: fresh resets, demonstration states, replays.

Snapshots are exact, so a group can start from *any* state and its G attempts still compare
fairly. ``algo.starts.source`` picks the sources, ``algo.starts.weights`` their shares:

* ``reset``: a fresh reset at the curriculum's difficulty (the default, and what evaluation
  always plays);
* ``demo``: a state along a recorded expert demonstration (``algo.starts.demos`` of them, at
  ``task.difficulty``), chosen by a reverse curriculum over *how much of the demonstration is
  left*: a :class:`~harness.curriculum.SuccessBandCurriculum` whose difficulty ``d`` is the
  fraction of the demonstration remaining. It starts near the demonstration's end (``d`` in the
  first bin, a few steps from success) and moves the start back as success there passes the
  band's upper edge, until groups start where the demonstration did (``d = 1``: a reset state);
* ``replay``: a state from one of the policy's own failed attempts, the one closest to success
  (by the task's ``success_margin``), from a bounded buffer of the latest ones.

The shares are drawn per group from the trainer's own generator; a source with nothing to give
yet (an empty replay buffer) gives way to ``reset``. Every draw, buffer and curriculum state is
in the checkpoint, so a resumed run starts the same groups as an uninterrupted one.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

import tasks
from harness import curriculum as curricula
from harness.demos import DEMO_FORMAT_VERSION, collect_demos, demo_cache_dir
from harness.start_policy import demo_file

log = logging.getLogger(__name__)

SOURCES: tuple[str, ...] = ("reset", "demo", "replay")


@dataclass
class Start:
    """One group's start: its snapshot, the difficulty it is recorded under, where it came
    from and, for a demo start, the fraction of the demonstration remaining."""

    snapshot: tasks.Snapshot
    difficulty: float
    source: str
    remaining: float | None = None


def demo_start_file(cfg, demo_dir: str | Path | None = None, progress: bool = True) -> Path:
    """The demo file of ``algo.starts.demos`` (state observations, at ``task.difficulty``):
    recorded once (from :func:`harness.config.demo_first_seed`) and cached beside the BC demos
    (``demo_dir``, default :func:`harness.demos.demo_cache_dir`); a cached file of format
    version 1 (no snapshots) is recorded again."""
    demo_dir = demo_cache_dir() if demo_dir is None else demo_dir
    options = {**cfg.task.env_options(), "obs_mode": "state"}
    options.pop("camera", None)
    options.pop("image_size", None)
    first_seed = cfg.seeds.demos
    path = demo_file(demo_dir, cfg.task.name, options, cfg.algo.starts.demos,
                     cfg.task.difficulty, seed=first_seed)
    if path.exists():
        with h5py.File(path, "r") as f:
            version = int(f["data"].attrs.get("format_version", 1))
        if version >= DEMO_FORMAT_VERSION:
            return path
        log.info("%s holds no snapshots (format version %d): recording it again", path, version)
    collect_demos(path, cfg.task.name, cfg.algo.starts.demos, difficulty=cfg.task.difficulty,
                  seed=first_seed, obs_mode="state", camera=cfg.task.camera,
                  max_episode_steps=options.pop("max_episode_steps", None),
                  env_options={k: v for k, v in options.items()
                               if k not in ("obs_mode", "difficulty")},
                  progress=progress)
    return path


class StartStates:
    """Draws each group's start from the configured sources (see the module docstring).

    Args:
        cfg: The training config (``algo.starts.source``, ``algo.starts.weights``,
            ``algo.starts.replay_buffer``, ``algo.starts.curriculum``, ``seed``).
        curriculum: The run's curriculum, for ``reset`` starts.
        starts_env: A state-only env of the task, to reset and snapshot.
        demos: For ``demo`` starts: every step's snapshot bytes, episode by episode
            (:func:`harness.demos.load_demo_snapshots`).
    """

    def __init__(self, cfg, curriculum, starts_env, demos: list[list[bytes]] | None = None
                 ) -> None:
        algo = cfg.algo
        self.cfg = cfg
        self.curriculum = curriculum
        self.env = starts_env
        self.weights = np.array([algo.starts.shares[s] for s in SOURCES], float)
        self.weights /= self.weights.sum()
        self.demos = demos or []
        # the choice of source and the demo/replay picks draw from their own stream, so turning
        # a source on shifts neither the curriculum's nor the resets' draws
        self.rng = np.random.default_rng(cfg.seeds.start_sources)
        self.replay: deque[tuple[bytes, float]] = deque(maxlen=algo.starts.replay_buffer)
        self.demo_curriculum = None
        if self.weights[SOURCES.index("demo")] > 0:
            if not self.demos:
                raise ValueError("algo.starts.source uses demo starts but no demonstration "
                                 "was given (algo.starts.demos)")
            self.demo_curriculum = curricula.make(
                "success_band", seed=cfg.seeds.demo_curriculum,
                group_size=algo.group_size, **dict(algo.starts.curriculum))
        self.counts = {s: 0 for s in SOURCES}
        self.signal = {s: 0 for s in SOURCES}

    @property
    def replay_wanted(self) -> bool:
        """Whether attempts should report their closest-to-success state."""
        return self.weights[SOURCES.index("replay")] > 0

    def draw(self, start_counter: int) -> tuple[Start, int]:
        """The next group's start; ``start_counter`` numbers the reset seeds (it advances for
        every start, whatever its source, so sources never shift each other's seeds)."""
        source = SOURCES[int(self.rng.choice(len(SOURCES), p=self.weights))]
        if source == "replay" and not self.replay:
            source = "reset"
        seed = self.cfg.seeds.train_start(start_counter)
        if source == "demo":
            remaining = float(self.demo_curriculum.sample())
            episode = self.demos[int(self.rng.integers(len(self.demos)))]
            step = int(round((1.0 - remaining) * (len(episode) - 1)))
            snapshot = tasks.snapshot_from_bytes(episode[step], source=f"demo step {step}")
            start = Start(snapshot, float(self.cfg.task.difficulty), source, remaining)
        elif source == "replay":
            data, difficulty = self.replay[int(self.rng.integers(len(self.replay)))]
            start = Start(tasks.snapshot_from_bytes(data, source="replay buffer"), difficulty,
                          source)
        else:
            difficulty = float(self.curriculum.sample())
            self.env.reset(seed=seed, options=self.curriculum.reset_options(difficulty))
            start = Start(self.env.snapshot(), difficulty, source)
        return start, start_counter + 1

    def record(self, start: Start, outcomes: list[float], informative: bool) -> None:
        """Feed a group's verifier outcomes to the curriculum its start came from, and count
        whether the group carried signal (by the run's estimator)."""
        self.counts[start.source] += 1
        self.signal[start.source] += int(informative)
        if start.source == "reset":
            self.curriculum.update(start.difficulty, outcomes)
        elif start.source == "demo":
            self.demo_curriculum.update(start.remaining, outcomes)

    def add_replays(self, closest: list, success: np.ndarray, difficulty: np.ndarray) -> None:
        """Keep the closest-to-success state of every failed attempt (newest last)."""
        for state, won, level in zip(closest, success, difficulty, strict=True):
            if state is not None and not won:
                self.replay.append((state, float(level)))

    def metrics(self) -> dict[str, float]:
        """``starts/...``: share of groups and informative fraction per source (since the last
        call), the demo offset (upper edge of the unlocked fraction remaining), buffer size."""
        total = max(1, sum(self.counts.values()))
        out = {}
        for source in SOURCES:
            if self.weights[SOURCES.index(source)] > 0 or self.counts[source]:
                out[f"starts/share_{source}"] = self.counts[source] / total
                out[f"starts/signal_{source}"] = (self.signal[source] / self.counts[source]
                                                 if self.counts[source] else float("nan"))
        if self.demo_curriculum is not None:
            out["starts/demo_remaining"] = float(self.demo_curriculum.frontier)
        if self.replay_wanted:
            out["starts/replay_buffer"] = float(len(self.replay))
        self.counts = {s: 0 for s in SOURCES}
        self.signal = {s: 0 for s in SOURCES}
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "rng": self.rng.bit_generator.state,
            "replay": [(bytes(data), level) for data, level in self.replay],
            "demo_curriculum": (None if self.demo_curriculum is None
                                else self.demo_curriculum.state_dict()),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.replay.clear()
        self.replay.extend((bytes(data), float(level)) for data, level in state["replay"])
        if self.demo_curriculum is not None and state.get("demo_curriculum") is not None:
            self.demo_curriculum.load_state_dict(state["demo_curriculum"])
