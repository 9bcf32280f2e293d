"""Reading run folders: which folders are runs, their arms, and the per-run numbers the report
shows (held-out and training curves, informative groups, verifier error rates)."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from harness.config import SB3_ALGOS
from harness_common.files import read_metrics

log = logging.getLogger(__name__)

SEED_KEY = "seed"
TASK_KEYS = ("task", "task.name")          # overrides / config keys naming the task
RESUME_KEY = "resume"  # how a job was (re-)launched, not what it trained: never an arm
SIGNAL_KEY = "rollout/mixed_outcome_fraction"  # group trainer, per iteration
OLD_SIGNAL_KEY = "rollout/signal_fraction"  # the same, in runs logged before the split of the two
CURRICULUM_SIGNAL_KEY = "curriculum/signal_fraction"  # cumulative over a curriculum's updates


class ReportError(ValueError):
    """A multirun folder that cannot give a report (no runs, mixed tasks unasked, ...)."""


@dataclass
class RunRecord:
    """One finished training run, as read from its folder.

    Attributes:
        path: The run folder.
        job: The folder relative to the multirun directory (``"3_curriculum=linear,seed=0"``).
        summary: ``summary.json``.
        config: ``config.yaml`` (the resolved ``TrainConfig``); empty when the file is missing.
        overrides: ``.hydra/overrides.yaml`` as ``{key: value}`` (``+``/``~`` prefixes dropped);
            ``None`` when the run has no ``.hydra/`` folder.
        metrics: ``metrics.csv`` as ``{key: [(step, value), ...]}``.
        arm: The arm's label, set by :func:`scan_runs`.
    """

    path: Path
    job: str
    summary: dict[str, Any]
    config: dict[str, Any]
    overrides: dict[str, str] | None
    metrics: dict[str, list[tuple[int, float]]]
    arm: str = ""

    @property
    def task(self) -> str:
        return str(self.summary.get("task") or self.config.get("task", {}).get("name"))

    @property
    def algo(self) -> str:
        return str(self.summary.get("algo") or self.config.get("algo", {}).get("name"))

    @property
    def seed(self) -> int | None:
        seed = self.summary.get("seed", self.config.get("seed"))
        return None if seed is None else int(seed)

    @property
    def env_steps(self) -> int:
        return int(self.summary.get("env_steps", 0))


@dataclass(frozen=True)
class SkippedRun:
    """A folder that looked like a run but cannot be reported, and why."""

    path: Path
    reason: str


@dataclass
class Arm:
    """The runs of one arm (see :func:`scan_runs`), in the order they were found."""

    name: str
    runs: list[RunRecord] = field(default_factory=list)

    def strata(self, values: Mapping[int, float]) -> list[list[float]]:
        """``values`` (by run index in ``runs``) grouped by task."""
        by_task: dict[str, list[float]] = {}
        for i, run in enumerate(self.runs):
            if i in values:
                by_task.setdefault(run.task, []).append(values[i])
        return list(by_task.values())


def scan_runs(multirun_dir: str | Path, metric: str = "success_rate",
              ignore: tuple[str, ...] = ()) -> tuple[list[RunRecord], list[SkippedRun]]:
    """Every run below ``multirun_dir`` (the folder itself included), with arms assigned, and
    the folders that look like runs but cannot be reported. Settings named in ``ignore`` (e.g.
    ``algo.start_policy.file`` when each seed's arm starts from that seed's saved start) never
    define
    an arm.

    A folder looks like a run when it holds ``summary.json``, ``metrics.csv`` or
    ``.hydra/overrides.yaml``; it is reported when it has a readable ``summary.json`` with a
    numeric ``metric`` and a ``metrics.csv`` with rows.

    Raises:
        ReportError: ``multirun_dir`` is not a folder.
    """
    root = Path(multirun_dir)
    if not root.is_dir():
        raise ReportError(f"{root} is not a folder; pass the multirun folder of a sweep "
                          "(multirun/<date>/<time>) or a run folder")
    folders = set()
    for path in _files_below(root):
        if path.name in ("summary.json", "metrics.csv"):
            folders.add(path.parent)
        elif path.name == "overrides.yaml" and path.parent.name == ".hydra":
            folders.add(path.parent.parent)
    runs: list[RunRecord] = []
    skipped: list[SkippedRun] = []
    for folder in sorted(folders, key=lambda f: _job_order(f.relative_to(root))):
        record = _read_run(folder, root, metric)
        (runs if isinstance(record, RunRecord) else skipped).append(record)
    _assign_arms(runs, ignore)
    return runs, skipped


def _files_below(root: Path):
    """Every file below ``root``, following links to folders (each real folder once), so that a
    folder of links to several sweeps (``ln -s ../sweep_a a``) reports them as one."""
    seen: set[Path] = set()
    stack = [root]
    while stack:
        folder = stack.pop()
        real = folder.resolve()
        if real in seen:
            continue
        seen.add(real)
        for entry in sorted(folder.iterdir()):
            if entry.is_dir():
                stack.append(entry)
            else:
                yield entry


def load_runs(multirun_dir: str | Path, metric: str = "success_rate") -> list[RunRecord]:
    """The reportable runs below ``multirun_dir`` with their arms (see :func:`scan_runs`); each
    skipped folder is logged as a warning with its reason."""
    runs, skipped = scan_runs(multirun_dir, metric)
    for skip in skipped:
        log.warning("skipped %s: %s", skip.path, skip.reason)
    return runs


def _job_order(relative: Path) -> tuple:
    """Hydra's job number first (``12_...`` after ``2_...``), then the path."""
    head = relative.name.split("_", 1)[0]
    return (str(relative.parent), int(head) if head.isdigit() else math.inf, str(relative))


def _read_run(folder: Path, root: Path, metric: str) -> RunRecord | SkippedRun:
    summary_path, metrics_path = folder / "summary.json", folder / "metrics.csv"
    if not summary_path.exists():
        return SkippedRun(folder, "no summary.json: the run did not finish (killed, crashed or "
                                  "still running)")
    if not metrics_path.exists():
        return SkippedRun(folder, "no metrics.csv")
    try:
        summary = json.loads(summary_path.read_text())
    except (OSError, ValueError) as error:
        return SkippedRun(folder, f"summary.json is unreadable: {error}")
    value = summary.get(metric)
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return SkippedRun(folder, f"summary.json has no numeric {metric!r} (has "
                                  f"{sorted(summary)})")
    try:
        metrics = read_metrics(metrics_path)
    except (OSError, ValueError, KeyError, TypeError) as error:
        return SkippedRun(folder, f"metrics.csv is unreadable: {error!r}")
    if not metrics:
        return SkippedRun(folder, "metrics.csv holds no rows")
    config: dict[str, Any] = {}
    if (folder / "config.yaml").exists():
        config = yaml.safe_load((folder / "config.yaml").read_text()) or {}
    overrides = None
    if (folder / ".hydra" / "overrides.yaml").exists():
        overrides = _parse_overrides(
            yaml.safe_load((folder / ".hydra" / "overrides.yaml").read_text()) or []
        )
    record = RunRecord(folder, str(folder.relative_to(root)) if folder != root else folder.name,
                       summary, config, overrides, metrics)
    if record.task in ("None", ""):
        return SkippedRun(folder, "neither summary.json nor config.yaml names the task")
    return record


def _parse_overrides(lines: list[str]) -> dict[str, str]:
    """``["+experiment=x", "seed=1"]`` -> ``{"experiment": "x", "seed": "1"}``."""
    parsed = {}
    for line in lines:
        key, _, value = str(line).partition("=")
        parsed[key.lstrip("+~")] = value
    return parsed


def _assign_arms(runs: list[RunRecord], ignore: tuple[str, ...] = ()) -> list[str]:
    """Label each run's arm by the settings that vary across runs, ``seed``, ``resume``, the
    task and ``ignore`` left out; returns those keys."""
    if runs and all(r.overrides is not None for r in runs):
        settings = [dict(r.overrides) for r in runs]
    else:
        settings = [_flatten(r.config) for r in runs]
    keys: list[str] = []
    for setting in settings:
        keys += [k for k in setting if k not in keys]
    varying = [
        k for k in keys
        if k not in (SEED_KEY, RESUME_KEY, *ignore) and k not in TASK_KEYS
        and not k.startswith("hydra.")
        and len({s.get(k) for s in settings}) > 1
    ]
    varying = _collapse_named_groups(varying, settings)
    for run, setting in zip(runs, settings, strict=True):
        parts = [f"{k.removesuffix('.name')}={setting.get(k, '<default>')}" for k in varying]
        run.arm = ", ".join(parts) if parts else "all runs"
    return varying


def _collapse_named_groups(varying: list[str], settings: list[dict[str, Any]]) -> list[str]:
    """Drop ``algo.n_steps`` and the like when ``algo.name`` varies and fixes them (config
    fallback: switching the algorithm changes every key of its group)."""
    named = {k.removesuffix(".name") for k in varying if k.endswith(".name")}
    kept = []
    for key in varying:
        group = key.rsplit(".", 1)[0] if "." in key else None
        if group in named and not key.endswith(".name"):
            by_name: dict[Any, set] = {}
            for s in settings:
                by_name.setdefault(s.get(f"{group}.name"), set()).add(repr(s.get(key)))
            if all(len(values) == 1 for values in by_name.values()):
                continue
        kept.append(key)
    return kept


def _flatten(node: Any, prefix: str = "") -> dict[str, str]:
    if isinstance(node, Mapping):
        out: dict[str, str] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: str(node)}


# ----------------------------------------------------------------------------- per-run numbers
def held_out_curve(run: RunRecord, metric: str = "success_rate") -> list[tuple[int, float]]:
    """Periodic evaluations (``eval/<metric>``) followed by the final one (``final/<metric>``)."""
    return _sorted_unique(run.metrics.get(f"eval/{metric}", [])
                          + run.metrics.get(f"final/{metric}", []))


def training_curve(run: RunRecord, metric: str = "success_rate") -> list[tuple[int, float]]:
    """Training attempts (``rollout/<metric>``): at the curriculum's difficulties, not the
    evaluation's."""
    return _sorted_unique(run.metrics.get(f"rollout/{metric}", []))


def _sorted_unique(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """Step order, the last value kept where a step repeats."""
    return sorted(dict(points).items())


def informative_fraction(run: RunRecord) -> tuple[float | None, str]:
    """The fraction of groups whose outcomes were not all equal, and where it came from.

    The group trainer logs ``rollout/mixed_outcome_fraction`` per iteration (older runs:
    ``rollout/signal_fraction``, which then meant the same): its mean over iterations.
    Otherwise a group trainer's cumulative ``curriculum/signal_fraction`` (last value). SB3 runs
    have no groups: their curriculum receives one outcome per episode, so its signal fraction
    is 0 by construction and is not reported.
    """
    key = SIGNAL_KEY if run.metrics.get(SIGNAL_KEY) else OLD_SIGNAL_KEY
    if run.metrics.get(key):
        return float(np.mean([v for _, v in run.metrics[key]])), \
            f"mean of {key} over iterations"
    if run.algo in SB3_ALGOS:
        return None, "no groups (SB3 trains on single episodes)"
    if run.metrics.get(CURRICULUM_SIGNAL_KEY):
        return run.metrics[CURRICULUM_SIGNAL_KEY][-1][1], \
            f"last {CURRICULUM_SIGNAL_KEY} (cumulative)"
    return None, "not logged"


def detector_rates(run: RunRecord) -> dict[str, float]:
    """Mean over the run of each ``detector/*`` metric (empty without a learned verifier)."""
    return {k: float(np.mean([v for _, v in points]))
            for k, points in run.metrics.items() if k.startswith("detector/") and points}
