"""Every package of the source tree is in the wheel: pyproject.toml lists packages by hand (the
role folders are mapped into `textserve`), and a package left out imports in a checkout but not
in an installed server (service/http once did: the container image failed to start)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROLE_FOLDERS = ("service", "model", "export", "bench")


def source_packages() -> set[str]:
    found = set()
    for init in (ROOT / "textserve").rglob("__init__.py"):
        rel = init.parent.relative_to(ROOT)
        if rel.parts[1:2] and rel.parts[1] in ROLE_FOLDERS:  # the symlinks: counted below
            continue
        found.add(".".join(rel.parts))
    for role in ROLE_FOLDERS:
        for init in (ROOT / role).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT)
            found.add(".".join(("textserve", *rel.parts)))
    return found


def test_every_source_package_is_listed_for_the_wheel() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    listed = set(config["tool"]["setuptools"]["packages"])
    missing = sorted(source_packages() - listed)
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {missing}"
    assert "textserve.service.http" in source_packages()  # the walk sees nested packages
