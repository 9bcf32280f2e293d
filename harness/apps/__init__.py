"""The user's commands as Hydra apps over the package's configs (``pkg://harness.conf``): each
module's ``main(argv) -> exit status`` is a console script (``harness-train``,
``harness-evaluate``, ...; ``pyproject.toml``) and what ``scripts/<name>.py`` runs.

Importing the package registers ``${data_dir:}`` (:func:`harness_common.paths.data_dir`), which
the configs use for the data they write and read by default.
"""

from pathlib import Path

from harness_common.paths import register_resolver

register_resolver()


def conf_file(name: str) -> Path:
    """The package's config file ``conf/<name>.yaml`` (whose ``hydra.help`` is the app's
    ``--help``)."""
    return Path(__file__).resolve().parents[1] / "conf" / f"{name}.yaml"
