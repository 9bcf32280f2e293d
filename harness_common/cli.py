"""Running a Hydra app as a function: ``main(argv) -> exit status`` for the scripts, and a
``--help`` that builds only what its template shows."""

from __future__ import annotations

import string
import sys
from argparse import ArgumentParser
from collections.abc import Callable, Sequence

from hydra._internal.hydra import Hydra
from omegaconf import DictConfig, OmegaConf


def run_app(app: Callable[[], object], argv: Sequence[str] | None = None) -> int:
    """Run the ``@hydra.main`` function ``app`` on ``argv`` (default: the command line) and
    return its exit status: 0, or the status of the ``SystemExit`` it raised (1 for a message,
    as the scripts' ``fail`` does). ``sys.argv`` is restored afterwards."""
    saved = sys.argv
    sys.argv = [saved[0], *(saved[1:] if argv is None else argv)]
    try:
        app()
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    finally:
        sys.argv = saved
    return 0


def lazy_help_sections() -> None:
    """Make Hydra's ``--help`` and ``--hydra-help`` build only the sections their template
    names (``$APP_CONFIG_GROUPS``, ``$HYDRA_CONFIG_GROUPS``, ``$FLAGS_HELP``, ``$CONFIG``).

    Hydra 1.3 builds all four for every help, and each of the ~55 group look-ups behind one
    group list deep-copies its config repository, ConfigStore schemas included: 4-5 s of
    ``scripts/train.py --help``, whose template lists its groups by hand and shows neither
    list. The text of a help is unchanged. Call before the ``@hydra.main`` function runs.
    """
    Hydra.get_help = _get_help


def _get_help(self: Hydra, help_cfg: DictConfig, cfg: DictConfig, args_parser: ArgumentParser,
              resolve: bool) -> str:
    """``Hydra.get_help`` of Hydra 1.3, building a section only where the template names it."""
    template = string.Template(help_cfg.template)

    def is_hydra_group(group: str) -> bool:
        return group == "hydra" or group.startswith("hydra/")

    sections = {
        "FLAGS_HELP": lambda: self.format_args_help(args_parser),
        "HYDRA_CONFIG_GROUPS": lambda: self.format_config_groups(is_hydra_group),
        "APP_CONFIG_GROUPS": lambda: self.format_config_groups(
            lambda group: not is_hydra_group(group)),
        "CONFIG": lambda: OmegaConf.to_yaml(cfg, resolve=resolve),
    }
    named = set(template.get_identifiers())
    return template.substitute({name: build() for name, build in sections.items()
                                if name in named})
