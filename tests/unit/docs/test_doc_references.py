"""Every repository path a doc, docstring or comment names exists, and none points outside.

Checked: the Markdown files (README.md, docs/, the rest), and the docstrings and comments of
every Python file. A path is a token whose first segment is one of the repository's top-level
folders (`service/engine/batcher.py`, `deploy/k8s/base`, `tests/unit/{textserve,model}`, globs
like `bench/results/*.json`), a `../` reference, or the target of a relative Markdown link
(resolved from the file that holds it). Paths created at run time (`models/`, `runs/`) are not
top-level folders of the repository, so they are not checked.
"""

from __future__ import annotations

import ast
import glob
import io
import re
import subprocess
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
# Generated gRPC code, and the checkout's symlinks into the role folders (read there).
SKIP = ("textserve/v1/", "textserve/oip/")
# Folders a command writes that are not committed: `make bench`'s workers comparison.
WRITTEN = ("bench/results/workers",)


def _tracked(pattern: str) -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", pattern],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    paths = [ROOT / line for line in out.splitlines() if not line.startswith(SKIP)]
    return [p for p in paths if p.is_file() and not p.is_symlink()]


ROOTS = sorted(
    {p.relative_to(ROOT).parts[0] for p in _tracked("*") if len(p.relative_to(ROOT).parts) > 1}
)
_SEGMENT = r"[A-Za-z0-9_.*{},<>-]+"
PATH = re.compile(
    r"(?<![\w./:@$-])((?:\.\./)+" + _SEGMENT + r"(?:/" + _SEGMENT + r")*"
    r"|(?:" + "|".join(map(re.escape, ROOTS)) + r")(?:/" + _SEGMENT + r")+/?)"
)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _expand(path: str) -> list[str]:
    """Shell-style braces: a/{b,c}.py -> a/b.py, a/c.py."""
    match = re.search(r"\{([^{}]*)\}", path)
    if not match:
        return [path]
    head, tail = path[: match.start()], path[match.end() :]
    return [p for option in match.group(1).split(",") for p in _expand(head + option + tail)]


def _exists(base: Path, reference: str) -> bool:
    reference = re.sub(r"<[^<>]*>", "*", reference)  # docs/<topic>.md: some file of that shape
    for path in _expand(reference):
        target = (base / path).resolve()
        if not target.is_relative_to(ROOT):
            return False  # outside the repository
        if any(ch in path for ch in "*?["):
            if not glob.glob(str(base / path)):
                return False
        elif not target.exists():
            # `service/cli.add_arguments`, `service/workers/sizing.py::worker_memory`: a name in a
            # file
            module = re.sub(r"(::.*|\.[A-Za-z_]\w*)$", "", path)
            if module == path or not (
                (base / module).exists() or (base / (module + ".py")).exists()
            ):
                return False
    return True


def _problems(text: str, where: Path, link_base: Path | None) -> list[str]:
    found = []
    for match in PATH.finditer(text):
        ref = match.group(1).rstrip(".,;:)")
        if ref.rstrip("/") in WRITTEN:
            continue
        base = where.parent if ref.startswith("../") else ROOT
        if not _exists(base, ref):
            found.append(ref)
    if link_base is not None:
        for match in LINK.finditer(text):
            ref = match.group(1).split("#", 1)[0]
            if not ref or re.match(r"^[a-z][a-z0-9+.-]*:", ref) or ref.startswith("/"):
                continue  # an anchor on the page, a URL or a site-absolute link
            if not _exists(link_base, ref):
                found.append(ref)
    return [f"{where.relative_to(ROOT)}: {ref}" for ref in found]


def _python_prose(path: Path) -> str:
    """A Python file's docstrings and comments: the prose in it, not its string literals."""
    source = path.read_text(encoding="utf-8")
    parts = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                parts.append(doc)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            parts.append(token.string)
    return "\n".join(parts)


def test_the_roots_are_the_repository_folders() -> None:
    # The check means something only if it knows the folders (a broken git call finds none).
    assert {"service", "textserve", "docs", "tests", "deploy"} <= set(ROOTS)


@pytest.mark.parametrize("suffix", ["md", "py"])
def test_every_named_path_exists(suffix: str) -> None:
    problems = []
    for path in _tracked(f"*.{suffix}"):
        if suffix == "md":
            text = path.read_text(encoding="utf-8")
            problems += _problems(text, path, link_base=path.parent)
        else:
            problems += _problems(_python_prose(path), path, link_base=None)
    assert not problems, "paths that do not exist or lie outside the repository:\n" + "\n".join(
        problems
    )


def test_the_check_finds_a_stale_and_an_outside_path(tmp_path: Path) -> None:
    doc = ROOT / "docs" / "example.md"  # never written: only names a place for relative links
    text = (
        "See `service/engine/no_such_module.py`, `../shared/DESIGN.md`, "
        "`tests/unit/{docs,no_such_tier}` and [a page](no-such-page.md); "
        "`service/engine/`, `bench/results/*.json` and [home](index.md) exist."
    )
    assert _problems(text, doc, link_base=doc.parent) == [
        "docs/example.md: service/engine/no_such_module.py",
        "docs/example.md: ../shared/DESIGN.md",
        "docs/example.md: tests/unit/{docs,no_such_tier}",
        "docs/example.md: no-such-page.md",
    ]
