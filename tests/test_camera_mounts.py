"""Camera mounts recorded in detector data and checkpoints, and refused where they moved.

Layers: the pure comparison by hand (tolerance, ``-0.0``, each differing field named); the mounts
a real ``push`` scene builds against ``tasks/scene.py``'s constants; then tiny real files: frames
rendered by MuJoCo (``front+wrist``, 16 px), written with ``write_dataset``, a CNN trained for one
epoch on them, and the checkpoint met with data, envs, the group trainer's verifier, mining and
evaluation, with its recorded mounts intact, altered or absent.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from types import SimpleNamespace

import cv2
import numpy as np
import pytest
import torch

import tasks
from success_detectors import VerifierWrapper, load_detector
from success_detectors.base import mount_differences
from success_detectors.data import FrameSet, camera_mounts, read_attrs, write_dataset
from success_detectors.evaluation import evaluate_on_file
from success_detectors.mining import MineConfig, append_to_train, mine_hard_negatives
from success_detectors.training import TrainConfig, TrainDetectorConfig, train_detector
from tasks.scene import WRIST_CAMERA_POS, WRIST_CAMERA_TARGET, lookat_quat

torch.set_num_threads(1)

CAMERA, SIZE = "front+wrist", 16
ONE_EPOCH = TrainConfig(epochs=1, batch_size=8, max_minutes=1.0)


def _mount_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "camera mounts" in str(w.message)]


def _moved_wrist(mounts: list[dict], **fields) -> list[dict]:
    moved = copy.deepcopy(mounts)
    moved[1].update(fields)
    return moved


# ------------------------------------------------------------------------------ oracles
def test_mount_differences_by_hand():
    front = {"camera": "front", "body": "world", "pos": [0.0, -0.5, 0.52],
             "quat": [0.9, 0.4, 0.0, 0.0], "fovy": 50.0}
    same = {**front, "pos": [-0.0, -0.5 + 4e-6, 0.52], "quat": [0.9, 0.4, -0.0, 0.0]}
    assert mount_differences([front], [same]) == []  # within 1e-5, and -0.0 == 0.0
    moved = {**front, "body": "gripper", "fovy": 75.0}
    assert mount_differences([moved], [front]) == [
        "view 'front': body 'gripper' recorded, 'world' expected",
        "view 'front': fovy 75.0 recorded, 50.0 expected",
    ]
    nudged = {**front, "pos": [0.0, -0.5, 0.53]}
    assert mount_differences([nudged], [front]) == [
        "view 'front': pos [0.0, -0.5, 0.53] recorded, [0.0, -0.5, 0.52] expected"]
    assert "1 view(s) recorded" in mount_differences([front], [front, front])[0]


# ------------------------------------------------------------------------- the real scene
def test_push_front_wrist_mounts_are_the_scenes():
    env = tasks.make("push", obs_mode="state")
    mounts = env.unwrapped.camera_mounts(CAMERA)
    env.close()
    front, wrist = mounts
    assert [m["camera"] for m in mounts] == ["front", "wrist"]
    assert front["body"] == "world" and wrist["body"] == "gripper"
    assert front["pos"] == pytest.approx([0.0, -0.5, 0.52]) and front["fovy"] == 50.0
    assert wrist["pos"] == pytest.approx(WRIST_CAMERA_POS) and wrist["fovy"] == 80.0
    quat = lookat_quat(WRIST_CAMERA_POS, WRIST_CAMERA_TARGET)
    assert wrist["quat"] == pytest.approx(quat / np.linalg.norm(quat), abs=1e-6)
    assert camera_mounts("push", CAMERA) == mounts
    every = camera_mounts("push", "+".join(env.unwrapped.camera_names))
    assert all(m["quat"][0] >= 0 for m in every)  # q and -q: always recorded with w >= 0
    with pytest.raises(ValueError, match="not among"):
        camera_mounts("push", "front+elbow")


# ------------------------------------------------------------------- tiny real files
def _rendered_splits() -> dict[str, FrameSet]:
    """Four real ``front+wrist`` frames per split (one per episode, labels alternating): the
    mounts, not the accuracy, are under test."""
    env = tasks.make("push", obs_mode="state")
    splits, episode = {}, 0
    for name in ("train", "val", "test"):
        pixels = []
        for _ in range(4):
            env.reset(seed=episode)
            pixels.append(env.unwrapped.render_camera(CAMERA, SIZE))
            episode += 1
        n = len(pixels)
        splits[name] = FrameSet(
            np.stack(pixels), np.array([True, False] * (n // 2)),
            np.arange(episode - n, episode, dtype=np.int64), np.zeros(n, np.int32),
            np.zeros(n, np.float32), np.full(n, np.nan, np.float32), np.zeros(n, np.int8))
    env.close()
    return splits


def _train(data: Path, out: Path):
    return train_detector(TrainDetectorConfig(data=str(data), out_dir=str(out), train=ONE_EPOCH),
                          progress=False)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Data files with the current mounts, moved ones and none; a detector trained on the first
    and one on the last (the older kind, with a warning)."""
    root = tmp_path_factory.mktemp("mounts")
    splits, mounts = _rendered_splits(), camera_mounts("push", CAMERA)
    current = write_dataset(root / "current.h5", splits, task="push", camera=CAMERA,
                            camera_mounts=mounts)
    moved = write_dataset(root / "moved.h5", splits, task="push", camera=CAMERA,
                          camera_mounts=_moved_wrist(mounts, pos=[0.0, -0.09, 0.11]))
    older = write_dataset(root / "older.h5", splits, task="push", camera=CAMERA)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trained = _train(current, root / "current")
    assert _mount_warnings(caught) == []
    with pytest.warns(UserWarning, match="records no camera mounts") as caught:
        older_trained = _train(older, root / "older")
    assert len(_mount_warnings(caught)) == 1
    return {"root": root, "mounts": mounts, "current": current, "moved": moved, "older": older,
            "checkpoint": trained.checkpoint, "older_checkpoint": older_trained.checkpoint}


def _checkpoint_with(files, name: str, mounts: list[dict]) -> Path:
    checkpoint = torch.load(files["checkpoint"], map_location="cpu", weights_only=True)
    checkpoint["camera_mounts"] = mounts
    path = files["root"] / name
    torch.save(checkpoint, path)
    return path


def test_data_files_round_trip_their_mounts(files):
    assert read_attrs(files["current"])["camera_mounts"] == files["mounts"]
    assert read_attrs(files["older"])["camera_mounts"] is None


def test_checkpoints_keep_the_datas_mounts_or_none(files):
    assert load_detector(files["checkpoint"]).camera_mounts == files["mounts"]
    older = torch.load(files["older_checkpoint"], map_location="cpu", weights_only=True)
    assert "camera_mounts" not in older
    assert load_detector(files["older_checkpoint"]).camera_mounts is None


def test_training_refuses_data_of_a_moved_camera(files, tmp_path):
    with pytest.raises(ValueError, match=r"moved\.h5.*view 'wrist': pos \[0\.0, -0\.09, 0\.11\] "
                                         r"recorded, \[-0\.08, 0\.0, 0\.09\] expected.*re-collect"):
        _train(files["moved"], tmp_path)
    assert not (tmp_path / f"push_{CAMERA}.pt").exists()


def test_photos_record_no_mounts_and_warn_nothing(tmp_path):
    rng = np.random.default_rng(0)
    for label, value in (("success", 200), ("failure", 40)):
        (tmp_path / "photos" / label).mkdir(parents=True)
        for i in range(20):
            image = rng.integers(0, 60, (SIZE, SIZE, 3)).astype(np.uint8) + value // 2
            cv2.imwrite(str(tmp_path / "photos" / label / f"{i:02d}.png"), image)
    config = TrainDetectorConfig(image_dir=str(tmp_path / "photos"), task="push",
                                 camera="real_front", image_size=SIZE,
                                 out_dir=str(tmp_path / "out"), train=ONE_EPOCH)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = train_detector(config, progress=False)
    assert _mount_warnings(caught) == []
    assert load_detector(result.checkpoint).camera_mounts is None


# ----------------------------------------------------------------- where a detector meets an env
def _push_env():
    return tasks.make("push", terminate_on_success=False, max_episode_steps=5)


def test_verifier_accepts_matching_mounts_silently(files):
    detector = load_detector(files["checkpoint"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env = VerifierWrapper(_push_env(), detector, when="every_step")
    assert _mount_warnings(caught) == []
    env.reset(seed=0)
    _, _, _, _, info = env.step(np.zeros(env.action_space.shape))
    assert 0.0 <= info["verifier_probability"] <= 1.0
    env.close()


def test_verifier_refuses_a_checkpoint_of_a_moved_camera(files):
    moved = _checkpoint_with(files, "moved.pt", _moved_wrist(files["mounts"], fovy=75.0))
    with pytest.raises(ValueError, match=r"moved\.pt.*view 'wrist': fovy 75\.0 recorded, 80\.0 "
                                         r"expected.*retrain it on frames of this camera"):
        VerifierWrapper(_push_env(), load_detector(moved))


def test_verifier_warns_once_on_a_checkpoint_without_mounts(files):
    detector = load_detector(files["older_checkpoint"])
    with pytest.warns(UserWarning, match="records no camera mounts") as caught:
        VerifierWrapper(_push_env(), detector)
    assert len(_mount_warnings(caught)) == 1


def test_group_trainer_verifier_checks_the_mounts(files):
    from harness.algos.group.collect import build_detector

    def config(checkpoint: Path) -> SimpleNamespace:
        return SimpleNamespace(detector={"name": "cnn", "checkpoint": str(checkpoint)},
                               task=SimpleNamespace(name="push"))

    env = tasks.make("push", obs_mode="state")
    assert build_detector(config(files["checkpoint"]), env).camera == CAMERA
    moved = _checkpoint_with(files, "moved_body.pt", _moved_wrist(files["mounts"], body="world"))
    with pytest.raises(ValueError, match="view 'wrist': body 'world' recorded, 'gripper'"):
        build_detector(config(moved), env)
    env.close()


def test_mining_refuses_moved_mounts_and_keeps_the_datas(files, tmp_path):
    moved = _checkpoint_with(files, "moved_quat.pt",
                             _moved_wrist(files["mounts"], quat=[1.0, 0.0, 0.0, 0.0]))
    with pytest.raises(ValueError, match="view 'wrist': quat"):
        mine_hard_negatives(MineConfig(checkpoint=str(moved), data=str(files["current"]),
                                       episodes=1), first_episode=100, progress=False)
    out = append_to_train(files["current"], tmp_path / "mined.h5",
                          FrameSet.concatenate([], (SIZE, 2 * SIZE, 3)), {})
    assert read_attrs(out)["camera_mounts"] == files["mounts"]


def test_evaluation_refuses_disagreeing_mounts_only_when_both_are_known(files):
    detector = load_detector(files["checkpoint"])
    assert evaluate_on_file(detector, files["current"])["frames"] == 4
    assert evaluate_on_file(detector, files["older"])["frames"] == 4
    assert evaluate_on_file(load_detector(files["older_checkpoint"]), files["moved"])["frames"] == 4
    with pytest.raises(ValueError, match=r"moved\.h5.*view 'wrist': pos"):
        evaluate_on_file(detector, files["moved"])


def test_malformed_recorded_mounts_are_refused_by_name(tmp_path):
    frames = FrameSet.concatenate([], (SIZE, 2 * SIZE, 3))
    path = write_dataset(tmp_path / "bad.h5", {"train": frames, "val": frames, "test": frames},
                         task="push", camera=CAMERA, camera_mounts=[{"camera": "front"}])
    with pytest.raises(ValueError, match="camera_mounts=.*expected a list of"):
        read_attrs(path)
