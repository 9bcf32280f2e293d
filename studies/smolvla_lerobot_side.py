"""LeRobot's half of the SmolVLA compatibility check: run in a venv that has ``lerobot``.

usage: <lerobot venv>/bin/python studies/smolvla_lerobot_side.py make --work DIR [--skip-groot]
       <lerobot venv>/bin/python studies/smolvla_lerobot_side.py load --work DIR [--skip-groot]
       <lerobot venv>/bin/python studies/smolvla_lerobot_side.py load-exported --work DIR

``make`` saves a tiny SmolVLM backbone (config, word-level tokenizer, processor) in
``DIR/tiny-smolvlm`` and, for each variant of :data:`VARIANTS`, builds a random
``SmolVLAPolicy`` with LeRobot's own classes on that backbone (``vlm_model_name`` = that folder,
``load_vlm_weights=False``: no hub), saves it with ``save_pretrained`` in ``DIR/<variant>/lerobot``
and writes fixed inputs, noise, flow times and LeRobot's outputs (``sample_actions`` chunks and
the per-element flow-matching losses) to ``DIR/<variant>/lerobot.npz``. It also loads the
weights of :func:`fixed_state` into each policy (``strict=True``) and writes LeRobot's outputs on
:func:`fixed_inputs` to ``DIR/golden.json``: both are made by integer hashing, so
``tests/test_smolvla.py`` rebuilds them and checks our outputs against a copy of that file in
``tests/fixtures/`` without LeRobot or stored tensors. Our side,
``studies/smolvla_lerobot_check.py``, loads those folders with ``SmolVLAModel.from_folder``,
compares, and saves folders of its own in ``DIR/<variant>/ours`` with ``ours.npz``; ``load`` then
loads each of ours with ``SmolVLAPolicy.from_pretrained(..., strict=True)`` and compares LeRobot's
outputs with ours. ``load-exported`` does the same for a fine-tuned policy written back by
``scripts/export_policy.py format=lerobot`` (:func:`load_exported`). docs/smolvla.md gives the
versions and commands.

Nothing here imports this repository, so it runs in the LeRobot venv alone.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

VARIANTS: dict[str, dict] = {
    # backbone of 6 layers cut to 4; the expert cross-attends on odd layers
    "cross": {"attention_mode": "cross_attn", "num_vlm_layers": 4, "num_expert_layers": -1,
              "self_attn_every_n_layers": 2},
    # 2 expert layers for 4 backbone layers: backbone layers 1 and 3 leave the actions alone
    "half_expert": {"attention_mode": "cross_attn", "num_vlm_layers": 4, "num_expert_layers": 2,
                    "self_attn_every_n_layers": 4},
    # every layer joint self-attention
    "self": {"attention_mode": "self_attn", "num_vlm_layers": 4, "num_expert_layers": -1,
             "self_attn_every_n_layers": 2},
}
IMAGE, CHUNK, STATE, ACTION, BATCH, WORDS, VOCAB = 32, 8, 6, 4, 2, 7, 96
SPECIAL = {"fake_image_token": "<fake_token_around_image>", "image_token": "<image>",
           "global_image_token": "<global-img>", "end_of_utterance_token": "<end_of_utterance>"}
TOLERANCE = 1e-5


def allow_torchvision_without_its_ops() -> None:
    """Let ``import torchvision`` succeed when its C++ ops cannot load.

    PyPI's torchvision wheels are CUDA builds; against a CPU-only torch their ops library does
    not load, and torchvision 0.28 then fails at import registering fake kernels for ``nms`` and
    ``qnms``. LeRobot imports torchvision (dataset transforms) but SmolVLA runs none of its ops,
    so declaring those two schemas is enough.
    """
    import importlib.util

    import torch

    spec = importlib.util.find_spec("torchvision")
    done = hasattr(allow_torchvision_without_its_ops, "library")
    if done or spec is None or spec.submodule_search_locations is None:
        return
    extension = next(Path(spec.submodule_search_locations[0]).glob("_C*.so"), None)
    try:
        if extension is not None:
            torch.ops.load_library(str(extension))
            return
    except OSError:
        pass
    library = torch.library.Library("torchvision", "DEF")  # noqa: TOR901 (kept alive below)
    for op in ("nms", "qnms"):
        library.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    allow_torchvision_without_its_ops.library = library


def skip_groot_package() -> None:
    """Import LeRobot 0.4.4's ``lerobot.policies`` under ``transformers`` 5.

    That package's ``__init__`` imports every policy, and GR00T's model module does not import
    under transformers 5 (LeRobot 0.4.4 pins transformers < 5). Registering ``groot`` as a bare
    package lets ``__init__`` import its config module alone; SmolVLA does not touch GR00T.
    """
    import importlib.util
    import types

    spec = importlib.util.find_spec("lerobot")
    groot = types.ModuleType("lerobot.policies.groot")
    groot.__path__ = [str(Path(spec.submodule_search_locations[0]) / "policies" / "groot")]
    sys.modules["lerobot.policies.groot"] = groot


def save_backbone(folder: Path, vlm: dict | None = None) -> None:
    """A tiny SmolVLM config and processor (word-level tokenizer) in ``folder``; with ``vlm``
    (a backbone config dict, e.g. an exported folder's ``vlm_config.json``) that config and a
    processor sized to it instead."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, SmolVLMConfig, SmolVLMProcessor
    from transformers.models.smolvlm import SmolVLMImageProcessor, SmolVLMVideoProcessor

    vocab = VOCAB if vlm is None else vlm["text_config"]["vocab_size"]
    image = IMAGE if vlm is None else vlm["vision_config"]["image_size"]
    words = ["<pad>", "<unk>", "<s>", *SPECIAL.values()] + [f"w{i}" for i in range(vocab - 7)]
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, "<unk>")),
        pad_token="<pad>", unk_token="<unk>", bos_token="<s>", extra_special_tokens=SPECIAL)
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    patch = 8 if vlm is None else vlm["vision_config"]["patch_size"]
    scale = 2 if vlm is None else vlm["scale_factor"]
    processor = SmolVLMProcessor(
        image_processor=SmolVLMImageProcessor(size={"longest_edge": image},
                                              max_image_size={"longest_edge": image}),
        tokenizer=tokenizer, video_processor=SmolVLMVideoProcessor(),
        image_seq_len=(image // patch) ** 2 // scale**2)
    processor.save_pretrained(folder)
    if vlm is not None:
        SmolVLMConfig.from_dict(vlm).save_pretrained(folder)
        return
    config = SmolVLMConfig(
        text_config={"model_type": "llama", "vocab_size": VOCAB, "hidden_size": 64,
                     "intermediate_size": 128, "num_hidden_layers": 6, "num_attention_heads": 4,
                     "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-5,
                     "max_position_embeddings": 512, "pad_token_id": 0, "tie_word_embeddings":
                     False},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                       "num_attention_heads": 2, "image_size": IMAGE, "patch_size": patch},
        scale_factor=scale, image_token_id=words.index("<image>"), tie_word_embeddings=False)
    config.save_pretrained(folder)


def policy_config(backbone: Path, variant: dict):
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig

    features = {f"observation.images.{camera}": PolicyFeature(FeatureType.VISUAL,
                                                              (3, IMAGE, IMAGE))
                for camera in ("front", "wrist")}
    features["observation.state"] = PolicyFeature(FeatureType.STATE, (STATE,))
    return SmolVLAConfig(
        input_features=features, device="cpu", chunk_size=CHUNK, n_action_steps=CHUNK,
        output_features={"action": PolicyFeature(FeatureType.ACTION, (ACTION,))},
        max_state_dim=STATE, max_action_dim=ACTION, vlm_model_name=str(backbone),
        load_vlm_weights=False, resize_imgs_with_padding=(IMAGE, IMAGE), push_to_hub=False,
        **variant)


def uniform(count: int, stream: int) -> np.ndarray:
    """``count`` values in [-1, 1) by splitmix64 over ``(stream, index)``: integer arithmetic,
    so every machine and library version gets the same float32 values, no generator needed."""
    with np.errstate(over="ignore"):  # wrapping uint64 arithmetic is the point
        z = np.arange(count, dtype=np.uint64) + np.uint64(stream) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return ((z >> np.uint64(11)).astype(np.float64) * 2.0**-52 - 1.0).astype(np.float32)


def fixed_state(shapes: dict[str, tuple[int, ...]]) -> dict:
    """Weights for a network with these tensor shapes from :func:`uniform`: RMSNorm weights
    ``1 + 0.1 u``, everything else ``0.15 u``, one stream per name in sorted order."""
    import torch

    state = {}
    for stream, name in enumerate(sorted(shapes)):
        values = uniform(int(np.prod(shapes[name], dtype=np.int64)), stream)
        values = 1 + 0.1 * values if name.endswith("norm.weight") else 0.15 * values
        state[name] = torch.from_numpy(values.reshape(shapes[name]))
    return state


def fixed_inputs() -> dict:
    """Model inputs from :func:`uniform`: two cameras (the second absent in sample 1), language
    with two padding tokens in sample 1, state, sampling noise, demonstrated actions, training
    noise and flow times."""
    import torch

    def values(stream: int, *shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.from_numpy(scale * uniform(int(np.prod(shape)), 10_000 + stream)
                                .reshape(shape))

    lang_masks = torch.ones(BATCH, WORDS, dtype=torch.bool)
    lang_masks[1, -2:] = False
    tokens = ((values(2, BATCH, WORDS) + 1) / 2 * (VOCAB - 7)).long() + 7
    return {
        "image_front": values(0, BATCH, 3, IMAGE, IMAGE),
        "image_wrist": values(1, BATCH, 3, IMAGE, IMAGE),
        "mask_front": torch.ones(BATCH, dtype=torch.bool),
        "mask_wrist": torch.tensor([True, False]),
        "lang_tokens": tokens.clamp(max=VOCAB - 1),
        "lang_masks": lang_masks,
        "state": values(3, BATCH, STATE, scale=1.7),
        "noise": values(4, BATCH, CHUNK, ACTION, scale=1.7),
        "actions": values(5, BATCH, CHUNK, ACTION, scale=1.7),
        "train_noise": values(6, BATCH, CHUNK, ACTION, scale=1.7),
        "time": torch.tensor([0.3, 0.85]),
    }


def lerobot_outputs(flow, data: dict) -> dict:
    """``sample_actions`` and the per-element losses of LeRobot's ``VLAFlowMatching``."""
    import torch

    images, masks = [data["image_front"], data["image_wrist"]], [data["mask_front"],
                                                                 data["mask_wrist"]]
    with torch.no_grad():
        actions = flow.sample_actions(images, masks, data["lang_tokens"], data["lang_masks"],
                                      data["state"], noise=data["noise"].clone())
        losses = flow.forward(images, masks, data["lang_tokens"], data["lang_masks"],
                              data["state"], data["actions"], data["train_noise"].clone(),
                              data["time"].clone())
    return {"lerobot_sample": actions, "lerobot_losses": losses}


def versions() -> dict:
    """The versions this side ran with, stored in each ``lerobot.npz``."""
    from importlib.metadata import version

    return {f"version_{name}": np.array(version(name))
            for name in ("lerobot", "transformers", "torch")}


def verdict(worst: float) -> int:
    """Print the largest difference against :data:`TOLERANCE` with this side's versions; the
    exit status: 0 within it, else 1."""
    print(f"worst {worst:.3g} (tolerance {TOLERANCE}); " + ", ".join(
        f"{key[8:]} {value}" for key, value in versions().items()))
    return 0 if worst <= TOLERANCE else 1


def make(work: Path) -> int:
    import torch
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

    backbone = work / "tiny-smolvlm"
    save_backbone(backbone)
    golden = {}
    for seed, (name, variant) in enumerate(VARIANTS.items()):
        torch.manual_seed(seed)
        policy = SmolVLAPolicy(policy_config(backbone.resolve(), variant)).eval()
        policy.save_pretrained(work / name / "lerobot")
        data = fixed_inputs()
        data.update(lerobot_outputs(policy.model, data))
        np.savez(work / name / "lerobot.npz", **{k: v.numpy() for k, v in data.items()},
                 **versions())
        print(f"{name}: saved {work / name / 'lerobot'} and lerobot.npz")
        policy.load_state_dict(fixed_state({key: tuple(value.shape) for key, value
                                            in policy.state_dict().items()}), strict=True)
        policy_json = json.loads((work / name / "lerobot" / "config.json").read_text())
        outputs = lerobot_outputs(policy.model, fixed_inputs())
        golden[name] = {"policy": {**policy_json, "vlm_model_name": backbone.name},
                        **{key[8:]: value.tolist() for key, value in outputs.items()}}
    (work / "golden.json").write_text(json.dumps({
        "versions": {key[8:]: str(value) for key, value in versions().items()},
        "vlm": json.loads((backbone / "config.json").read_text()), "variants": golden}) + "\n")
    print(f"saved {work / 'golden.json'}: outputs of fixed_state weights on fixed_inputs")
    return 0


def load(work: Path) -> int:
    import torch
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

    worst = 0.0
    for name in VARIANTS:
        policy = SmolVLAPolicy.from_pretrained(work / name / "ours", strict=True)
        saved = dict(np.load(work / name / "ours.npz"))
        data = {key: torch.from_numpy(value) for key, value in saved.items()
                if not key.startswith("version_")}
        for key, value in lerobot_outputs(policy.model, data).items():
            ours = key.replace("lerobot_", "ours_")
            difference = float(np.abs(value.numpy() - saved[ours]).max())
            worst = max(worst, difference)
            print(f"{name}: LeRobot loading our folder, {key} vs {ours}: max |diff| = "
                  f"{difference:.3g}")
    return verdict(worst)


def load_exported(work: Path) -> int:
    """Load the folder named in ``work/exported.npz`` (written by ``export_policy.py
    format=lerobot``; ``smolvla_lerobot_check.py --exported``) with ``from_pretrained(...,
    strict=True)`` and compare LeRobot's chunks and losses with ours under this side's patch
    rule. The tiny backbone is no hub id, so its config (the folder's ``vlm_config.json``) and a
    processor go to ``work/exported-backbone`` and a copy of the folder names it."""
    import shutil
    from importlib.metadata import version

    import torch
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

    saved = dict(np.load(work / "exported.npz"))
    folder = Path(str(saved.pop("folder")))
    backbone, copy = work / "exported-backbone", work / "exported-for-lerobot"
    save_backbone(backbone, json.loads((folder / "vlm_config.json").read_text()))
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(folder, copy)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config,
                                                  "vlm_model_name": str(backbone.resolve())}))
    policy = SmolVLAPolicy.from_pretrained(copy, strict=True).eval()
    data = {key: torch.from_numpy(value) for key, value in saved.items()
            if not key.startswith("ours_")}
    images, masks = [data["image_front"]], [data["mask_front"]]
    with torch.no_grad():
        sample = policy.model.sample_actions(images, masks, data["lang_tokens"],
                                             data["lang_masks"], data["state"],
                                             noise=data["noise"].clone())
        losses = policy.model.forward(images, masks, data["lang_tokens"], data["lang_masks"],
                                      data["state"], data["actions"], data["train_noise"].clone(),
                                      data["time"].clone())
    rule = "shifted" if int(version("transformers").split(".")[0]) < 5 else "exact"
    worst = 0.0
    for key, value in (("sample", sample), ("losses", losses)):
        difference = float(np.abs(value.numpy() - saved[f"ours_{key}_{rule}"]).max())
        worst = max(worst, difference)
        print(f"LeRobot loading {folder.name}: {key} vs ours (patch_positions={rule!r}): "
              f"max |diff| = {difference:.3g} (values up to {float(value.abs().max()):.3g})")
    return verdict(worst)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("make", "load", "load-exported"))
    parser.add_argument("--work", type=Path, required=True, help="folder of the check's files")
    parser.add_argument("--skip-groot", action="store_true",
                        help="for LeRobot 0.4.4 under transformers 5: see skip_groot_package")
    args = parser.parse_args(argv)
    allow_torchvision_without_its_ops()
    if args.skip_groot:
        skip_groot_package()
    args.work.mkdir(parents=True, exist_ok=True)
    commands = {"make": make, "load": load, "load-exported": load_exported}
    return commands[args.command](args.work)


if __name__ == "__main__":
    sys.exit(main())
