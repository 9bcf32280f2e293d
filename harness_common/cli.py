"""Running a Hydra app as a function: ``main(argv) -> exit status`` for the console scripts and
``scripts/``, with a path argument taken as written even where Hydra's override grammar would
not take it (a sweep's job folder, ``multirun/<date>/<time>/0_algo=grpo,seed=1``)."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

# ``key=value``, ``+key=value``, ``++key=value``, ``~key=value``: an override, not a flag's value.
OVERRIDE_KEY = re.compile(r"(\+\+|\+|~)?[A-Za-z_][\w.@/-]*")
# What Hydra's override grammar takes unquoted in a value (letters, digits and these symbols).
UNQUOTED_VALUE = re.compile(r"[\w/\\+.$%*@?|:-]*", re.ASCII)


def run_app(app: Callable[[], object], argv: Sequence[str] | None = None,
            renamed: Mapping[str, str] | None = None,
            moved: Mapping[str, str] | None = None, help_file: Path | None = None) -> int:
    """Run the ``@hydra.main`` function ``app`` on ``argv`` (default: the command line) and
    return its exit status: 0, or the status of the ``SystemExit`` it raised; a message
    (``sys.exit("...")``) goes to stderr with status 1, as the interpreter would print it. Path
    arguments are quoted first (:func:`quote_paths`); ``sys.argv`` is restored afterwards. An
    override of a key in ``renamed`` (:func:`refuse_renamed`) or ``moved``
    (:func:`refuse_moved`) is refused first, with its new spelling. ``--help`` prints the
    ``hydra.help`` template of the app's config file ``help_file`` (:func:`render_help`), as
    Hydra would, without the seconds Hydra spends listing every config group first."""
    saved = sys.argv
    args = saved[1:] if argv is None else list(argv)
    if help_file is not None and ("--help" in args or "-h" in args):
        text = render_help(help_file)
        if text is not None:
            print(text)
            return 0
    sys.argv = [saved[0], *quote_paths(args)]
    try:
        refuse_renamed(args, renamed or {})
        refuse_moved(args, moved or {})
        app()
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    finally:
        sys.argv = saved
    return 0


def render_help(config_file: Path) -> str | None:
    """The help text of a Hydra app: its config file's ``hydra.help.template`` with its
    interpolations (``${hydra.help.header}``...) resolved, or ``None`` when the file has none
    (Hydra's then). Hydra's own ``--help`` prints the same text, after listing every group of
    its config store for the template's ``$APP_CONFIG_GROUPS`` (the apps' templates list their
    groups themselves)."""
    import string

    from omegaconf import OmegaConf

    help_node = OmegaConf.select(OmegaConf.load(config_file), "hydra.help")
    if help_node is None or "template" not in help_node:
        return None
    template = OmegaConf.to_container(help_node, resolve=True)["template"]
    return string.Template(template).safe_substitute(
        FLAGS_HELP="", HYDRA_CONFIG_GROUPS="", APP_CONFIG_GROUPS="", CONFIG="")


def refuse_renamed(args: Sequence[str], renamed: Mapping[str, str]) -> None:
    """Refuse an override of a key that an app spells otherwise now, giving the new spelling.

    Hydra would only say that the key is not in the app's config; this names the one to write.

    Args:
        args: Command-line arguments (``key=value``, ``+key.field=value``, flags).
        renamed: Old key -> the key that replaces it, e.g. ``{"imperfections":
            "task.imperfections", "task_options": "task"}``.

    Raises:
        SystemExit: An override of an old key or of a field below it; the message gives the
            override in the new spelling (``+task.imperfections.action_latency=2``).
    """
    for arg in args:
        key, equals, value = arg.partition("=")
        if arg.startswith("-") or not OVERRIDE_KEY.fullmatch(key):
            continue
        old, dot, field = key.lstrip("+~").partition(".")
        if old not in renamed:
            continue
        new = renamed[old] + dot + field
        if not equals or (not field and value.startswith("{")):
            spelling = f"+{new}.<field>=<value>, one override per field"
        else:
            spelling = f"+{new}={value}"
        raise SystemExit(f"{arg}: '{old}' is no key of this app; write {spelling} "
                         f"(task.<option> overrides the task's options in every app)")


def moved_spelling(override: str, moved: Mapping[str, str]) -> str | None:
    """The new spelling of ``override`` when its key (or a key above it) moved, else ``None``.

    Args:
        override: ``key=value`` (``+``/``~`` prefixes allowed).
        moved: Old dotted key -> new key, e.g. ``{"policy.flow_steps": "policy.head.steps",
            "policy.action_head": "policy/head"}`` (a ``/`` marks a config group: the value
            chooses one of its files). An old key ending in ``=`` moved alone, the keys below
            it did not: ``{"algo.critic=": "algo.critic.network"}``.

    Returns:
        ``"<old> is now <new>: write <new>=<value>"``, or ``None``.
    """
    key, equals, value = override.partition("=")
    if override.startswith("-") or not OVERRIDE_KEY.fullmatch(key):
        return None
    key = key.lstrip("+~")
    for old in sorted(moved, key=len, reverse=True):
        alone = old.endswith("=")
        name = old.rstrip("=")
        if key == name or (not alone and key.startswith(name + ".")):
            if alone and value.startswith("{"):
                continue  # the whole block, in its new spelling
            new = moved[old] + key[len(name):]
            write = f"{new}={value}" if equals else new
            return f"{name} is now {moved[old]}: write {write}"
    return None


def refuse_moved(args: Sequence[str], moved: Mapping[str, str]) -> None:
    """Refuse an override of a key that moved inside the config, giving the new spelling.

    Raises:
        SystemExit: Naming the override and the key to write instead.
    """
    for arg in args:
        spelling = moved_spelling(arg, moved)
        if spelling is not None:
            raise SystemExit(f"{arg}: {spelling}")


def quote_paths(args: Sequence[str]) -> list[str]:
    """``args`` with each ``key=value`` whose value names an existing file or folder, and holds
    a character Hydra's grammar would read as syntax (``=``, ``,``, brackets, quotes, spaces),
    rewritten as ``key='value'``: so ``checkpoint=<a sweep's job folder>`` works as written.

    A value that is no existing path is left alone, so ``-m checkpoint=run_a,run_b`` still
    sweeps two checkpoints.
    """
    return [_quoted(arg) for arg in args]


def _quoted(arg: str) -> str:
    key, equals, value = arg.partition("=")
    if (not equals or arg.startswith("-") or not OVERRIDE_KEY.fullmatch(key)
            or UNQUOTED_VALUE.fullmatch(value) or not Path(value).exists()):
        return arg
    if "'" not in value:
        return f"{key}='{value}'"
    if '"' not in value:
        return f'{key}="{value}"'
    return f"{key}='{value.replace(chr(39), chr(92) + chr(39))}'"
