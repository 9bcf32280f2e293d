"""Crafted SmolVLA folders are refused by name before a tensor is allocated (issue 67, items 1-3).

Each case starts from the tiny folder (``tiny:smolvla`` saved with ``save_folder``) and edits one
field or file: sizes that would build a network of many GB, zeros that divide, non-finite
ratios, negative sizes, a string for an int, a 3 GB ``config.json``, a damaged safetensors
header, a tensor of an integer dtype, NaN weights and NaN noise scales. All of them go through
training (compose, then ``trainers.train``) in one child process under a 3 GB address-space
limit; each must be refused with a ``ConfigError`` naming the file and the field or tensor, in
under 10 s, with no run folder, and the child's peak resident memory must stay under 1 GB.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from harness.policies.smolvla.architecture import CheckpointError, tiny_config
from harness.policies.smolvla.folder import HEADS_FILE, check_folder, head_shapes, read_checkpoint
from harness.policies.smolvla.model import SmolVLAModel

CHUNK, FLOW_STEPS, HIDDEN = 4, 3, 64  # the run's policy.chunk_size, flow_steps and hidden
MAX_SECONDS = 10.0  # CPU time per refusal
MAX_PEAK_MB = 1_000  # resident, over every refusal
CHILD_ADDRESS_SPACE = 3 << 30  # bytes: a regression fails the case instead of the machine
CASE_ALARM = 20  # CPU seconds before a case that was not refused is stopped
DELETE = object()

# The child: every crafted folder through training, one JSON line per case, then its peak.
CHILD = r"""
import json, resource, signal, sys, time
from pathlib import Path

resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[2]),) * 2)
import torch

torch.set_num_threads(1)
from harness import config as harness_config
from harness import trainers
import harness.policies.smolvla.model  # imported once, as any run does, not timed per case


def stop(signum, frame):
    raise TimeoutError("not refused in time")


def peak_mb():
    # VmHWM: this process's own peak (ru_maxrss would carry the forking parent's over the exec)
    status = Path("/proc/self/status").read_text().split("VmHWM:")[1]
    return int(status.split()[0]) / 1024


signal.signal(signal.SIGPROF, stop)
spec = json.loads(Path(sys.argv[1]).read_text())
for name, folder in spec["cases"].items():
    run_dir = Path(spec["runs"]) / name
    start, wall = time.process_time(), time.perf_counter()
    signal.setitimer(signal.ITIMER_PROF, spec["alarm"])  # CPU seconds: the machine may be busy
    try:
        trainers.train(harness_config.compose([*spec["overrides"], f"policy.model={folder}"]),
                       run_dir)
        error, message = None, ""
    except BaseException as caught:
        error, message = type(caught).__name__, str(caught)
    signal.setitimer(signal.ITIMER_PROF, 0)
    print(json.dumps({"case": name, "error": error, "message": message,
                      "cpu_seconds": time.process_time() - start,
                      "wall_seconds": time.perf_counter() - wall, "run_dir": run_dir.exists(),
                      "peak_mb": peak_mb()}),
          flush=True)
"""

OVERRIDES = ["task=reach", "task.obs_mode=pixels", "task.image_size=32",
             "task.max_episode_steps=9", "task.difficulty=0.1", "policy=smolvla",
             f"policy.chunk_size={CHUNK}", f"policy.flow_steps={FLOW_STEPS}",
             f"policy.hidden={HIDDEN}", "algo=grpo", "algo.group_size=2",
             "algo.num_start_states=2", "algo.iterations=1", "algo.start_policy.bc.demos=1",
             "eval.every_steps=0", "eval.final_episodes=2", "eval.episodes=2", "logger=none"]


def set_field(path: Path, key: str, value: Any) -> None:
    """Set (or with ``DELETE`` remove) the dotted ``key`` of the JSON object in ``path``."""
    config = json.loads(path.read_text())
    *parents, last = key.split(".")
    node = config
    for parent in parents:
        node = node[parent]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    path.write_text(json.dumps(config))  # NaN and inf as JavaScript's NaN and Infinity


def policy(key: str, value: Any) -> Callable[[Path], None]:
    return lambda folder: set_field(folder / "config.json", key, value)


def backbone(key: str, value: Any) -> Callable[[Path], None]:
    return lambda folder: set_field(folder / "vlm_config.json", key, value)


def default_sized_backbone(folder: Path) -> None:
    """The issue's 110-byte ``vlm_config.json``: transformers' default sizes for the rest."""
    (folder / "vlm_config.json").write_text(json.dumps({
        "model_type": "smolvlm", "text_config": {"model_type": "llama", "num_hidden_layers": 4},
        "vision_config": {}}))


def default_sized_text(folder: Path) -> None:
    """The tiny vision tower, but a text model of LLaMA's default widths (1.3e9 parameters)."""
    backbone("text_config", {"model_type": "llama", "num_hidden_layers": 4})(folder)


def three_gigabyte_config(folder: Path) -> None:
    with (folder / "config.json").open("r+b") as file:  # sparse: no disk is used
        file.truncate(3_000_000_000)


def deeply_nested_config(folder: Path) -> None:
    (folder / "vlm_config.json").write_text("[" * 500_000)


def too_many_parameters(folder: Path) -> None:
    """Every size within its bound, but 4 layers of a 16384-wide backbone with a 65536-wide MLP:
    1.8e10 parameters."""
    set_field(folder / "vlm_config.json", "text_config.hidden_size", 16_384)
    set_field(folder / "vlm_config.json", "text_config.intermediate_size", 65_536)


def weights(edit: Callable[[dict[str, torch.Tensor]], None],
            file: str = "model.safetensors") -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        tensors = load_file(str(folder / file))
        edit(tensors)
        save_file(tensors, str(folder / file))
    return apply


def damaged_header(folder: Path) -> None:
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(b"\xff" * 8 + data[8:])


def damaged_heads(folder: Path) -> None:
    (folder / HEADS_FILE).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")


def nan_at(name: str) -> Callable[[dict[str, torch.Tensor]], None]:
    def edit(tensors: dict[str, torch.Tensor]) -> None:
        tensors[name] = tensors[name].clone()
        tensors[name].view(-1)[0] = math.nan
    return edit


def integer_state_proj(tensors: dict[str, torch.Tensor]) -> None:
    tensors["model.state_proj.weight"] = tensors["model.state_proj.weight"].long()


CONFIG, VLM, WEIGHTS = r"config\.json", r"vlm_config\.json", r"model\.safetensors"
CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    # item 1: sizes that exhaust memory or time
    "default_sized_backbone": (default_sized_backbone,
                               r"resize_imgs_with_padding=\[32, 32\] cuts 1 patches of "
                               r"vision_config\.patch_size=32"),
    "default_sized_text": (default_sized_text,
                           WEIGHTS + r" does not match .* \d+ mis-shaped: \['model\.action_in_"
                           r"proj\.bias \(48,\) \(expected \(3072,\)\)'"),
    "text_layers_10000": (backbone("text_config.num_hidden_layers", 10_000),
                          VLM + r": text_config\.num_hidden_layers=10000 must be >= 1 and "
                          r"<= 256"),
    "hidden_size_1e6": (backbone("text_config.hidden_size", 10**6),
                        VLM + r": text_config\.hidden_size=1000000 must be"),
    "head_dim_1e6": (backbone("text_config.head_dim", 10**6),
                     VLM + r": text_config\.head_dim=1000000 must be"),
    "vision_layers_1e5": (backbone("vision_config.num_hidden_layers", 10**5),
                          VLM + r": vision_config\.num_hidden_layers=100000 must be"),
    "config_3gb": (three_gigabyte_config,
                   CONFIG + r" is 3000000000 bytes; a config is at most 1000000"),
    "deeply_nested_json": (deeply_nested_config, VLM + " is not readable JSON"),
    "max_state_dim_1e9": (policy("max_state_dim", 10**9),
                          CONFIG + r": max_state_dim=1000000000 must be >= 1 and <= 4096"),
    "prefix_length_1e9": (policy("prefix_length", 10**9),
                          CONFIG + r": prefix_length=1000000000 must be <= "),
    "vocab_size_1e9": (backbone("text_config.vocab_size", 10**9),
                       VLM + r": text_config\.vocab_size=1000000000 must be"),
    "too_many_parameters": (too_many_parameters,
                            r"describes a network of [\d,]+ parameters \(\d+\.\d GB in float32\),"
                            r" above the limit of 4,000,000,000 \(max_parameters\)"),
    # item 2: raw exceptions
    "no_image_size": (policy("resize_imgs_with_padding", DELETE),
                      r"resize_imgs_with_padding=None; need \[height, width\]"),
    "text_heads_0": (backbone("text_config.num_attention_heads", 0),
                     VLM + r": text_config\.num_attention_heads=0 must be >= 1"),
    "patch_size_0": (backbone("vision_config.patch_size", 0),
                     VLM + r": vision_config\.patch_size=0 must be >= 1"),
    "scale_factor_0": (backbone("scale_factor", 0), VLM + r": scale_factor=0 must be >= 1"),
    "text_layers_0": (backbone("text_config.num_hidden_layers", 0),
                      VLM + r": text_config\.num_hidden_layers=0 must be >= 1"),
    "expert_width_inf": (policy("expert_width_multiplier", math.inf),
                         CONFIG + r": expert_width_multiplier=inf must be finite"),
    "expert_width_nan": (policy("expert_width_multiplier", math.nan),
                         CONFIG + r": expert_width_multiplier=nan must be finite"),
    "negative_width": (backbone("text_config.hidden_size", -64),
                       VLM + r": text_config\.hidden_size=-64 must be >= 1"),
    "negative_action_dim": (policy("max_action_dim", -4),
                            CONFIG + r": max_action_dim=-4 must be >= 1"),
    "string_width": (backbone("text_config.hidden_size", "64"),
                     VLM + r": text_config\.hidden_size='64' is not of type int"),
    "unknown_activation": (backbone("text_config.hidden_act", "os.system"),
                           VLM + r": text_config\.hidden_act='os\.system' is not an activation"),
    "damaged_header": (damaged_header, WEIGHTS + r" is not a safetensors file: its header "
                       r"length 18446744073709551615"),
    "integer_weights": (weights(integer_state_proj),
                        WEIGHTS + r" does not match .* not of a floating-point dtype: "
                        r"\['model\.state_proj\.weight I64'\]"),
    "damaged_heads": (damaged_heads, r"harness_heads\.safetensors is not a safetensors file"),
    # item 3: non-finite values
    "nan_weights": (weights(nan_at("model.state_proj.weight")),
                    WEIGHTS + r" holds NaN or infinite values in 1 tensors: "
                    r"\['model\.state_proj\.weight'\]"),
    "nan_noise_scales": (weights(nan_at("noise_logit"), HEADS_FILE),
                         r"harness_heads\.safetensors holds NaN or infinite values in 1 tensors: "
                         r"\['noise_logit'\]"),
}


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    """The tiny SmolVLA of the run's chunk size, with noise scales and a value head beside it."""
    torch.manual_seed(0)
    model = SmolVLAModel(tiny_config(chunk_size=CHUNK))
    folder = model.save_folder(tmp_path_factory.mktemp("smolvla") / "tiny")
    save_file({name: torch.zeros(shape) for name, shape
               in head_shapes(FLOW_STEPS, HIDDEN, model.config).items()},
              str(folder / HEADS_FILE))
    return folder


def crafted(tiny_folder: Path, target: Path, edit: Callable[[Path], None]) -> Path:
    target.mkdir(parents=True)
    for path in tiny_folder.iterdir():
        (target / path.name).write_bytes(path.read_bytes())
    edit(target)
    return target


def test_crafted_folders_are_refused_by_name_before_a_run_folder_in_little_memory(tiny_folder,
                                                                                  tmp_path):
    folders = {name: str(crafted(tiny_folder, tmp_path / "folders" / name, edit))
               for name, (edit, _) in CASES.items()}
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"cases": folders, "runs": str(tmp_path / "runs"),
                                "overrides": OVERRIDES, "alarm": CASE_ALARM}))
    child = subprocess.run([sys.executable, "-c", CHILD, str(spec), str(CHILD_ADDRESS_SPACE)],
                           capture_output=True, text=True, timeout=1_800,
                           env={**os.environ, "HARNESS_DATA": str(tmp_path / "data")})
    results = {line["case"]: line for line in map(json.loads, child.stdout.splitlines())}
    for name, result in results.items():  # shown by pytest -rA
        print(f"{name}: {result['error']} in {result['cpu_seconds']:.2f} s CPU, peak "
              f"{result['peak_mb']:.0f} MB")
    assert set(results) == set(CASES), child.stderr[-3000:]
    for name, (_, message) in CASES.items():
        result = results[name]
        assert result["error"] == "ConfigError", (name, result)
        assert f"policy.model='{folders[name]}'" in result["message"], (name, result)
        assert re.search(message, result["message"]), (name, result["message"])
        assert result["cpu_seconds"] < MAX_SECONDS, (name, result["cpu_seconds"])
        assert not result["run_dir"], name
    peak = max(result["peak_mb"] for result in results.values())
    assert peak < MAX_PEAK_MB, peak


def test_the_parameter_limit_is_an_argument(tiny_folder):
    assert check_folder(tiny_folder, SmolVLAModel).arch.chunk_size == CHUNK
    with pytest.raises(CheckpointError, match=r"network of [\d,]+ parameters .* above the limit "
                                              r"of 1,000 \(max_parameters\)"):
        SmolVLAModel.from_folder(tiny_folder, max_parameters=1_000)


def test_the_header_is_checked_before_any_tensor_is_read(tiny_folder, tmp_path, monkeypatch):
    """A folder whose header does not match its config is refused without reading tensors."""
    import safetensors.torch

    folder = crafted(tiny_folder, tmp_path / "wide", default_sized_text)
    monkeypatch.setattr(safetensors.torch, "load_file",
                        lambda *args, **kwargs: pytest.fail("tensors were read"))
    with pytest.raises(CheckpointError, match="mis-shaped"):
        read_checkpoint(folder, SmolVLAModel)
