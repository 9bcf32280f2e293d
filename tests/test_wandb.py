"""``logger=wandb``, offline: the W&B run id is kept in the run directory and a resumed run
continues that W&B run while a fresh one gets its own; a sweep's jobs are grouped by the sweep
folder and named by their job folder; a missing ``wandb`` package or a bad mode is refused by
name before anything starts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness import trainers
from harness.config import ConfigError, compose
from harness.wandb_run import ID_FILE, WandbRun

TINY = ["task=reach", "algo=grpo", "policy=mlp", "algo.group_size=2", "algo.num_start_states=2",
        "algo.minibatch_size=4", "task.max_episode_steps=10", "eval.final_episodes=2",
        "eval.every_steps=0", "logger=wandb", "logger.tensorboard=false", "logger.videos=false",
        "logger.progress_bar=false"]


@pytest.fixture
def offline(tmp_path, monkeypatch) -> None:
    """W&B offline, quiet, with its settings and caches in the test's folder."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb_home"))


def train(run_dir: Path, *overrides: str) -> None:
    """A tiny run with ``logger=wandb`` in ``run_dir``, in this process (what
    ``scripts/train.py`` runs; W&B's own service process serves every run of it)."""
    trainers.train(compose([*TINY, *overrides]), run_dir)


def offline_runs(run_dir: Path) -> list[str]:
    """Ids of the W&B offline runs below ``run_dir`` (``wandb/offline-run-<time>-<id>``)."""
    return sorted(path.name.rsplit("-", 1)[-1]
                  for path in (run_dir / "wandb").glob("offline-run-*") if path.is_dir())


def test_a_resumed_run_continues_its_wandb_run_and_a_fresh_one_starts_its_own(tmp_path, offline):
    run_dir = tmp_path / "run"
    train(run_dir, "algo.iterations=1")
    run_id = (run_dir / ID_FILE).read_text().strip()
    assert offline_runs(run_dir) == [run_id]

    train(run_dir, "algo.iterations=2", "resume=true")  # a larger budget: resumes and trains on
    assert (run_dir / ID_FILE).read_text().strip() == run_id
    assert offline_runs(run_dir) == [run_id, run_id]

    other = tmp_path / "other"  # a fresh run directory: a W&B run of its own
    other.mkdir()
    logger = WandbRun(other, compose([*TINY, "algo.iterations=1"]), resuming=False)
    try:
        assert logger.run.id == (other / ID_FILE).read_text().strip() != run_id
    finally:
        logger.close()
    assert offline_runs(other) == [logger.id]


def test_a_sweep_job_is_grouped_by_its_sweep_and_named_by_its_folder(tmp_path, offline):
    job = tmp_path / "curricula" / "3_curriculum=linear,seed=1"
    job.mkdir(parents=True)
    logger = WandbRun(job, compose([*TINY, "algo.iterations=1"]), resuming=False)
    try:
        assert (logger.run.group, logger.run.name) == ("curricula", job.name)
        assert logger.run.id == logger.id == (job / ID_FILE).read_text().strip()
        logger.log({"rollout/success_rate": 0.5, "train/loss": float("nan")}, step=40)
    finally:
        logger.close()


def test_logger_wandb_without_the_package_is_refused_by_name(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what an environment without wandb gives
    with pytest.raises(ConfigError, match="logger=wandb needs the wandb package"):
        compose([*TINY, "algo.iterations=1"])


def test_a_bad_wandb_mode_is_refused_by_name():
    with pytest.raises(ConfigError, match="logger.wandb.mode='online2'"):
        compose([*TINY, "algo.iterations=1", "logger.wandb.mode=online2"])
