"""LeRobotDataset v3.0 folders in and out: export of real pixel demos, the files LeRobot's loader
reads (checked against its layout: templates, feature dtypes, parquet schemas, statistics), the
round trip back to the demos, behaviour cloning from a folder, and every bad input.

Frames go through H.264 (``yuv444p``, CRF 10), so they come back within a tolerance measured on
these 32x32 frames: mean absolute error 1.1/255 (push, pick_place, reach, drawer_open), worst
frame 1.7/255, worst pixel 34/255. The bounds below leave room: 2/255, 3/255 and 64/255.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from harness import config as harness_config
from harness import trainers
from harness.config import BCConfig, ConfigError, GroupAlgoConfig, Seeds, StartPolicyConfig
from harness.demos import collect_demos, load_demos
from harness.lerobot import export_lerobot, load_lerobot, read_info
from harness.lerobot.video import decode_video
from harness.policies.mlp import MLPConfig
from harness.policies.tiny_vla import TinyVLAConfig
from harness.start_policy import cloned_start_policy

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parent.parent
IMAGE = 32
CAMERA = "observation.images.front"
VIDEO = f"videos/{CAMERA}/chunk-000/file-000.mp4"
PIXEL_OPTIONS = {"obs_mode": "pixels", "image_size": IMAGE, "difficulty": 0.0}


@pytest.fixture(scope="module")
def pixel_demos(tmp_path_factory) -> Path:
    """3 successful push demos with 32x32 front-camera frames (about 45 frames in all)."""
    path = tmp_path_factory.mktemp("demos") / "push_pixels.hdf5"
    collect_demos(path, "push", 3, obs_mode="pixels", image_size=IMAGE, difficulty=0.0,
                  progress=False)
    return path


@pytest.fixture(scope="module")
def exported(pixel_demos, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lerobot") / "push_pixels"
    export_lerobot(pixel_demos, out)
    return out


@pytest.fixture(scope="module")
def state_dataset(tmp_path_factory) -> tuple[Path, Path]:
    """2 reach demos in ``state`` mode (no camera), and their export."""
    folder = tmp_path_factory.mktemp("state")
    collect_demos(folder / "reach.hdf5", "reach", 2, obs_mode="state", difficulty=0.1,
                  max_episode_steps=25, progress=False)
    export_lerobot(folder / "reach.hdf5", folder / "reach")
    return folder / "reach.hdf5", folder / "reach"


def copy_of(folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / folder.name))


# --- the round trip ---------------------------------------------------------------------------


def test_export_then_import_gives_the_demos_back(pixel_demos, exported):
    original, back = load_demos(pixel_demos), load_lerobot(exported)
    assert sorted(back.obs) == sorted(original.obs) == ["instruction", "pixels", "proprio"]
    for key in ("instruction", "proprio"):
        assert back.obs[key].dtype == original.obs[key].dtype
        np.testing.assert_array_equal(back.obs[key], original.obs[key])
    for name in ("actions", "rewards", "dones", "episode_ids", "successes", "seeds"):
        np.testing.assert_array_equal(getattr(back, name), getattr(original, name))
        assert getattr(back, name).dtype == getattr(original, name).dtype
    assert back.env_args == original.env_args
    assert back.obs["pixels"].dtype == np.uint8
    assert back.obs["pixels"].shape == original.obs["pixels"].shape
    error = np.abs(back.obs["pixels"].astype(int) - original.obs["pixels"].astype(int))
    assert error.mean() < 2  # levels of 255
    assert error.mean(axis=(1, 2, 3)).max() < 3
    assert error.max() <= 64


def test_state_mode_exports_without_video_and_round_trips_exactly(state_dataset):
    demos_path, folder = state_dataset
    original, back = load_demos(demos_path), load_lerobot(folder)
    assert sorted(back.obs) == ["instruction", "state"]  # as recorded, not every feature
    np.testing.assert_array_equal(back.obs["state"], original.obs["state"])
    np.testing.assert_array_equal(back.actions, original.actions)
    info = read_info(folder)
    assert info["video_path"] is None and not (folder / "videos").exists()
    # LeRobot policies read the robot's own state as observation.state: the proprio part
    proprio = load_lerobot(folder, keys=["proprio"]).obs["proprio"]
    np.testing.assert_array_equal(proprio, original.obs["state"][:, :8])
    assert info["features"]["observation.environment_state"]["shape"] == [
        original.obs["state"].shape[1]]


def test_a_folder_written_by_lerobot_itself_reads_without_our_extra_file(exported, tmp_path):
    # LeRobot's writer stores the task text as pandas' unnamed index and has no
    # meta/vla_rl_harness.json: every episode then counts as a success, seeds are unknown
    folder = copy_of(exported, tmp_path)
    (folder / "meta/vla_rl_harness.json").unlink()
    tasks = pq.read_table(folder / "meta/tasks.parquet")
    pandas = json.loads(tasks.schema.metadata[b"pandas"])
    pandas["index_columns"] = ["__index_level_0__"]
    renamed = tasks.rename_columns(["task_index", "__index_level_0__"])
    pq.write_table(renamed.replace_schema_metadata({"pandas": json.dumps(pandas)}),
                   folder / "meta/tasks.parquet")
    ours, theirs = load_lerobot(exported), load_lerobot(folder)
    assert sorted(theirs.obs) == ["instruction", "pixels", "proprio"]
    np.testing.assert_array_equal(theirs.obs["instruction"], ours.obs["instruction"])
    assert theirs.successes.all() and (theirs.seeds == -1).all() and theirs.env_args == {}


# --- the files, against LeRobot's v3.0 layout -------------------------------------------------


def test_info_json_has_lerobot_v3_fields(pixel_demos, exported):
    demos = load_demos(pixel_demos)
    info = json.loads((exported / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0"
    assert info["fps"] == 25  # 1 / (timestep 0.002 s * 20 substeps)
    assert info["robot_type"] == "floating_gripper"
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"]) == (
        3, len(demos), len({tuple(row) for row in demos.obs["instruction"].tolist()}))
    assert (info["chunks_size"], info["data_files_size_in_mb"],
            info["video_files_size_in_mb"]) == (1000, 100, 200)
    assert info["splits"] == {"train": "0:3"}
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    assert info["video_path"] == (
        "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4")
    features = info["features"]
    assert list(features) == [
        "observation.state", CAMERA, "action", "next.reward", "next.done",
        "timestamp", "frame_index", "episode_index", "index", "task_index"]
    assert features["observation.state"] == {
        "dtype": "float32", "shape": [8], "names": [
            "ee_x", "ee_y", "ee_z", "ee_vx", "ee_vy", "ee_vz", "finger_opening",
            "gripper_command"]}
    assert features["action"] == {"dtype": "float32", "shape": [4],
                                  "names": ["dx", "dy", "dz", "gripper"]}
    assert features[CAMERA]["dtype"] == "video"
    assert features[CAMERA]["shape"] == [IMAGE, IMAGE, 3]
    assert features[CAMERA]["names"] == ["height", "width", "channels"]
    assert features[CAMERA]["info"] == {
        "video.height": IMAGE, "video.width": IMAGE, "video.codec": "h264",
        "video.pix_fmt": "yuv444p", "video.is_depth_map": False, "video.fps": 25,
        "video.channels": 3, "has_audio": False}
    for name, dtype in (("next.reward", "float32"), ("next.done", "bool"),
                        ("timestamp", "float32"), ("frame_index", "int64"),
                        ("episode_index", "int64"), ("index", "int64"), ("task_index", "int64")):
        assert features[name] == {"dtype": dtype, "shape": [1], "names": None}


def test_data_parquet_has_lerobot_schema_and_rows(pixel_demos, exported):
    demos = load_demos(pixel_demos)
    table = pq.read_table(exported / "data/chunk-000/file-000.parquet")
    assert table.schema.equals(pa.schema([
        ("observation.state", pa.list_(pa.float32(), 8)),
        ("action", pa.list_(pa.float32(), 4)),
        ("next.reward", pa.float32()), ("next.done", pa.bool_()),
        ("timestamp", pa.float32()), ("frame_index", pa.int64()),
        ("episode_index", pa.int64()), ("index", pa.int64()), ("task_index", pa.int64())]))
    hf = json.loads(table.schema.metadata[b"huggingface"])["info"]["features"]
    assert hf["action"] == {"feature": {"dtype": "float32", "_type": "Value"}, "length": 4,
                            "_type": "List"}
    assert hf["timestamp"] == {"dtype": "float32", "_type": "Value"}
    np.testing.assert_array_equal(table["index"].to_numpy(), np.arange(len(demos)))
    np.testing.assert_array_equal(table["episode_index"].to_numpy(), demos.episode_ids)
    frame_index = table["frame_index"].to_numpy()
    assert (frame_index[demos.episode_ids != np.r_[-1, demos.episode_ids[:-1]]] == 0).all()
    np.testing.assert_allclose(table["timestamp"].to_numpy(), frame_index / 25, atol=1e-6)
    np.testing.assert_array_equal(table["next.done"].to_numpy(), demos.dones)


def test_episodes_tasks_and_video_say_where_each_episode_is(pixel_demos, exported):
    demos = load_demos(pixel_demos)
    episodes = pq.read_table(exported / "meta/episodes/chunk-000/file-000.parquet")
    columns = set(episodes.column_names)
    assert {"episode_index", "tasks", "length", "data/chunk_index", "data/file_index",
            "dataset_from_index", "dataset_to_index", f"videos/{CAMERA}/chunk_index",
            f"videos/{CAMERA}/file_index", f"videos/{CAMERA}/from_timestamp",
            f"videos/{CAMERA}/to_timestamp", "meta/episodes/chunk_index",
            "meta/episodes/file_index", "stats/action/mean", f"stats/{CAMERA}/std"} <= columns
    assert episodes.schema.field("tasks").type == pa.list_(pa.string())
    rows = episodes.to_pydict()
    lengths = np.bincount(demos.episode_ids)
    assert rows["episode_index"] == [0, 1, 2] and rows["length"] == lengths.tolist()
    stops = np.cumsum(lengths)
    assert rows["dataset_to_index"] == stops.tolist()
    assert rows["dataset_from_index"] == [0, *stops[:-1].tolist()]
    assert rows[f"videos/{CAMERA}/from_timestamp"] == pytest.approx([0, *stops[:-1] / 25])
    assert rows[f"videos/{CAMERA}/to_timestamp"] == pytest.approx(stops / 25)
    assert rows["stats/action/mean"][1] == pytest.approx(
        demos.actions[demos.episode_ids == 1].mean(axis=0))

    tasks = pq.read_table(exported / "meta/tasks.parquet")
    assert tasks.column_names == ["task_index", "task"]
    assert json.loads(tasks.schema.metadata[b"pandas"])["index_columns"] == ["task"]
    assert tasks["task"][0].as_py() == rows["tasks"][0][0]
    assert tasks["task"][0].as_py().startswith("push the ")

    frames = decode_video(exported / VIDEO)  # every episode of the camera in one file
    assert frames.shape == (len(demos), IMAGE, IMAGE, 3)
    assert sorted(p.name for p in (exported / "videos").iterdir()) == [CAMERA]


def test_stats_json_matches_the_data(pixel_demos, exported):
    demos = load_demos(pixel_demos)
    stats = json.loads((exported / "meta/stats.json").read_text())
    assert set(stats) == {"observation.state", CAMERA, "action", "next.reward", "next.done",
                          "timestamp", "frame_index", "episode_index", "index", "task_index"}
    action = stats["action"]
    assert set(action) == {"min", "max", "mean", "std", "count", "q01", "q10", "q50", "q90",
                           "q99"}
    assert action["count"] == [len(demos)]
    assert action["mean"] == pytest.approx(demos.actions.mean(axis=0))
    assert action["std"] == pytest.approx(demos.actions.std(axis=0))
    assert action["q50"] == pytest.approx(np.median(demos.actions, axis=0))
    image = stats[CAMERA]  # per channel, in [0, 1], shaped (3, 1, 1) like LeRobot's
    assert np.asarray(image["mean"]).shape == (3, 1, 1) and image["count"] == [len(demos)]
    pixels = demos.obs["pixels"].reshape(-1, 3) / 255
    np.testing.assert_allclose(np.asarray(image["mean"]).ravel(), pixels.mean(axis=0))
    np.testing.assert_allclose(np.asarray(image["std"]).ravel(), pixels.std(axis=0))
    np.testing.assert_allclose(np.asarray(image["max"]).ravel(), pixels.max(axis=0))
    assert stats["next.done"]["mean"] == pytest.approx([3 / len(demos)])


# --- behaviour cloning from a folder ----------------------------------------------------------


def test_bc_clones_a_pixel_policy_from_a_dataset_folder(exported, tmp_path):
    policy, metrics = cloned_start_policy(
        "push", PIXEL_OPTIONS, TinyVLAConfig(hidden=16, conv_channels=[4]),
        StartPolicyConfig(dataset=str(exported), bc=BCConfig(epochs=3, difficulty=0.0)),
        Seeds(0, 0), progress=False, demo_dir=tmp_path)
    assert metrics["bc/dataset"] == str(exported) and "bc/demo_file" not in metrics
    assert math.isfinite(metrics["bc/train_loss"]) and metrics["bc/train_steps"] > 0
    assert not list(tmp_path.iterdir())  # nothing recorded
    assert not policy.training


def test_training_app_starts_from_bc_on_a_dataset_folder(state_dataset, tmp_path):
    config = harness_config.compose([
        "task=reach", "task.obs_mode=state", "task.max_episode_steps=25", "policy=mlp",
        "policy.hidden=16", "algo=grpo", "algo.group_size=2", "algo.num_start_states=2",
        "algo.iterations=1", "algo.start_policy.bc.epochs=2",
        f"algo.start_policy.dataset={state_dataset[1]}",
        "eval.every_steps=0", "eval.final_episodes=2", "logger.videos=false",
        "logger.tensorboard=false", "logger.progress_bar=false"])
    summary = trainers.train(config, tmp_path / "run")
    assert summary["bc/dataset"] == str(state_dataset[1]) and summary["iterations"] == 1
    assert math.isfinite(summary["bc/train_loss"])


# --- bad input: each named, before anything is trained or written ----------------------------


def test_a_dataset_of_another_version_is_refused(exported, tmp_path):
    folder = copy_of(exported, tmp_path)
    info = json.loads((folder / "meta/info.json").read_text())
    (folder / "meta/info.json").write_text(json.dumps({**info, "codebase_version": "v2.1"}))
    with pytest.raises(ValueError, match="codebase_version='v2.1'.*'v3.0'"):
        load_lerobot(folder)
    with pytest.raises(ConfigError, match="algo.start_policy.dataset=.*codebase_version='v2.1'"):
        GroupAlgoConfig(name="grpo", start_policy=StartPolicyConfig(dataset=str(folder)))
    with pytest.raises(ConfigError, match="not a LeRobot dataset"):
        GroupAlgoConfig(name="grpo", start_policy=StartPolicyConfig(dataset=str(tmp_path)))
    with pytest.raises(ConfigError, match="no LeRobot dataset folder"):
        StartPolicyConfig(dataset=str(tmp_path / "absent"))


def test_dataset_and_recorded_demos_are_exclusive(exported):
    with pytest.raises(ConfigError,
                       match="algo.start_policy.dataset=.*algo.start_policy.bc.demos=5.*not both"):
        harness_config.compose(["algo=grpo", "policy=mlp", "algo.start_policy.bc.demos=5",
                                f"algo.start_policy.dataset={exported}"])
    config = GroupAlgoConfig(name="grpo", start_policy=StartPolicyConfig(dataset=str(exported)))
    assert config.start_policy.dataset == str(exported)


def test_a_dataset_without_what_the_task_observes_is_refused(exported, state_dataset,
                                                              tmp_path):
    mlp = MLPConfig(use_instruction=True, hidden=16)
    with pytest.raises(ValueError, match=r"lacks the feature\(s\) \['observation.images"):
        cloned_start_policy("reach", {"obs_mode": "pixels", "image_size": IMAGE}, mlp,
                            StartPolicyConfig(dataset=str(state_dataset[1]),
                                              bc=BCConfig(epochs=1, difficulty=0.0)),
                            Seeds(0, 0), progress=False, demo_dir=tmp_path)
    with pytest.raises(ValueError, match=rf"{CAMERA} \(pixels\) has shape \(32, 32, 3\)"):
        load_lerobot(exported, shapes={"pixels": (48, 48, 3)})
    with pytest.raises(ValueError, match="no camera 'wrist'"):
        load_lerobot(exported, camera="wrist")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("missing", [VIDEO, "data/chunk-000/file-000.parquet",
                                     "meta/tasks.parquet", "meta/episodes", "meta/info.json"])
def test_a_dataset_missing_a_file_names_it(exported, tmp_path, missing):
    folder = copy_of(exported, tmp_path)
    path = folder / missing
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    expected = "not a LeRobot dataset" if missing == "meta/info.json" else missing
    with pytest.raises(ValueError, match=expected):
        load_lerobot(folder)


def test_a_dataset_whose_task_is_outside_the_vocabulary_is_refused(exported, tmp_path):
    folder = copy_of(exported, tmp_path)
    table = pq.read_table(folder / "meta/tasks.parquet")
    texts = ["fold the laundry", *table["task"].to_pylist()[1:]]
    pq.write_table(table.set_column(1, "task", pa.array(texts)), folder / "meta/tasks.parquet")
    with pytest.raises(ValueError, match="task 'fold the laundry' cannot be an instruction"):
        load_lerobot(folder)
    assert load_lerobot(folder, keys=["proprio"]).obs["proprio"].shape[1] == 8


def test_export_refuses_a_non_empty_out_unless_told_to_overwrite(pixel_demos, tmp_path):
    out = tmp_path / "dataset"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not empty; pass overwrite=true"):
        export_lerobot(pixel_demos, out)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    export_lerobot(pixel_demos, out, overwrite=True)
    assert not (out / "notes.txt").exists() and read_info(out)["total_episodes"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dataset"]  # no staging left
    (tmp_path / "a_file").write_text("")
    with pytest.raises(ValueError, match="is a file"):
        export_lerobot(pixel_demos, tmp_path / "a_file", overwrite=True)


def test_export_of_a_missing_demo_file_writes_nothing(tmp_path):
    with pytest.raises(FileNotFoundError, match="no demo file at .*absent.hdf5"):
        export_lerobot(tmp_path / "absent.hdf5", tmp_path / "out")
    assert not list(tmp_path.iterdir())


def test_yuv420p_refuses_odd_frame_sides(tmp_path):
    collect_demos(tmp_path / "odd.hdf5", "reach", 1, obs_mode="pixels", image_size=21,
                  max_episode_steps=5, only_successes=False, progress=False)
    with pytest.raises(ValueError, match="yuv420p.*even.*21x21"):
        export_lerobot(tmp_path / "odd.hdf5", tmp_path / "out", pix_fmt="yuv420p")
    export_lerobot(tmp_path / "odd.hdf5", tmp_path / "out")  # yuv444p takes any size
    steps = len(load_demos(tmp_path / "odd.hdf5"))
    assert load_lerobot(tmp_path / "out").obs["pixels"].shape == (steps, 21, 21, 3)


# --- the command line and kill safety ---------------------------------------------------------


def export_command(demos: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "scripts/export_dataset.py", f"demos={demos}", f"out={out}",
            "hydra/job_logging=none", "hydra/hydra_logging=none", "hydra.run.dir=" +
            str(out.parent / "hydra"), *extra]


def test_cli_exports_and_names_a_bad_format(pixel_demos, tmp_path, capsys):
    """The export app (``scripts/export_dataset.py``'s ``main``, in this process; the kill test
    below runs the script itself)."""
    from harness.apps import export_dataset

    args = export_command(pixel_demos, tmp_path / "ds")[2:]  # without python and the script
    assert export_dataset.main(args) == 0, capsys.readouterr().err
    assert "wrote 3 episodes" in capsys.readouterr().out
    assert read_info(tmp_path / "ds")["total_frames"] > 0
    args = export_command(pixel_demos, tmp_path / "other", "format=rlds")[2:]
    assert export_dataset.main(args) == 1
    assert "format='rlds' is unknown; choose one of ('lerobot',)" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()


def test_a_killed_export_leaves_no_dataset_and_the_next_one_cleans_up(pixel_demos, tmp_path):
    out = tmp_path / "ds"
    staged = None
    for _ in range(3):  # kill it while its staging folder exists
        process = subprocess.Popen(export_command(pixel_demos, out), cwd=ROOT,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while staged is None and process.poll() is None and time.monotonic() < deadline:
            staged = next(tmp_path.glob(".ds.*.tmp"), None)
            time.sleep(0.001)
        if staged is not None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
            break
        shutil.rmtree(out, ignore_errors=True)
    assert staged is not None, "the export always finished before it could be killed"
    assert not out.exists() and staged.exists()
    export_lerobot(pixel_demos, out)
    assert not staged.exists() and load_lerobot(out).obs["pixels"].shape[1:] == (IMAGE, IMAGE, 3)
