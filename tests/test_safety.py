"""Nothing a checkpoint holds runs as code, and a refused resume leaves the run as it was.

Researchers share checkpoints; whoever crafts one can edit its SHA-256 in the JSON too. These
tests plant pickles that would create a marker file when unpickled, give them consistent
metadata, and check that loading and resuming refuse them (or ignore the pickled part) without
the marker ever appearing.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import zipfile
from pathlib import Path

import cloudpickle
import pytest
import torch

from harness import trainers
from harness.checkpoints import evaluate_checkpoint
from harness.config import ConfigError, compose
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
    from harness.algos.sb3 import run as sb3

    def broken(self, split, sampled=False, videos=0):
        raise RuntimeError("the final evaluation failed")

    monkeypatch.setattr(sb3.SB3Run, "evaluate", broken)
    with pytest.raises(RuntimeError, match="final evaluation failed"):
        trainers.train(compose([*SB3, "total_timesteps=128"]), tmp_path / "ppo")
    latest = json.loads((tmp_path / "ppo" / "checkpoints" / "latest.json").read_text())
    assert latest["num_timesteps"] == 128


# ------------------------------------------------------------------- model folders (hf_vla)
HF_PIXELS = ["task=reach", "task.obs_mode=pixels", "task.image_size=32", "policy=hf_vla",
             "algo=grpo", "policy.num_bins=8"]
EVIL_CODE = "import pathlib\npathlib.Path({marker!r}).touch()\n"


@pytest.fixture(scope="module")
def saved_policy(tmp_path_factory):
    """A LoRA ``hf_vla`` policy saved as ``save_pretrained`` writes it (8 bins), which loads."""
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from harness.policies import build_policy
    from harness.policies.hf_vla import HFVLAConfig, LoRAConfig

    config = HFVLAConfig(model="tiny:idefics3", num_bins=8,
                         lora=LoRAConfig(rank=2, target_modules=["all-linear"]))
    folder = tmp_path_factory.mktemp("hf") / "policy"
    build_policy(config, {"pixels": (32, 32, 3), "proprio": (8,), "instruction": (12,)}
                 ).save_pretrained(folder)
    compose([*HF_PIXELS, f"policy.model={folder}"])  # the untouched folder is accepted
    return folder


def _edit_json(path: Path, **fields) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def _name_code(folder: Path, marker: Path, file: str, **fields) -> None:
    """Point ``file`` at ``evil.py``, which creates ``marker`` when imported."""
    (folder / "evil.py").write_text(EVIL_CODE.format(marker=str(marker)))
    _edit_json(folder / file, **fields)


def _plant_pickle(folder: Path, marker: Path, name: str) -> None:
    """Swap the safetensors weights of ``name`` (a .bin path) for a pickle that runs code."""
    (folder / name).with_name(Path(name).stem.replace("pytorch_model", "model")
                              + ".safetensors").unlink()
    torch.save({"weights": Touch(marker)}, folder / name)


@pytest.mark.parametrize(("edit", "named"), [
    (lambda f, m: _name_code(f, m, "config.json", model_type="evil",
                             auto_map={"AutoConfig": "evil.EvilConfig"}),
     ["config.json", "auto_map", "never runs code"]),
    (lambda f, m: _name_code(f, m, "tokenizer_config.json",
                             auto_map={"AutoTokenizer": ["evil.EvilTokenizer", None]}),
     ["tokenizer_config.json", "auto_map"]),
    (lambda f, m: _plant_pickle(f, m, "pytorch_model.bin"), ["pytorch_model.bin", "safetensors"]),
    (lambda f, m: _plant_pickle(f, m, "adapter/adapter_model.bin"),
     ["adapter_model.bin", "safetensors"]),
    (lambda f, m: (f / "hf_vla.json").write_text('{"config": {}}'),
     ["hf_vla.json", "config.num_bins"]),
    (lambda f, m: (f / "hf_vla.json").write_text("{not json"), ["hf_vla.json", "not readable"]),
    (lambda f, m: _edit_json(f / "adapter" / "adapter_config.json", peft_type="PROMPT_TUNING"),
     ["adapter_config.json", "peft_type='PROMPT_TUNING'"]),
])
def test_a_crafted_model_folder_is_refused_at_config_and_runs_nothing(
        saved_policy, tmp_path, monkeypatch, edit, named):
    """Even a user who answers "y" to transformers' "run the custom code?" prompt runs nothing:
    the folder is refused by name when the config is composed, before any run folder."""
    import shutil

    monkeypatch.setattr("builtins.input", lambda *args: "y")
    folder, marker = tmp_path / "model", tmp_path / "pwned"
    shutil.copytree(saved_policy, folder)
    edit(folder, marker)
    with pytest.raises(ConfigError) as error:
        compose([*HF_PIXELS, f"policy.model={folder}"])
    for word in named:
        assert word in str(error.value)
    assert not marker.exists()


# ------------------------------------------------- dataset folders name only their own files
DATA = "data/chunk-000/file-000.parquet"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A LeRobot dataset of 2 reach demos, and a folder outside it holding a copy."""
    from harness.demos import collect_demos
    from harness.lerobot import export_lerobot

    root = tmp_path_factory.mktemp("datasets")
    collect_demos(root / "reach.hdf5", "reach", 2, obs_mode="state", max_episode_steps=20,
                  progress=False)
    export_lerobot(root / "reach.hdf5", root / "reach")
    shutil.copytree(root / "reach", root / "outside")
    return root / "reach"


def _set_info(folder: Path, **values) -> None:
    info = json.loads((folder / "meta/info.json").read_text())
    (folder / "meta/info.json").write_text(json.dumps({**info, **values}))


def _link(path: Path, target: Path) -> None:
    path.unlink()
    path.symlink_to(target)


@pytest.mark.parametrize(("edit", "match"), [
    (lambda f, out: _set_info(f, data_path=f"{out}/data/chunk-{{chunk_index:03d}}/file-"
                                           "{file_index:03d}.parquet"),
     "data_path names '/.*'; a dataset's paths are relative"),
    (lambda f, out: _set_info(f, data_path="../outside/data/chunk-{chunk_index:03d}/file-"
                                           "{file_index:03d}.parquet"),
     "data_path names '../outside.*without '..'"),
    (lambda f, out: _link(f / DATA, out / DATA), f"data_path '{DATA}' leads outside"),
    (lambda f, out: _link(f / "meta/info.json", out / "meta/info.json"),
     "'meta/info.json' leads outside"),
    (lambda f, out: _link(f / "meta/stats.json", out / "meta/stats.json"),
     "'meta/stats.json' leads outside"),
    (lambda f, out: _set_info(f, data_path="data/chunk-{chunk_index:0300000000d}/file-"
                                           "{file_index:03d}.parquet"),
     "formats {chunk_index} as '0300000000d'; expected an integer format of width <= 20"),
    (lambda f, out: _set_info(f, data_path="data/{chunk_index.__class__}.parquet"),
     "has the field {chunk_index.__class__}"),
])
def test_a_dataset_naming_files_outside_its_folder_is_refused_at_config_load(
        dataset, tmp_path, edit, match):
    from harness.lerobot import load_lerobot

    folder = Path(shutil.copytree(dataset, tmp_path / "reach", symlinks=True))
    edit(folder, dataset.parent / "outside")
    config = [*GROUP, "algo.start_policy.bc.epochs=1", f"algo.start_policy.dataset={folder}"]
    with pytest.raises(ConfigError, match=f"algo.start_policy.dataset=.*{re.escape(match)}"
                       .replace(r"\.\*", ".*")):
        compose(config)
    with pytest.raises(ValueError, match=re.escape(match).replace(r"\.\*", ".*")):
        load_lerobot(folder)
