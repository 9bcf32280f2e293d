"""The group trainer's checkpoint format (harness.algos.group.checkpoints): a checkpoint saved
before the format was versioned resumes to the very run an uninterrupted one gives; one that
lacks a field a resume reads, or comes from a newer harness, is refused by name before the run
directory changes. Real runs on state reach with a tiny MLP."""

from __future__ import annotations

import json
import math

import pytest
import torch

from harness import config as harness_config
from harness import trainers
from harness.algos.group.checkpoints import (
    CHECKPOINT_FORMAT,
    FORMAT_3_DEFAULTS,
    RESUME_KEYS,
    migrate,
    read_checkpoint,
)
from harness.algos.group.run import GroupRun
from harness.runs import CheckpointError
from harness_common.files import read_metrics, sha256_of

FAST = [
    "task=reach", "task.obs_mode=state", "task.difficulty=0.3", "task.max_episode_steps=12",
    "policy=mlp", "policy.hidden=32", "algo=grpo", "algo.group_size=4", "algo.num_start_states=3",
    "algo.learning_rate=3e-3", "eval.every_steps=0", "eval.final_episodes=6", "logger=none",
    "checkpoint_every_steps=1",
]
OPERATIONAL = ("time/",)


def run(tmp_path, name, *overrides):
    summary = trainers.train(harness_config.compose([*FAST, *overrides]), tmp_path / name)
    metrics = read_metrics(tmp_path / name / "metrics.csv")
    return summary, {k: v for k, v in metrics.items() if not k.startswith(OPERATIONAL)}


def rewrite(path, change) -> None:
    """Change the checkpoint's fields, as an older (or newer) harness would have written them,
    with its metadata's SHA-256 to match: a whole file, not a corrupt one."""
    state = torch.load(path, weights_only=True)
    change(state)
    torch.save(state, path)
    meta = path.with_suffix(".json")
    record = json.loads(meta.read_text())
    record["sha256"] = sha256_of(path)
    meta.write_text(json.dumps(record))


def test_migrate_turns_format_one_into_the_current_format():
    old = {"policy_config": {}, "obs_shapes": {}, "trainer": {}, "best": 0.25}
    new = migrate(old)
    assert new["format"] == CHECKPOINT_FORMAT == 4
    assert new["best"] == {"success_rate": 0.25, "mean_return": -math.inf}
    assert {key: new[key] for key in FORMAT_3_DEFAULTS} == FORMAT_3_DEFAULTS
    assert migrate({**old, "best": -1.0})["best"] is None  # "no evaluation yet" in format 1
    assert "format" not in old, "the caller's dict is left as it was"
    with pytest.raises(CheckpointError, match="format 99"):
        migrate({**old, "format": 99})
    with pytest.raises(CheckpointError, match="format '2'"):
        migrate({**old, "format": "2"})


def test_migrate_turns_format_two_into_three_without_the_start_baseline():
    kept = {"policy_config": {}, "obs_shapes": {}, "trainer": {}, "best": None,
            "start_outcomes": [True, False]}
    new = migrate({**kept, "format": 2})
    assert new == {**kept, **FORMAT_3_DEFAULTS, "format": 4, "policy_format": 1, "plugins": []}
    current = {**kept, "format": 4, "best_start_decoding": "sampled", "policy_format": 2,
               "plugins": []}
    assert migrate(current) == current  # the current format passes through unchanged


def test_migrate_turns_format_three_into_four_with_the_heads_own_weight_names():
    """Format 3 held every kind's fields in one policy record (``kind``) and the tokens head's
    layer as ``action_head``: format 4 reads that record as policy format 1 and renames the
    layer in the policy, the reference and a separate critic, leaving the optimiser as it was
    (Adam's state is by parameter position, which did not change)."""
    weight, other = torch.ones(2), torch.zeros(3)
    networks = {"action_head.weight": weight, "value_head.0.bias": other}
    old = {"format": 3, "policy_config": {"kind": "mlp", "action_head": "tokens"},
           "obs_shapes": {}, "trainer": {"policy": networks, "reference": dict(networks),
                                         "critic": dict(networks), "optimizer": {"state": 1}}}
    new = migrate(old)
    assert (new["format"], new["policy_format"], new["plugins"]) == (4, 1, [])
    for which in ("policy", "reference", "critic"):
        assert new["trainer"][which] == {"head.linear.weight": weight,
                                         "value_head.0.bias": other}
    assert new["trainer"]["optimizer"] == {"state": 1}
    assert old["trainer"]["policy"] is networks and "action_head.weight" in networks


def test_a_format_one_checkpoint_resumes_to_the_uninterrupted_run(tmp_path):
    straight, straight_metrics = run(tmp_path, "straight", "algo.iterations=3")
    run(tmp_path, "resumed", "algo.iterations=2")
    latest = tmp_path / "resumed" / "checkpoints" / "latest.pt"
    assert read_checkpoint(latest)["format"] == CHECKPOINT_FORMAT
    rewrite(latest, lambda state: state.pop("format"))  # as written before the format existed
    resumed, resumed_metrics = run(tmp_path, "resumed", "algo.iterations=3", "resume=true")
    assert resumed["iterations"] == straight["iterations"] == 3
    assert resumed["success_rate"] == straight["success_rate"]
    # the first session ended with its own final evaluation (at its last step): compare the
    # training and the last final rows
    last = {k: v[-1:] if k.startswith("final") else v for k, v in resumed_metrics.items()}
    assert last == straight_metrics


def test_a_format_two_checkpoint_resumes_without_the_gain_over_the_better_start(
        tmp_path, caplog):
    """A run saved before the start's validation figures were kept resumes to the same
    training and final figures; its summary lacks the gain over the better start decoding,
    and a log line says why."""
    straight, straight_metrics = run(tmp_path, "straight", "algo.iterations=3")
    assert straight["best_start_decoding"] in ("greedy", "sampled")
    assert "improvement_vs_best_start" in straight
    run(tmp_path, "resumed", "algo.iterations=2")
    latest = tmp_path / "resumed" / "checkpoints" / "latest.pt"

    def as_format_two(state):
        for key in FORMAT_3_DEFAULTS:
            state.pop(key)
        state["format"] = 2

    rewrite(latest, as_format_two)
    with caplog.at_level("INFO", logger="harness.algos.group.summary"):
        resumed, resumed_metrics = run(tmp_path, "resumed", "algo.iterations=3", "resume=true")
    assert "without improvement_vs_best_start" in caplog.text
    new = ("best_start_decoding", "improvement_vs_best_start",
           "improvement_vs_best_start_interval", "improvement_vs_best_start_p_value",
           "start_validation_success_rate")
    assert not any(key in resumed for key in new)
    for key in ("success_rate", "sampled_success_rate", "start_success_rate", "improvement",
                "improvement_interval", "improvement_p_value", "iterations"):
        assert resumed[key] == straight[key], key
    trained = [key for key in straight_metrics if key.startswith(("rollout/", "train/"))]
    assert trained and all(resumed_metrics[key] == straight_metrics[key] for key in trained)


@pytest.mark.parametrize("missing", ["start_counter", "schedules"])
def test_a_checkpoint_without_a_field_a_resume_reads_is_refused_by_name(tmp_path, missing):
    run(tmp_path, "run", "algo.iterations=1")
    latest = tmp_path / "run" / "checkpoints" / "latest.pt"
    rewrite(latest, lambda state: (state.pop("format"), state.pop(missing)))
    before = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    with pytest.raises(CheckpointError, match=rf"format 1\) cannot be resumed: .*{missing}"):
        run(tmp_path, "run", "algo.iterations=2", "resume=true")
    after = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    assert after == before, "a refused resume must leave the run directory untouched"
    # the policies still evaluate: only the resume needs the missing field
    assert GroupRun.load_policy(latest, {}, sampled=False) is not None


def test_a_checkpoint_of_a_newer_format_is_refused_by_name(tmp_path):
    run(tmp_path, "run", "algo.iterations=1")
    latest = tmp_path / "run" / "checkpoints" / "latest.pt"
    rewrite(latest, lambda state: state.update(format=CHECKPOINT_FORMAT + 1))
    with pytest.raises(CheckpointError, match=f"format {CHECKPOINT_FORMAT + 1}"):
        run(tmp_path, "run", "algo.iterations=2", "resume=true")


def test_every_field_the_run_saves_is_one_a_resume_reads(tmp_path):
    run(tmp_path, "run", "algo.iterations=1")
    state = read_checkpoint(tmp_path / "run" / "checkpoints" / "latest.pt")
    assert set(state) == {"format", *RESUME_KEYS}
