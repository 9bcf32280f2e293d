"""Train a policy on a task: ``python scripts/train.py task=reach algo=ppo``.

Hydra composes ``conf/train.yaml``; the run directory is Hydra's output dir. ``resume=true`` with
``hydra.run.dir=<run dir>`` continues a killed run from its latest checkpoint. See docs/training.md.
"""

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from harness import config as harness_config
from harness_common.cli import lazy_help_sections

harness_config.register_configs()
lazy_help_sections()


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> float:
    # Here, not at the top: torch and the trainers load only for a run (not for --help, --cfg).
    from harness import trainers

    config = harness_config.load(cfg)
    summary = trainers.train(config, HydraConfig.get().runtime.output_dir)
    return summary["success_rate"]


if __name__ == "__main__":
    main()
