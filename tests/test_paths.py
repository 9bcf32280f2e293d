"""``data_dir()``: HARNESS_DATA first, then a checkout's ``data/``, then the user data folder of
an installed package; and ``${data_dir:}`` in a config resolves to it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

from harness_common.paths import data_dir, register_resolver

ROOT = Path(__file__).resolve().parent.parent


def test_harness_data_wins_over_everything(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_DATA", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert data_dir() == tmp_path / "mine"
    assert data_dir(package_root=tmp_path) == tmp_path / "mine"


def test_a_checkout_keeps_its_data_in_the_repository(monkeypatch):
    monkeypatch.delenv("HARNESS_DATA", raising=False)
    assert data_dir() == ROOT / "data"


def test_an_installed_package_uses_the_user_data_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("HARNESS_DATA", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    site = tmp_path / "site-packages"  # no pyproject.toml beside the packages
    site.mkdir()
    assert data_dir(package_root=site) == tmp_path / "xdg" / "vla-rl-harness"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert data_dir(package_root=site) == tmp_path / "home/.local/share/vla-rl-harness"


def test_a_copy_of_the_package_outside_the_checkout_finds_the_user_folder(tmp_path):
    """The package imported from a folder that looks like site-packages, in a fresh process."""
    site = tmp_path / "site-packages"
    shutil.copytree(ROOT / "harness_common", site / "harness_common",
                    ignore=shutil.ignore_patterns("__pycache__"))
    code = "from harness_common.paths import data_dir; print(data_dir())"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "HOME": str(tmp_path / "home"),
           "XDG_DATA_HOME": str(tmp_path / "xdg")}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "xdg" / "vla-rl-harness")


def test_the_resolver_puts_the_data_folder_into_a_config(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_DATA", str(tmp_path))
    register_resolver()
    register_resolver()  # a second registration is harmless
    config = OmegaConf.create({"out": "${data_dir:}/demos/push.hdf5"})
    assert config.out == f"{tmp_path}/demos/push.hdf5"
