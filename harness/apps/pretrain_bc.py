"""Behaviour-clone a policy on demonstrations, save it, and report its held-out success.

usage: python scripts/pretrain_bc.py [demos=data/demos/push.hdf5] [policy=tiny_vla|mlp]
           [policy.head.num_bins=11] [policy.hidden=128] [epochs=250] [learning_rate=3e-3]
           [batch_size=32] [augment=false] [eval_episodes=50] [seed=0]
           [out=outputs/bc/push_tiny_vla.pt]

A Hydra app over ``conf/pretrain_bc.yaml`` (``--help`` lists the keys, ``--cfg job`` prints
them, ``-m`` sweeps them); the ``policy`` group is the training app's (the group trainer's
kinds). The saved file is what ``algo.start_policy.file`` of the training app loads.

The policy is sized from the observation space of the environment the demos were recorded in
(``env_args`` of the demo file) and evaluated there on reset seeds ``10_000 + seed`` onwards,
which collection (seeds from 0) does not reach with fewer than 10,000 attempts.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from harness.apps import conf_file
from harness.config import MOVED, PolicyConfig
from harness.demos import load_demos, rebuild_env
from harness_common.cli import run_app
from harness_common.files import atomic_write_text

HELD_OUT_SEED_OFFSET = 10_000


@dataclass
class PretrainBCConfig:
    """The primary config of this app (``conf/pretrain_bc.yaml``).

    Attributes:
        demos: HDF5 file of ``scripts/collect_demos.py``.
        policy: The token policy (the ``policy`` group: ``mlp`` or ``tiny_vla``).
        epochs: Passes over the training steps.
        learning_rate: Adam learning rate.
        batch_size: Steps per gradient step.
        val_fraction: Share of the episodes held out for the validation loss.
        augment: Random shifts of pixel observations.
        eval_episodes: Held-out episodes played after training.
        seed: Seeds the weights, the training and the held-out episodes.
        torch_threads: Torch CPU threads.
        out: The policy file to write (its metrics go beside it, as ``.json``).
    """

    demos: str = "${data_dir:}/demos/push.hdf5"
    policy: PolicyConfig = field(default_factory=lambda: PolicyConfig(name="tiny_vla"))
    epochs: int = 250
    learning_rate: float = 3e-3
    batch_size: int = 32
    val_fraction: float = 0.1
    augment: bool = True
    eval_episodes: int = 50
    seed: int = 0
    torch_threads: int = 1
    out: str = "outputs/bc/push_tiny_vla.pt"

    def __post_init__(self) -> None:
        # Here and in main(), not at the top: composing the config (--help, --cfg job)
        # loads no torch.
        from harness.policies import policy_kinds

        if self.policy.name not in policy_kinds("group"):
            raise ValueError(f"policy={self.policy.name!r}: behaviour cloning trains the group "
                             f"trainer's policies; choose one of {policy_kinds('group')}")
        for key in ("epochs", "batch_size", "eval_episodes", "torch_threads"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key}={getattr(self, key)}; must be >= 1")
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate={self.learning_rate}; must be > 0")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction={self.val_fraction}; must be in [0, 1)")
        if self.seed < 0:
            raise ValueError(f"seed={self.seed}; must be >= 0")


ConfigStore.instance().store(name="pretrain_bc_schema", node=PretrainBCConfig)


@hydra.main(version_base="1.3", config_path="pkg://harness.conf", config_name="pretrain_bc")
def app(cfg: DictConfig) -> None:
    import torch

    from harness.policies import make, save_policy
    from harness.start_policy.bc import evaluate_policy, pretrain_bc

    try:
        config = OmegaConf.to_object(cfg)
        demos = load_demos(config.demos)
    except (OmegaConfBaseException, ValueError, OSError) as error:
        sys.exit(f"pretrain_bc.py: {error}")
    torch.set_num_threads(config.torch_threads)
    torch.manual_seed(config.seed)

    env = rebuild_env(demos.env_args)
    policy = make(config.policy, env.observation_space)
    print(f"{config.policy.name} policy, {sum(p.numel() for p in policy.parameters()):,}"
          f" parameters; {demos.num_episodes} demos, {len(demos)} steps from {config.demos}")

    metrics = pretrain_bc(
        policy, demos, epochs=config.epochs, lr=config.learning_rate,
        batch_size=config.batch_size, seed=config.seed, augment=config.augment,
        val_fraction=config.val_fraction,
    )
    out = Path(config.out)
    save_policy(out, policy)
    accuracy = metrics["bc/val_accuracy"]  # NaN for a continuous head: no tokens to count
    tokens = "" if math.isnan(accuracy) else f", val token accuracy {accuracy:.1%}"
    print(f"trained {config.epochs} epochs in {metrics['bc/seconds']:.0f} s: train loss"
          f" {metrics['bc/train_loss']:.3f}, val loss {metrics['bc/val_loss']:.3f}{tokens};"
          f" saved {out}")

    start = time.perf_counter()
    result = evaluate_policy(policy, env, config.eval_episodes,
                             seed=HELD_OUT_SEED_OFFSET + config.seed)
    env.close()
    print(f"held-out success {result['eval/success_rate']:.1%}"
          f" (95% CI {result['eval/success_low']:.1%}-{result['eval/success_high']:.1%}) over"
          f" {config.eval_episodes} episodes, mean length {result['eval/mean_length']:.1f}"
          f" ({time.perf_counter() - start:.0f} s)")
    summary = {key: value for key, value in metrics.items() if key != "history"} | result
    atomic_write_text(out.with_suffix(".json"), json.dumps(summary, indent=2))


def main(argv: list[str] | None = None) -> int:
    """Run the app on ``argv`` (default: the command line) and return its exit status."""
    return run_app(app, argv, moved=MOVED, help_file=conf_file("pretrain_bc"))


if __name__ == "__main__":
    sys.exit(main())
