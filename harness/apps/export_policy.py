"""Export a trained policy: ``python scripts/export_policy.py checkpoint=<run dir>
out=policy.onnx``, or a SmolVLA policy as a LeRobot checkpoint folder: ``... format=lerobot
out=<folder>``.

A Hydra app over ``conf/export_policy.yaml`` (``--help`` lists the keys, ``--cfg job`` prints
them). ``checkpoint`` is a group-trainer run (grpo, dr_grpo, rloo, critic, reinforce, vla_ppo) as
``scripts/evaluate.py`` takes it: a run directory (its best checkpoint, else its latest), a
``checkpoints/`` folder, a checkpoint file or its metadata JSON. Its mlp or tiny_vla policy
(``reference=true``: the frozen start policy stored with it) becomes one ONNX graph from the raw
observation arrays to logits, greedy tokens and actions (:mod:`harness.export`), or, with a
continuous ``action_head`` (gaussian, flow), to its greedy actions, with the task, its options,
the inputs, the action head and its bin-centre or greedy rule, the checkpoint's SHA-256 and the
export date in the model's metadata. Before anything is written the graph runs, in onnxruntime,
on ``check_observations`` observations of real env steps and must give the torch policy's logits
within ``tolerance`` and the same greedy tokens (a continuous head: its greedy actions within
``tolerance``). ``out`` is written atomically: a kill never leaves a partial file there.

Run it with ``scripts/deploy_policy.py model=<out>`` (no torch needed); see docs/export.md.

``format=lerobot`` takes a ``policy=smolvla`` checkpoint and writes its network as a LeRobot
SmolVLA checkpoint folder (``config.json``, ``model.safetensors`` in LeRobot's parameter names,
LoRA adapters merged into the weights), with the harness's learned noise scales and value head
beside it (:meth:`harness.policies.smolvla.policy.SmolVLAPolicy.write_lerobot_folder`;
docs/smolvla.md). The folder is built under a temporary name and renamed into place, with
``harness_export.json`` in it, the exporter's marker (writer, format, date, files). An existing
``out`` is replaced only with ``overwrite=true``, and only when it is a folder the exporter wrote
(its marker, and no file the marker does not list); any other checkpoint folder is moved aside
whole to ``<out>.replaced-<UTC time>`` (:func:`move_folder_aside`), a folder without
``config.json`` is refused, and so is an ``out`` that is the working directory or a folder above
it (``out=.``, ``out=..``), before anything is built
(:mod:`harness.policies.smolvla.out_folder`). The ONNX
``out`` replaces only a regular file, never a folder, a link or a device.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from harness.apps import conf_file
from harness_common.cli import run_app
from harness_common.files import atomic_write, sha256_of

if TYPE_CHECKING:
    from harness.policies import Policy

FORMATS = ("onnx", "lerobot")


@dataclass
class ExportConfig:
    """The primary config of this app (``conf/export_policy.yaml``); see the module docstring."""

    checkpoint: str = MISSING
    out: str = MISSING
    format: str = "onnx"
    reference: bool = False
    check_observations: int = 32
    tolerance: float = 1e-4
    seed: int = 0
    overwrite: bool = False

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"format={self.format!r}; choose one of {FORMATS}")
        if self.check_observations < 1:
            raise ValueError(f"check_observations={self.check_observations}; must be >= 1")
        if not self.tolerance > 0:
            raise ValueError(f"tolerance={self.tolerance}; must be > 0")


ConfigStore.instance().store(name="export_policy_schema", node=ExportConfig)


def fail(message: str) -> NoReturn:
    """Print ``message`` as this script's error and exit with status 1."""
    print(f"export_policy.py: {message}", file=sys.stderr)
    raise SystemExit(1)


def load_checkpoint_policy(checkpoint: str, reference: bool = False
                           ) -> tuple[Policy, Path, dict[str, Any]]:
    """The policy of a group-trainer checkpoint, its file and its metadata.

    Raises:
        CheckpointError: Missing, unreadable or corrupt checkpoint.
        ValueError: A checkpoint of another algorithm, or a policy that cannot be rebuilt (an
            unknown kind, weights that do not fit); the message names the value.
    """
    # Here and in export_policy(), not at the top: torch and the harness load only for an
    # export (not for --help, --cfg job).
    from harness.algos.group.checkpoints import policy_from_state, read_checkpoint
    from harness.config import GROUP_ALGOS, SB3_ALGOS
    from harness.runs import resolve_checkpoint

    path, metadata = resolve_checkpoint(checkpoint)
    algo = metadata["algo"]
    if algo not in GROUP_ALGOS:
        what = ("an SB3 policy (a Gaussian over continuous actions, not action tokens)"
                if algo in SB3_ALGOS else "an algorithm this version does not know")
        raise ValueError(f"checkpoint {path} is of algo={algo!r}, {what}; only the "
                         f"policies of group-trainer checkpoints ({', '.join(GROUP_ALGOS)}) "
                         "can be exported")
    state = read_checkpoint(path)
    try:
        policy = policy_from_state(state, "reference" if reference else "policy")
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        raise ValueError(f"checkpoint {path}: cannot rebuild its policy: {error}") from None
    return policy.eval(), path, metadata


def move_folder_aside(folder: Path) -> Path:
    """Rename ``folder`` to ``<name>.replaced-<UTC time>`` beside it (as training moves a run's
    earlier files to ``replaced/``) and return the new path; nothing in it is deleted."""
    from datetime import UTC, datetime

    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    aside = folder.with_name(f"{folder.name}.replaced-{stamp}")
    count = 1
    while aside.exists():
        aside = folder.with_name(f"{folder.name}.replaced-{stamp}-{count}")
        count += 1
    folder.rename(aside)
    return aside


def export_lerobot(args: ExportConfig) -> None:
    """Write the SmolVLA policy of ``args.checkpoint`` to the folder ``args.out`` in LeRobot's
    checkpoint layout, refusing an existing ``out`` without ``overwrite`` and any other
    policy."""
    from harness.policies.smolvla.architecture import CONFIG_FILE
    from harness.policies.smolvla.folder import HEADS_FILE
    from harness.policies.smolvla.out_folder import check_out_folder, check_replaceable
    from harness.runs import CheckpointError

    out = Path(args.out)
    try:
        check_out_folder(out)
    except ValueError as error:
        fail(f"out={args.out}: {error}")
    if out.exists() and not args.overwrite:
        fail(f"out={args.out} exists; pass overwrite=true to replace it")
    if out.exists() and not (out / CONFIG_FILE).is_file():
        fail(f"out={args.out} exists and is not a checkpoint folder (it holds no {CONFIG_FILE}); "
             "overwrite=true replaces checkpoint folders only")
    foreign = None  # a checkpoint folder the exporter did not write: moved aside, not replaced
    if out.exists():
        try:
            check_replaceable(out)
        except FileExistsError as error:
            foreign = str(error)
    try:
        policy, path, metadata = load_checkpoint_policy(args.checkpoint, args.reference)
    except (CheckpointError, ValueError, TypeError) as error:
        fail(str(error))
    if policy.spec.folder_format != "lerobot":
        fail(f"checkpoint {path} holds a policy={policy.spec.kind!r}; format=lerobot writes "
             "policies in LeRobot's layout only (policy=smolvla; format=onnx exports mlp and "
             "tiny_vla)")
    if foreign is not None:
        aside = move_folder_aside(out)
        print(f"out={args.out} holds files the exporter did not write ({foreign.split('; ')[0]}); "
              f"moved it aside whole to {aside}")
    try:
        policy.save_pretrained(out, overwrite=args.overwrite)
    except (FileExistsError, ValueError) as error:
        fail(str(error))
    which = "start (reference)" if args.reference else "fine-tuned"
    merged = ", LoRA adapters merged" if policy.config.lora_rank > 0 else ""
    print(f"wrote the {which} smolvla policy of {metadata['algo']} on {metadata['task']} "
          f"(checkpoint {path.name}, sha256 {sha256_of(path)[:12]}...) to {out} as a LeRobot "
          f"SmolVLA checkpoint ({policy.config.dtype}{merged}); the noise scales and value "
          f"head are in {HEADS_FILE} beside it")


@hydra.main(version_base="1.3", config_path="pkg://harness.conf", config_name="export_policy")
def export_policy(cfg: DictConfig) -> None:
    """Export ``cfg.checkpoint``'s policy to ``cfg.out``: an ONNX graph checked against the
    torch policy, or (``format=lerobot``) a LeRobot SmolVLA checkpoint folder."""
    import tasks
    from harness.export import export_onnx, sample_observations
    from harness.policies import obs_shapes_from_space
    from harness.runs import CheckpointError

    try:
        args = OmegaConf.to_object(cfg)
    except MissingMandatoryValue as error:
        fail(f"{error.full_key}= is required: checkpoint=<run dir> out=<file.onnx> (a folder "
             "with format=lerobot)")
    except (OmegaConfBaseException, ValueError) as error:
        fail(str(error))
    if args.format == "lerobot":
        export_lerobot(args)
        return
    out = Path(args.out)
    if out.is_symlink() or (out.exists() and not out.is_file()):
        fail(f"out={args.out} exists and is not a regular file (a folder, a link or a device); "
             "format=onnx writes one file and replaces only a file")
    try:
        policy, path, metadata = load_checkpoint_policy(args.checkpoint, args.reference)
        task, options = metadata["task"], metadata["task_options"]
        env = tasks.make(task, **options)
        shapes = obs_shapes_from_space(env.observation_space)
        if shapes != policy.obs_shapes:
            raise ValueError(f"checkpoint {path} holds a policy for observations "
                             f"{policy.obs_shapes}, but its task {task!r} with {options} gives "
                             f"{shapes}")
        observations = sample_observations(env, args.check_observations, args.seed)
        env.close()
        record = {
            "task": task, "task_options": options, "evaluation": metadata.get("evaluation"),
            "control_period_s": env.config.timestep * env.config.substeps,
            "source": {"checkpoint": str(path.resolve()), "sha256": sha256_of(path),
                       "algo": metadata["algo"], "num_timesteps": metadata.get("num_timesteps"),
                       "seed": metadata.get("seed"),
                       "policy": "reference (start)" if args.reference else "fine-tuned"},
        }
        model, info = export_onnx(policy, record, observations, args.tolerance)
    except (CheckpointError, ValueError, TypeError) as error:
        fail(str(error))
    atomic_write(args.out, lambda file: file.write(model))
    parity = info["parity"]
    inputs = ", ".join(f"{e['name']} {tuple(e['shape'])} {e['dtype']}" for e in info["inputs"])
    print(f"exported the {info['source']['policy']} {policy.spec.kind} policy of "
          f"{metadata['algo']} on {task} (checkpoint {path.name}, sha256 "
          f"{info['source']['sha256'][:12]}...) to {args.out}: {len(model) / 1024:.0f} KiB, "
          f"opset {info['exporter']['opset']}")
    print(f"inputs (batch first): {inputs}; outputs: {', '.join(info['outputs'])}")
    if "max_abs_logit_diff" in parity:
        print(f"parity on {parity['observations']} env observations: max |logit diff| "
              f"{parity['max_abs_logit_diff']:.2e} (tolerance {args.tolerance:g}), greedy tokens "
              "equal")
    else:
        print(f"parity on {parity['observations']} env observations: max |action diff| "
              f"{parity['max_abs_action_diff']:.2e} (tolerance {args.tolerance:g}), "
              f"{info['action_head']} head, greedy actions")


def main(argv: list[str] | None = None) -> int:
    """Run the app on ``argv`` (default: the command line) and return its exit status: 0, or 1
    after an error (a bad key or value, a missing or corrupt checkpoint, a policy that cannot be
    exported, a failed parity check, an existing ``out`` folder without ``overwrite``)."""
    return run_app(export_policy, argv, help_file=conf_file("export_policy"))


if __name__ == "__main__":
    sys.exit(main())
