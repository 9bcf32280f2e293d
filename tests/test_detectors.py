"""Tests for the success detectors: scripted ground truth, the CNN verifier, data, metrics, wrapper.

Layers: pure-function oracles (metrics, threshold, splits) with hand-computed numbers; the
scripted detector against the environments; one small CNN trained end to end on generated push
frames (module fixture, reused by the checkpoint, input and wrapper tests); and every bad input
the issue lists.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

import success_detectors
import tasks
from success_detectors import (
    CNNDetector,
    DetectorCounts,
    ScriptedDetector,
    SuccessDetector,
    VerifierWrapper,
    check_pixels,
    load_detector,
)
from success_detectors import cnn as cnn_module
from success_detectors.cnn import SuccessCNN, save_checkpoint
from success_detectors.data import (
    CollectConfig,
    FrameSet,
    balance_classes,
    build_dataset,
    camera_mounts,
    load_image_folder,
    read_dataset,
    split_episodes,
    success_margin,
    write_dataset,
)
from success_detectors.training import (
    TrainConfig,
    TrainDetectorConfig,
    binary_metrics,
    errors_by_margin,
    expected_calibration_error,
    roc_auc,
    select_threshold,
    train_detector,
)

torch.set_num_threads(1)

CONF = Path(__file__).resolve().parents[1] / "conf"


# ------------------------------------------------------------------------------ oracles
def test_binary_metrics_match_hand_computed_values():
    labels = np.array([True, False, True, False])
    probs = np.array([0.9, 0.6, 0.4, 0.1])
    m = binary_metrics(labels, probs, threshold=0.5)
    # tp = 1 (0.9), fp = 1 (0.6), fn = 1 (0.4), tn = 1 (0.1)
    assert m["confusion_matrix"] == [[1, 1], [1, 1]]
    assert m["accuracy"] == m["precision"] == m["recall"] == m["f1"] == pytest.approx(0.5)
    # positive beats negative in 3 of the 4 pairs: (0.9>0.6), (0.9>0.1), (0.4>0.1)
    assert m["roc_auc"] == pytest.approx(0.75)
    # one frame per bin: (|1-.9| + |0-.6| + |1-.4| + |0-.1|) / 4
    assert m["ece"] == pytest.approx(0.35)
    assert m["false_positive_rate"] == pytest.approx(0.5)


def test_roc_auc_gives_ties_half_credit_and_ece_zero_when_calibrated():
    assert roc_auc(np.array([1, 0], bool), np.array([0.5, 0.5])) == pytest.approx(0.5)
    assert np.isnan(roc_auc(np.array([1, 1], bool), np.array([0.2, 0.3])))
    labels = np.array([1, 0, 0, 0] * 5, bool)
    assert expected_calibration_error(labels, np.full(20, 0.25)) == pytest.approx(0.0)


def test_errors_by_margin_by_hand():
    # margins in metres (negative inside success); threshold 0.5
    labels = np.array([True, False, True, False, False, True])
    probs = np.array([0.9, 0.6, 0.2, 0.1, 0.7, 0.8])
    margins = np.array([-0.001, 0.002, -0.004, 0.03, 0.08, np.nan])
    rows = errors_by_margin(labels, probs, margins, threshold=0.5)
    by_bin = {(r["from_cm"], r["to_cm"]): r for r in rows}
    assert by_bin[(0.0, 0.25)] == {"from_cm": 0.0, "to_cm": 0.25, "frames": 2, "errors": 1,
                                   "false_positives": 1, "false_negatives": 0}
    assert by_bin[(0.25, 0.5)]["false_negatives"] == 1        # 0.4 cm inside, rejected
    assert by_bin[(2.0, 5.0)]["errors"] == 0                  # 3 cm out, rejected
    assert by_bin[(5.0, None)]["false_positives"] == 1        # 8 cm out, accepted
    assert sum(r["frames"] for r in rows) == 5                # the NaN margin is left out


def test_select_threshold_by_hand():
    labels = np.array([1, 1, 0, 1, 0, 0], bool)
    scores = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4])
    strict = select_threshold(labels, scores, target_precision=1.0)
    assert strict.threshold == pytest.approx(0.8) and strict.reached
    assert strict.recall == pytest.approx(2 / 3)
    loose = select_threshold(labels, scores, target_precision=0.75)  # at 0.6: 3 tp, 1 fp
    assert loose.threshold == pytest.approx(0.6) and loose.recall == pytest.approx(1.0)
    never = select_threshold(np.array([0, 1], bool), np.array([0.9, 0.1]), 0.98)
    assert not never.reached and never.precision == pytest.approx(0.5)


def test_select_threshold_hits_target_precision_on_synthetic_scores():
    rng = np.random.default_rng(0)
    labels = rng.random(4000) < 0.5
    scores = np.where(labels, rng.beta(5, 2, 4000), rng.beta(2, 5, 4000))
    choice = select_threshold(labels, scores, target_precision=0.98)
    predicted = scores >= choice.threshold
    precision = np.sum(predicted & labels) / np.sum(predicted)
    assert choice.reached and precision >= 0.98
    assert choice.precision == pytest.approx(precision)
    # the lowest such threshold: one score lower and the precision falls below the target
    lower = np.max(scores[scores < choice.threshold])
    below = scores >= lower
    assert np.sum(below & labels) / np.sum(below) < 0.98
    with pytest.raises(ValueError, match="no positive"):
        select_threshold(np.zeros(3, bool), np.ones(3))


def test_split_episodes_has_no_leakage():
    episodes = np.repeat(np.arange(50), 7)  # 7 frames per episode
    splits = split_episodes(episodes, (0.7, 0.15, 0.15), seed=3)
    train, val, test = (set(splits[k].tolist()) for k in ("train", "val", "test"))
    assert not (train & val or train & test or val & test)
    assert train | val | test == set(range(50))
    assert (len(train), len(val), len(test)) == (36, 7, 7)
    tiny = split_episodes([4, 5, 6], (0.8, 0.1, 0.1))
    assert all(len(ids) == 1 for ids in tiny.values())
    with pytest.raises(ValueError, match="summing to 1"):
        split_episodes(episodes, (0.5, 0.2, 0.2))


def _frames(labels: np.ndarray, margins: np.ndarray) -> FrameSet:
    n = len(labels)
    return FrameSet(np.zeros((n, 4, 4, 3), np.uint8), labels, np.arange(n), np.zeros(n, np.int32),
                    np.zeros(n, np.float32), margins.astype(np.float32), np.zeros(n, np.int8))


def test_balance_classes_keeps_near_misses():
    labels = np.array([True] * 10 + [False] * 40)
    margins = np.r_[np.full(10, -0.01), np.full(8, 0.01), np.full(32, 0.2)]  # 8 near-misses
    chosen = balance_classes(_frames(labels, margins), hard_margin=0.03, hard_fraction=0.5)
    assert labels[chosen].sum() == 10 and (~labels[chosen]).sum() == 10
    assert np.sum((~labels[chosen]) & (margins[chosen] < 0.03)) == 5
    every_near = balance_classes(_frames(labels, margins), 0.03, hard_fraction=1.0)
    assert np.sum((~labels[every_near]) & (margins[every_near] < 0.03)) == 8


# ------------------------------------------------------------------------- scripted detector
@pytest.mark.parametrize("name", sorted(tasks.TASKS))
def test_scripted_detector_agrees_with_env_on_random_rollouts(name):
    env = tasks.make(name, terminate_on_success=False, max_episode_steps=40)
    detector = ScriptedDetector()
    rng = np.random.default_rng(0)
    verdicts, truths = [], []
    for episode in range(4):
        env.reset(seed=episode, options={"difficulty": 0.0})
        expert = tasks.ScriptedExpert(env, noise=0.3, seed=episode)
        done = False
        while not done:
            # half the episodes random, half a noisy expert, so both verdicts occur
            action = rng.uniform(-1, 1, 4) if episode % 2 else expert()
            _, _, terminated, truncated, info = env.step(action)
            verdicts.append(bool(detector({"env": [env]})[0]))
            truths.append(info["is_success"])
            assert success_margin(env) < 0 if info["is_success"] else success_margin(env) >= 0
            done = terminated or truncated
    env.close()
    assert verdicts == truths
    assert any(truths) and not all(truths)


def test_scripted_detector_reads_a_batch_of_envs_through_wrappers():
    import gymnasium as gym

    envs = [gym.wrappers.RecordEpisodeStatistics(tasks.make("reach")) for _ in range(3)]
    for i, env in enumerate(envs):
        env.reset(seed=i)
    probs = ScriptedDetector().predict_proba({"env": envs})
    assert probs.shape == (3,) and probs.dtype == np.float64
    with pytest.raises(ValueError, match="needs batch key"):
        ScriptedDetector()({"pixels": np.zeros((1, 8, 8, 3), np.uint8)})
    with pytest.raises(ValueError, match="no task"):
        ScriptedDetector()({"env": [object()]})


# ------------------------------------------------------------------------------- CNN, trained
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A drawer_open detector trained on 60 generated episodes at 48x48 (seconds).

    Easy settings (experts, noisy experts and random policies; no near-miss policies) keep the
    check fast and steady across seeds; the full-difficulty push and pick_place figures at 84x84
    are measured by the scripts and reported in docs/detectors.md.
    """
    root = tmp_path_factory.mktemp("detector")
    collect = CollectConfig(
        task="drawer_open", episodes=60, image_size=48, frame_stride=2,
        policies={"expert": 1.0, "noisy_expert": 1.0, "perturbed": 1.0, "random": 0.5},
        hard_margin=0.01, hard_fraction=0.0, seed=1,
    )
    splits = build_dataset(collect, progress=False)
    data_path = write_dataset(root / "drawer.h5", splits, task="drawer_open", camera="front",
                              camera_mounts=camera_mounts("drawer_open", "front"))
    config = TrainDetectorConfig(
        data=str(data_path), out_dir=str(root / "out"),
        train=TrainConfig(epochs=10, learning_rate=3e-3, patience=10, max_minutes=2.0),
    )
    start = time.perf_counter()
    result = train_detector(config, progress=False)
    return {"result": result, "data": data_path, "seconds": time.perf_counter() - start,
            "root": root}


def test_cnn_reaches_90_percent_validation_accuracy_quickly(trained):
    result = trained["result"]
    history = result.metrics["training"]["history"]
    best = history[result.metrics["training"]["best_epoch"] - 1]
    assert best["val_accuracy"] >= 0.9, history
    assert trained["seconds"] < 120


def test_collected_dataset_is_split_by_episode_and_balanced(trained):
    splits = read_dataset(trained["data"])
    episodes = {name: set(np.unique(part.episode).tolist()) for name, part in splits.items()}
    assert not (episodes["train"] & episodes["val"])
    assert not (episodes["train"] & episodes["test"])
    assert not (episodes["val"] & episodes["test"])
    for part in splits.values():
        assert part.pixels.shape[1:] == (48, 48, 3) and part.pixels.dtype == np.uint8
        assert part.label.sum() * 2 == len(part)  # balanced
        assert np.all((part.margin <= 0) == part.label)  # labels are the scripted predicate


def test_training_writes_checkpoint_metrics_and_figure(trained):
    result = trained["result"]
    metrics = json.loads(result.metrics_path.read_text())
    for key in ("accuracy", "precision", "recall", "f1", "roc_auc", "ece", "threshold",
                "confusion_matrix"):
        assert key in metrics
    assert metrics["split"] == "test" and metrics["task"] == "drawer_open"
    assert result.figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    detector = load_detector(result.checkpoint, task="drawer_open", camera="front")
    assert detector.threshold == pytest.approx(metrics["threshold"])
    assert detector.image_size == 48
    test = read_dataset(trained["data"])["test"]
    probs = detector.predict_proba({"pixels": test.pixels})
    assert np.allclose(probs, result.detector.predict_proba({"pixels": test.pixels}))
    accuracy = np.mean(detector({"pixels": test.pixels}) == test.label)
    assert accuracy == pytest.approx(metrics["accuracy"])


def test_margin_head_learns_the_distance_to_success(trained, tmp_path):
    """``architecture.margin_head``: the second head's predicted margin follows the simulator's
    on held-out frames, and the checkpoint (with that head) reloads to the same verdicts."""
    from success_detectors.cnn import Architecture

    config = TrainDetectorConfig(
        data=str(trained["data"]), out_dir=str(tmp_path / "out"),
        train=TrainConfig(epochs=8, learning_rate=3e-3, patience=8, max_minutes=2.0,
                          architecture=Architecture(margin_head=True)),
    )
    result = train_detector(config, progress=False)
    model = result.detector.model
    assert model.margin_head is not None
    test = read_dataset(trained["data"])["test"]
    with torch.no_grad():
        _, predicted = model.forward_with_margin(torch.from_numpy(test.pixels))
    truth = np.clip(100 * test.margin, -5, 5)
    correlation = np.corrcoef(predicted.numpy(), truth)[0, 1]
    assert correlation > 0.6, correlation
    reloaded = load_detector(result.checkpoint, task="drawer_open")
    assert reloaded.model.margin_head is not None
    assert np.allclose(reloaded.predict_proba({"pixels": test.pixels}),
                       result.detector.predict_proba({"pixels": test.pixels}))


def test_make_builds_detectors_from_the_hydra_group(trained):
    from omegaconf import OmegaConf

    scripted = OmegaConf.load(CONF / "detector" / "scripted.yaml")
    assert isinstance(success_detectors.make(scripted), ScriptedDetector)
    cfg = OmegaConf.load(CONF / "detector" / "cnn.yaml")
    cfg.checkpoint = str(trained["result"].checkpoint)
    detector = success_detectors.make(cfg, task="drawer_open")
    assert isinstance(detector, CNNDetector) and detector.camera == "front"
    cfg.threshold = 0.9
    assert success_detectors.make(cfg).threshold == 0.9
    with pytest.raises(ValueError, match="'cnn', 'scripted'"):
        success_detectors.make({"name": "oracle"})
    with pytest.raises(ValueError, match="unknown field"):
        success_detectors.make({"name": "scripted", "checkpoint": "x.pt"})
    with pytest.raises(ValueError, match="needs detector.checkpoint"):
        success_detectors.make({"name": "cnn"})


def test_hydra_configs_compose():
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(CONF), version_base="1.3"):
        collect = compose("collect_detector_data", overrides=["task=pick_place"])
        assert collect.task.name == "pick_place"
        assert collect.out.endswith("pick_place_front_84.h5")
        train = compose("train_detector", overrides=["data=x.h5"])
        assert "task" not in train and train.train.target_precision == 0.98
        TrainDetectorConfig(**{k: v for k, v in train.items() if k != "hydra"})


# ----------------------------------------------------------------------------- image folders
def _write_folder(root: Path, per_class: int = 40, size: int = 32) -> Path:
    """Grey photos with a green (success) or red (failure) square somewhere."""
    rng = np.random.default_rng(0)
    for label, bgr in (("success", (0, 200, 0)), ("failure", (0, 0, 200))):
        (root / label).mkdir(parents=True)
        for i in range(per_class):
            image = np.full((size + 8, size, 3), 120, np.uint8)  # not square: gets cropped
            x, y = rng.integers(2, size - 10, 2)
            image[y + 4:y + 12, x:x + 8] = bgr
            cv2.imwrite(str(root / label / f"{i:03d}.png"), image)
    (root / "success" / "notes.txt").write_text("ignored")
    return root


def test_image_folder_training(tmp_path):
    folder = _write_folder(tmp_path / "photos")
    frames = load_image_folder(folder, image_size=32)
    assert len(frames) == 80 and frames.label.sum() == 40
    green = frames.pixels[frames.label].reshape(-1, 3)
    assert np.any(np.all(green == (0, 200, 0), axis=1))  # converted to RGB
    config = TrainDetectorConfig(
        image_dir=str(folder), task="push", camera="real_front", image_size=32,
        out_dir=str(tmp_path / "out"),
        train=TrainConfig(epochs=15, batch_size=16, learning_rate=3e-3, patience=15,
                          architecture={"margin_head": True}),
    )
    result = train_detector(config, progress=False)
    detector = load_detector(result.checkpoint, camera="real_front")
    assert np.mean(detector({"pixels": frames.pixels}) == frames.label) >= 0.9
    assert detector.model.margin_head is None  # photos have no margins to regress
    assert result.metrics["camera"] == "real_front"


@pytest.mark.parametrize(("setup", "error", "match"), [
    ("missing", FileNotFoundError, "does not exist"),
    ("empty", ValueError, "holds no images"),
    ("one_class", ValueError, "one class only"),
    ("unreadable", ValueError, "cannot read image .*broken.png"),
])
def test_image_folder_bad_input(tmp_path, setup, error, match):
    root = tmp_path / "photos"
    if setup != "missing":
        (root / "success").mkdir(parents=True)
        (root / "failure").mkdir()
    if setup in ("one_class", "unreadable"):
        cv2.imwrite(str(root / "success" / "a.png"), np.zeros((8, 8, 3), np.uint8))
    if setup == "unreadable":
        cv2.imwrite(str(root / "failure" / "b.jpg"), np.zeros((8, 8, 3), np.uint8))
        (root / "failure" / "broken.png").write_bytes(b"not a png at all")
    with pytest.raises(error, match=match):
        load_image_folder(root, image_size=16)


def test_dataset_bad_input(tmp_path):
    with pytest.raises(ValueError, match="train split .* has .*'positives': 0"):
        build_dataset(CollectConfig(task="push", episodes=3, image_size=16,
                                    policies={"random": 1.0}), progress=False)
    with pytest.raises(ValueError, match="unknown policy kind"):
        CollectConfig(policies={"teleport": 1.0})
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_dataset(tmp_path / "none.h5")
    (tmp_path / "junk.h5").write_bytes(b"junk")
    with pytest.raises(ValueError, match="not a readable HDF5 file"):
        read_dataset(tmp_path / "junk.h5")


# ------------------------------------------------------------------------ several views
def test_render_camera_puts_views_side_by_side():
    env = tasks.make("push", obs_mode="state")
    env.reset(seed=0)
    base = env.unwrapped
    both = base.render_camera("front+overhead", 32)
    assert both.shape == (32, 64, 3) and both.dtype == np.uint8
    assert np.array_equal(both[:, :32], base.render_camera("front", 32))
    assert np.array_equal(both[:, 32:], base.render_camera("overhead", 32))
    with pytest.raises(ValueError, match=r"\['top'\] not among"):
        base.render_camera("front+top", 32)
    env.close()


def test_two_view_detector_trains_and_verifies(tmp_path):
    """``camera="front+side"``: frames of both views side by side, one network reading both,
    in data collection, training, checkpoints and the verifier wrapper."""
    collect = CollectConfig(
        task="drawer_open", episodes=40, image_size=32, frame_stride=2, camera="front+side",
        policies={"expert": 1.0, "noisy_expert": 1.0, "perturbed": 1.0, "random": 0.5},
        hard_margin=0.01, hard_fraction=0.0, seed=1,
    )
    splits = build_dataset(collect, progress=False)
    assert splits["train"].pixels.shape[1:] == (32, 64, 3)
    data_path = write_dataset(tmp_path / "drawer.h5", splits, task="drawer_open",
                              camera="front+side",
                              camera_mounts=camera_mounts("drawer_open", "front+side"))
    config = TrainDetectorConfig(
        data=str(data_path), out_dir=str(tmp_path / "out"),
        train=TrainConfig(epochs=10, learning_rate=3e-3, patience=10, max_minutes=2.0),
    )
    result = train_detector(config, progress=False)
    best = result.metrics["training"]["history"][result.metrics["training"]["best_epoch"] - 1]
    assert best["val_accuracy"] >= 0.85, result.metrics["training"]["history"]
    detector = load_detector(result.checkpoint, task="drawer_open", camera="front+side")
    assert detector.model.architecture.views == 2
    with pytest.raises(ValueError, match="2 32x32 views side by side"):
        detector.predict_proba({"pixels": splits["test"].pixels[:, :, :32]})
    with pytest.raises(ValueError, match="names 1 view"):
        CNNDetector(detector.model, task="drawer_open", camera="front", image_size=32)

    env = VerifierWrapper(tasks.make("drawer_open", terminate_on_success=False), detector,
                          when="every_step")
    env.reset(seed=3)
    for _ in range(5):
        _, _, _, _, info = env.step(env.action_space.sample())
    assert 0.0 <= info["verifier_probability"] <= 1.0
    counts = env.counts
    assert counts.true_positives + counts.false_positives + counts.true_negatives \
        + counts.false_negatives == 5
    env.close()


# ------------------------------------------------------------------------ CNN bad input
@pytest.fixture(scope="module")
def small_detector():
    torch.manual_seed(0)
    return CNNDetector(SuccessCNN(), task="push", camera="front", image_size=16)


@pytest.mark.parametrize(("pixels", "match"), [
    (np.zeros((2, 16, 16, 3), np.float32), "dtype float32; expected uint8"),
    (np.zeros((2, 3, 16, 16), np.uint8), "channel-first"),
    (np.zeros((16, 16, 3), np.uint8), "single image"),
    (np.zeros((2, 16, 16, 4), np.uint8), "4 channel"),
    (np.zeros((2, 32, 32, 3), np.uint8), "trained on 16x16"),
    (np.zeros((2, 16, 32, 3), np.uint8), "trained on 16x16"),  # two views for a one-view net
    (np.zeros((2, 16, 16), np.uint8), "expected a batch"),
])
def test_cnn_rejects_bad_pixels(small_detector, pixels, match):
    with pytest.raises(ValueError, match=match):
        small_detector({"pixels": pixels})


def test_cnn_accepts_good_pixels_and_tensors(small_detector):
    pixels = np.random.default_rng(0).integers(0, 256, (5, 16, 16, 3), dtype=np.uint8)
    probs = small_detector.predict_proba({"pixels": pixels})
    assert probs.shape == (5,) and np.all((probs >= 0) & (probs <= 1))
    assert np.allclose(probs, small_detector.predict_proba({"pixels": torch.from_numpy(pixels)}))
    assert small_detector.predict_proba({"pixels": pixels[:0]}).shape == (0,)
    assert check_pixels(pixels).shape == (5, 16, 16, 3)
    with pytest.raises(ValueError, match="needs batch key"):
        small_detector({"env": []})


def test_checkpoint_bad_input(tmp_path, small_detector):
    good = small_detector.save(tmp_path / "push_front.pt")
    assert load_detector(good, task="push", camera="front").image_size == 16
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_detector(tmp_path / "nope.pt")
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ValueError, match="not a readable detector checkpoint"):
        load_detector(corrupt)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ValueError, match="not a readable detector checkpoint"):
        load_detector(truncated)
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, other)
    with pytest.raises(ValueError, match="not a CNN success-detector checkpoint"):
        load_detector(other)
    with pytest.raises(ValueError, match="trained for task 'push', not 'pick_place'"):
        load_detector(good, task="pick_place")
    with pytest.raises(ValueError, match="trained on camera 'front', not 'wrist'"):
        success_detectors.make({"name": "cnn", "checkpoint": str(good), "camera": "wrist"})


def test_failed_checkpoint_write_keeps_the_good_one(tmp_path, small_detector, monkeypatch):
    path = small_detector.save(tmp_path / "push_front.pt")
    before = path.read_bytes()

    def crash(obj, file):
        Path(file).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(cnn_module.torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, small_detector.model, task="push", camera="front", image_size=16,
                        threshold=0.5)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["push_front.pt"]


# ---------------------------------------------------------------------------------- wrapper
class _Inverted(SuccessDetector):
    """Says the opposite of the ground truth: every verdict is wrong."""

    requires = ("env",)

    def predict_proba(self, batch):
        return 1.0 - ScriptedDetector().predict_proba(batch)


class _Always(SuccessDetector):
    """Says success whatever happens."""

    requires = ("env",)

    def predict_proba(self, batch):
        return np.ones(len(batch["env"]))


def _run(env, episodes: int, noise: float = 0.2):
    truths, rewards, infos = [], [], []
    for episode in range(episodes):
        env.reset(seed=episode, options={"difficulty": 0.0})
        expert = tasks.ScriptedExpert(env, noise=noise, seed=episode)
        done = False
        while not done:
            _, reward, terminated, truncated, info = env.step(expert())
            truths.append(info["is_success"])
            rewards.append(reward)
            infos.append(info)
            done = terminated or truncated
    return np.array(truths), np.array(rewards), infos


def test_verifier_counts_errors_of_a_wrong_detector_every_step():
    env = VerifierWrapper(tasks.make("push", terminate_on_success=False, max_episode_steps=60),
                          _Inverted(), when="every_step")
    truths, rewards, infos = _run(env, episodes=2)
    positives, negatives = int(truths.sum()), int((~truths).sum())
    assert positives > 0 and negatives > 0
    counts = env.counts
    assert (counts.false_positives, counts.false_negatives) == (negatives, positives)
    assert counts.true_positives == counts.true_negatives == 0
    assert np.array_equal(rewards, (~truths).astype(float))  # replace: reward = verdict
    assert all(info["verifier_success"] != info["is_success"] for info in infos)
    rates = env.error_rates(reset=True)
    assert rates["detector/false_positive_rate"] == 1.0
    assert rates["detector/false_negative_rate"] == 1.0
    assert rates["detector/precision"] == 0.0
    assert rates["detector/evaluations"] == len(truths)
    assert env.counts == DetectorCounts()


def test_verifier_final_add_and_termination():
    base = tasks.make("reach", terminate_on_success=False, max_episode_steps=30)
    env = VerifierWrapper(base, _Always(), when="final", mode="add")
    truths, rewards, infos = _run(env, episodes=3, noise=1.5)  # noisy: some episodes fail
    finals = [i for i, info in enumerate(infos) if "verifier_success" in info]
    assert len(finals) == 3 and finals[-1] == len(infos) - 1
    final_truths = truths[finals]
    assert env.counts.true_positives == int(final_truths.sum())
    assert env.counts.false_positives == int((~final_truths).sum())
    unwrapped_reward = [info["reward_terms"] for info in infos]
    for i, terms in enumerate(unwrapped_reward):
        expected = -terms["distance"] * -1 + terms["success"]  # reach weights are 1 and 1
        assert rewards[i] == pytest.approx(expected + (1.0 if i in finals else 0.0))

    stopper = VerifierWrapper(tasks.make("reach", terminate_on_success=False), _Always(),
                              when="every_step", terminate_on_detection=True)
    stopper.reset(seed=0)
    _, reward, terminated, _, info = stopper.step(np.zeros(4))
    assert terminated and reward == 1.0 and info["verifier_success"]


def test_verifier_with_scripted_detector_has_no_errors_and_warns_for_learned_ones(trained):
    env = VerifierWrapper(tasks.make("push", terminate_on_success=False, max_episode_steps=50),
                          ScriptedDetector(), when="every_step")
    _run(env, episodes=1)
    rates = env.error_rates()
    assert rates["detector/false_positives"] == rates["detector/false_negatives"] == 0
    detector = load_detector(trained["result"].checkpoint)
    with pytest.warns(UserWarning, match="terminate_on_success"):
        VerifierWrapper(tasks.make("drawer_open"), detector)
    cnn_env = VerifierWrapper(tasks.make("drawer_open", terminate_on_success=False,
                                         max_episode_steps=20), detector, when="every_step")
    _run(cnn_env, episodes=1)
    assert cnn_env.counts.error_rates()["detector/evaluations"] == 20
    with pytest.raises(ValueError, match="made for task 'drawer_open'"):
        VerifierWrapper(tasks.make("reach", terminate_on_success=False), detector)


def test_verifier_rejects_bad_options():
    env = tasks.make("reach")
    with pytest.raises(ValueError, match="when="):
        VerifierWrapper(env, ScriptedDetector(), when="sometimes")
    with pytest.raises(ValueError, match="mode="):
        VerifierWrapper(env, ScriptedDetector(), mode="multiply")
    with pytest.raises(ValueError, match="needs when='every_step'"):
        VerifierWrapper(env, ScriptedDetector(), terminate_on_detection=True)
