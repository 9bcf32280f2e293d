"""Record scripted-expert demonstrations of a task into an HDF5 file (robomimic layout).

usage: python scripts/collect_demos.py [task=push] [task.obs_mode=pixels_state] [episodes=20]
           [noise=0.0] [task.difficulty=0.0] [task.camera=front] [task.image_size=84]
           [seed=0] [keep_failures=true] [out=data/demos/push.hdf5]

A Hydra app over ``conf/collect_demos.yaml`` (``--help`` lists the keys, ``--cfg job`` prints
them, ``-m`` sweeps them). The ``task`` group is the training app's: every option of it is
recorded in the file's ``env_args``, so ``harness.demos.rebuild_env`` rebuilds the same env.

The default difficulty is 0: a pixel TinyVLA cloned from 20 push demos by
``scripts/pretrain_bc.py``'s defaults succeeded in 8 of 50 held-out episodes at difficulty 0, but
in none of 30 at difficulty 1, which would leave group fine-tuning no signal to work from.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from harness.apps import conf_file
from harness.config import TaskOptions
from harness.demos import DEMO_LABELS, collect_demos
from harness_common.cli import run_app


@dataclass
class CollectDemosConfig:
    """The primary config of this app (``conf/collect_demos.yaml``).

    Attributes:
        task: The task and its environment options (the ``task`` group).
        episodes: Demos to keep.
        noise: Standard deviation of the Gaussian noise on the expert's actions.
        seed: Reset seed of the first attempt.
        keep_failures: Also record failed episodes (marked by their ``success`` attribute).
        label: What ``actions`` hold: ``executed`` (the noisy action executed) or ``expert``
            (the expert's noise-free action in the state the noise led to: DART).
        out: The HDF5 file to write.
    """

    task: TaskOptions = field(default_factory=TaskOptions)
    episodes: int = 20
    noise: float = 0.0
    seed: int = 0
    keep_failures: bool = False
    label: str = "executed"
    out: str = "${data_dir:}/demos/push.hdf5"

    def __post_init__(self) -> None:
        if self.episodes < 1:
            raise ValueError(f"episodes={self.episodes}; must be >= 1")
        if self.noise < 0:
            raise ValueError(f"noise={self.noise}; must be >= 0")
        if self.seed < 0:
            raise ValueError(f"seed={self.seed}; must be >= 0")
        if self.label not in DEMO_LABELS:
            raise ValueError(f"label={self.label!r}; choose one of {DEMO_LABELS}")


ConfigStore.instance().store(name="collect_demos_schema", node=CollectDemosConfig)


@hydra.main(version_base="1.3", config_path="pkg://harness.conf", config_name="collect_demos")
def app(cfg: DictConfig) -> None:
    try:
        config = OmegaConf.to_object(cfg)
    except (OmegaConfBaseException, ValueError) as error:
        sys.exit(f"collect_demos.py: {error}")
    options = config.task.env_options()
    try:
        summary = collect_demos(
            Path(config.out), config.task.name, config.episodes, noise=config.noise,
            obs_mode=options.pop("obs_mode"), camera=options.pop("camera"),
            image_size=options.pop("image_size"), difficulty=options.pop("difficulty"),
            max_episode_steps=options.pop("max_episode_steps", None), seed=config.seed,
            only_successes=not config.keep_failures, env_options=options, label=config.label,
        )
    except (ValueError, RuntimeError) as error:
        sys.exit(f"collect_demos.py: {error}")
    print(
        f"wrote {summary['episodes']} {config.task.name} demos ({summary['steps']} steps) to"
        f" {summary['path']}; the expert succeeded in {summary['expert_success_rate']:.0%} of"
        f" {summary['attempts']} attempts"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the app on ``argv`` (default: the command line) and return its exit status."""
    return run_app(app, argv, help_file=conf_file("collect_demos"))


if __name__ == "__main__":
    sys.exit(main())
