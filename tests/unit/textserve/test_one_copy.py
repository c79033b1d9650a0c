"""One class object per module, however it is reached: the role folders (service/, model/,
export/, bench/) are the packages textserve.<role>, and importing them as top-level packages
(the repository root on sys.path) fails with a clear message instead of loading second copies
whose classes are not the server's (a ServerConfig from `service.config` failed every
isinstance check against textserve.service.config's)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
ROLES = ("service", "model", "export", "bench")


def test_a_class_is_one_object_however_its_module_is_reached() -> None:
    from textserve.service import config as by_from
    from textserve.service.config import ServerConfig

    by_name = importlib.import_module("textserve.service.config")
    assert by_from.ServerConfig is ServerConfig is by_name.ServerConfig
    assert sys.modules["textserve.service.config"] is by_name
    # The folder behind the checkout's symlink is the file that was imported.
    assert Path(by_name.__file__ or "").resolve() == ROOT / "service" / "config.py"
    assert not any(name == "service" or name.startswith("service.") for name in sys.modules)


@pytest.mark.parametrize("role", ROLES)
def test_a_role_folder_imported_as_a_top_level_package_fails_clearly(role: str) -> None:
    module = {"service": "service.config", "model": "model.classifier"}.get(role, role)
    # A fresh interpreter, the repository root first on sys.path, as `python -c` from a checkout
    # with PYTHONPATH=. would have it.
    result = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); import {module}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last == (
        f"ImportError: import textserve.{role}, not {role}: the {role}/ folder is the package "
        f"textserve.{role} (see docs/architecture.md)"
    )
