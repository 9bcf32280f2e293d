"""Nothing a checkpoint holds runs as code, and a refused resume leaves the run as it was.

Researchers share checkpoints; whoever crafts one can edit its SHA-256 in the JSON too. These
tests plant pickles that would create a marker file when unpickled, give them consistent
metadata, and check that loading and resuming refuse them (or ignore the pickled part) without
the marker ever appearing.
"""

from __future__ import annotations

import base64
import json
import zipfile
from pathlib import Path

import cloudpickle
import pytest
import torch

from harness import trainers
from harness.checkpoints import evaluate_checkpoint
from harness.config import compose
from harness.runs import CheckpointError
from harness_common.files import sha256_of

GROUP = ["task=reach", "task.obs_mode=state", "task.max_episode_steps=10", "policy=mlp",
         "policy.hidden=16", "algo=grpo", "algo.group_size=2", "algo.num_start_states=2",
         "algo.iterations=1", "eval.every_steps=0", "eval.final_episodes=2",
         "logger.videos=false", "logger.tensorboard=false", "logger.progress_bar=false"]
SB3 = ["task=reach", "algo=ppo", "algo.n_steps=64", "algo.batch_size=32", "algo.n_epochs=1",
       "policy.net_arch=[8]", "total_timesteps=64", "eval.every_steps=0", "eval.final_episodes=2",
       "task.max_episode_steps=10", "logger.videos=false", "logger.tensorboard=false",
       "logger.progress_bar=false"]


class Touch:
    """Unpickling this creates ``marker``: the stand-in for arbitrary code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def reseal(checkpoint: Path) -> None:
    """Give a tampered checkpoint a consistent SHA-256, as an attacker would."""
    meta = checkpoint.with_suffix(".json")
    record = json.loads(meta.read_text())
    record["sha256"] = sha256_of(checkpoint)
    meta.write_text(json.dumps(record))


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes()
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.fixture()
def group_run(tmp_path):
    run_dir = tmp_path / "group"
    trainers.train(compose(GROUP), run_dir)
    return run_dir


def test_a_crafted_group_checkpoint_runs_nothing(group_run, tmp_path):
    marker = tmp_path / "pwned"
    latest = group_run / "checkpoints" / "latest.pt"
    state = torch.load(latest, weights_only=True)
    state["policy_config"] = Touch(marker)
    torch.save(state, latest)
    reseal(latest)
    with pytest.raises(CheckpointError, match="could not be loaded safely"):
        evaluate_checkpoint(latest, episodes=1)
    assert not marker.exists()


def test_a_refused_resume_leaves_the_run_untouched(group_run, tmp_path):
    marker = tmp_path / "pwned"
    latest = group_run / "checkpoints" / "latest.pt"
    torch.save({"trainer": Touch(marker)}, latest)
    reseal(latest)
    before = snapshot(group_run)
    with pytest.raises(CheckpointError):
        trainers.train(compose([*GROUP, "algo.iterations=2", "resume=true"]), group_run)
    assert not marker.exists()
    assert snapshot(group_run) == before  # metrics.csv not cut, config.yaml not rewritten


def test_resuming_a_finished_run_changes_nothing(group_run):
    before = snapshot(group_run)
    summary = trainers.train(compose([*GROUP, "resume=true"]), group_run)
    assert snapshot(group_run) == before
    assert summary == json.loads((group_run / "summary.json").read_text())


def test_a_crafted_sb3_zip_has_its_pickles_ignored(tmp_path):
    """SB3's own loader unpickles the zip's ``data`` entry with cloudpickle; ours rebuilds the
    model from the run's configuration and reads only the tensors."""
    run_dir = tmp_path / "ppo"
    summary = trainers.train(compose(SB3), run_dir)
    marker = tmp_path / "pwned"
    latest = run_dir / "checkpoints" / "latest.zip"
    payload = base64.b64encode(cloudpickle.dumps(Touch(marker))).decode()
    crafted = tmp_path / "crafted.zip"
    with zipfile.ZipFile(latest) as source, zipfile.ZipFile(crafted, "w") as target:
        for item in source.namelist():
            data = source.read(item)
            if item == "data":
                fields = json.loads(data)
                data = json.dumps({key: {":type:": "x", ":serialized:": payload}
                                   for key in fields}).encode()
            target.writestr(item, data)
    crafted.replace(latest)
    reseal(latest)
    result, _ = evaluate_checkpoint(latest, episodes=2)
    assert not marker.exists()
    assert result.success_rate == summary["success_rate"]  # the weights are the run's own
    trainers.train(compose([*SB3, "total_timesteps=128", "resume=true"]), run_dir)
    assert not marker.exists()


def test_sb3_saves_its_last_checkpoint_before_the_final_evaluation(tmp_path, monkeypatch):
    """A failure in the final evaluation loses no training: ``latest`` already holds the end."""
    from harness.algos import sb3

    def broken(self, split, sampled=False, videos=0):
        raise RuntimeError("the final evaluation failed")

    monkeypatch.setattr(sb3.SB3Run, "evaluate", broken)
    with pytest.raises(RuntimeError, match="final evaluation failed"):
        trainers.train(compose([*SB3, "total_timesteps=128"]), tmp_path / "ppo")
    latest = json.loads((tmp_path / "ppo" / "checkpoints" / "latest.json").read_text())
    assert latest["num_timesteps"] == 128
