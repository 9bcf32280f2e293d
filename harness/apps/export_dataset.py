"""Export scripted-expert demonstrations (an HDF5 file of scripts/collect_demos.py) as a dataset
another framework reads: for now a LeRobotDataset v3.0 folder.

usage: python scripts/export_dataset.py demos=data/demos/push.hdf5 out=data/lerobot/push
           [format=lerobot] [overwrite=false] [pix_fmt=yuv444p]

A Hydra app over ``conf/export_dataset.yaml`` (``--help`` lists the keys, ``--cfg job`` prints
them). The folder is written beside ``out`` under a temporary name and renamed at the end, so
a killed export leaves no half-written dataset; an existing, non-empty ``out`` is refused
unless ``overwrite=true``. ``algo.start_policy.dataset=<folder>`` of the training app clones the
start
policy on it. See docs/datasets.md.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from harness.apps import conf_file
from harness.lerobot import FORMATS, PIX_FMTS, export_lerobot
from harness_common.cli import run_app


@dataclass
class ExportDatasetConfig:
    """The primary config of this app (``conf/export_dataset.yaml``).

    Attributes:
        demos: HDF5 demo file of ``scripts/collect_demos.py``.
        format: Dataset format to write, one of ``harness.lerobot.FORMATS``.
        out: The dataset folder to write.
        overwrite: Replace ``out`` when it exists and is not empty.
        pix_fmt: Pixel format of the videos: ``yuv444p`` (full colour resolution) or
            ``yuv420p`` (what web players take; needs even frame sides).
    """

    demos: str = MISSING
    format: str = "lerobot"
    out: str = MISSING
    overwrite: bool = False
    pix_fmt: str = "yuv444p"

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"format={self.format!r} is unknown; choose one of {FORMATS}")
        if self.pix_fmt not in PIX_FMTS:
            raise ValueError(f"pix_fmt={self.pix_fmt!r}; choose one of {PIX_FMTS}")


ConfigStore.instance().store(name="export_dataset_schema", node=ExportDatasetConfig)


@hydra.main(version_base="1.3", config_path="pkg://harness.conf", config_name="export_dataset")
def app(cfg: DictConfig) -> None:
    try:
        config = OmegaConf.to_object(cfg)
        summary = export_lerobot(config.demos, config.out, overwrite=config.overwrite,
                                 pix_fmt=config.pix_fmt)
    except (OmegaConfBaseException, ValueError, OSError) as error:
        sys.exit(f"export_dataset.py: {error}")
    print(f"wrote {summary['episodes']} episodes ({summary['frames']} frames at"
          f" {summary['fps']} fps, {len(summary['tasks'])} task(s)) from {config.demos} to"
          f" {summary['out']} as a LeRobotDataset v3.0; features: {summary['features']}")


def main(argv: list[str] | None = None) -> int:
    """Run the app on ``argv`` (default: the command line) and return its exit status."""
    return run_app(app, argv, help_file=conf_file("export_dataset"))


if __name__ == "__main__":
    sys.exit(main())
