"""One process per run folder, and refused runs that leave no trace (real group runs on state
reach with a tiny MLP):

* a run holds its folder's lock (``run.lock``) while it trains, and a resume takes it again; a
  second run into a folder another process holds, with or without ``resume=true``, through
  ``trainers.train`` or the training app, is refused naming the folder and the holder's PID, and
  the folder is left byte for byte as it was;
* the lock file of a process killed with SIGKILL is taken over, the log naming its PID, and the
  run completes;
* a run refused at config time leaves no run folder (no ``.hydra/``, no ``train.log``), and in an
  existing run folder leaves every file as it was; a run that starts keeps Hydra's files.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness import config as harness_config
from harness import trainers
from harness.algos.group.run import GroupRun
from harness.apps import evaluate as evaluate_app
from harness.apps import train as train_app
from harness.runs import LOCK_FILE, RunInUseError, RunLock

ROOT = Path(__file__).resolve().parent.parent
FAST = [
    "task=reach", "task.obs_mode=state", "task.difficulty=0.3", "task.max_episode_steps=10",
    "policy=mlp", "policy.hidden=16", "algo=grpo", "algo.group_size=2", "algo.num_start_states=2",
    "algo.minibatch_size=4", "algo.iterations=1", "eval.every_steps=0", "eval.final_episodes=2",
    "logger=none",
]
# An app run in this process leaves logging alone (see tests/test_cli.py).
HYDRA_QUIET = ["hydra/job_logging=none", "hydra/hydra_logging=none"]
# Takes a folder's lock as trainers.train does, says so, and holds it until stdin closes.
HOLD_THE_LOCK = (
    "import sys\n"
    "from harness.runs import RunLock\n"
    "RunLock(sys.argv[1]).acquire()\n"
    "print('locked', flush=True)\n"
    "sys.stdin.read()\n"
)


def train(run_dir: Path, *overrides: str) -> dict:
    return trainers.train(harness_config.compose([*FAST, *overrides]), run_dir)


def contents(folder: Path) -> dict[Path, bytes]:
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@contextmanager
def another_process_holding(run_dir: Path) -> Iterator[subprocess.Popen]:
    """A second process that holds ``run_dir``'s lock while the block runs."""
    process = subprocess.Popen([sys.executable, "-c", HOLD_THE_LOCK, str(run_dir)], cwd=ROOT,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline() == "locked\n"
        yield process
    finally:
        process.stdin.close()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished run of the training app: summary, checkpoints, ``.hydra/``."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    assert train_app.main([*FAST, *HYDRA_QUIET, f"hydra.run.dir={run_dir}"]) == 0
    return run_dir


def test_a_run_holds_its_folder_while_it_trains_and_its_resume_holds_it_again(tmp_path,
                                                                              monkeypatch):
    run_dir = tmp_path / "run"
    held_at_saves = []
    real_save = GroupRun.save

    def save_and_try_the_lock(self, name, result=None):
        with pytest.raises(RunInUseError, match=f"PID {os.getpid()} on "):
            RunLock(run_dir).acquire()
        held_at_saves.append((run_dir / LOCK_FILE).exists())
        return real_save(self, name, result)

    monkeypatch.setattr(GroupRun, "save", save_and_try_the_lock)
    assert train(run_dir)["iterations"] == 1
    assert held_at_saves and all(held_at_saves)
    assert not (run_dir / LOCK_FILE).exists()
    saves = len(held_at_saves)
    assert train(run_dir, "resume=true", "algo.iterations=2")["iterations"] == 2
    assert len(held_at_saves) > saves
    assert not (run_dir / LOCK_FILE).exists()


@pytest.mark.parametrize("resume", ["true", "false"])
def test_a_second_run_into_a_held_folder_is_refused_by_name_and_changes_nothing(
        tmp_path, finished, resume, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    with another_process_holding(run_dir) as holder:
        before = contents(run_dir)
        refusal = f"run dir {run_dir} is in use by PID {holder.pid} on {socket.gethostname()}"
        with pytest.raises(RunInUseError, match=refusal):
            train(run_dir, f"resume={resume}")
        assert contents(run_dir) == before
        # The app refuses before Hydra rewrites the holder's .hydra/ or opens its log.
        assert train_app.main([*FAST, f"resume={resume}", f"hydra.run.dir={run_dir}"]) == 1
        assert refusal in capsys.readouterr().err
        assert contents(run_dir) == before


def test_the_lock_of_a_killed_process_is_taken_over_and_the_run_completes(tmp_path, caplog):
    run_dir = tmp_path / "run"
    with another_process_holding(run_dir) as holder:
        holder.kill()  # SIGKILL: the kernel drops its lock, its lock file stays
        holder.wait(timeout=30)
    assert f'"pid": {holder.pid}' in (run_dir / LOCK_FILE).read_text()
    with caplog.at_level(logging.WARNING, logger="harness.runs"):
        summary = train(run_dir)
    assert f"taking over the lock of PID {holder.pid} on " in caplog.text
    assert summary["iterations"] == 1 and (run_dir / "summary.json").exists()
    assert not (run_dir / LOCK_FILE).exists()


def test_a_config_time_refusal_leaves_no_run_folder_behind(tmp_path):
    """As a user runs it, with Hydra's logging: neither the folder nor .hydra/ nor train.log."""
    run_dir = tmp_path / "new" / "run"
    done = subprocess.run([sys.executable, "scripts/train.py", "algo.learning_rate=-1",
                           f"hydra.run.dir={run_dir}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1
    assert "algo.learning_rate=-1.0; must be > 0" in done.stderr
    assert not (tmp_path / "new").exists()


def test_a_refusal_in_the_default_run_folder_or_of_another_app_leaves_none(tmp_path, capsys,
                                                                           monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default hydra.run.dir is outputs/<date>/<time>_..., here
    assert train_app.main(["+algo.unknown_key=1", *HYDRA_QUIET]) == 1
    assert "unknown config key(s) ['algo.unknown_key']" in capsys.readouterr().err
    assert evaluate_app.main(["checkpoint=x", "episodes=0", *HYDRA_QUIET]) != 0
    assert "episodes=0" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_refusal_in_an_existing_run_folder_leaves_it_exactly_as_it_was(tmp_path, finished,
                                                                         capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    before = contents(run_dir)
    assert Path(".hydra/config.yaml") in before
    assert train_app.main(["resume=true", "algo.learning_rate=-1", *HYDRA_QUIET,
                           f"hydra.run.dir={run_dir}"]) == 1
    assert "algo.learning_rate=-1.0; must be > 0" in capsys.readouterr().err
    assert contents(run_dir) == before
    # A run that starts keeps Hydra's record of it, as before.
    assert train_app.main([*FAST, "resume=true", "algo.iterations=2", *HYDRA_QUIET,
                           f"hydra.run.dir={run_dir}"]) == 0
    assert "algo.iterations=2" in (run_dir / ".hydra" / "overrides.yaml").read_text()
