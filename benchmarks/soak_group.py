"""Soak test of the group trainer: train for a long time and sample the memory of every process.

    python benchmarks/soak_group.py --minutes 60 --out outputs/soak

runs ``scripts/train.py`` with the pixel settings of ``+experiment=push_easy_pixels`` (TinyVLA on
``push``, 2 rollout workers; the main job until 2026-12-05, with which docs/results.md's soak
figures were measured) for ``--minutes`` (budgeted by ``max_minutes``: a soak is about time, not
a result), and every ``--every`` seconds records the resident memory of the trainer process and
of its rollout workers (from ``/proc``, Linux). Writes ``rss.csv``, ``soak.json`` (first, last and
peak RSS and the least-squares trend of each, over the training window: :func:`summarise`) and
``rss.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import io
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness_common.files import atomic_write_text, write_json  # noqa: E402

SETTINGS = [
    "+experiment=push_easy_pixels", "algo.start_policy.bc.demos=5", "algo.start_policy.bc.epochs=5",
    "algo.start_policy.state_pretrain.episodes=0",
    "algo.iterations=1000000", "eval.every_steps=50000", "eval.episodes=10",
    "eval.final_episodes=10", "checkpoint_every_steps=20000", "logger.progress_bar=false",
    "hydra/job_logging=none", "hydra/hydra_logging=none",
]


def rss_mb(pid: int) -> float:
    """Resident memory of one process in MiB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def children(pid: int) -> list[int]:
    """Direct child processes of ``pid``."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def trend(minutes: list[float], values: list[float]) -> float:
    """Least-squares slope of ``values`` over ``minutes``, per minute (0 for fewer than 2 times)."""
    if len(minutes) < 2 or max(minutes) == min(minutes):
        return 0.0
    mean_t, mean_v = sum(minutes) / len(minutes), sum(values) / len(values)
    covariance = sum((t - mean_t) * (v - mean_v) for t, v in zip(minutes, values, strict=True))
    return covariance / sum((t - mean_t) ** 2 for t in minutes)


def summarise(rows: list[tuple[float, float, float, int]], warmup_minutes: float = 5.0) -> dict:
    """Memory figures over the training window of a soak's samples.

    The window is the samples whose rollout workers hold at least half their peak memory (start
    and shutdown excluded), from ``warmup_minutes`` on when the window lasts longer than that.
    ``trend`` is the least-squares slope over every sample; the trainer's ``floor_trend`` is the
    slope of each minute's lowest sample, the memory held between iterations (a sample taken
    during an update also counts the update's short-lived tensors).
    """
    peak_workers = max(row[2] for row in rows)
    window = [row for row in rows if row[2] >= 0.5 * peak_workers] or rows
    settled = [row for row in window if row[0] >= 60.0 * warmup_minutes]
    window = settled if len(settled) >= 2 else window
    minutes = [row[0] / 60.0 for row in window]
    floors: dict[int, float] = {}
    for t, row in zip(minutes, window, strict=True):
        floors[int(t)] = min(floors.get(int(t), row[1]), row[1])

    def figures(column: int) -> dict:
        values = [row[column] for row in window]
        return {"first": values[0], "last": values[-1], "peak": max(values),
                "trend_mb_per_min": round(trend(minutes, values), 2)}

    return {
        "minutes": round(rows[-1][0] / 60.0, 1), "samples": len(rows),
        "window_minutes": [round(minutes[0], 1), round(minutes[-1], 1)],
        "trainer_rss_mb": figures(1) | {"floor_trend_mb_per_min": round(
            trend([float(t) for t in floors], list(floors.values())), 2)},
        "workers_rss_mb": figures(2),
        "total_rss_peak_mb": round(max(row[1] + row[2] for row in window), 1),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="length of the soak")
    parser.add_argument("--every", type=float, default=15.0, help="seconds between samples")
    parser.add_argument("--out", type=Path, default=Path("outputs/soak"), help="output folder")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.every <= 0:
        parser.error(f"--minutes={args.minutes} and --every={args.every} must be > 0")
    args.out.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [sys.executable, "scripts/train.py", *SETTINGS, f"max_minutes={args.minutes}",
         f"hydra.run.dir={args.out / 'run'}"], cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    started, rows = time.monotonic(), []
    while process.poll() is None:
        workers = children(process.pid)
        rows.append((round(time.monotonic() - started, 1), round(rss_mb(process.pid), 1),
                     round(sum(rss_mb(pid) for pid in workers), 1), len(workers)))
        time.sleep(args.every)
    stderr = process.stderr.read().decode()
    if process.returncode != 0:
        sys.exit(f"the soak run failed ({process.returncode}):\n{stderr[-3000:]}")

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(("seconds", "trainer_rss_mb", "workers_rss_mb", "workers"))
    writer.writerows(rows)
    atomic_write_text(args.out / "rss.csv", buffer.getvalue())
    summary = summarise(rows) | {"summary": str(args.out / "run" / "summary.json")}
    write_json(args.out / "soak.json", summary)

    from harness_common.plots import plt, save_figure

    figure, axis = plt.subplots(figsize=(7, 3.5))
    minutes = [row[0] / 60.0 for row in rows]
    axis.plot(minutes, [row[1] for row in rows], label="trainer process")
    axis.plot(minutes, [row[2] for row in rows], label="rollout workers (sum)")
    axis.set_xlabel("minutes")
    axis.set_ylabel("resident memory (MiB)")
    axis.set_ylim(bottom=0)
    axis.legend()
    axis.set_title("group trainer soak: memory over time")
    save_figure(figure, args.out / "rss.png", dpi=110, bbox_inches="tight")
    print(summary)
    return summary


if __name__ == "__main__":
    main()
