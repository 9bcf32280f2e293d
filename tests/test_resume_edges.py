"""Two resume edges where a run could lose or double what it wrote (real group runs on state
reach with a tiny MLP):

* a run folder whose ``checkpoints/latest`` is gone but which holds a summary, metrics or other
  checkpoints is refused, whether ``resume`` is set or not, and left byte for byte as it was;
  ``overwrite=true`` moves its files to ``replaced/<time>/`` and starts afresh;
* a run killed after its last validation rows but before its ``final/*`` rows resumes to the
  very metrics an uninterrupted run writes (the rows logged after the checkpoint are dropped,
  then logged again once).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness import config as harness_config
from harness import trainers
from harness.algos.group.run import GroupRun
from harness.runs import CheckpointError
from harness_common.files import read_metrics

ROOT = Path(__file__).resolve().parent.parent
FAST = [
    "task=reach", "task.obs_mode=state", "task.difficulty=0.3", "task.max_episode_steps=12",
    "policy=mlp", "policy.hidden=32", "algo=grpo", "algo.group_size=4", "algo.num_start_states=3",
    "algo.learning_rate=3e-3", "algo.iterations=3", "eval.every_steps=144", "eval.episodes=4",
    "eval.final_episodes=6", "logger=none",
]


def train(run_dir: Path, *overrides: str) -> dict:
    return trainers.train(harness_config.compose([*FAST, *overrides]), run_dir)


def learned(run_dir: Path) -> dict:
    metrics = read_metrics(run_dir / "metrics.csv")
    return {k: v for k, v in metrics.items() if not k.startswith("time/")}


def contents(run_dir: Path) -> dict[Path, bytes]:
    return {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> dict:
    """The metrics of an uninterrupted run."""
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    train(run_dir)
    return learned(run_dir)


@pytest.mark.parametrize("resume", ["true", "false"])
def test_a_finished_run_without_its_latest_checkpoint_is_refused_and_left_whole(tmp_path,
                                                                                resume):
    run_dir = tmp_path / "run"
    train(run_dir)
    (run_dir / "checkpoints" / "latest.json").unlink()
    before = contents(run_dir)
    with pytest.raises(CheckpointError, match=r"a finished run \(summary.json\).*overwrite=true"):
        train(run_dir, f"resume={resume}")
    assert contents(run_dir) == before


def test_metrics_without_a_checkpoint_are_refused_unless_overwrite_moves_them_aside(tmp_path):
    run_dir = tmp_path / "run"
    train(run_dir)
    for name in ("summary.json", "checkpoints/latest.json", "checkpoints/latest.pt",
                 "checkpoints/best.json", "checkpoints/best.pt"):
        (run_dir / name).unlink()
    before = contents(run_dir)
    with pytest.raises(CheckpointError, match=r"an earlier run .*metrics.csv"):
        train(run_dir, "resume=true")
    assert contents(run_dir) == before

    summary = train(run_dir, "overwrite=true")
    assert summary["iterations"] == 3
    [aside] = list((run_dir / "replaced").iterdir())
    for name in ("metrics.csv", "config.yaml", "start_policy.pt"):
        assert (aside / name).read_bytes() == before[Path(name)], name
    assert (run_dir / "summary.json").exists()


def test_a_run_stopped_between_its_validation_and_final_rows_resumes_to_the_same_rows(
        tmp_path, monkeypatch, straight):
    run_dir = tmp_path / "run"
    real = GroupRun._test_both

    def stop_at_the_final_rows(self, prefix, videos=0, start=False):
        if prefix == "final":
            raise KeyboardInterrupt("stopped after the last validation rows")
        return real(self, prefix, videos, start)

    with monkeypatch.context() as patch:
        patch.setattr(GroupRun, "_test_both", stop_at_the_final_rows)
        with pytest.raises(KeyboardInterrupt):
            train(run_dir)
    stopped = learned(run_dir)
    assert "final/success_rate" not in stopped
    assert len(stopped["eval/success_rate"]) == len(straight["eval/success_rate"])
    train(run_dir, "resume=true")
    assert learned(run_dir) == straight


KILLED_AT_THE_FINAL_ROWS = textwrap.dedent("""
    import os, signal, sys
    from harness import config, trainers
    from harness.algos.group.run import GroupRun

    real = GroupRun._test_both

    def die_at_the_final_rows(self, prefix, *args, **kwargs):
        if prefix == "final":
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, prefix, *args, **kwargs)

    GroupRun._test_both = die_at_the_final_rows
    trainers.train(config.compose(sys.argv[2:]), sys.argv[1])
""")


@pytest.mark.slow
def test_a_kill_between_the_last_validation_and_the_final_rows_resumes_whole(tmp_path,
                                                                             straight):
    """The kill suite's window: SIGKILL after the last validation rows, before ``final/*``."""
    run_dir = tmp_path / "run"
    script = tmp_path / "killed.py"
    script.write_text(KILLED_AT_THE_FINAL_ROWS)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.run([sys.executable, str(script), str(run_dir), *FAST], cwd=ROOT,
                             env=env, capture_output=True, timeout=300)
    assert process.returncode == -signal.SIGKILL, process.stderr.decode()[-2000:]
    assert "final/success_rate" not in learned(run_dir)
    train(run_dir, "resume=true")
    assert learned(run_dir) == straight
