"""``studies/audit_verifier.py`` on real group runs scored by real (untrained) CNN detectors."""

from __future__ import annotations

import importlib
import json

import pytest
import torch

from harness import config as harness_config
from harness import trainers

TINY = ["task=reach", "task.obs_mode=state", "task.max_episode_steps=5", "algo=grpo",
        "policy=mlp", "algo.start_policy.bc.demos=0", "algo.num_start_states=2",
        "algo.group_size=2",
        "algo.minibatch_size=4", "algo.iterations=3", "eval.every_steps=0",
        "eval.final_episodes=2", "logger.videos=false", "logger.tensorboard=false",
        "logger.progress_bar=false", "torch_threads=1"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A run with the scripted verifier, and two scored by an untrained CNN on the front camera
    (16 px): threshold 0 calls every attempt a success, threshold 1 calls none one (an untrained
    net is never certain)."""
    from success_detectors.cnn import CNNDetector, SuccessCNN
    from success_detectors.data import camera_mounts

    root = tmp_path_factory.mktemp("audit")
    torch.manual_seed(0)
    CNNDetector(SuccessCNN(), task="reach", camera="front", image_size=16,
                camera_mounts=camera_mounts("reach", "front")).save(root / "cnn.pt")
    trainers.train(harness_config.compose(TINY), root / "scripted")
    for name, threshold in (("fooled", 0.0), ("blind", 1.0)):
        trainers.train(harness_config.compose([
            *TINY, "task.terminate_on_success=false", "reward=verifier", "detector=cnn",
            f"detector.checkpoint={root / 'cnn.pt'}", f"detector.threshold={threshold}"]),
            root / name)
    return root


def test_a_detector_that_calls_everything_success_fails_the_audit(runs):
    script = importlib.import_module("studies.audit_verifier")
    result = script.main([str(runs / "fooled"), "--reference", str(runs / "scripted")])
    assert result["iterations_logged"] == 3
    # reach at difficulty 1 from an untrained policy: nearly every attempt truly fails, and the
    # detector called each of them a success
    assert result["fp_rate_max"] == 1.0 and result["iterations_above_fp_target"] >= 1
    assert not result["fp_within_target_every_iteration"]
    assert result["first_step_above_fp_target"] is not None
    assert result["detected_minus_true_success_last_tenth"] > 0.5
    saved = json.loads((runs / "fooled" / "verifier_audit.json").read_text())
    assert saved["final_true_success"] == result["final_true_success"]
    assert saved["reference_final_true_success"] == json.loads(
        (runs / "scripted" / "summary.json").read_text())["success_rate"]
    assert (runs / "fooled" / "verifier_audit.png").stat().st_size > 0


def test_a_detector_that_never_calls_success_has_no_false_positives(runs, tmp_path):
    script = importlib.import_module("studies.audit_verifier")
    result = script.main([str(runs / "blind"), "--out", str(tmp_path / "blind.png"),
                          "--baseline", str(runs / "fooled"), "--baseline-label", "fooled"])
    assert result["baseline"]["fp_rate_max"] == 1.0  # the other run, audited beside it
    assert result["fp_rate_max"] == 0.0 and result["fp_within_target_every_iteration"]
    assert result["first_step_above_fp_target"] is None and "reference" not in result
    assert (tmp_path / "blind.png").is_file()


def test_bad_input_is_named(runs):
    script = importlib.import_module("studies.audit_verifier")
    with pytest.raises(SystemExit, match="logged no detector/false_positive_rate"):
        script.main([str(runs / "scripted")])  # the scripted verifier has no error rates
    with pytest.raises(SystemExit, match="has no summary.json"):
        script.main([str(runs / "fooled"), "--reference", str(runs)])
    with pytest.raises(SystemExit):
        script.main([str(runs / "fooled"), "--fp-target", "2"])
