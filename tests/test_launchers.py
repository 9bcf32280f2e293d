"""Sweeps through every launcher (docs/scaling.md): the same tiny two-job sweep through joblib (the
default), the submitit rehearsal of a SLURM sweep and a local Ray gives the same job folders and
the same numbers, and the report reads each; a re-launched sweep (``resume=true``) leaves a
finished job untouched and completes the others; a launcher that cannot run the sweep stops it
with the setting to change before anything is written. Each sweep runs ``scripts/train.py`` in a
subprocess, as a user would; the report reads each in this process (``scripts/report.py`` itself
is run in tests/test_cli.py and tests/test_report.py), and a sweep that SLURM's checks refuse
before any job starts runs the app's ``main`` in this process too. The SLURM checks run against
stand-in ``sbatch`` and ``sinfo`` scripts on a ``PATH`` of their own, so they need no SLURM (and
ignore one that is installed)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness import trainers
from harness.apps import report as report_app
from harness.apps import train as train_app
from harness.config import compose
from harness.launchers import LauncherError, check_slurm
from harness.report import scan_runs
from harness.report.compare import compare_sweeps, job_folders
from harness.runs import CheckpointError

ROOT = Path(__file__).resolve().parent.parent
TINY = ["task=reach", "algo=grpo", "policy=mlp", "algo.iterations=1", "algo.group_size=2",
        "algo.num_start_states=2", "algo.minibatch_size=4", "task.max_episode_steps=10",
        "eval.final_episodes=2", "eval.every_steps=0", "logger=none"]
SWEEP = [*TINY, "seed=0,1"]
LOCAL_RAY = ["hydra/launcher=ray_cluster", "hydra.launcher.ray.init.num_cpus=2",
             "hydra.launcher.ray.init.object_store_memory=80000000"]


@dataclass
class Sweep:
    """A finished ``scripts/train.py -m`` process."""

    pid: int
    returncode: int
    stderr: str


def sweep(sweep_dir: Path | str, *overrides: str, check: bool = True) -> Sweep:
    """``python scripts/train.py -m <the tiny sweep> overrides... hydra.sweep.dir=sweep_dir``."""
    process = subprocess.Popen(
        [sys.executable, "scripts/train.py", "-m", *SWEEP, *overrides,
         f"hydra.sweep.dir={sweep_dir}"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    _, stderr = process.communicate(timeout=300)
    if check:
        assert process.returncode == 0, stderr[-3000:]
    return Sweep(process.pid, process.returncode, stderr)


def refused_in_process(capsys, sweep_dir: Path, *overrides: str) -> tuple[int, str]:
    """The exit status and stderr of the tiny sweep run by the training app's ``main`` in this
    process (``scripts/train.py`` calls the same function): for sweeps that a launcher refuses
    before any job starts, where a process of their own only added its start. Hydra leaves
    logging alone (its set-up would close pytest's handlers and captured output)."""
    capsys.readouterr()
    status = train_app.main(["-m", *SWEEP, *overrides, f"hydra.sweep.dir={sweep_dir}",
                             "hydra/job_logging=none", "hydra/hydra_logging=none"])
    return status, capsys.readouterr().err


def check_no_ray_left(done: Sweep) -> None:
    """No process of the local Ray that the sweep started is left: Ray names its session folder
    after the process that started it (``session_<date>_<time>_<n>_<pid>``), and every daemon
    of that Ray carries the name in its arguments. Other people's Ray is left out."""
    session = re.compile(rf"session_[0-9_-]+_{done.pid}\b")
    deadline = time.monotonic() + 20
    while True:
        listing = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True,
                                 text=True).stdout
        left = [line for line in listing.splitlines() if session.search(line)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not left, f"the sweep left Ray processes behind: {left}"


def check_reported(sweep_dir: Path) -> None:
    """Two jobs, each with its summary.json, and the report app (``scripts/report.py``'s
    ``main``, in this process) reads both, skipping none."""
    assert len(job_folders(sweep_dir)) == 2
    runs, skipped = scan_runs(sweep_dir)
    assert len(runs) == 2 and not skipped, skipped
    assert report_app.main([str(sweep_dir), "--reps", "100"]) == 0
    text = (sweep_dir / "report.md").read_text()
    assert "2 runs of task reach" in text and "Skipped folders" not in text


@pytest.fixture(scope="module")
def joblib_sweep(built_once) -> Path:
    """The tiny sweep through the default launcher (joblib), run once for both xdist workers:
    the Ray launcher's test (in the Ray group) compares against it too. Read-only: a test that
    changes it works on a copy."""
    return built_once("joblib_sweep", lambda folder: sweep(folder / "sweep",
                                                           "hydra.launcher.n_jobs=2")) / "sweep"


def test_joblib_is_the_default_and_the_sweep_is_reported(joblib_sweep, tmp_path):
    hydra = (joblib_sweep / "multirun.yaml").read_text()
    assert "JoblibLauncher" in hydra
    shutil.copytree(joblib_sweep, tmp_path / "sweep")  # the report writes into the sweep
    check_reported(tmp_path / "sweep")


def test_joblib_jobs_can_spawn_rollout_workers(tmp_path):
    """A job of the joblib launcher runs in a loky process, whose global start method a
    spawned rollout worker cannot resolve; the workers name one it can."""
    sweep_dir = tmp_path / "sweep"
    done = sweep(sweep_dir, "hydra.launcher.n_jobs=2", "algo.workers=2",
                 "task.obs_mode=state")
    assert "died" not in done.stderr, done.stderr[-3000:]
    check_reported(sweep_dir)


def test_submitit_rehearsal_gives_the_joblib_sweep(joblib_sweep, tmp_path):
    sweep_dir = tmp_path / "sweep"
    sweep(sweep_dir, "hydra/launcher=slurm_rehearsal", "hydra.sweeper.max_batch_size=2")
    assert (sweep_dir / ".submitit").is_dir()  # submitit's pickles and logs, next to the jobs
    assert job_folders(sweep_dir).keys() == job_folders(joblib_sweep).keys()
    assert compare_sweeps(joblib_sweep, sweep_dir) == []
    check_reported(sweep_dir)


@pytest.mark.ray
def test_local_ray_gives_the_joblib_sweep_and_stops(joblib_sweep, tmp_path):
    sweep_dir = tmp_path / "sweep"
    done = sweep(sweep_dir, *LOCAL_RAY)
    assert job_folders(sweep_dir).keys() == job_folders(joblib_sweep).keys()
    assert compare_sweeps(joblib_sweep, sweep_dir) == []
    check_reported(sweep_dir)
    check_no_ray_left(done)


@pytest.mark.parametrize("damage", [
    pytest.param("never started", marks=pytest.mark.slow),  # the simpler case: -m slow
    "killed before its summary",
])
def test_a_relaunched_sweep_skips_finished_jobs_and_completes_the_others(joblib_sweep, tmp_path,
                                                                         damage):
    sweep_dir = tmp_path / "sweep"
    shutil.copytree(joblib_sweep, sweep_dir)
    finished, other = (job_folders(sweep_dir)[name] for name in sorted(job_folders(sweep_dir)))
    if damage == "never started":
        shutil.rmtree(other)
    else:  # killed during its final evaluation: checkpoint at the full budget, no final rows
        (other / "summary.json").unlink()
        rows = (other / "metrics.csv").read_text().splitlines(keepends=True)
        (other / "metrics.csv").write_text("".join(r for r in rows if ",final" not in r))
    # Hydra rewrites .hydra/ and appends to train.log on every launch; the run's own files stay.
    before = {path: (path.read_bytes(), path.stat().st_mtime_ns)
              for path in finished.rglob("*")
              if path.is_file() and ".hydra" not in path.parts and path.name != "train.log"}

    sweep(sweep_dir, "hydra.launcher.n_jobs=2", "resume=true")

    after = {path: (path.read_bytes(), path.stat().st_mtime_ns) for path in before}
    assert after == before
    assert sorted(job_folders(sweep_dir)) == sorted(job_folders(joblib_sweep))
    assert compare_sweeps(joblib_sweep, sweep_dir) == []


def test_resume_true_where_no_checkpoint_was_saved_starts_afresh_only_with_overwrite(tmp_path):
    run_dir = tmp_path / "job"
    run_dir.mkdir()
    assert trainers.train(compose([*TINY, "resume=true"]), run_dir / "empty")["env_steps"] > 0
    # an earlier start killed before its first checkpoint left a row behind: never truncated
    stale = "step,time_s,key,value\n7,0.1,stale/row,1.0\n"
    (run_dir / "metrics.csv").write_text(stale)
    with pytest.raises(CheckpointError, match="overwrite=true"):
        trainers.train(compose([*TINY, "resume=true"]), run_dir)
    assert (run_dir / "metrics.csv").read_text() == stale
    summary = trainers.train(compose([*TINY, "resume=true", "overwrite=true"]), run_dir)
    assert summary["env_steps"] > 0 and (run_dir / "summary.json").exists()
    assert "stale/row" not in (run_dir / "metrics.csv").read_text()
    [aside] = list((run_dir / "replaced").iterdir())
    assert (aside / "metrics.csv").read_text() == stale


# ------------------------------------------------------------------------------- bad input
def closed_port() -> int:
    """A local TCP port nothing listens at."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# sinfo --all --noheader --Node --format=%P|%N|%c of a cluster with a default partition "cpu"
# (two 4-CPU nodes) and a partition "big" (one 4-CPU node shared with cpu, one 16-CPU node)
SINFO = "cpu*|n1|4\\ncpu*|n2|4\\nbig|n2|4\\nbig|n3|16\\n"


def fake_slurm(folder: Path, sinfo: str | None = f"printf '{SINFO}'") -> str:
    """A ``PATH`` of ``folder``, which gets stand-ins for ``sbatch`` (it records that it was
    called, and fails) and ``sinfo`` (a shell script running the command ``sinfo``; no ``sinfo``
    where ``None``), and of the folder of this Python, which holds no SLURM command."""
    folder.mkdir(parents=True, exist_ok=True)
    scripts = {"sbatch": f"touch '{folder}/sbatch_called'; exit 1", "sinfo": sinfo}
    for name, body in scripts.items():
        if body is not None:
            (folder / name).write_text(f"#!/bin/sh\n{body}\n")
            (folder / name).chmod(0o755)
    return os.pathsep.join([str(folder), str(Path(sys.executable).parent)])


def test_slurm_without_sbatch_stops_before_anything_is_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    status, stderr = refused_in_process(capsys, tmp_path / "sweep", "hydra/launcher=slurm")
    assert status == 1
    assert "sbatch, which is not on this machine's PATH" in stderr
    assert "hydra/launcher=slurm_rehearsal" in stderr
    assert not (tmp_path / "sweep").exists()


@pytest.mark.parametrize(("setting", "message"), [
    ("hydra.launcher.partition=gpu", "hydra.launcher.partition='gpu': this SLURM cluster has no "
     "partition 'gpu' (sinfo lists: cpu, big)"),
    ("hydra.launcher.cpus_per_task=8", "hydra.launcher.cpus_per_task=8: one job asks for 8 CPU(s) "
     "on each of 1 node(s), which no partition it may run in can hold (partition 'cpu': 2 "
     "node(s), the largest with 4 CPUs)"),
], ids=["unknown partition", "too many CPUs"])
def test_slurm_refuses_what_sbatch_would_refuse_or_leave_pending(tmp_path, monkeypatch, capsys,
                                                                 setting, message):
    monkeypatch.setenv("PATH", fake_slurm(tmp_path / "bin"))
    status, stderr = refused_in_process(capsys, tmp_path / "sweep", "hydra/launcher=slurm",
                                        setting)
    assert status == 1
    assert message in stderr, stderr[-2000:]
    assert not (tmp_path / "sweep").exists() and not (tmp_path / "bin" / "sbatch_called").exists()


@pytest.mark.parametrize(("request_", "sinfo", "refused"), [
    ({}, f"printf '{SINFO}'", None),
    ({"partition": "cpu"}, f"printf '{SINFO}'", None),
    ({"partition": "big, cpu"}, f"printf '{SINFO}'", None),  # sbatch --partition takes a list
    ({"partition": "big,long"}, f"printf '{SINFO}'", "no partition 'long' (sinfo lists: cpu, big)"),
    ({"partition": "CPU"}, f"printf '{SINFO}'", "no partition 'CPU'"),  # names are case-sensitive
    ({"cpus_per_task": 4, "nodes": 2}, f"printf '{SINFO}'", None),
    ({"cpus_per_task": 5}, f"printf '{SINFO}'", "(partition 'cpu': 2 node(s), the largest with "
     "4 CPUs); SLURM would accept the array and leave it pending (Reason=PartitionConfig)"),
    ({"cpus_per_task": 2, "tasks_per_node": 3}, f"printf '{SINFO}'",
     "hydra.launcher.cpus_per_task=2, hydra.launcher.tasks_per_node=3: one job asks for 6 CPU(s)"),
    ({"partition": "big", "cpus_per_task": 16}, f"printf '{SINFO}'", None),
    ({"partition": "cpu,big", "cpus_per_task": 16}, f"printf '{SINFO}'", None),  # one fits
    ({"partition": "big", "cpus_per_task": 8, "nodes": 2}, f"printf '{SINFO}'",
     "(partition 'big': 2 node(s), the largest with 16 CPUs, 1 with 8 or more)"),
    ({"cpus_per_task": 64}, "printf 'cpu|n1|4\\n'", None),  # no default partition: sbatch's
    ({"cpus_per_task": 64}, "printf 'cpu*|n1|N/A\\n'", None),  # CPUs unknown: sbatch's
    ({"partition": "long", "cpus_per_task": 64},
     "echo 'sinfo: error: Unable to contact slurm controller' >&2; exit 1", None),
    ({"partition": "long"}, None, None),  # no sinfo: left to sbatch
], ids=["default", "default partition", "list", "one unknown of two", "case", "fits",
        "too many CPUs", "too many tasks", "fits the big node", "fits one of two",
        "too few big nodes", "no default", "CPUs unknown", "sinfo fails", "no sinfo"])
def test_check_slurm_refuses_what_no_partition_sinfo_lists_can_hold(tmp_path, monkeypatch,
                                                                     request_, sinfo, refused):
    monkeypatch.setenv("PATH", fake_slurm(tmp_path, sinfo))
    if refused is None:
        check_slurm(**request_)
        return
    with pytest.raises(LauncherError) as error:
        check_slurm(**request_)
    assert refused in str(error.value)


@pytest.mark.parametrize(("setting", "relative", "message"), [
    ("hydra.launcher.ray.init.address=127.0.0.1:{port}", False,
     "hydra.launcher.ray.init.address='127.0.0.1:{port}': nothing answers at 127.0.0.1:{port}"),
    ("hydra.launcher.ray.init.address=auto", True,
     "hydra.sweep.dir='multirun/never_written' is relative"),
    ("hydra.launcher.ray.remote.num_cpus=64", False,
     "hydra.launcher.ray.remote.num_cpus=64: no node of the local Ray can hold one job"),
    pytest.param("hydra.launcher.ray.remote.num_gpus=64", False,  # the CPU check's path
                 "hydra.launcher.ray.remote.num_gpus=64: no node of the local Ray can hold one job",
                 marks=pytest.mark.slow),
], ids=["unreachable address", "relative sweep dir", "too many CPUs", "too many GPUs"])
@pytest.mark.ray
def test_ray_refuses_what_it_cannot_run_before_anything_is_written(tmp_path, setting, relative,
                                                                   message):
    port = closed_port()
    sweep_dir = "multirun/never_written" if relative else tmp_path / "sweep"
    done = sweep(sweep_dir, *LOCAL_RAY, setting.format(port=port), check=False)
    assert done.returncode == 1
    assert message.format(port=port) in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "sweep").exists() and not (ROOT / "multirun" / "never_written").exists()
    check_no_ray_left(done)
