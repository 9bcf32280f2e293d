"""In-run refresh of a learned verifier (``detector_refresh``, :mod:`success_detectors.refresh`).

Layers: the labelling and the bounded buffer by hand; one real refresh of a CNN trained on real
``push`` frames (collected with MuJoCo) that must lower its scores on the hard negatives it was
shown and choose its threshold again by the training rule; then real group runs scored by that
CNN, refreshed every iteration, which must log the refreshes, leave the given checkpoint alone,
write the refreshed one, and resume exactly as an uninterrupted run.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from harness import config as harness_config
from harness import trainers
from success_detectors import load_detector
from success_detectors.cnn import CNNDetector, SuccessCNN
from success_detectors.data import (
    CollectConfig,
    build_dataset,
    camera_mounts,
    read_split,
    write_dataset,
)
from success_detectors.metrics import select_threshold
from success_detectors.network import predict_pixels
from success_detectors.refresh import DetectorRefresher, policy_floor
from success_detectors.training import TrainConfig, TrainDetectorConfig, train_detector

torch.set_num_threads(1)

SIZE = 16
TINY = ["task=reach", "task.obs_mode=state", "task.max_episode_steps=5", "algo=grpo",
        "policy=mlp", "algo.start_policy.bc.demos=0", "algo.num_start_states=2",
        "algo.group_size=2",
        "algo.minibatch_size=4", "eval.every_steps=0", "eval.final_episodes=2",
        "logger.videos=false", "logger.tensorboard=false", "logger.progress_bar=false",
        "torch_threads=1", "task.terminate_on_success=false", "reward=verifier", "detector=cnn"]


def settings(**overrides):
    values = dict(every=1, label="claimed", buffer=1024, steps=40, batch_size=32,
                  learning_rate=3e-3, data=None, replay_fraction=0.5, target_precision=0.9,
                  conservative_threshold=False, holdout=0.0, hard_negative_share=0.0)
    return SimpleNamespace(**{**values, **overrides})


def untrained(threshold: float = 0.5) -> CNNDetector:
    torch.manual_seed(0)
    return CNNDetector(SuccessCNN(), task="reach", camera="front", image_size=SIZE,
                       threshold=threshold, camera_mounts=camera_mounts("reach", "front"))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """Real frames (collected with MuJoCo, split by episode): reach at 16 px with an untrained
    CNN for the runs, and push at 32 px with a CNN trained on them for one epoch."""
    root = tmp_path_factory.mktemp("refresh")
    collect = CollectConfig(task="reach", camera="front", image_size=SIZE, episodes=20,
                            difficulty=(0.0, 1.0), seed=3, frame_stride=2,
                            policies={"expert": 1.0, "offset_goal": 1.0, "stop_short": 1.0})
    write_dataset(root / "reach.h5", build_dataset(collect, progress=False), task="reach",
                  camera="front", camera_mounts=camera_mounts("reach", "front"))
    untrained().save(root / "cnn.pt")
    collect = CollectConfig(task="push", camera="front", image_size=32, episodes=16,
                            difficulty=(0.0, 0.3), seed=2,
                            policies={"expert": 2.0, "offset_goal": 1.0, "decoy": 0.5})
    write_dataset(root / "push.h5", build_dataset(collect, progress=False), task="push",
                  camera="front", camera_mounts=camera_mounts("push", "front"))
    train_detector(TrainDetectorConfig(data=str(root / "push.h5"), out_dir=str(root / "push"),
                                       train=TrainConfig(epochs=1, max_minutes=1.0)),
                   progress=False)
    return root


def test_claimed_frames_are_labelled_and_the_buffer_keeps_the_newest():
    refresher = DetectorRefresher(untrained(threshold=0.5), settings(buffer=3), seed=0)
    frames = np.arange(4, dtype=np.uint8).reshape(4, 1, 1, 1) * np.ones((4, SIZE, SIZE, 3),
                                                                         dtype=np.uint8)
    metrics = refresher.observe(frames, np.array([0.9, 0.1, 0.6, 0.3]),
                                np.array([False, False, True, True]))
    # claimed: frames 0 and 2; frame 0 is a hard negative
    assert metrics == {"detector/labels_total": 2.0, "detector/hard_negatives_total": 1.0,
                       "detector/refresh_buffer": 2.0}
    assert refresher.labels.tolist() == [False, True]
    assert refresher.pixels[:, 0, 0, 0].tolist() == [0, 2]
    refresher.observe(frames[:2] + 10, np.array([0.7, 0.8]), np.array([True, False]))
    assert refresher.pixels[:, 0, 0, 0].tolist() == [2, 10, 11]  # bounded: oldest out
    assert refresher.labels.tolist() == [True, True, False]
    assert refresher.labels_total == 4 and refresher.hard_negatives_total == 2
    everything = DetectorRefresher(untrained(threshold=0.5), settings(label="all"), seed=0)
    metrics = everything.observe(frames, np.array([0.9, 0.1, 0.6, 0.3]),
                                 np.array([False, False, True, True]))
    assert metrics["detector/labels_total"] == 4.0
    assert metrics["detector/hard_negatives_total"] == 1.0  # frame 1 was never claimed


def test_a_refresh_learns_the_hard_negatives_and_rechooses_the_threshold(root, tmp_path):
    data = str(root / "push.h5")
    # A low threshold makes the one-epoch detector claim failures: the hard negatives
    detector = load_detector(root / "push" / "push_front.pt", threshold=0.2)
    refresher = DetectorRefresher(detector, settings(data=data, learning_rate=1e-3), seed=0,
                                  out_dir=tmp_path)
    frames = read_split(data, "test")  # episodes it never trained on, as a policy's would be
    before = predict_pixels(detector.model, frames.pixels)
    refresher.observe(frames.pixels, before, frames.label, frames.margin)
    hard = (before >= 0.2) & ~frames.label
    assert refresher.hard_negatives_total == int(hard.sum()) > 0
    metrics = refresher.refresh()
    after = predict_pixels(detector.model, frames.pixels)
    assert after[hard].mean() < before[hard].mean() - 0.15
    assert after[frames.label].mean() > after[hard].mean() + 0.2
    val = read_split(data, "val")
    expected = select_threshold(val.label, predict_pixels(detector.model, val.pixels), 0.9)
    assert detector.threshold == pytest.approx(expected.threshold)
    assert metrics["detector/threshold"] == pytest.approx(expected.threshold)
    assert metrics["detector/refreshes"] == 1.0 and metrics["detector/refresh_skipped"] == 0.0
    saved = load_detector(tmp_path / "push_front.pt")
    assert saved.threshold == pytest.approx(detector.threshold)
    assert saved.training_summary["refreshed"]["hard_negatives"] == int(hard.sum())
    assert (tmp_path / "hard_negatives_001.png").stat().st_size > 0


def test_the_policy_floor_is_the_lowest_threshold_reaching_the_target_on_its_frames():
    # scores from high to low: 10 true successes, then 5 failures the detector rates highly
    # (the policy's hard negatives), then 5 true successes
    probs = np.linspace(0.95, 0.0, 20)
    truth = np.array([True] * 10 + [False] * 5 + [True] * 5)
    # precision at the k highest: 1.0 down to k = 10, 10/11 = 0.909 at k = 11, 10/12 = 0.833 ...
    # 15/20 = 0.75 at k = 20: the lowest threshold reaching 0.9 is the 11th score
    assert policy_floor(truth, probs, 0.9) == pytest.approx(probs[10])
    assert policy_floor(truth, probs, 0.75) == pytest.approx(probs[19])  # every frame
    assert policy_floor(truth, probs, 0.95) == pytest.approx(probs[9])  # 10/10, not 10/11
    # no true success: every claim is false, the floor lies above the highest score
    floor = policy_floor(np.zeros(20, dtype=bool), probs, 0.9)
    assert floor > probs.max() and floor == pytest.approx(probs.max())


def test_held_out_policy_frames_never_train_and_raise_the_threshold_to_the_target(root):
    data = str(root / "push.h5")
    frames = read_split(data, "test")
    refreshed = []
    for blank in (False, True):  # the second sees black pixels wherever a frame is held out
        detector = load_detector(root / "push" / "push_front.pt", threshold=0.2)
        refresher = DetectorRefresher(detector, settings(data=data, learning_rate=1e-3,
                                                         holdout=0.5), seed=0)
        before = predict_pixels(detector.model, frames.pixels)
        refresher.observe(frames.pixels, before, frames.label, frames.margin)
        claimed = int((before >= 0.2).sum())
        assert refresher.held_out.tolist() == [i % 2 == 1 for i in range(claimed)]
        if blank:
            refresher.pixels[refresher.held_out] = 0
        refreshed.append((refresher, refresher.refresh()))
    (refresher, metrics), (blanked, _) = refreshed
    for key, value in refresher.detector.model.state_dict().items():  # held out: never trained on
        assert torch.equal(value, blanked.detector.model.state_dict()[key]), key
    model, held = refresher.detector.model, refresher.held_out
    val = read_split(data, "val")
    on_val = select_threshold(val.label, predict_pixels(model, val.pixels), 0.9).threshold
    probs, truth = predict_pixels(model, refresher.pixels[held]), refresher.labels[held]
    on_policy = select_threshold(truth, probs, 0.9).threshold
    assert refresher.detector.threshold == pytest.approx(max(on_val, on_policy))
    claims = probs >= refresher.detector.threshold
    assert truth[claims].mean() >= 0.9
    assert metrics["detector/refresh_policy_precision"] == pytest.approx(truth[claims].mean())
    assert metrics["detector/refresh_policy_frames"] == held.sum() >= 20


def test_hard_negatives_are_oversampled_by_their_share(root):
    data = str(root / "push.h5")
    frames = read_split(data, "test")
    refreshed = {}
    for share, blank in ((0.0, False), (0.5, False), (1.0, False), (1.0, True)):
        detector = load_detector(root / "push" / "push_front.pt", threshold=0.2)
        refresher = DetectorRefresher(detector, settings(data=data, learning_rate=1e-3,
                                                         hard_negative_share=share), seed=0)
        before = predict_pixels(detector.model, frames.pixels)
        refresher.observe(frames.pixels, before, frames.label, frames.margin)
        hard = refresher.claimed & ~refresher.labels
        assert 0 < hard.sum() < len(hard)
        if blank:  # every buffer frame but the hard negatives black
            refresher.pixels[~hard] = 0
        refresher.refresh()
        refreshed[share, blank] = (detector.model.state_dict(), refresher.pixels[hard])
    # share 1: the buffer's part of every batch is hard negatives only, so the other buffer
    # frames never reach the detector
    weights, _ = refreshed[1.0, False]
    for key, value in weights.items():
        assert torch.equal(value, refreshed[1.0, True][0][key]), key
    # share 0 draws the buffer uniformly (the old behaviour); a share pushes the hard
    # negatives' scores further down than that
    scores = {}
    for share in (0.0, 0.5):
        detector = load_detector(root / "push" / "push_front.pt")
        detector.model.load_state_dict(refreshed[share, False][0])
        scores[share] = predict_pixels(detector.model, refreshed[share, False][1]).mean()
    assert scores[0.5] < scores[0.0] - 0.05


def test_a_buffer_with_one_class_and_no_data_is_skipped():
    refresher = DetectorRefresher(untrained(threshold=0.0), settings(), seed=0)
    assert refresher.refresh()["detector/refresh_skipped"] == 1.0  # nothing labelled yet
    frames = np.zeros((2, SIZE, SIZE, 3), dtype=np.uint8)
    refresher.observe(frames, np.array([0.6, 0.7]), np.array([False, False]))
    weights = [p.clone() for p in refresher.detector.model.parameters()]
    assert refresher.refresh()["detector/refresh_skipped"] == 1.0
    assert all(torch.equal(a, b) for a, b in
               zip(weights, refresher.detector.model.parameters(), strict=True))


def test_data_of_another_camera_is_refused(root, tmp_path):
    collect = CollectConfig(task="reach", camera="overhead", image_size=SIZE, episodes=4, seed=0)
    other = write_dataset(tmp_path / "overhead.h5", build_dataset(collect, progress=False),
                          task="reach", camera="overhead",
                          camera_mounts=camera_mounts("reach", "overhead"))
    with pytest.raises(ValueError, match="camera='overhead'; the detector reads 'front'"):
        DetectorRefresher(untrained(), settings(data=str(other)), seed=0)


def _run(root, name: str, *extra: str) -> dict[str, list[tuple[int, float]]]:
    overrides = [*TINY, f"detector.checkpoint={root / 'cnn.pt'}", "detector.threshold=0.0",
                 "detector_refresh.every=1", f"detector_refresh.data={root / 'reach.h5'}",
                 "detector_refresh.steps=5", "detector_refresh.batch_size=16", *extra]
    trainers.train(harness_config.compose(overrides), root / name)
    metrics: dict[str, list[tuple[int, float]]] = {}
    for line in (root / name / "metrics.csv").read_text().splitlines()[1:]:
        step, _, key, value = line.split(",")
        metrics.setdefault(key, []).append((int(step), float(value)))
    return metrics


def test_a_group_run_refreshes_its_verifier_and_resumes_exactly(root):
    given = hashlib.sha256((root / "cnn.pt").read_bytes()).hexdigest()
    straight = _run(root, "straight", "algo.iterations=3", "detector_refresh.holdout=0.5")
    assert [v for _, v in straight["detector/refreshes"]] == [1.0, 2.0, 3.0]
    assert straight["detector/threshold"][-1][1] > 0.0  # chosen again on val, no longer 0
    assert hashlib.sha256((root / "cnn.pt").read_bytes()).hexdigest() == given
    refreshed = load_detector(root / "straight" / "detector_refresh" / "reach_front.pt")
    assert refreshed.training_summary["refreshed"]["refreshes"] == 3
    assert json.loads((root / "straight" / "summary.json").read_text())["iterations"] == 3
    # every attempt was claimed, so each failure is a false positive, outside the success region
    assert all(v > 0 for _, v in straight["detector/false_positive_margin_mm_median"])
    audit = importlib.import_module("studies.audit_verifier").main([str(root / "straight")])
    assert audit["fp_margin_mm_median_over_iterations"] > 0
    assert audit["refreshes"] == 3
    assert audit["labels_total"] == straight["detector/labels_total"][-1][1] > 0

    _run(root, "resumed", "algo.iterations=2", "detector_refresh.holdout=0.5")
    resumed = _run(root, "resumed", "algo.iterations=3", "detector_refresh.holdout=0.5",
                   "resume=true")
    for key in ("detector/refreshes", "detector/threshold", "detector/labels_total",
                "detector/false_positive_rate", "rollout/verifier_success_rate"):
        assert resumed[key] == straight[key], key
    again = load_detector(root / "resumed" / "detector_refresh" / "reach_front.pt")
    assert again.threshold == refreshed.threshold
    for key, value in refreshed.model.state_dict().items():
        assert torch.equal(value, again.model.state_dict()[key]), key


def test_refresh_needs_a_group_run_with_a_learned_verifier(root):
    with pytest.raises(harness_config.ConfigError, match="detector_refresh.every=1 refreshes"):
        harness_config.compose(["task=reach", "algo=grpo", "policy=mlp",
                                "detector_refresh.every=1"])
    with pytest.raises(harness_config.ConfigError, match="algo='ppo'"):
        harness_config.compose(["task=reach", "algo=ppo", "detector_refresh.every=1"])
    for bad, message in (("detector_refresh.label=every", "label='every'"),
                         ("detector_refresh.replay_fraction=1.0", "replay_fraction=1.0"),
                         ("detector_refresh.every=-1", "every=-1"),
                         ("detector_refresh.holdout=1.0", "holdout=1.0"),
                         ("detector_refresh.hard_negative_share=1.5",
                          "hard_negative_share=1.5"),
                         ("detector_refresh.data=missing.h5", "'missing.h5' is not a file")):
        with pytest.raises(harness_config.ConfigError, match=message):
            harness_config.compose([*TINY, f"detector.checkpoint={root / 'cnn.pt'}", bad])
