"""Running a Hydra app as a function: ``main(argv) -> exit status`` for the console scripts and
``scripts/``, with a path argument taken as written even where Hydra's override grammar would
not take it (a sweep's job folder, ``multirun/<date>/<time>/0_algo=grpo,seed=1``), and a refused
run leaving no trace of itself in its run folder (:class:`RunFolderGuard`)."""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

# ``key=value``, ``+key=value``, ``++key=value``, ``~key=value``: an override, not a flag's value.
OVERRIDE_KEY = re.compile(r"(\+\+|\+|~)?[A-Za-z_][\w.@/-]*")
# What Hydra's override grammar takes unquoted in a value (letters, digits and these symbols).
UNQUOTED_VALUE = re.compile(r"[\w/\\+.$%*@?|:-]*", re.ASCII)
# A Hydra override, not one of the app's, so that it is kept out of .hydra/overrides.yaml and of
# a sweep job's folder name (and run_app adds it only to a single run, not to a sweep).
GUARD_OVERRIDE = "++hydra.callbacks.run_folder_guard._target_=harness_common.cli.RunFolderGuard"
# A sweep (each job's folder is the launcher's), or a look at the config without a run.
UNGUARDED_FLAGS = ("-m", "--multirun", "-c", "--cfg", "-i", "--info")


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
    Hydra would, without the seconds Hydra spends listing every config group first.

    A single run (not a ``-m`` sweep) that fails before it wrote anything of its own, as a
    config-time refusal does, leaves its run folder as it found it (:class:`RunFolderGuard`):
    a folder Hydra created for it is removed with its ``.hydra/`` and log; in a folder that
    existed (``hydra.run.dir=<run dir> resume=true``), Hydra's files are put back as they were."""
    saved = sys.argv
    args = saved[1:] if argv is None else list(argv)
    if help_file is not None and ("--help" in args or "-h" in args):
        text = render_help(help_file)
        if text is not None:
            print(text)
            return 0
    sys.argv = [saved[0], *with_run_folder_guard(quote_paths(args))]
    RUN_FOLDERS.clear()
    status = 1  # an exception other than SystemExit (HYDRA_FULL_ERROR=1) fails the run too
    try:
        refuse_renamed(args, renamed or {})
        refuse_moved(args, moved or {})
        app()
        status = 0
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            status = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
    finally:
        sys.argv = saved
        if status != 0:
            for folder in RUN_FOLDERS:
                folder.restore()
        RUN_FOLDERS.clear()
    return status


def override_value(args: Sequence[str], key: str) -> str | None:
    """The value ``args`` give ``key`` (``key=``, ``+key=`` or ``++key=``, quotes removed), or
    ``None``; the last one wins, as in Hydra."""
    value = None
    for arg in args:
        name, equals, text = arg.partition("=")
        if equals and not arg.startswith("-") and name.lstrip("+") == key:
            value = text.strip("'\"")
    return value


def with_run_folder_guard(args: Sequence[str]) -> list[str]:
    """``args`` with :data:`GUARD_OVERRIDE` among the overrides (Hydra takes them as one run of
    arguments), unless they ask for a sweep or for the config only (:data:`UNGUARDED_FLAGS`)."""
    args = list(args)
    if any(arg in UNGUARDED_FLAGS for arg in args):
        return args
    first = next((i for i, arg in enumerate(args) if "=" in arg and not arg.startswith("-")),
                 len(args))
    return [*args[:first], GUARD_OVERRIDE, *args[first:]]


@dataclass
class RunFolder:
    """A run folder as it was before Hydra wrote into it, so that a refused run can leave it so.

    Hydra's own files are those under ``hydra.output_subdir`` (``.hydra/``: ``config.yaml``,
    ``hydra.yaml``, ``overrides.yaml``) and the job's log (``<job name>.log``); the job's own
    files are everything else.

    Attributes:
        path: The run folder (``hydra.run.dir``).
        created: The topmost folder Hydra's ``mkdir(parents=True)`` creates for it, or ``None``
            when the run folder existed.
        hydra_dir: ``path / hydra.output_subdir``, or ``None`` when Hydra writes no copy there.
        log: The job's log file.
        hydra_files: The bytes of each file in ``hydra_dir`` before (an existing folder).
        had_log: Whether the job's log existed before.
        job_files: ``{relative path: (size, mtime in ns)}`` of the job's own files before.
    """

    path: Path
    created: Path | None
    hydra_dir: Path | None
    log: Path
    hydra_files: dict[Path, bytes]
    had_log: bool
    job_files: dict[Path, tuple[int, int]]

    @classmethod
    def before(cls, path: Path, output_subdir: str | None, job_name: str) -> RunFolder:
        """What ``path`` holds now, before Hydra creates or writes into it."""
        path = Path(os.path.abspath(path))
        created = None
        for folder in (path, *path.parents):
            if folder.exists():
                break
            created = folder
        hydra_dir = None if output_subdir is None else path / output_subdir
        hydra_files = {} if hydra_dir is None or not hydra_dir.is_dir() else {
            file: file.read_bytes() for file in hydra_dir.rglob("*") if file.is_file()}
        folder = cls(path, created, hydra_dir, path / f"{job_name}.log", hydra_files,
                     (path / f"{job_name}.log").exists(), {})
        folder.job_files = folder.list_job_files()
        return folder

    def list_job_files(self) -> dict[Path, tuple[int, int]]:
        """``{relative path: (size, mtime in ns)}`` of every file but Hydra's own."""
        if not self.path.is_dir():
            return {}
        found = {}
        for file in self.path.rglob("*"):
            if file == self.log or (self.hydra_dir is not None
                                    and file.is_relative_to(self.hydra_dir)):
                continue
            if file.is_file():
                stat = file.stat()
                found[file.relative_to(self.path)] = (stat.st_size, stat.st_mtime_ns)
        return found

    def restore(self) -> None:
        """Leave the folder as it was before, when the run wrote nothing of its own (a run that
        started and then failed keeps Hydra's files, as a finished one does): remove the
        folders Hydra created, or put Hydra's files in an existing folder back as they were."""
        if self.list_job_files() != self.job_files:
            return
        if self.created is not None:
            shutil.rmtree(self.created, ignore_errors=True)
            return
        if self.hydra_dir is not None and self.hydra_dir.is_dir():
            for file in [file for file in self.hydra_dir.rglob("*") if file.is_file()]:
                if file not in self.hydra_files:
                    file.unlink()
                elif file.read_bytes() != self.hydra_files[file]:
                    file.write_bytes(self.hydra_files[file])
            if not self.hydra_files:
                shutil.rmtree(self.hydra_dir, ignore_errors=True)
        if not self.had_log:
            self.log.unlink(missing_ok=True)


# The run folders of the run that run_app is running (filled by RunFolderGuard, which Hydra builds).
RUN_FOLDERS: list[RunFolder] = []


class RunFolderGuard(Callback):
    """Hydra callback that :func:`run_app` adds to a single run: it notes what the run folder
    holds before Hydra creates it or writes its ``.hydra/`` and log into it
    (:meth:`RunFolder.before`), so that :func:`run_app` can leave it so if the run is refused."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        hydra = config.hydra
        RUN_FOLDERS.append(RunFolder.before(Path(hydra.run.dir), hydra.output_subdir,
                                            hydra.job.name))


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
