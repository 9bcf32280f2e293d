"""LeRobotDataset v3.0 folders in and out: :func:`export_lerobot` writes the demos of an HDF5
demo file (``harness.demos``) as one, :func:`load_lerobot` reads one back as
:class:`harness.demos.Demos` for behaviour cloning, after :func:`validate_dataset` has checked
the whole folder (:mod:`harness.lerobot.checks`). The layout and the mapping of our observation
keys to LeRobot's features are in :mod:`harness.lerobot.layout`; the video codec in
:mod:`harness.lerobot.video`. See docs/datasets.md.
"""

from harness.lerobot.layout import CODEBASE_VERSION
from harness.lerobot.reader import load_lerobot, read_info, validate_dataset
from harness.lerobot.video import PIX_FMTS
from harness.lerobot.writer import export_lerobot

FORMATS: tuple[str, ...] = ("lerobot",)  # what scripts/export_dataset.py writes

__all__ = ["CODEBASE_VERSION", "FORMATS", "PIX_FMTS", "export_lerobot", "load_lerobot",
           "read_info", "validate_dataset"]
