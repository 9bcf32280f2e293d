"""Weights & Biases as a third copy of a run's metrics (``logger=wandb``), next to
``metrics.csv`` and TensorBoard; :class:`harness.runs.Run` writes to it.

The W&B run id is kept in the run directory (``wandb_run_id``), so a resumed run continues the
same W&B run (``resume="allow"``) and a run that starts afresh gets a new one. Every metric is
plotted against ``env_step`` (W&B's ``define_metric(..., step_metric=...)``), the environment step
the run loop logs it at, rather than against W&B's own call counter, which would make a resumed
run's steps and those of an uninterrupted one disagree. W&B's files go below the run directory
(``wandb/``); ``WANDB_MODE=offline`` keeps them there without any network.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from harness_common.files import atomic_write_text

ID_FILE = "wandb_run_id"
STEP_KEY = "env_step"


class WandbRun:
    """One W&B run mirroring a run directory's metrics.

    Args:
        run_dir: The run directory.
        config: The run's ``TrainConfig`` (logged as the W&B run's config); its
            ``logger.wandb`` holds the W&B settings.
        resuming: The run continues from a checkpoint: reuse the saved run id.

    Attributes:
        id: The W&B run id (kept in ``<run_dir>/wandb_run_id``).
        run: The ``wandb`` run.
    """

    def __init__(self, run_dir: Path, config: Any, resuming: bool) -> None:
        try:
            import wandb
        except ImportError as error:
            raise RuntimeError(f"logger=wandb needs the wandb package ({error}): pip install "
                               "wandb, or choose logger=default") from None
        settings = config.logger.wandb
        id_path = Path(run_dir) / ID_FILE
        run_id = id_path.read_text().strip() if resuming and id_path.exists() else None
        run_id = run_id or secrets.token_hex(4)  # W&B's own ids are 8 characters too
        atomic_write_text(id_path, run_id + "\n")
        self.id = run_id
        self.run = wandb.init(
            project=settings.project, entity=settings.entity,
            group=settings.group or Path(run_dir).resolve().parent.name,
            name=settings.name or Path(run_dir).resolve().name, tags=list(settings.tags),
            mode=settings.mode, id=run_id, resume="allow", dir=str(run_dir),
            config=OmegaConf.to_container(OmegaConf.structured(config)),
        )
        self.run.define_metric(STEP_KEY)
        self.run.define_metric("*", step_metric=STEP_KEY)

    @classmethod
    def open(cls, run_dir: Path, config: Any, resuming: bool) -> WandbRun | None:
        """A :class:`WandbRun` when ``config.logger.wandb`` is set, else ``None``."""
        return None if config.logger.wandb is None else cls(run_dir, config, resuming)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Log the finite numeric ``metrics`` at environment step ``step``."""
        numeric = {key: float(value) for key, value in metrics.items()
                   if isinstance(value, (bool, int, float, np.number))
                   and math.isfinite(float(value))}
        if numeric:
            self.run.log({**numeric, STEP_KEY: int(step)})

    def close(self) -> None:
        self.run.finish()
