"""Hard-negative mining and held-out visual domains for the CNN success detector.

Layers: pure-function oracles (which false positives are kept, metric drops) by hand; one tiny
real loop on ``push`` with the two views a real cell has (``front+wrist``, 32 px): collect with
MuJoCo, train a small CNN for one epoch, mine its false positives on fresh rollouts, retrain; the
checks are that every mined frame is a false positive of that detector, labelled failure, from a
new episode, and in the train split only; then a test-only file of a held-out visual domain.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from success_detectors import load_detector
from success_detectors.data import (
    CollectConfig,
    FrameSet,
    build_dataset,
    camera_mounts,
    collect_episode,
    read_attrs,
    read_dataset,
    write_dataset,
)
from success_detectors.evaluation import evaluate_on_file, metric_drops, threshold_on_file
from success_detectors.mining import (
    MineConfig,
    append_to_train,
    first_new_episode,
    keep_false_positives,
    mine_round,
)
from success_detectors.training import TrainConfig, TrainDetectorConfig, train_detector

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
CAMERA, SIZE = "front+wrist", 32
HELD_OUT = {"enabled": True, "friction": [1, 1], "mass": [1, 1], "damping": [1, 1],
            "textures": True, "table_colour": 0.25, "background_colour": 0.25,
            "light_direction": 0.5, "light_count": [1, 4]}


def _script(name: str):
    """An app's module, :mod:`harness.apps.<name>` (what ``scripts/<name>.py`` runs)."""
    import importlib

    return importlib.import_module(f"harness.apps.{name}")


def _frames(label, episode, step=None) -> FrameSet:
    n = len(label)
    return FrameSet(np.zeros((n, 2, 2, 3), np.uint8), np.asarray(label, bool),
                    np.asarray(episode, np.int64),
                    np.arange(n, dtype=np.int32) if step is None else np.asarray(step, np.int32),
                    np.zeros(n, np.float32), np.ones(n, np.float32), np.zeros(n, np.int8))


# ------------------------------------------------------------------------------ oracles
def test_keep_false_positives_by_hand():
    frames = _frames(label=[0, 0, 1, 0, 0, 0, 0, 0], episode=[5, 5, 5, 5, 7, 7, 7, 7])
    probs = np.array([0.9, 0.2, 0.95, 0.5, 0.6, 0.7, 0.8, 0.49])
    # at 0.5: episode 5 rows 0 and 3 (row 2 is a true positive), episode 7 rows 4, 5, 6
    assert keep_false_positives(frames, probs, 0.5, 8).tolist() == [0, 3, 4, 5, 6]
    # two per episode, spread over each episode's: the first and last of 4, 5, 6
    assert keep_false_positives(frames, probs, 0.5, 2).tolist() == [0, 3, 4, 6]
    assert keep_false_positives(frames, probs, 0.99, 8).tolist() == []


def test_metric_drops_by_hand():
    reference = {"accuracy": 0.98, "precision": 0.99, "recall": 0.97, "roc_auc": 0.999}
    other = {"accuracy": 0.90, "precision": 1.00, "recall": 0.80, "roc_auc": 0.95}
    assert metric_drops(reference, other) == pytest.approx(
        {"accuracy": 0.08, "precision": -0.01, "recall": 0.17, "roc_auc": 0.049})


def test_mine_config_rejects_bad_values():
    with pytest.raises(ValueError, match=r"unknown policy kind\(s\) \['oracle'\]"):
        MineConfig(checkpoint="x.pt", data="x.h5", policies={"oracle": 1.0})
    with pytest.raises(ValueError, match="episodes=0"):
        MineConfig(checkpoint="x.pt", data="x.h5", episodes=0)
    with pytest.raises(ValueError, match="threshold=1.5"):
        MineConfig(checkpoint="x.pt", data="x.h5", threshold=1.5)
    assert MineConfig(checkpoint="x.pt", data="d/a.h5").out_path == Path("d/a_mined.h5")


# ----------------------------------------------------------------- the loop, tiny and real
@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    """Collect 16 push episodes, train one epoch, mine 6 fresh episodes, retrain."""
    root = tmp_path_factory.mktemp("mining")
    collect = CollectConfig(task="push", camera=CAMERA, image_size=SIZE, episodes=16,
                            difficulty=(0.0, 0.3), seed=2,
                            policies={"expert": 2.0, "offset_goal": 1.0, "decoy": 0.5})
    data = write_dataset(root / "push.h5", build_dataset(collect, progress=False), task="push",
                         camera=CAMERA, camera_mounts=camera_mounts("push", CAMERA))
    train = TrainConfig(epochs=1, max_minutes=1.0)
    first = train_detector(TrainDetectorConfig(data=str(data), out_dir=str(root / "first"),
                                               train=train), progress=False)
    # A low threshold makes false positives certain for a detector trained for one epoch.
    mine = MineConfig(checkpoint=str(first.checkpoint), data=str(data), episodes=6,
                      threshold=0.2, max_per_episode=5, seed=1,
                      policies={"offset_goal": 1.0, "decoy": 1.0})
    result, mined = mine_round(mine, progress=False, report=lambda _: None)
    second = train_detector(TrainDetectorConfig(data=str(mined), out_dir=str(root / "second"),
                                                train=train), progress=False)
    return {"data": data, "mined": mined, "result": result, "mine": mine, "first": first,
            "second": second, "collect": collect, "root": root}


def test_mined_frames_are_false_positives_of_the_detector(loop):
    frames, mine = loop["result"].frames, loop["mine"]
    assert len(frames) > 0 and loop["result"].counts["added"] == len(frames)
    assert frames.pixels.shape[1:] == (SIZE, 2 * SIZE, 3)
    detector = load_detector(mine.checkpoint, threshold=mine.threshold)
    assert np.all(detector.predict_proba({"pixels": frames.pixels}) >= mine.threshold)
    assert not frames.label.any()  # the scripted predicate said failure
    counts = loop["result"].counts
    assert counts["false_positives"] >= len(frames)
    assert counts["episodes"] == 6
    assert sum(counts[k] for k in ("true_positives", "false_positives", "true_negatives",
                                   "false_negatives")) == counts["frames"]
    for episode in np.unique(frames.episode):
        assert np.sum(frames.episode == episode) <= mine.max_per_episode


def test_mined_frames_are_real_states_the_predicate_calls_failure(loop):
    """Replaying a mined episode renders the very frames, and labels them failure again."""
    import tasks

    frames, mine = loop["result"].frames, loop["mine"]
    episode = int(frames.episode[0])
    replay_config = CollectConfig(task="push", camera=CAMERA, image_size=SIZE,
                                  policies=mine.policies, frame_stride=1, seed=mine.seed)
    env = tasks.make("push", obs_mode="state", camera="front", image_size=SIZE,
                     terminate_on_success=False)
    replay = collect_episode(env, episode, replay_config)
    env.close()
    for row in np.flatnonzero(frames.episode == episode):
        match = np.flatnonzero(replay.step == frames.step[row])
        assert len(match) == 1
        assert np.array_equal(replay.pixels[match[0]], frames.pixels[row])
        assert not replay.label[match[0]]


def test_mined_frames_land_in_new_train_episodes_only(loop):
    before, after = read_dataset(loop["data"]), read_dataset(loop["mined"])
    frames = loop["result"].frames
    for split in ("val", "test"):
        for column in ("pixels", "label", "episode", "step", "margin", "policy"):
            assert np.array_equal(getattr(before[split], column), getattr(after[split], column))
    n = len(before["train"])
    assert len(after["train"]) == n + len(frames)
    assert np.array_equal(after["train"].pixels[:n], before["train"].pixels)
    assert np.array_equal(after["train"].pixels[n:], frames.pixels)
    assert not after["train"].label[n:].any()
    old_ids = np.concatenate([part.episode for part in before.values()])
    assert frames.episode.min() > old_ids.max()
    attrs = read_attrs(loop["mined"])
    assert attrs["camera_mounts"] == camera_mounts("push", CAMERA)  # carried over
    record, = attrs["mining"]
    assert record["threshold"] == 0.2 and record["added"] == len(frames)
    assert record["episode_ids"] == [int(old_ids.max()) + 1, int(old_ids.max()) + 6]
    assert first_new_episode(loop["mined"]) == int(old_ids.max()) + 7
    assert loop["second"].metrics["training"]["frames"]["train"] == n + len(frames)


def test_append_refuses_episode_ids_already_in_the_file(loop):
    test = read_dataset(loop["data"])["test"]
    with pytest.raises(ValueError, match="already in"):
        append_to_train(loop["data"], loop["root"] / "bad.h5", test.subset(np.arange(2)),
                        record={})


def test_mining_refuses_a_detector_for_another_camera(loop, tmp_path):
    splits = read_dataset(loop["data"])
    other = write_dataset(tmp_path / "other.h5", splits, task="push", camera="side+wrist")
    with pytest.raises(ValueError, match="trained on camera"):
        mine_round(MineConfig(checkpoint=str(loop["first"].checkpoint), data=str(other)),
                   progress=False)


def test_mining_rollouts_of_a_trained_policy_run(loop, tmp_path):
    """``policy_run``: a tiny trained group-trainer run on push plays the episodes."""
    from harness import config as harness_config
    from harness import trainers

    run = tmp_path / "run"
    trainers.train(harness_config.compose([
        "task=push", "task.max_episode_steps=12", "algo=grpo", "algo.iterations=1",
        "algo.group_size=2", "algo.num_start_states=2", "algo.minibatch_size=4",
        "policy=mlp", "policy.hidden=16", "eval.final_episodes=1", "eval.every_steps=0",
        "logger=none", "torch_threads=1"]), run)
    mine = MineConfig(checkpoint=str(loop["first"].checkpoint), data=str(loop["data"]),
                      out=str(tmp_path / "mined.h5"), episodes=2, threshold=0.05,
                      policy_run=str(run))
    with pytest.raises(ValueError, match="needs a policy_loader"):
        mine_round(mine, progress=False)
    script = _script("mine_hard_negatives")
    result, out = mine_round(mine, progress=False, report=lambda _: None,
                             policy_loader=script.load_run_policy)
    assert result.counts["episodes"] == 2
    assert result.counts["frames"] == 2 * 13  # every step of 12-step episodes, and the start
    assert np.all(result.frames.policy == -1) and not result.frames.label.any()
    assert read_attrs(out)["mining"][0]["policy_run"] == str(run)


# ------------------------------------------------------------------ held-out visual domain
def test_held_out_visual_domain_is_a_test_only_file(loop, tmp_path):
    collect = CollectConfig(task="push", camera=CAMERA, image_size=SIZE, episodes=4,
                            policies={"expert": 1.0, "offset_goal": 1.0}, seed=0,
                            splits=(0.0, 0.0, 1.0), randomization=HELD_OUT)
    splits = build_dataset(collect, progress=False)
    assert len(splits["train"]) == len(splits["val"]) == 0 and len(splits["test"]) > 0
    path = write_dataset(tmp_path / "held_out.h5", splits, task="push", camera=CAMERA,
                         config={"randomization": HELD_OUT})
    # The same episode rendered in the nominal and the held-out domain looks different.
    nominal = build_dataset(CollectConfig(**{**collect.__dict__, "randomization": {}}),
                            progress=False)["test"]
    assert not np.array_equal(nominal.pixels[:1], splits["test"].pixels[:1])

    detector = loop["second"].detector
    held_out = evaluate_on_file(detector, path)
    reference = evaluate_on_file(detector, loop["mined"])
    assert held_out["frames"] == len(splits["test"]) and held_out["randomization"] == HELD_OUT
    drops = metric_drops(reference, held_out)
    assert drops["accuracy"] == pytest.approx(reference["accuracy"] - held_out["accuracy"])
    with pytest.raises(ValueError, match="no frames in its 'train' split"):
        evaluate_on_file(detector, path, split="train")


def test_a_threshold_chosen_again_on_val_follows_training_rule(loop, tmp_path):
    import json

    from hydra import compose, initialize_config_dir

    from success_detectors.data import FrameSet, read_split
    from success_detectors.metrics import select_threshold
    from success_detectors.network import predict_pixels

    detector = loop["second"].detector
    val = read_split(loop["mined"], "val")
    probs = predict_pixels(detector.model, val.pixels)
    for conservative in (True, False):
        chosen = threshold_on_file(detector, loop["mined"], "val", 0.9, conservative)
        assert chosen == select_threshold(val.label, probs, 0.9, conservative)
    # the measured precision qualifies lower thresholds than its 95% lower bound does
    assert threshold_on_file(detector, loop["mined"], conservative=False).threshold <= \
        threshold_on_file(detector, loop["mined"], conservative=True).threshold
    test = read_split(loop["mined"], "test")
    empty = FrameSet.concatenate([], test.pixels.shape[1:])
    test_only = write_dataset(tmp_path / "test_only.h5",
                              {"train": empty, "val": empty, "test": test},
                              task="push", camera=CAMERA)
    with pytest.raises(ValueError, match="no frames in its 'val' split to choose"):
        threshold_on_file(detector, test_only)

    # the script chooses on the first file's val split, reads every file at it, records it
    script = _script("evaluate_detector")
    out = tmp_path / "evaluation.json"
    base = [f"checkpoint={loop['second'].checkpoint}", f"data=[{loop['mined']},{test_only}]",
            f"out={out}"]
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("evaluate_detector", overrides=[
            *base, "choose_threshold={target_precision: 0.9, conservative: false}"])
        both = compose("evaluate_detector", overrides=[
            *base, "threshold=0.5", "choose_threshold={target_precision: 0.9}"])
    script.app.__wrapped__(cfg)
    written = json.loads(out.read_text())
    assert written["threshold"] == pytest.approx(
        threshold_on_file(detector, loop["mined"], "val", 0.9, False).threshold)
    assert written["threshold_chosen"]["conservative"] is False
    assert [r["data"] for r in written["results"]] == [str(loop["mined"]), str(test_only)]
    with pytest.raises(ValueError, match="give one of them"):
        script.app.__wrapped__(both)


def test_collect_config_rejects_a_bad_randomization_block():
    with pytest.raises(ValueError, match=r"unknown randomization option\(s\) \['texture'\]"):
        CollectConfig(task="push", randomization={"enabled": True, "texture": True})


def test_hydra_configs_compose():
    from hydra import compose, initialize_config_dir

    from harness_common.paths import register_resolver

    register_resolver()  # ${data_dir:}, as the apps register it
    with initialize_config_dir(str(CONF), version_base="1.3"):
        held_out = compose("collect_detector_data",
                           overrides=["task.camera=front+wrist", "visual_domain=held_out"])
        assert held_out.splits == [0.0, 0.0, 1.0] and held_out.seed == 1
        assert held_out.task.randomization.textures and held_out.out.endswith(
            "push_front+wrist_84_held_out.h5")
        assert held_out.task.randomization.texture_set == 1
        randomized = compose("collect_detector_data",
                             overrides=["task.camera=front+wrist", "visual_domain=randomized"])
        assert randomized.splits == [0.7, 0.15, 0.15] and randomized.seed == 0
        assert randomized.task.randomization.texture_set == 0 and randomized.out.endswith(
            "push_front+wrist_84_randomized.h5")
        # the held-out domain's lights go beyond the training domain's
        held, trained = held_out.task.randomization, randomized.task.randomization
        assert held.light_count[1] > trained.light_count[1]
        assert held.light_direction > trained.light_direction
        nominal = compose("collect_detector_data")
        assert nominal.task.randomization == {} and nominal.seed == 0
        mine = compose("mine_hard_negatives", overrides=["checkpoint=a.pt", "data=a.h5"])
        MineConfig(**{k: v for k, v in mine.items() if k != "hydra"})
        evaluate = compose("evaluate_detector", overrides=["checkpoint=a.pt", "data=[a.h5]"])
        assert evaluate.split == "test"
        assert evaluate.choose_threshold is None


def test_texture_sets_build_disjoint_textures_and_set_0_is_the_default():
    import tasks

    def textures(options):
        env = tasks.make("push", randomization={"enabled": True, "textures": True, **options})
        model = env.unwrapped.model
        names = [model.texture(i).name for i in range(model.ntex)]
        data = {name: model.tex_data[model.tex_adr[i]:model.tex_adr[i] + 64 * 64 * 3].tobytes()
                for i, name in enumerate(names) if name.startswith("random_texture_")}
        env.close()
        return data

    default, set0, set1 = textures({}), textures({"texture_set": 0}), textures({"texture_set": 1})
    assert len(default) == 8 and default == set0
    assert set(default) == set(set1) and not set(default.values()) & set(set1.values())
    with pytest.raises(ValueError, match=r"randomization.texture_set=-1; expected an integer"):
        tasks.make("push", randomization={"enabled": True, "texture_set": -1})
