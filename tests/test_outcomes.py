"""How episodes end (``harness.outcomes``, ``studies/failure_modes.py``): the classification
against hand-made cases, the recorder on real ``push`` and ``reach`` episodes played by the
scripted expert, by a still arm and by the expert sent to a distractor, and the script end to
end on a real (tiny) group-trainer run."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import numpy as np
import pytest

import tasks
from harness.checkpoints import evaluate_checkpoint
from harness.outcomes import (
    MOVED,
    NEAR_MISS,
    OUTCOMES,
    EpisodeOutcome,
    OutcomeRecorder,
    classify,
    tally,
)
from harness.runs import CheckpointError

failure_modes = importlib.import_module("studies.failure_modes")


@pytest.mark.parametrize(("case", "expected"), [
    ((True, 0.5, 0.0, 0.0, True), "success"),           # the predicate decides, not the margin
    ((False, NEAR_MISS, 0.0, 0.0, True), "near miss"),  # on the edge counts as near
    ((False, -0.001, 0.2, 0.0, True), "near miss"),     # inside the radius, lifted: not success
    ((False, 0.05, MOVED, 0.3, True), "moved the named object"),
    ((False, 0.05, 0.009, MOVED, True), "moved another object only"),
    ((False, 0.05, 0.009, 0.009, True), "moved nothing"),
    ((False, 0.05, 0.0, 0.0, False), "missed"),
    ((False, 0.01, 0.0, 0.0, False), "near miss"),
])
def test_classify_hand_made_cases(case, expected):
    assert classify(*case) == expected


def test_points_are_signed_and_never_minus_zero():
    assert [failure_modes.points(x) for x in (0.37, -0.004, 0.0, -0.126)] == \
        ["+37", "+0", "+0", "-13"]


def test_tally_counts_every_outcome_with_zeros():
    outcomes = [EpisodeOutcome(i, name, name == "success", 0.1, 0.0, 0.0, 5)
                for i, name in enumerate(["success", "success", "moved nothing", "near miss"])]
    result = tally(outcomes)
    assert result["episodes"] == 4
    assert list(result["counts"]) == list(OUTCOMES)
    assert result["counts"] == {"success": 2, "near miss": 1, "moved the named object": 0,
                                "moved another object only": 0, "moved nothing": 1, "missed": 0}
    assert result["shares"]["success"] == 0.5
    assert result["records"][2]["outcome"] == "moved nothing"


def play(env, policy, seeds, difficulty=1.0):
    observations = []
    for seed in seeds:
        obs, _ = env.reset(seed=seed, options={"difficulty": difficulty})
        done = False
        while not done:
            obs, _, terminated, truncated, _ = env.step(policy(env.unwrapped, obs))
            observations.append(obs)
            done = terminated or truncated
    return observations


def expert(base, obs):
    return tasks.ScriptedExpert(base)(obs)


def still(base, obs):
    return np.zeros(base.action_space.shape, dtype=np.float32)


def expert_on_a_distractor(base, obs):
    """The expert, sent to push the first cube on the table that the instruction does not
    name; the task's own target is put back before the step."""
    named = base.task.state["target"]
    others = [i for i, joint in enumerate(("cube_red", "cube_blue", "cube_yellow"))
              if i != named and joint in base.task.movable_objects(base)]
    base.task.state["target"] = others[0]
    try:
        return tasks.ScriptedExpert(base)(obs)
    finally:
        base.task.state["target"] = named


def test_push_outcomes_of_the_expert_a_still_arm_and_a_wrong_cube():
    env = OutcomeRecorder(tasks.make("push", difficulty=1.0, max_episode_steps=60))
    seeds = range(3)
    play(env, expert, seeds)
    assert [o.outcome for o in env.outcomes] == ["success"] * 3
    assert all(o.named_moved > 0.05 and o.final_margin < 0 for o in env.outcomes)
    env.outcomes.clear()
    play(env, still, seeds)
    assert [o.outcome for o in env.outcomes] == ["moved nothing"] * 3
    assert [o.length for o in env.outcomes] == [60] * 3
    env.outcomes.clear()
    play(env, expert_on_a_distractor, seeds)  # two distractors on the table at difficulty 1
    assert [o.outcome for o in env.outcomes] == ["moved another object only"] * 3
    assert all(o.others_moved > 0.05 and o.named_moved < MOVED for o in env.outcomes)
    assert [o.seed for o in env.outcomes] == list(seeds)
    env.close()


def test_the_recorder_changes_nothing_the_policy_sees():
    plain = tasks.make("push", difficulty=1.0, max_episode_steps=20)
    wrapped = OutcomeRecorder(tasks.make("push", difficulty=1.0, max_episode_steps=20))
    for a, b in zip(play(plain, expert, [7]), play(wrapped, expert, [7]), strict=True):
        assert all(np.array_equal(a[key], b[key]) for key in a)
    plain.close()
    wrapped.close()


def test_a_task_without_objects_misses_or_nearly_does():
    env = OutcomeRecorder(tasks.make("reach", difficulty=1.0, max_episode_steps=5))
    play(env, still, range(4))
    assert {o.outcome for o in env.outcomes} <= {"missed", "near miss"}
    assert all(o.named_moved == 0 and o.others_moved == 0 for o in env.outcomes)
    assert env.unwrapped.task.named_object(env.unwrapped) is None
    env.close()


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A tiny group-trainer run on push, by the training app (``scripts/train.py``'s ``main``)
    in this process."""
    from harness.apps import train

    run_dir = tmp_path_factory.mktemp("outcomes") / "run"
    assert train.main(
        ["task=push", "task.difficulty=0.2", "algo=grpo", "policy=mlp", "algo.iterations=1",
         "algo.group_size=2", "algo.num_start_states=2", "algo.minibatch_size=4",
         "task.max_episode_steps=10", "eval.final_episodes=4", "eval.every_steps=0",
         "logger=none", f"hydra.run.dir={run_dir}",
         # Hydra's logging set-up would close pytest's handlers (and its captured output)
         "hydra/job_logging=none", "hydra/hydra_logging=none"]) == 0
    return run_dir


def test_the_script_tallies_both_policies_of_a_run_as_the_evaluation_scores_them(
        tiny_run, tmp_path):
    result = failure_modes.main([str(tiny_run), "--episodes", "4", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "failure_modes.json").read_text()) == result
    assert (tmp_path / "failure_modes.png").stat().st_size > 5_000
    checkpoint = tiny_run / "checkpoints" / "latest.json"
    for policy, reference in (("start", True), ("fine-tuned", False)):
        tallied = result["runs"][0]["policies"][policy]
        assert sum(tallied["counts"].values()) == tallied["episodes"] == 4
        evaluation, _ = evaluate_checkpoint(checkpoint, 4, reference=reference)
        assert tallied["counts"]["success"] == evaluation.successes
        assert [r["seed"] for r in tallied["records"]] == [e.seed for e in evaluation.episodes]
        assert result["pooled"][policy]["counts"] == tallied["counts"]
    assert result["runs"][0]["max_episode_steps"] == 10  # the run's (task.max_episode_steps)
    summary = json.loads((tiny_run / "summary.json").read_text())
    assert result["runs"][0]["improvement"] == pytest.approx(summary["improvement"])
    assert result["runs"][0]["improvement_p_value"] == pytest.approx(
        summary["improvement_p_value"])
    short = failure_modes.main([str(tiny_run), "--episodes", "2", "--max-episode-steps", "3",
                                "--out", str(tmp_path / "short")])
    assert short["runs"][0]["max_episode_steps"] == 3
    assert max(r["length"] for r in short["runs"][0]["policies"]["start"]["records"]) <= 3


def test_the_script_refuses_what_is_not_a_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        failure_modes.main([str(tmp_path / "absent"), "--out", str(tmp_path)])
    with pytest.raises(CheckpointError):
        failure_modes.main([str(tmp_path), "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit):
        failure_modes.parse_args([str(tmp_path), "--episodes", "0"])
