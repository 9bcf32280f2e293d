"""SmolVLA in LeRobot's layout (``harness.policies.smolvla``): the pure pieces against values
worked out by hand, the tiny model offline, its folder round trip and refusals, deterministic
sampling, a falling flow-matching loss, and LeRobot's own outputs on fixed weights.

The LeRobot outputs (``tests/fixtures/smolvla_lerobot_transformers{4,5}.json``) were computed by
``studies/smolvla_lerobot_side.py make`` with LeRobot's classes (versions inside each file): each
variant's network gets the weights of ``fixed_state`` and the inputs of ``fixed_inputs``, both
made by integer hashing, so this test rebuilds them without LeRobot or any stored tensor.
"""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from harness.policies.smolvla.architecture import CheckpointError, SmolVLAConfig, tiny_config
from harness.policies.smolvla.layers import (
    attention_mask_2d,
    grouped_attention,
    patch_positions,
    rotary,
)
from harness.policies.smolvla.model import (
    SmolVLAModel,
    sample_flow_time,
    sinusoidal_time_embedding,
)

side = importlib.import_module("studies.smolvla_lerobot_side")
FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("smolvla_lerobot_*.json"))
B, CHUNK, STATE, ACTION = 2, 8, 6, 4


def batch(seed: int = 0) -> dict:
    """Inputs for :func:`tiny_config`'s network: one 32 x 32 camera, 5 words (2 padded in the
    second sample), a 5-wide state (padded to 6 inside)."""
    generator = torch.Generator().manual_seed(seed)
    masks = torch.ones(B, 5, dtype=torch.bool)
    masks[1, 3:] = False
    return {"images": [torch.rand(B, 3, 32, 32, generator=generator) * 2 - 1],
            "lang_tokens": torch.randint(4, 96, (B, 5), generator=generator),
            "lang_masks": masks, "state": torch.randn(B, STATE - 1, generator=generator)}


def noise(seed: int = 1) -> torch.Tensor:
    return torch.randn(B, CHUNK, ACTION, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def tiny() -> SmolVLAModel:
    torch.manual_seed(0)
    return SmolVLAModel(tiny_config()).eval()


@pytest.fixture(scope="module")
def saved(tiny, tmp_path_factory) -> Path:
    return tiny.save_folder(tmp_path_factory.mktemp("smolvla") / "policy")


# --- pure pieces -------------------------------------------------------------------------------

def test_attention_mask_2d_is_prefix_lm_over_real_tokens():
    pads = torch.tensor([[True, True, True, True, False]])
    starts = torch.tensor([[0, 0, 1, 1, 1]])
    expected = torch.tensor([[1, 1, 0, 0, 0],   # the first block sees itself only
                             [1, 1, 0, 0, 0],
                             [1, 1, 1, 0, 0],   # then causal
                             [1, 1, 1, 1, 0],
                             [0, 0, 0, 0, 0]],  # padding sees nothing and is never seen
                            dtype=torch.bool)
    assert torch.equal(attention_mask_2d(pads, starts)[0], expected)


def test_rotary_rotates_each_pair_by_position_over_its_wavelength():
    x = torch.tensor([1.0, 0.0, 0.0, 2.0]).view(1, 1, 1, 4)  # pairs (x0, x2) and (x1, x3)
    out = rotary(x, torch.tensor([[3]]), wavelength=100.0).view(4)
    # pair k turns by 3 / 100^(2k/4): 3 rad, then 0.3 rad
    expected = torch.tensor([math.cos(3), -2 * math.sin(0.3), math.sin(3), 2 * math.cos(0.3)])
    torch.testing.assert_close(out, expected)
    q, k = torch.randn(2, 1, 2, 8).split(1)
    dots = [(rotary(q, torch.tensor([[m]])) * rotary(k, torch.tensor([[m - 4]]))).sum()
            for m in (4, 9, 30)]
    torch.testing.assert_close(torch.stack(dots), dots[0].expand(3), atol=1e-5, rtol=0)


def test_grouped_attention_matches_torch_with_repeated_key_value_heads():
    q, mask = torch.randn(2, 5, 4, 8), torch.rand(2, 5, 7) > 0.3
    mask[..., 0] = True
    k, v = torch.randn(2, 7, 2, 8), torch.randn(2, 7, 2, 8)
    reference = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.repeat_interleave(2, dim=2).transpose(1, 2),
        v.repeat_interleave(2, dim=2).transpose(1, 2), attn_mask=mask[:, None])
    torch.testing.assert_close(grouped_attention(q, k, v, mask),
                               reference.transpose(1, 2).reshape(2, 5, 32))


def test_time_embedding_by_hand():
    # periods 1 and 4 (dim 4): t = 0.25 is a quarter turn of the first, 1/16 of the second
    out = sinusoidal_time_embedding(torch.tensor([0.25]), 4, 1.0, 4.0)
    torch.testing.assert_close(out[0], torch.tensor(
        [1.0, math.sin(math.pi / 8), 0.0, math.cos(math.pi / 8)], dtype=torch.float64))


def test_flow_time_is_beta_1_5_1_scaled():
    times = sample_flow_time(200_000, torch.Generator().manual_seed(0))
    assert 0.001 <= times.min() and times.max() <= 1.0
    # Beta(1.5, 1): mean 0.6, P(t < 0.5) = 0.5 ** 1.5; 4 standard errors
    assert abs(times.mean().item() - (0.6 * 0.999 + 0.001)) < 4 * 0.2 / math.sqrt(200_000)
    below = (times < 0.001 + 0.999 * 0.5).float().mean().item()
    assert abs(below - 0.5**1.5) < 4 * math.sqrt(0.354 * 0.646 / 200_000)


def test_patch_positions_exact_and_shifted_rules():
    assert patch_positions(4, 4, 4, "exact").tolist() == list(range(16))
    assert patch_positions(4, 1, 4, "shifted").tolist() == [0, 0, 4, 8]  # rows 0, 0, 1, 2
    # a 2 x 2 grid on a 4 x 4 table: rows at 0 and 1/2
    assert patch_positions(2, 2, 4, "exact").tolist() == [0, 2, 8, 10]
    assert patch_positions(2, 2, 4, "shifted").tolist() == [0, 1, 4, 5]


# --- the network -------------------------------------------------------------------------------

def test_tiny_model_has_lerobots_parameter_names(tiny):
    shapes = {name: tuple(value.shape) for name, value in tiny.state_dict().items()}
    expert = "model.vlm_with_expert.lm_expert.layers"
    assert shapes["model.state_proj.weight"] == (64, STATE)
    assert shapes["model.action_in_proj.weight"] == (48, ACTION)
    assert shapes["model.action_out_proj.weight"] == (ACTION, 48)
    assert shapes["model.action_time_mlp_in.weight"] == (48, 96)
    assert shapes["model.action_time_mlp_out.weight"] == (48, 48)
    assert shapes[f"{expert}.0.self_attn.k_proj.weight"] == (32, 48)  # self-attention layer
    assert shapes[f"{expert}.1.self_attn.k_proj.weight"] == (32, 32)  # reads backbone keys
    assert shapes[f"{expert}.1.mlp.up_proj.weight"] == (256, 48)
    assert "model.vlm_with_expert.vlm.lm_head.weight" in shapes
    assert not any("lm_expert.embed_tokens" in name for name in shapes)
    assert sum(".text_model.layers." in name and name.endswith("q_proj.weight")
               for name in shapes) == 4


@pytest.mark.skipif(int(transformers.__version__.split(".")[0]) < 5,
                    reason="the exact rule is transformers 5's")
def test_vision_tower_with_the_exact_rule_is_the_installed_transformers_tower(tiny):
    parts = tiny.model.vlm_with_expert
    pixels = batch()["images"][0]
    with torch.no_grad():
        theirs = parts.backbone.connector(
            parts.backbone.vision_model(pixel_values=pixels).last_hidden_state)
        torch.testing.assert_close(parts.embed_image(pixels), theirs, rtol=0, atol=1e-6)


def test_sample_actions_is_deterministic_given_noise(tiny):
    with torch.no_grad():
        first = tiny.sample_actions(**batch(), noise=noise())
        again = tiny.sample_actions(**batch(), noise=noise())
        other = tiny.sample_actions(**batch(), noise=noise(seed=2))
        drawn = [tiny.sample_actions(**batch(), generator=torch.Generator().manual_seed(5))
                 for _ in range(2)]
    assert first.shape == (B, CHUNK, ACTION)
    assert torch.equal(first, again) and torch.equal(drawn[0], drawn[1])
    assert not torch.allclose(first, other)


def test_one_euler_step_is_noise_minus_velocity_at_time_one(tiny):
    inputs = batch()
    with torch.no_grad():
        cache, pads = tiny.encode(**inputs)
        velocity = tiny.velocity(cache, pads, noise(), torch.ones(B))
        torch.testing.assert_close(tiny.sample_actions(**inputs, noise=noise(), num_steps=1),
                                   noise() - velocity, rtol=0, atol=0)


def test_flow_loss_falls_when_training_on_a_fixed_target():
    torch.manual_seed(0)
    model = SmolVLAModel(tiny_config()).train()
    inputs, target = batch(), torch.randn(B, CHUNK, ACTION) * 0.5
    fixed = {"noise": noise(), "time": torch.tensor([0.3, 0.8])}
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        loss = model.flow_loss(**inputs, actions=target, **fixed)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    assert losses[-1] < 0.3 * losses[0], losses


# --- folders -----------------------------------------------------------------------------------

def test_save_then_load_gives_identical_outputs(tiny, saved):
    assert sorted(path.name for path in saved.iterdir()) == ["config.json", "model.safetensors",
                                                             "vlm_config.json"]
    assert [path.name for path in saved.parent.iterdir()] == ["policy"]  # no staging left
    assert json.loads((saved / "config.json").read_text()) == tiny.config.policy
    loaded = SmolVLAModel.from_folder(saved)
    for name, value in tiny.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
    with torch.no_grad():
        assert torch.equal(loaded.sample_actions(**batch(), noise=noise()),
                           tiny.sample_actions(**batch(), noise=noise()))


def test_save_refuses_an_existing_folder_unless_told(tiny, saved):
    with pytest.raises(FileExistsError, match="overwrite=True"):
        tiny.save_folder(saved)
    torch.manual_seed(3)
    other = SmolVLAModel(tiny_config())
    other.save_folder(saved.parent / "other")
    other.save_folder(saved.parent / "other", overwrite=True)
    reloaded = SmolVLAModel.from_folder(saved.parent / "other")
    assert torch.equal(reloaded.model.state_proj.weight, other.model.state_proj.weight)
    assert sorted(path.name for path in saved.parent.iterdir()) == ["other", "policy"]


def test_tied_embeddings_are_stored_once_and_restored(tmp_path):
    config = tiny_config()
    vlm = {**config.vlm, "tie_word_embeddings": True,
           "text_config": {**config.vlm["text_config"], "tie_word_embeddings": True}}
    model = SmolVLAModel(SmolVLAConfig(policy=config.policy, vlm=vlm))
    head = "model.vlm_with_expert.vlm.lm_head.weight"
    embeddings = "model.vlm_with_expert.vlm.model.text_model.embed_tokens.weight"
    assert model.state_dict()[head].data_ptr() == model.state_dict()[embeddings].data_ptr()
    stored = load_file(str(model.save_folder(tmp_path / "tied") / "model.safetensors"))
    assert (head in stored) != (embeddings in stored)
    loaded = SmolVLAModel.from_folder(tmp_path / "tied")
    assert torch.equal(loaded.state_dict()[head], model.state_dict()[embeddings])


def copy_folder(saved: Path, target: Path) -> Path:
    target.mkdir()
    for path in saved.iterdir():
        (target / path.name).write_bytes(path.read_bytes())
    return target


@pytest.mark.parametrize("case, message", [
    ("missing", "is not a folder"),
    ("file", "is not a folder"),
    ("no_config", r"lacks \['config.json'\]"),
    ("pickle_only", r"lacks \['model.safetensors'\] \(it has \['pytorch_model.bin'\]"),
    ("wrong_type", "type='act'; expected 'smolvla'"),
    ("not_json", "is not readable JSON"),
    ("bad_field", "chunk_size='8' is not of type int"),
    ("hub_backbone", "vlm_model_name='HuggingFaceTB/SmolVLM2-500M-Video-Instruct' is not a "
                     "local folder"),
])
def test_from_folder_refuses_what_is_not_a_smolvla_checkpoint(saved, tmp_path, case, message):
    folder = tmp_path / "bad"
    if case == "file":
        folder.write_text("{}")
    elif case != "missing":
        copy_folder(saved, folder)
    config = json.loads((saved / "config.json").read_text())
    if case == "no_config":
        (folder / "config.json").unlink()
    elif case == "pickle_only":
        (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    elif case in ("wrong_type", "bad_field"):
        config.update({"type": "act"} if case == "wrong_type" else {"chunk_size": "8"})
        (folder / "config.json").write_text(json.dumps(config))
    elif case == "not_json":
        (folder / "config.json").write_text("{not json")
    elif case == "hub_backbone":
        (folder / "vlm_config.json").unlink()
        config["vlm_model_name"] = "HuggingFaceTB/SmolVLM2-500M-Video-Instruct"
        (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message) as error:
        SmolVLAModel.from_folder(folder)
    assert str(folder) in str(error.value)


def test_from_folder_names_missing_unexpected_and_misshaped_tensors(saved, tmp_path):
    folder = copy_folder(saved, tmp_path / "edited")
    tensors = load_file(str(folder / "model.safetensors"))
    gone = ["model.state_proj.bias", "model.vlm_with_expert.lm_expert.norm.weight"]
    for name in gone:
        del tensors[name]
    tensors["model.extra_head.weight"] = torch.zeros(2)
    tensors["model.action_out_proj.bias"] = torch.zeros(ACTION + 1)
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError) as error:
        SmolVLAModel.from_folder(folder)
    text = str(error.value)
    assert str(folder / "model.safetensors") in text
    assert f"2 missing: {sorted(gone)}" in text
    assert "1 unexpected: ['model.extra_head.weight']" in text
    assert f"model.action_out_proj.bias ({ACTION + 1},) (expected ({ACTION},))" in text


def test_backbone_config_comes_from_the_argument_or_a_local_vlm_model_name(saved, tmp_path):
    folder = copy_folder(saved, tmp_path / "plain")
    (folder / "vlm_config.json").rename(tmp_path / "backbone.json")
    assert SmolVLAModel.from_folder(folder, vlm_config=tmp_path / "backbone.json")
    backbone = tmp_path / "tiny-smolvlm"
    backbone.mkdir()
    (tmp_path / "backbone.json").rename(backbone / "config.json")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vlm_model_name": str(backbone)}))
    assert SmolVLAModel.from_folder(folder)


@pytest.mark.parametrize("change, message", [
    ({"attention_mode": "both"}, "attention_mode='both' is not one of"),
    ({"add_image_special_tokens": True}, "add_image_special_tokens=true is not supported"),
    ({"num_expert_layers": 3}, "num_expert_layers=3 does not divide the backbone's 4 layers"),
    ({"num_expert_layers": 2}, r"backbone layers \[2\] would run an expert layer built for"),
    ({"chunk_size": 0}, "chunk_size=0 must be >= 1"),
])
def test_config_refuses_what_lerobot_cannot_run(change, message):
    config = tiny_config()
    with pytest.raises(CheckpointError, match=message):
        SmolVLAConfig(policy={**config.policy, **change}, vlm=config.vlm)


# --- LeRobot's own outputs ---------------------------------------------------------------------

@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda path: path.stem)
@pytest.mark.parametrize("variant", ["cross", "half_expert", "self"])
def test_outputs_match_lerobots_on_fixed_weights(fixture, variant):
    recorded = json.loads(fixture.read_text())
    rule = "shifted" if recorded["versions"]["transformers"].startswith("4.") else "exact"
    config = SmolVLAConfig(policy=recorded["variants"][variant]["policy"], vlm=recorded["vlm"],
                           patch_positions=rule)
    model = SmolVLAModel(config).eval()
    model.load_state_dict(side.fixed_state({name: tuple(value.shape) for name, value
                                            in model.state_dict().items()}), strict=True)
    data = side.fixed_inputs()
    images = [data["image_front"], data["image_wrist"]]
    common = {"images": images, "lang_tokens": data["lang_tokens"],
              "lang_masks": data["lang_masks"], "state": data["state"],
              "img_masks": [data["mask_front"], data["mask_wrist"]]}
    with torch.no_grad():
        sample = model.sample_actions(**common, noise=data["noise"])
        losses = model.flow_loss(**common, actions=data["actions"], noise=data["train_noise"],
                                 time=data["time"], reduction="none")
    expected = recorded["variants"][variant]
    np.testing.assert_allclose(sample.numpy(), expected["sample"], rtol=0, atol=1e-5)
    np.testing.assert_allclose(losses.numpy(), expected["losses"], rtol=0, atol=1e-5)


def test_exported_check_writes_our_outputs_for_the_lerobot_side(tiny, saved, tmp_path):
    """``smolvla_lerobot_check.py --exported``: inputs shaped by the folder, our outputs under
    both patch rules (the LeRobot side, run in its own venv, is in docs/smolvla.md)."""
    check = importlib.import_module("studies.smolvla_lerobot_check")
    assert check.main(["--work", str(tmp_path / "work"), "--exported", str(saved)]) == 0
    data = dict(np.load(tmp_path / "work" / "exported.npz"))
    assert str(data["folder"]) == str(saved.resolve())
    assert data["image_front"].shape == (2, 3, 32, 32) and data["noise"].shape == (2, 8, 4)
    assert data["lang_masks"].sum(1).tolist() == [5, 3] and data["lang_tokens"].max() < 96
    images, masks = [torch.from_numpy(data["image_front"])], [torch.from_numpy(data["mask_front"])]
    common = (images, torch.from_numpy(data["lang_tokens"]), torch.from_numpy(data["lang_masks"]),
              torch.from_numpy(data["state"]))
    with torch.no_grad():
        sample = tiny.sample_actions(*common, noise=torch.from_numpy(data["noise"]),
                                     img_masks=masks)
    np.testing.assert_array_equal(data["ours_sample_exact"], sample.numpy())
    assert data["ours_losses_shifted"].shape == (2, 8, 4)
    assert not np.array_equal(data["ours_sample_shifted"], data["ours_sample_exact"])
    (tmp_path / "not_exported").mkdir()
    with pytest.raises(SystemExit, match="no vlm_config.json"):
        check.main(["--work", str(tmp_path / "w2"), "--exported", str(tmp_path / "not_exported")])
