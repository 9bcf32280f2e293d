"""The group trainer hands the memory its iterations free back to the operating system.

A one-hour pixel soak grew the trainer process by 13 MiB/min (CHANGELOG.md, 2026-12-01): glibc
kept the free pages that each iteration's batches, of varying size, leave between live blocks.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness import config as harness_config
from harness import trainers
from harness.algos import hooks
from harness.algos.group import run as group

TINY = [
    "task=reach", "task.obs_mode=state", "task.max_episode_steps=10", "policy=mlp",
    "policy.hidden=16", "algo=grpo", "algo.group_size=4", "algo.num_start_states=2",
    "algo.minibatch_size=8", "algo.iterations=3", "eval.every_steps=0", "eval.final_episodes=2",
    "logger.videos=false", "logger.tensorboard=false", "logger.progress_bar=false",
]


def resident_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmRSS in /proc/self/status")


def test_every_iteration_releases_free_memory(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(group, "release_free_memory", lambda: calls.append(1) or True,
                        raising=False)
    summary = trainers.train(harness_config.compose(TINY), tmp_path / "run")
    assert summary["iterations"] == 3
    assert len(calls) == 3, f"released {len(calls)} times in 3 iterations"


@pytest.mark.skipif(hooks._malloc_trim() is None, reason="needs glibc's malloc_trim")
def test_release_returns_the_pages_of_freed_blocks():
    """Blocks below the mmap threshold come from the heap; freeing all but every 50th leaves
    ~120 MiB of holes that stay resident until they are released."""
    blocks = [bytearray(64 * 1024) for _ in range(2000)]  # written: every page resident
    kept = blocks[49::50]
    del blocks
    before = resident_mib()
    assert hooks.release_free_memory()
    released = before - resident_mib()
    assert released > 60, f"only {released:.1f} MiB of ~120 MiB of freed blocks released"
    assert len(kept) == 40


def test_release_is_a_no_op_without_glibc(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    hooks._malloc_trim.cache_clear()
    try:
        assert hooks.release_free_memory() is False
    finally:
        hooks._malloc_trim.cache_clear()


def soak_script():
    import importlib.util

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("soak_script", root / "benchmarks/soak_group.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_soak_summary_against_hand_worked_numbers():
    """Samples every 30 s for 10 minutes: the trainer climbs 2 MiB/min between iterations, and
    every other sample lands mid-update, 300 MiB higher; the workers start at 100 MiB, hold
    4,000 MiB while training and are gone at the end."""
    soak = soak_script()
    rows = [(0.0, 50.0, 0.0, 0), (30.0, 600.0, 100.0, 2)]
    for i in range(2, 21):  # 60 s .. 600 s
        seconds = 30.0 * i
        trainer = 700.0 + 2.0 * seconds / 60.0 + (300.0 if i % 2 else 0.0)
        rows.append((seconds, trainer, 4000.0, 2))
    rows.append((630.0, 900.0, 12.0, 1))
    summary = soak.summarise(rows, warmup_minutes=5.0)
    # the window: 5.0-10.0 minutes (the start, the shutdown and the warm-up left out)
    assert summary["window_minutes"] == [5.0, 10.0]
    assert summary["minutes"] == 10.5 and summary["samples"] == 22
    # each whole minute's lowest sample is the between-iterations one: 700 + 2 t exactly
    assert summary["trainer_rss_mb"]["floor_trend_mb_per_min"] == pytest.approx(2.0)
    trainer = summary["trainer_rss_mb"]
    assert trainer["first"] == 710.0 and trainer["last"] == 720.0
    assert summary["trainer_rss_mb"]["peak"] == 700.0 + 2.0 * 9.5 + 300.0
    assert summary["workers_rss_mb"]["trend_mb_per_min"] == 0.0
    assert summary["total_rss_peak_mb"] == 5019.0
    assert soak.trend([0.0, 1.0, 2.0], [5.0, 7.0, 9.0]) == pytest.approx(2.0)
    assert soak.trend([3.0], [1.0]) == 0.0
