"""Nothing lost, nothing half-written: ``kill -9`` at random moments of every long job, then a
resume or a re-run, and every file left behind is whole.

The default suite kills one group-trainer run (the SB3 kill is in test_train_sb3.py); the
``slow`` part kills each long job several times at random moments (run it by hand:
``pytest -m slow tests/test_reliability.py``; ``RELIABILITY_KILLS`` sets the kills per job, 5
by default, and ``RELIABILITY_LOG=<file>`` tallies which kills hit a running job). What is
checked after each kill:

* training (SB3, group): the checkpoint pair reads back whole; the resumed run reaches its
  budget and writes ``summary.json``; ``metrics.csv`` has only whole rows and no step of any key
  logged again after a later one (what a resume that failed to cut the rows would leave);
* demos, detector data, detector training: the output file is absent or loads whole; the re-run
  writes it whole;
* a two-job multirun: every job folder holds a whole ``summary.json`` or none, and re-running
  the sweep finishes both.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.runs import resolve_checkpoint
from harness_common.files import read_metrics

ROOT = Path(__file__).resolve().parent.parent
KILLS = int(os.environ.get("RELIABILITY_KILLS", "5"))
QUIET = ["hydra/job_logging=none", "hydra/hydra_logging=none", "logger.progress_bar=false",
         "logger.videos=false", "logger.tensorboard=false"]
GROUP = ["task=reach", "task.obs_mode=state", "task.max_episode_steps=15", "policy=mlp",
         "policy.hidden=16", "algo=grpo", "algo.group_size=4", "algo.num_start_states=4",
         "eval.every_steps=200", "eval.episodes=2", "eval.final_episodes=4",
         "checkpoint_every_steps=100"]
SB3 = ["task=reach", "algo=ppo", "algo.n_steps=128", "algo.batch_size=64", "algo.n_epochs=1",
       "policy.net_arch=[8]", "eval.every_steps=256", "eval.episodes=2", "eval.final_episodes=4",
       "checkpoint_every_steps=128", "task.max_episode_steps=20"]


def run_and_kill(args: list[str], after_s: float) -> int | None:
    """Start ``python <args>`` in the repository, SIGKILL it ``after_s`` seconds later (if it is
    still running); its exit code when it finished first, else ``None``."""
    process = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + after_s
    while time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    killed = process.poll() is None
    if killed:
        process.send_signal(signal.SIGKILL)
        process.wait()
    if os.environ.get("RELIABILITY_LOG"):  # the tally recorded in docs/results.md
        with open(os.environ["RELIABILITY_LOG"], "a") as log:
            log.write(f"{Path(args[0]).stem},{after_s:.1f},{'killed' if killed else 'finished'}\n")
    return None if killed else process.returncode


def run(args: list[str]) -> float:
    """Run ``python <args>`` to the end; its wall-clock seconds."""
    started = time.monotonic()
    result = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return time.monotonic() - started


class Killer:
    """Kills a job at uniformly random fractions of its measured duration, and counts the
    kills that landed while it ran (a kill after the job ended proves nothing)."""

    def __init__(self, seed: int, duration: float) -> None:
        self.rng, self.duration, self.landed, self.tries = random.Random(seed), duration, 0, 0

    def __call__(self, args: list[str]) -> None:
        self.tries += 1
        if run_and_kill(args, self.rng.uniform(0.1, 0.9) * self.duration) is None:
            self.landed += 1

    def check(self) -> None:
        assert self.landed >= self.tries - 1, f"only {self.landed} of {self.tries} kills landed"


def check_metrics_whole(path: Path) -> None:
    """Whole rows only, and no key logged at an earlier step after a later one."""
    text = path.read_text()
    assert text.endswith("\n"), "a torn last row"
    for key, points in read_metrics(path).items():
        steps = [step for step, _ in points]
        assert steps == sorted(steps), f"{key} logged again at earlier steps: {steps}"


def check_training_after_kill(run_dir: Path, overrides: list[str], target: dict[str, str]) -> None:
    """Resume (or start again when no checkpoint was written yet) and check every file. The
    resume is the training app's ``main`` in this process (``scripts/train.py`` runs the same
    function; only the killed job needs a process of its own)."""
    from harness.apps import train

    latest = run_dir / "checkpoints" / "latest.json"
    if latest.exists():
        resolve_checkpoint(latest)  # whole, or finished by the reader: never corrupt
    budget = [f"{key}={value}" for key, value in target.items()]
    # no checkpoint yet: the killed start's files are moved aside (overwrite=true), not lost
    assert train.main([*overrides, *QUIET, *budget, f"hydra.run.dir={run_dir}",
                       f"resume={str(latest.exists()).lower()}", "overwrite=true"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] >= int(target.get("total_timesteps", 0))
    resolve_checkpoint(run_dir / "checkpoints" / "latest.json")
    check_metrics_whole(run_dir / "metrics.csv")


@pytest.mark.parametrize("algo", [("algo=grpo",), ("algo=vla_ppo", "algo.critic.network=separate")])
def test_a_killed_group_run_resumes_whole(tmp_path, algo):
    run_dir = tmp_path / "group"
    overrides = [*GROUP, *algo]
    args = ["scripts/train.py", *overrides, *QUIET, "algo.iterations=1000",
            f"hydra.run.dir={run_dir}"]
    process = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    latest = run_dir / "checkpoints" / "latest.json"
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and process.poll() is None:
            if latest.exists() and json.loads(latest.read_text()).get("iteration", 0) >= 3:
                break
            time.sleep(0.1)
    finally:
        process.send_signal(signal.SIGKILL)
        _, stderr = process.communicate()
    assert latest.exists(), stderr.decode()[-2000:]
    killed = resolve_checkpoint(latest)[1]["iteration"]
    check_training_after_kill(run_dir, overrides, {"algo.iterations": str(killed + 3)})
    assert json.loads((run_dir / "summary.json").read_text())["iterations"] == killed + 3


# ------------------------------------------------------------------ slow: kills at random
@pytest.mark.slow
@pytest.mark.parametrize("job", ["group", "sb3"])
def test_training_survives_kills_at_random_moments(tmp_path, job):
    overrides, budget = ((GROUP, {"algo.iterations": "150"}) if job == "group"
                         else (SB3, {"total_timesteps": "12288"}))

    def args(run_dir: Path) -> list[str]:
        return ["scripts/train.py", *overrides, *QUIET, *[f"{k}={v}" for k, v in budget.items()],
                f"hydra.run.dir={run_dir}"]

    kill = Killer(0, run(args(tmp_path / "uninterrupted")))
    for index in range(KILLS):
        run_dir = tmp_path / f"{job}_{index}"
        kill(args(run_dir))
        check_training_after_kill(run_dir, overrides, budget)
    kill.check()


@pytest.mark.slow
def test_demo_collection_survives_kills(tmp_path):
    from harness.demos import load_demos

    def args(out: Path) -> list[str]:
        return ["scripts/collect_demos.py", "task=reach", "task.obs_mode=pixels",
                "task.image_size=32", "episodes=40", f"out={out}", *QUIET[:2],
                f"hydra.run.dir={tmp_path / 'hydra'}"]

    kill = Killer(1, run(args(tmp_path / "uninterrupted.hdf5")))
    for index in range(KILLS):
        out = tmp_path / f"demos_{index}.hdf5"
        kill(args(out))
        if out.exists():
            assert load_demos(out).num_episodes == 40
        run(args(out))
        assert load_demos(out).num_episodes == 40
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(f".demos_{index}")]
    kill.check()


@pytest.mark.slow
def test_detector_data_and_training_survive_kills(tmp_path):
    import torch

    from success_detectors import load_detector
    from success_detectors.data import read_dataset

    data = tmp_path / "push.h5"
    collect = ["scripts/collect_detector_data.py", "task=push", "episodes=120",
               "task.image_size=32", f"out={data}", *QUIET[:2],
               f"hydra.run.dir={tmp_path / 'hydra'}"]
    kill = Killer(2, run(collect))
    frames = sum(len(split) for split in read_dataset(data).values())
    for _ in range(KILLS):
        kill(collect)  # each re-run replaces the whole file, or leaves the previous one
        assert sum(len(split) for split in read_dataset(data).values()) == frames
    kill.check()
    out = tmp_path / "detectors"
    train = ["scripts/train_detector.py", f"data={data}", f"out_dir={out}", "train.epochs=40",
             "train.patience=40", *QUIET[:2], f"hydra.run.dir={tmp_path / 'hydra'}"]
    kill = Killer(3, run(train))
    for _ in range(KILLS):
        kill(train)
        assert load_detector(out / "push_front.pt").task == "push"
        json.loads((out / "push_front_metrics.json").read_text())
    kill.check()
    torch.set_num_threads(1)


@pytest.mark.slow
def test_a_killed_multirun_leaves_whole_jobs(tmp_path):
    def args(sweep: Path) -> list[str]:
        return ["scripts/train.py", "-m", *GROUP, *QUIET, "algo.iterations=60", "seed=0,1",
                f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir=${hydra.job.num}"]

    kill = Killer(4, run(args(tmp_path / "uninterrupted")))
    for index in range(KILLS):
        sweep = tmp_path / f"sweep_{index}"
        kill(args(sweep))
        for job in sorted(sweep.glob("[0-9]*")) if sweep.exists() else []:
            if (job / "summary.json").exists():
                json.loads((job / "summary.json").read_text())
            if (job / "checkpoints" / "latest.json").exists():
                resolve_checkpoint(job / "checkpoints" / "latest.json")
            if (job / "metrics.csv").exists():
                check_metrics_whole(job / "metrics.csv")
        run(args(tmp_path / f"again_{index}"))
        assert len(list((tmp_path / f"again_{index}").glob("*/summary.json"))) == 2
    kill.check()


def test_a_killed_writer_leaves_no_temporary_file_behind_for_long(tmp_path):
    """A writer killed mid-write leaves ``.<name>.<pid>-<id>.tmp``; the next write of the same
    file removes it, and never a live writer's."""
    from harness_common.files import atomic_write_text

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    orphan = tmp_path / f".report.{gone}-0123456789ab.tmp.md"
    live = tmp_path / f".report.{os.getpid()}-0123456789ab.tmp.md"
    orphan.write_text("half")
    live.write_text("being written")
    atomic_write_text(tmp_path / "report.md", "whole")
    assert (tmp_path / "report.md").read_text() == "whole"
    assert not orphan.exists() and live.exists()


def test_a_folder_is_replaced_whole_or_not_at_all(tmp_path):
    """``atomic_dir``: a failed write leaves the old folder as it was; a good one replaces it;
    folders of killed writers (``.tmp``, or ``.old`` between the renames) are removed, a live
    writer's never."""
    from harness_common.files import atomic_dir

    target = tmp_path / "dataset"
    with atomic_dir(target) as folder:
        (folder / "a.txt").write_text("first")
    with pytest.raises(RuntimeError), atomic_dir(target) as folder:
        (folder / "a.txt").write_text("half")
        raise RuntimeError("killed")
    assert (target / "a.txt").read_text() == "first"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    orphans = [tmp_path / f".dataset.{gone}-0123456789ab.{kind}" for kind in ("tmp", "old")]
    live = tmp_path / f".dataset.{os.getpid()}-0123456789ab.tmp"
    for folder in (*orphans, live):
        folder.mkdir()
    with atomic_dir(target) as folder:
        (folder / "b.txt").write_text("second")
    assert sorted(p.name for p in target.iterdir()) == ["b.txt"]
    assert not any(p.exists() for p in orphans) and live.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name, "dataset"]
