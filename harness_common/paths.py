"""Where the harness keeps its data (recorded demos, detector data sets): ``data_dir()``.

The rule, first match wins:

1. ``HARNESS_DATA``, when set and not empty;
2. ``data/`` of the repository, when the package runs from a checkout (a ``pyproject.toml`` sits
   next to the package folders);
3. a user data folder when the package is installed: ``$XDG_DATA_HOME/vla-rl-harness``, else
   ``~/.local/share/vla-rl-harness``.

The configs name it as ``${data_dir:}`` (an OmegaConf resolver, :func:`register_resolver`).
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import OmegaConf

ENV_VAR = "HARNESS_DATA"
APP_FOLDER = "vla-rl-harness"
# The folder holding harness_common/ (and harness/, tasks/, ...): a checkout's root, or
# site-packages when installed.
PACKAGE_ROOT = Path(__file__).resolve().parent.parent


def data_dir(package_root: Path | None = None) -> Path:
    """The data folder (see the module docstring); it need not exist yet.

    Args:
        package_root: The folder holding the packages (default: where this one is); a
            ``pyproject.toml`` there marks a checkout.

    Returns:
        An absolute path.
    """
    override = os.environ.get(ENV_VAR, "")
    if override:
        return Path(override).expanduser().resolve()
    root = PACKAGE_ROOT if package_root is None else Path(package_root)
    if (root / "pyproject.toml").is_file():
        return root.resolve() / "data"
    user_data = os.environ.get("XDG_DATA_HOME", "") or Path.home() / ".local" / "share"
    return Path(user_data).expanduser().resolve() / APP_FOLDER


def register_resolver() -> None:
    """Register ``${data_dir:}`` with OmegaConf (once; a second call changes nothing)."""
    if not OmegaConf.has_resolver("data_dir"):
        OmegaConf.register_new_resolver("data_dir", lambda: str(data_dir()))
