"""Strict inputs: every loader and option rejects bad values with an error that names them, and a
rejected input changes nothing (a crafted-input corpus over task options, actions, snapshots,
snapshot files and training options)."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

import tasks
from harness.config import ConfigError, compose


@pytest.mark.parametrize(("option", "value", "match"), [
    ("terminate_on_success", "false", "terminate_on_success='false'"),
    ("terminate_on_success", 1, "terminate_on_success=1"),
    ("image_size", 84.5, "image_size=84.5"),
    ("image_size", True, "image_size=True"),
    ("image_size", 4, "image_size=4"),
    ("substeps", 1.5, "substeps=1.5"),
    ("max_episode_steps", 0, "max_episode_steps=0"),
    ("difficulty", "0.5", "difficulty='0.5'"),
    ("difficulty", True, "difficulty=True"),
    ("difficulty", float("nan"), "difficulty=nan"),
    ("timestep", float("inf"), "timestep=inf"),
    ("reward_weights", {"reach": float("nan")}, "reward_weights.reach=nan"),
    ("camera", 3, "camera=3"),
    ("camera", "x/../../escaped", "not a camera name"),
])
def test_task_options_are_checked_by_type_and_range(option, value, match):
    with pytest.raises(ValueError, match=match.replace("[", r"\[")):
        tasks.make("reach", **{option: value})


@pytest.mark.parametrize(("action", "match"), [
    (np.array([1 + 2j, 0, 0, 0]), "complex"),
    (np.array(["0.1", "0", "0", "0"]), "dtype <U3"),
    (np.array([True, False, True, False]), "dtype bool"),
    (np.array([0.0, np.nan, 0.0, 0.0]), "not finite"),
    (np.zeros(3), "shape"),
])
def test_bad_actions_raise_before_the_simulator_moves(action, match):
    env = tasks.make("reach")
    env.reset(seed=0)
    before = env.unwrapped.snapshot()
    with pytest.raises(ValueError, match=match):
        env.step(action)
    after = env.unwrapped.snapshot()
    assert after.physics == before.physics and after.task_state["steps"] == 0


def test_huge_finite_actions_are_clipped_like_any_other():
    env, other = tasks.make("reach"), tasks.make("reach")
    env.reset(seed=1)
    other.reset(seed=1)
    huge = env.step(np.array([1e308, -1e308, 1e300, -5.0]))[0]
    unit = other.step(np.array([1.0, -1.0, 1.0, -1.0]))[0]
    assert np.array_equal(huge["state"], unit["state"])


def test_a_bad_snapshot_leaves_the_env_as_it_was():
    env = tasks.make("push")
    env.reset(seed=0)
    good = env.unwrapped.snapshot()
    env.step(env.action_space.sample())
    before = env.unwrapped.snapshot()
    broken = [
        ("not a snapshot", TypeError, "tasks.Snapshot"),
        (good.__class__(**{**good.__dict__, "physics": good.physics[:-8]}), ValueError, "numbers"),
        (good.__class__(**{**good.__dict__, "task_state": {**good.task_state, "steps": -1}}),
         ValueError, "steps"),
        (good.__class__(**{**good.__dict__,
                           "task_state": {**good.task_state, "difficulty": "hard"}}),
         ValueError, "difficulty"),
        (good.__class__(**{**good.__dict__, "rng_state": {}}), ValueError, "rng_state"),
    ]
    for snapshot, error, match in broken:
        with pytest.raises(error, match=match):
            env.unwrapped.restore(snapshot)
        after = env.unwrapped.snapshot()
        assert after.physics == before.physics and after.task_state["steps"] == 1


@pytest.mark.parametrize("name", sorted(tasks.TASKS))
def test_snapshot_files_round_trip_without_pickle(tmp_path, name):
    env = tasks.make(name, randomization={"enabled": True}) if name == "push" else tasks.make(name)
    env.reset(seed=3)
    for _ in range(3):
        env.step(env.action_space.sample())
    snapshot = env.unwrapped.snapshot()
    tasks.save_snapshot(tmp_path / "s.npz", snapshot)
    loaded = tasks.load_snapshot(tmp_path / "s.npz")
    action = np.array([0.3, -0.2, 0.1, 1.0])
    env.reset(options={"snapshot": snapshot})
    expected = env.step(action)[0]
    env.reset(options={"snapshot": loaded})
    again = env.step(action)[0]
    assert all(np.array_equal(expected[k], again[k]) for k in expected)


def test_a_changed_byte_in_a_snapshot_file_is_refused_or_changes_nothing(tmp_path):
    """40 single-bit flips across the file: each is refused, or sits in zip bookkeeping (dates,
    attributes) and loads the very same snapshot; none loads a different one."""
    env = tasks.make("reach")
    env.reset(seed=0)
    original = env.unwrapped.snapshot()
    tasks.save_snapshot(tmp_path / "s.npz", original)
    data = (tmp_path / "s.npz").read_bytes()
    refused = 0
    for offset in range(0, len(data), max(1, len(data) // 40)):
        flipped = bytearray(data)
        flipped[offset] ^= 0x01
        (tmp_path / "f.npz").write_bytes(bytes(flipped))
        try:
            loaded = tasks.load_snapshot(tmp_path / "f.npz")
        except ValueError:
            refused += 1
            continue
        assert loaded.physics == original.physics and loaded.rng_state == original.rng_state
        assert loaded.task_state.keys() == original.task_state.keys()
        for key, value in original.task_state.items():
            assert np.array_equal(loaded.task_state[key], value), key
    assert refused >= 30


def test_a_pickled_file_is_not_a_snapshot_file(tmp_path):
    (tmp_path / "s.npz").write_bytes(pickle.dumps({"physics": b""}))
    with pytest.raises(ValueError, match="not a snapshot file"):
        tasks.load_snapshot(tmp_path / "s.npz")


RANDOMISED = {"enabled": True, "textures": True}


def _forged(snapshot, randomization=None, physics=None, **task_state):
    """``snapshot`` with fields replaced and its randomisation signature recomputed, as whoever
    crafts a file can (the file's SHA-256 is recomputed by ``save_snapshot``)."""
    values = {**snapshot.randomization, **(randomization or {})}
    scratch = tasks.make("push", randomization=RANDOMISED).unwrapped._randomizer
    scratch.apply(values)
    return dataclasses.replace(snapshot, randomization=values, randomization_signature=(
        scratch.signature()), physics=physics or snapshot.physics,
        task_state={**snapshot.task_state, **task_state})


def _with(snapshot, key, index, value):
    array = snapshot.randomization[key].copy()
    array[index] = value
    return {key: array}


@pytest.mark.parametrize(("forge", "match"), [
    (lambda s: _forged(s, _with(s, "body_mass", 5, np.nan)), "body_mass"),
    (lambda s: _forged(s, _with(s, "body_mass", 5, -1.0)), "body_mass"),
    (lambda s: _forged(s, _with(s, "geom_friction", 3, np.inf)), "geom_friction"),
    (lambda s: _forged(s, {"mat_texid": np.full_like(s.randomization["mat_texid"], 10**6)}),
     "mat_texid"),
    (lambda s: _forged(s, {"body_inertia": np.zeros(3)}), "body_inertia"),
    (lambda s: _forged(s, goal=np.array([np.nan, 0.0, 0.02])), "goal"),
    (lambda s: _forged(s, goal=np.array([50.0, 0.0, 0.02])), "goal"),
    (lambda s: _forged(s, target=9), "target"),
    (lambda s: _forged(s, instruction="hack the robot"), "instruction"),
    (lambda s: _forged(s, gripper_cmd=5.0), "gripper_cmd"),
    (lambda s: _forged(s, physics=np.full(len(s.physics) // 8, np.nan).tobytes()), "physics"),
])
def test_a_forged_snapshot_file_is_refused_and_leaves_the_randomised_env_as_it_was(
        tmp_path, forge, match):
    """A digest without a key proves nothing: every restored field is checked for finiteness
    and range, and a refused ``reset(options={"snapshot": ...})`` leaves the model's randomised
    parameters, the physics and the task as they were."""
    env = tasks.make("push", randomization=RANDOMISED)
    env.reset(seed=0)
    env.step(env.action_space.sample())
    tasks.save_snapshot(tmp_path / "s.npz", forge(env.unwrapped.snapshot()))
    env.reset(seed=1)
    model, before = env.unwrapped.model, env.unwrapped.snapshot()
    masses, textures = model.body_mass.copy(), model.mat_texid.copy()
    with pytest.raises(ValueError, match=match):
        env.reset(options={"snapshot": tasks.load_snapshot(tmp_path / "s.npz")})
    after = env.unwrapped.snapshot()
    assert np.array_equal(model.body_mass, masses) and np.array_equal(model.mat_texid, textures)
    assert after.randomization_signature == before.randomization_signature
    assert after.physics == before.physics and after.task_state["steps"] == 0
    assert np.array_equal(after.task_state["goal"], before.task_state["goal"])


def test_a_refused_reset_option_leaves_the_env_as_it_was():
    env = tasks.make("push", randomization=RANDOMISED)
    env.reset(seed=0)
    env.step(env.action_space.sample())
    before, masses = env.unwrapped.snapshot(), env.unwrapped.model.body_mass.copy()
    with pytest.raises(ValueError, match="hack"):
        env.reset(seed=3, options={"instruction": "hack the robot"})
    after = env.unwrapped.snapshot()
    assert after.physics == before.physics and after.task_state["steps"] == 1
    assert np.array_equal(env.unwrapped.model.body_mass, masses)


def _zip(path, members):
    """An .npz of ``members``: name -> (npy header dict, payload bytes or a count of zeros)."""
    import zipfile

    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, (header, payload) in members.items():
            with archive.open(name, "w", force_zip64=True) as stream:
                np.lib.format.write_array_header_1_0(stream, header)
                if isinstance(payload, bytes):
                    stream.write(payload)
                else:
                    for _ in range(payload // 2**20):
                        stream.write(bytes(2**20))
    return path


def _resealed(path, edit):
    """A good snapshot file whose arrays and record ``edit`` changes, its digest recomputed."""
    from tasks import snapshot as snapshots

    env = tasks.make("reach")
    env.reset(seed=0)
    arrays, record = snapshots._to_plain(env.unwrapped.snapshot())
    edit(arrays, record)
    record["sha256"] = snapshots._digest(arrays, record)
    arrays["record"] = np.frombuffer(json.dumps(record).encode(), np.uint8)
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize(("make", "match"), [
    (lambda p: _zip(p, {"physics.npy": ({"descr": "<f8", "fortran_order": False,
                                          "shape": (2**23,)}, 2**26)}),
     r"'physics.npy', 67108992\); a snapshot file holds at most"),
    (lambda p: _zip(p, {"physics.npy": ({"descr": "<f8", "fortran_order": False,
                                          "shape": (200000, 200000)}, bytes(64))}),
     r"declares \(200000, 200000\)"),
    (lambda p: _resealed(p, lambda arrays, record: record.pop("task")), r"\['task'\]"),
    (lambda p: _resealed(p, lambda arrays, record: arrays.update(
        physics=arrays["physics"].view(np.int64))), r"\['physics'\]"),
])
def test_a_crafted_snapshot_archive_is_refused_by_name_before_it_costs_memory(tmp_path, make,
                                                                            match):
    import tracemalloc

    path = make(tmp_path / "crafted.npz")
    assert path.stat().st_size < 2**20
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=match) as error:
            tasks.load_snapshot(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "crafted.npz" in str(error.value)
    assert peak < 4 * 2**20  # bytes; a 64 MiB member is never unpacked


@pytest.mark.parametrize(("override", "match"), [
    ("seed=-1", "seed=-1"),
    ("eval.seed=-5", "eval.seed=-5"),
    ("algo.learning_rate=nan", "learning_rate=nan"),
    ("algo.learning_rate=inf", "learning_rate=inf"),
    ("+task.reward_weights.reach=nan", "reward_weights.reach=nan"),
    ("algo.clip_low=nan", "clip_low=nan"),
    ("algo.temperature=inf", "temperature=inf"),
])
def test_training_options_must_be_finite_and_in_range(override, match):
    with pytest.raises(ConfigError, match=match):
        compose(["algo=grpo", override])


@pytest.mark.parametrize(("override", "match"), [
    ("algo.group_size=1000000000", "algo.group_size=1000000000; must be >= 1 and <= 1000000"),
    ("algo.num_start_states=1000000000", "algo.num_start_states=1000000000; must be"),
    ("algo.minibatch_size=1000000000", "algo.minibatch_size=1000000000; must be"),
    ("algo.start_policy.bc.epochs=1000000000", "algo.start_policy.bc.epochs=1000000000; must be"),
    ("algo.group_size=200000", "algo.group_size x algo.num_start_states=1600000; must be"),
    ("algo.workers=100000", "algo.workers=100000; must be >= 1 and <= "),
    ("torch_threads=100000", "torch_threads=100000; must be >= 1 and <= "),
    ("algo.rollout.cpus_per_worker=1e9", "cpus_per_worker=1000000000.0; must be in"),
    ("task.max_episode_steps=1000000000000", "max_episode_steps=1000000000000; expected"),
    ("eval.max_episode_steps=1000000000000", "eval.max_episode_steps=1000000000000; must"),
    ("algo.temperature=1e300", "algo.temperature=1e\\+300; must be in \\(0, 100"),
    ("algo.clip_low=5", "algo.clip_low=5.0; must be in \\(0, 1\\)"),
    ("algo.clip_high=50", "algo.clip_high=50.0; must be in \\(0, 10"),
    ("algo.learning_rate=-1", "algo.learning_rate=-1.0; must be > 0"),
    ("algo.learning_rate=0", "algo.learning_rate=0.0; must be > 0"),
    ("algo.max_grad_norm=-1", "algo.max_grad_norm=-1.0; must be > 0"),
    ("seed=100000000000000000000", "seed=100000000000000000000; must be >= 0 and <= 4294967295"),
    ("eval.seed=100000000000000000000", "eval.seed=100000000000000000000; must be"),
])
def test_sizes_rates_and_seeds_are_bounded_at_config_load(override, match):
    """Each of these was accepted, then failed or misbehaved after the run folder existed."""
    with pytest.raises(ConfigError, match=match):
        compose(["algo=grpo", override])


@pytest.mark.parametrize("override", ["n_envs=100000", "algo.learning_rate=2",
                                      "algo.max_grad_norm=0", "algo.n_steps=1000000000"])
def test_sb3_sizes_and_rates_are_bounded_at_config_load(override):
    with pytest.raises(ConfigError, match=override.replace("=", "=.*")):
        compose(["algo=ppo", override])


def test_the_bounds_leave_room_for_real_runs():
    config = compose(["algo=grpo", f"algo.workers={os.cpu_count()}", "seed=4294967295",
                      "algo.clip_high=0.28", "algo.temperature=100", "algo.learning_rate=1"])
    assert config.seed == 2**32 - 1 and config.algo.workers == os.cpu_count()


# ------------------------------------------------------------------------------- data files
@pytest.fixture(scope="module")
def demo_file(tmp_path_factory):
    from harness.demos import collect_demos

    path = tmp_path_factory.mktemp("demos") / "reach.hdf5"
    collect_demos(path, "reach", 2, obs_mode="state", max_episode_steps=20, progress=False)
    return path


def _replace(group, name, data):
    """Swap dataset ``name`` of an HDF5 group for ``data``."""
    del group[name]
    group.create_dataset(name, data=data)


def _edited_copy(source, target, edit):
    import shutil

    import h5py

    shutil.copy(source, target)
    with h5py.File(target, "r+") as file:
        edit(file)
    return target


@pytest.mark.parametrize(("edit", "match"), [
    (lambda f: f["data/demo_0/actions"].__setitem__((0, 1), np.nan), "non-finite"),
    (lambda f: _replace(f["data/demo_0"], "actions", np.zeros((len(f["data/demo_0/actions"]), 3))),
     "(steps, 4)"),
    (lambda f: f["data"].attrs.__setitem__("env_args", "{not json"), "env_args"),
])
def test_a_damaged_demo_file_names_the_file_and_the_field(demo_file, tmp_path, edit, match):
    from harness.demos import load_demos

    damaged = _edited_copy(demo_file, tmp_path / "damaged.hdf5", edit)
    with pytest.raises(ValueError, match=match.replace("(", r"\(").replace(")", r"\)")) as error:
        load_demos(damaged)
    assert "damaged.hdf5" in str(error.value)


@pytest.fixture(scope="module")
def detector_file(tmp_path_factory):
    from success_detectors.data import write_dataset
    from success_detectors.frames import empty_frames

    frames = empty_frames((8, 8, 3))
    path = tmp_path_factory.mktemp("det") / "push.h5"
    write_dataset(path, {"train": frames, "val": frames, "test": frames}, task="push",
                  camera="front")
    return path


@pytest.mark.parametrize(("edit", "match"), [
    (lambda f: f["train"].__delitem__("label"), "lacks \\['train/label'\\]"),
    (lambda f: f.attrs.__delitem__("camera"), "lacks the root attribute\\(s\\) \\['camera'\\]"),
    (lambda f: f.attrs.__setitem__("camera", "x/../../escaped"), "not a camera name"),
    (lambda f: f.attrs.__setitem__("task", "stack"), "task='stack'"),
])
def test_a_damaged_detector_file_names_the_file_and_the_field(detector_file, tmp_path, edit,
                                                              match):
    from success_detectors.data import read_dataset

    damaged = _edited_copy(detector_file, tmp_path / "damaged.h5", edit)
    with pytest.raises(ValueError, match=match) as error:
        read_dataset(damaged)
    assert "damaged.h5" in str(error.value)


def test_detector_outputs_stay_inside_their_folder(tmp_path):
    from harness_common.files import contained_path

    assert contained_path(tmp_path, "push_front.pt") == tmp_path / "push_front.pt"
    with pytest.raises(ValueError, match="outside the output folder"):
        contained_path(tmp_path, "push_x/../../escaped.pt")
    with pytest.raises(ValueError, match="outside the output folder"):
        contained_path(tmp_path, "/etc/escaped.pt")


# ------------------------------------------------------------------ deployment metadata
@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """An exported MLP token policy for reach (random weights): model bytes and its record."""
    import torch

    from harness.export import export_onnx
    from harness.policies import make as make_policy
    from harness.policies.mlp import MLPConfig

    torch.manual_seed(0)
    env = tasks.make("reach")
    policy = make_policy(MLPConfig(use_instruction=True, hidden=16), env.observation_space)
    return export_onnx(policy, {"task": "reach", "task_options": {"max_episode_steps": 10}})


def _edited(record, path, value):
    """``record`` with the field at dotted ``path`` set to ``value`` (removed for ``...``)."""
    record = json.loads(json.dumps(record))
    *parents, last = path.split(".")
    target = record
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target[key]
    if value is ...:
        del target[last]
    else:
        target[last] = value
    return record


@pytest.mark.parametrize(("path", "value", "match"), [
    ("inputs.0.shape", [9], "the graph takes"),
    ("inputs.0.shape", [200000, 200000], r"inputs\[0\].shape=\[200000, 200000\]"),
    ("inputs.0.dtype", "object", r"inputs\[0\].dtype='object'"),
    ("inputs.0.name", "secrets", r"inputs\[0\].name='secrets'"),
    ("task", ..., "task=None"),
    ("task", "nope", "task='nope'"),
    ("policy", ..., "policy=None"),
    ("task_options.max_episode_steps", 10**12, "max_episode_steps=1000000000000"),
    ("task_options.max_episode_steps", 1e12, "max_episode_steps=1000000000000.0"),
    ("action_dim", "four", "action_dim='four'"),
    ("action_dim", 5, "action_dim=5"),
    ("evaluation", {"difficulties": [2.0]}, r"evaluation.difficulties=\[2.0\]"),
])
def test_a_crafted_deploy_record_is_refused_by_field_before_anything_runs(exported, tmp_path,
                                                                           path, value, match):
    """Wrong shapes, dtypes, missing task or policy, huge shapes and endless episodes end in
    one ValueError naming the file and the field, not in onnxruntime, KeyError or MemoryError
    tracebacks, and not in a deployment that runs for hours."""
    import onnx

    from harness.deploy import METADATA_KEY, ExportedPolicy

    model = onnx.load_from_string(exported[0])
    onnx.helper.set_model_props(model, {METADATA_KEY: json.dumps(
        _edited(exported[1], path, value))})
    onnx.save(model, tmp_path / "crafted.onnx")
    with pytest.raises(ValueError, match=match) as error:
        ExportedPolicy(tmp_path / "crafted.onnx")
    assert "crafted.onnx" in str(error.value)


# ------------------------------------------------------------------------- LeRobot datasets
DATA = "data/chunk-000/file-000.parquet"
INFO = "meta/info.json"


@pytest.fixture(scope="module")
def lerobot_folder(demo_file, tmp_path_factory):
    from harness.lerobot import export_lerobot

    out = tmp_path_factory.mktemp("lerobot") / "reach"
    export_lerobot(demo_file, out)
    return out


def _edit_column(folder, name, edit):
    """Rewrite column ``name`` of the data file as ``edit(values as Python lists)``, or drop it
    when ``edit`` is None."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(folder / DATA)
    if edit is None:
        table = table.drop_columns([name])
    else:
        table = table.set_column(table.column_names.index(name), name,
                                 pa.array(edit(table[name].to_pylist())))
    pq.write_table(table, folder / DATA)


def _edit_info(folder, edit):
    import json

    info = json.loads((folder / INFO).read_text())
    edit(info)
    (folder / INFO).write_text(json.dumps(info))


def _first_row(rows, value):
    return [[value, *rows[0][1:]], *rows[1:]]


@pytest.mark.parametrize(("edit", "where", "match"), [
    (lambda f: _edit_column(f, "action", lambda r: _first_row(r, np.nan)), DATA,
     "'action' holds non-finite"),
    (lambda f: _edit_column(f, "action", lambda r: _first_row(r, 1e30)), DATA,
     "'action' row 0 is \\[1e\\+30"),
    (lambda f: _edit_column(f, "observation.environment_state",
                            lambda r: _first_row(r, np.inf)), DATA,
     "'observation.environment_state' holds non-finite"),
    (lambda f: _edit_column(f, "observation.state", lambda r: [r[0][:5], *r[1:]]), DATA,
     "'observation.state' has a row of 5 values"),
    (lambda f: _edit_column(f, "next.reward", None), DATA,
     "lacks the column\\(s\\) \\[.next.reward"),
    (lambda f: _edit_column(f, "task_index", lambda r: [None, *r[1:]]), DATA,
     "'task_index' holds int64 with 1 nulls"),
    (lambda f: _edit_info(f, lambda i: i["features"].update({"action": "float32"})), INFO,
     "features\\['action'\\]='float32'"),
    (lambda f: _edit_info(f, lambda i: i["features"]["observation.state"].pop("shape")), INFO,
     "features\\['observation.state'\\].shape=None"),
    (lambda f: _edit_info(f, lambda i: i.update(features=["action"])), INFO,
     "features=\\['action'\\]"),
    (lambda f: _edit_info(f, lambda i: i.update(fps="fast")), INFO, "fps='fast'"),
])
def test_a_damaged_dataset_is_refused_at_config_load_naming_file_and_field(
        lerobot_folder, tmp_path, edit, where, match):
    import shutil

    from harness.config import StartPolicyConfig
    from harness.lerobot import load_lerobot

    folder = Path(shutil.copytree(lerobot_folder, tmp_path / "reach"))
    edit(folder)
    with pytest.raises(ConfigError, match=f"algo.start_policy.dataset=.*{where}.*{match}"):
        StartPolicyConfig(dataset=str(folder))
    with pytest.raises(ValueError, match=match):
        load_lerobot(folder)


def test_a_good_dataset_passes_every_check(lerobot_folder):
    from harness.config import StartPolicyConfig
    from harness.lerobot import validate_dataset

    assert validate_dataset(lerobot_folder)["total_episodes"] == 2
    assert StartPolicyConfig(dataset=str(lerobot_folder)).dataset
