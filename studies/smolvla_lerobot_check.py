"""Our half of the SmolVLA compatibility check: LeRobot's folders in our model, ours for LeRobot.

usage: python studies/smolvla_lerobot_check.py --work DIR [--tolerance 1e-5] [--seed 100]
       python studies/smolvla_lerobot_check.py --work DIR --exported FOLDER

Run after ``studies/smolvla_lerobot_side.py make --work DIR`` (in a venv with ``lerobot``). For
each variant folder ``DIR/<variant>``: loads ``lerobot/`` (saved by LeRobot's
``save_pretrained``) with ``SmolVLAModel.from_folder``, feeds it the inputs and noise of
``lerobot.npz`` and prints the largest absolute difference from LeRobot's action chunks and
flow-matching losses. Then it moves every parameter by seeded noise (so that no tensor is left
as LeRobot initialised it, RMSNorm weights included), saves the result with ``save_folder`` in
``ours/`` and writes our outputs for the same inputs to ``ours.npz``, for
``smolvla_lerobot_side.py load --work DIR`` to check in LeRobot. Exits 1 when a difference
exceeds ``--tolerance``.

With ``--exported FOLDER`` (a fine-tuned policy written back by ``scripts/export_policy.py
format=lerobot``) it writes inputs shaped by that folder and our outputs under both patch rules to
``DIR/exported.npz``, for ``smolvla_lerobot_side.py load-exported --work DIR`` to compare with
LeRobot's ``SmolVLAPolicy.from_pretrained`` of the same folder.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from harness.policies.smolvla.model import SmolVLAModel


def our_outputs(model: SmolVLAModel, data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Our action chunk (from the saved noise) and per-element flow losses (saved noise and
    times) on the saved inputs."""
    tensors = {key: torch.from_numpy(value) for key, value in data.items()
               if value.dtype.kind != "U"}
    images = [tensors["image_front"], tensors["image_wrist"]]
    masks = [tensors["mask_front"], tensors["mask_wrist"]]
    common = (images, tensors["lang_tokens"], tensors["lang_masks"], tensors["state"])
    with torch.no_grad():
        sample = model.sample_actions(*common, noise=tensors["noise"], img_masks=masks)
        losses = model.flow_loss(*common, tensors["actions"], noise=tensors["train_noise"],
                                 time=tensors["time"], img_masks=masks, reduction="none")
    return {"ours_sample": sample.numpy(), "ours_losses": losses.numpy()}


def patch_rule(transformers_version: str) -> str:
    """The patch-position rule of the ``transformers`` that LeRobot ran with."""
    return "shifted" if int(transformers_version.split(".")[0]) < 5 else "exact"


def differences(model: SmolVLAModel, lerobot: dict[str, np.ndarray]) -> dict[str, float]:
    """Largest absolute difference of each of our outputs from LeRobot's."""
    return {key: float(np.abs(value - lerobot[key.replace("ours_", "lerobot_")]).max())
            for key, value in our_outputs(model, lerobot).items()}


def check_variant(folder: Path, seed: int) -> float:
    """Compare with LeRobot on ``folder/lerobot``; write ``folder/ours`` and ``ours.npz``.

    Our model uses the patch-position rule of LeRobot's ``transformers``; the differences under
    the other rule are printed too, to show what that rule alone changes.

    Returns:
        The largest absolute difference from LeRobot's outputs under the matching rule.
    """
    lerobot = dict(np.load(folder / "lerobot.npz"))
    rule = patch_rule(str(lerobot["version_transformers"]))
    other = "exact" if rule == "shifted" else "shifted"
    model = SmolVLAModel.from_folder(folder / "lerobot", patch_positions=rule)
    found = differences(model, lerobot)
    unmatched = differences(SmolVLAModel.from_folder(folder / "lerobot", patch_positions=other),
                            lerobot)
    for key, difference in found.items():
        print(f"{folder.name}: our load of LeRobot's folder, {key}: max |diff| = "
              f"{difference:.3g} with patch_positions={rule!r} ({unmatched[key]:.3g} with "
              f"{other!r}; LeRobot's values up to "
              f"{np.abs(lerobot[key.replace('ours_', 'lerobot_')]).max():.3g})")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    model.save_folder(folder / "ours", overwrite=True)
    inputs = {key: value for key, value in lerobot.items() if not key.startswith("lerobot_")}
    np.savez(folder / "ours.npz", **inputs, **our_outputs(model, inputs))
    return max(found.values())


def exported_inputs(folder: Path, seed: int) -> dict[str, np.ndarray]:
    """Inputs shaped by an exported folder's ``config.json`` and ``vlm_config.json``: two
    samples of its one camera in [-1, 1], instruction ids of its vocabulary (the second with
    two padding slots), state, sampling noise, demonstrated actions, training noise and times."""
    policy = json.loads((folder / "config.json").read_text())
    vlm = json.loads((folder / "vlm_config.json").read_text())
    cameras = [k for k, v in policy["input_features"].items() if v["type"] == "VISUAL"]
    if len(cameras) != 1:
        raise SystemExit(f"{folder}: expected one camera feature, found {cameras}")
    image = tuple(policy["input_features"][cameras[0]]["shape"])
    chunk, state, action = (policy["chunk_size"], policy["max_state_dim"],
                            policy["max_action_dim"])
    rng = np.random.default_rng(seed)
    masks = np.ones((2, 5), dtype=bool)
    masks[1, -2:] = False

    def normal(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    return {"image_front": rng.uniform(-1, 1, (2, *image)).astype(np.float32),
            "mask_front": np.ones(2, dtype=bool),
            "lang_tokens": rng.integers(7, vlm["text_config"]["vocab_size"], (2, 5)),
            "lang_masks": masks, "state": normal(2, state), "noise": normal(2, chunk, action),
            "actions": rng.uniform(-1, 1, (2, chunk, action)).astype(np.float32),
            "train_noise": normal(2, chunk, action), "time": np.array([0.3, 0.85], np.float32)}


def check_exported(folder: Path, work: Path, seed: int) -> int:
    """Our outputs of a folder written by ``export_policy.py format=lerobot`` under both patch
    rules, in ``work/exported.npz`` for ``smolvla_lerobot_side.py load-exported`` to compare."""
    if not (folder / "vlm_config.json").is_file():
        raise SystemExit(f"{folder} has no vlm_config.json: not a folder written by "
                         "export_policy.py format=lerobot")
    inputs = exported_inputs(folder, seed)
    tensors = {key: torch.from_numpy(value) for key, value in inputs.items()}
    common = ([tensors["image_front"]], tensors["lang_tokens"], tensors["lang_masks"],
              tensors["state"])
    outputs = {}
    for rule in ("exact", "shifted"):
        model = SmolVLAModel.from_folder(folder, patch_positions=rule)
        with torch.no_grad():
            outputs[f"ours_sample_{rule}"] = model.sample_actions(
                *common, noise=tensors["noise"], img_masks=[tensors["mask_front"]]).numpy()
            outputs[f"ours_losses_{rule}"] = model.flow_loss(
                *common, tensors["actions"], noise=tensors["train_noise"], time=tensors["time"],
                img_masks=[tensors["mask_front"]], reduction="none").numpy()
    work.mkdir(parents=True, exist_ok=True)
    np.savez(work / "exported.npz", folder=np.array(str(folder.resolve())), **inputs, **outputs)
    print(f"{work / 'exported.npz'}: inputs and our outputs of {folder} "
          f"({sum(p.numel() for p in model.parameters())} parameters)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True,
                        help="the folder smolvla_lerobot_side.py make wrote")
    parser.add_argument("--tolerance", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=100, help="of the parameter noise")
    parser.add_argument("--exported", type=Path, default=None,
                        help="instead: a folder written by export_policy.py format=lerobot")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.exported is not None:
        return check_exported(args.exported, args.work, args.seed)
    variants = sorted(path.parent for path in args.work.glob("*/lerobot.npz"))
    if not variants:
        parser.error(f"{args.work} holds no <variant>/lerobot.npz; run "
                     "smolvla_lerobot_side.py make first")
    worst = max(check_variant(folder, args.seed + i) for i, folder in enumerate(variants))
    lerobot = np.load(variants[0] / "lerobot.npz")
    print(f"worst {worst:.3g} (tolerance {args.tolerance}); LeRobot side: " + ", ".join(
        f"{key[8:]} {lerobot[key]}" for key in lerobot.files if key.startswith("version_")))
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
