"""One rule for version folders: textserve.artifact lists them, every reader uses it.

An AST check over the shipped code (the server, the CLI, export, training, bench): outside
textserve/artifact.py nothing turns a folder name into a number itself (`int(p.name)`,
`p.name.isdigit()`, `parse_version(p.name)`); and the rule's behaviour, including the worker
sizing that once crashed `textserve serve` on a `²` folder.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from textserve.artifact import MANIFEST_FILE, identity, iter_versions, newest_version, next_version
from textserve.service.workers.sizing import WORKER_BASE_BYTES, worker_memory

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("textserve", "service", "model", "export", "bench")
RULE_HOME = ROOT / "textserve" / "artifact.py"
FOLDER_NAME_ATTRIBUTES = {"name", "stem"}  # Path.name, DirEntry.name, Path.stem


def shipped_sources() -> list[Path]:
    """Every .py file of the packages, each once (textserve/<role> are symbolic links to the
    role folders: not followed, the role folders are listed themselves)."""
    files = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if not any(part.is_symlink() for part in [path, *path.parents]):
                files.append(path)
    return files


def is_folder_name(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr in FOLDER_NAME_ATTRIBUTES


def own_version_rules(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for each place that reads a version from a folder name itself."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        callee = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        if callee in ("int", "parse_version") and node.args and is_folder_name(node.args[0]):
            found.append((node.lineno, f"{callee}() of a folder name"))
        if (
            isinstance(func, ast.Attribute)
            and func.attr in ("isdigit", "isdecimal", "isnumeric")
            and is_folder_name(func.value)
        ):
            found.append((node.lineno, f"{func.attr}() of a folder name"))
    return found


def test_the_check_finds_what_the_worker_sizing_once_did() -> None:
    # The code service/workers/sizing.py::worker_memory had before the rule moved (and two forms
    # the other readers had): the check must see each, or it proves nothing.
    old = """
versions = [v for v in model.iterdir() if v.name.isdigit()]
newest = max(versions, key=lambda v: int(v.name))
numbers = [v for p in model_dir.iterdir() if (v := parse_version(p.name))]
ok = artifact.parse_version(entry.stem)
"""
    assert [what for _, what in sorted(own_version_rules(ast.parse(old)))] == [
        "isdigit() of a folder name",
        "int() of a folder name",
        "parse_version() of a folder name",
        "parse_version() of a folder name",
    ]


def test_nothing_outside_textserve_artifact_reads_versions_from_folder_names() -> None:
    sources = shipped_sources()
    assert RULE_HOME in sources and ROOT / "service" / "repository" / "scan.py" in sources
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in sources
        if path != RULE_HOME
        for line, what in own_version_rules(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert offenders == [], "use textserve.artifact.iter_versions / identity:\n" + "\n".join(
        offenders
    )


def version(model_dir: Path, name: str, *, manifest: bool = True) -> Path:
    path = model_dir / name
    path.mkdir(parents=True)
    if manifest:
        (path / MANIFEST_FILE).write_text("{}")
    return path


def test_iter_versions_lists_canonical_decimals_ascending(tmp_path: Path) -> None:
    for name in ("10", "2", "²", "012", "0", "+3", str(2**63), ".tmp-1-x", "1"):
        version(tmp_path, name)
    version(tmp_path, "7", manifest=False)  # still being written
    (tmp_path / "8").write_text("a file, not a folder")
    os.symlink(tmp_path / "2", tmp_path / "9")  # listed: loading refuses it with a reason
    skipped: set[str] = set()
    listed = list(iter_versions(tmp_path, complete=True, skipped=skipped))
    assert listed == [(1, tmp_path / "1"), (2, tmp_path / "2"), (9, tmp_path / "9"),
                      (10, tmp_path / "10")]  # fmt: skip
    assert skipped == {"²", "012", "0", "+3", str(2**63)}  # hidden ones are not reported
    assert [v for v, _ in iter_versions(tmp_path)] == [1, 2, 7, 9, 10]
    assert newest_version(tmp_path, complete=True) == (10, tmp_path / "10")
    assert next_version(tmp_path) == 11
    assert identity(tmp_path / "10") == (tmp_path.name, 10)
    assert identity(tmp_path / "²") == (tmp_path.name, None)


def test_next_version_of_an_empty_model_is_1_and_a_missing_one_raises(tmp_path: Path) -> None:
    assert next_version(tmp_path) == 1 and newest_version(tmp_path) is None
    with pytest.raises(OSError):
        list(iter_versions(tmp_path / "absent"))


def test_worker_sizing_skips_folders_that_are_not_versions(tmp_path: Path) -> None:
    good = version(tmp_path / "m", "3")
    (good / "model.onnx").write_bytes(b"x" * 1000)
    bogus = version(tmp_path / "m", "²")  # int("²") raised ValueError here
    (bogus / "model.onnx").write_bytes(b"x" * 10**6)
    per_worker = worker_memory(tmp_path)
    assert WORKER_BASE_BYTES < per_worker < WORKER_BASE_BYTES + 10**6
