"""Do two sweeps hold the same results? (``studies/compare_sweeps.py``)

The same sweep run through two launchers (joblib, submitit, Ray) must give the same numbers:
every job plays the same seeds in a fresh process, whatever process started it. Jobs are matched
by their folder's path below the sweep folder (Hydra's ``<n>_<overrides>``, which depends on the
sweep's overrides only). Compared: every key of ``summary.json`` and every ``(step, value)`` of
every key of ``metrics.csv``, except what differs from one execution to the next by nature:
wall-clock figures (``wall_clock_s``, ``fps``, ``time/*_s``, ``*/seconds``, the ``time_s``
column) and provenance (``run_dir``, ``start_policy``, ``versions``, ``machine``, ``git``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from harness_common.files import read_metrics

PROVENANCE_KEYS = ("run_dir", "start_policy", "versions", "machine", "git")


def is_wall_clock(key: str) -> bool:
    """``wall_clock_s``, ``fps``, ``time/rollout_s``, ``bc/seconds``, SB3's
    ``time/time_elapsed``: keys that measure how long something took rather than what it
    computed."""
    name = key.rsplit("/", 1)[-1]
    return name.endswith(("_s", "seconds")) or name in ("fps", "time_elapsed")


def job_folders(sweep: str | Path) -> dict[str, Path]:
    """The folders below ``sweep`` that hold a ``summary.json``, by their path relative to it,
    in Hydra's job order (``2_...`` before ``10_...``)."""
    root = Path(sweep)
    folders = {str(path.parent.relative_to(root)): path.parent
               for path in root.rglob("summary.json")}
    return dict(sorted(folders.items(), key=lambda item: _job_order(item[0])))


def _job_order(job: str) -> tuple[float, str]:
    head = Path(job).name.split("_", 1)[0]
    return (int(head) if head.isdigit() else math.inf, job)


def wall_clocks(sweep: str | Path) -> dict[str, float]:
    """``wall_clock_s`` of each job of ``sweep`` (all sessions of a resumed job)."""
    return {job: float(json.loads((folder / "summary.json").read_text())["wall_clock_s"])
            for job, folder in job_folders(sweep).items()}


def compare_sweeps(first: str | Path, second: str | Path, tolerance: float = 0.0,
                   metrics: bool = True) -> list[str]:
    """The differences between two sweeps' results, one line each; empty when they agree.

    Args:
        first: A sweep folder.
        second: Another sweep folder.
        tolerance: Largest absolute difference of two numbers still counted as equal.
        metrics: Compare ``metrics.csv`` as well as ``summary.json``.

    Returns:
        Lines naming the job and the key (``"3_seed=1: summary success_rate: 0.4 != 0.45"``),
        including the jobs found in one sweep only.
    """
    jobs_a, jobs_b = job_folders(first), job_folders(second)
    lines = [f"{job}: only in {first}" for job in sorted(set(jobs_a) - set(jobs_b))]
    lines += [f"{job}: only in {second}" for job in sorted(set(jobs_b) - set(jobs_a))]
    for job in [job for job in jobs_a if job in jobs_b]:
        a, b = jobs_a[job], jobs_b[job]
        lines += [f"{job}: summary {line}" for line in _differences(
            _results(json.loads((a / "summary.json").read_text())),
            _results(json.loads((b / "summary.json").read_text())), tolerance)]
        if metrics:
            lines += [f"{job}: metrics.csv {line}" for line in _differences(
                _series(a / "metrics.csv"), _series(b / "metrics.csv"), tolerance)]
    return lines


def _results(summary: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in summary.items()
            if key not in PROVENANCE_KEYS and not is_wall_clock(key)}


def _series(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    return {key: [list(point) for point in points] for key, points in read_metrics(path).items()
            if not is_wall_clock(key)}


def _differences(a: Any, b: Any, tolerance: float, key: str = "") -> list[str]:
    """Leaves of two JSON-like trees that differ, as ``key: a != b``."""
    if isinstance(a, dict) and isinstance(b, dict):
        lines = []
        for name in sorted(set(a) | set(b), key=str):
            child = f"{key}.{name}" if key else str(name)
            if name not in a or name not in b:
                lines.append(f"{child}: only in {'the first' if name in a else 'the second'}")
            else:
                lines += _differences(a[name], b[name], tolerance, child)
        return lines
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [line for i, (x, y) in enumerate(zip(a, b, strict=True))
                for line in _differences(x, y, tolerance, f"{key}[{i}]")]
    if _equal(a, b, tolerance):
        return []
    if isinstance(a, list) and isinstance(b, list):
        return [f"{key}: {len(a)} entries != {len(b)}"]
    return [f"{key}: {a!r} != {b!r}"]


def _equal(a: Any, b: Any, tolerance: float) -> bool:
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool):
        if math.isnan(a) and math.isnan(b):
            return True
        return abs(a - b) <= tolerance
    return a == b
