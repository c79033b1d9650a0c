"""Size limits of the house: no module over 600 lines, no function or method over 80.

A module or function may be larger only where the code says why: a comment line
`# size: <reason>` among the module's opening lines (before its first statement after the
docstring), or directly above a def (above its decorators, in the comment block touching it),
or trailing the def line. The reason must be words, not a bare marker.

Walked: textserve/ (without the generated textserve/v1 and textserve/oip, and without its
symlinks, which point at the role folders walked in their own right) and service/, model/,
export/, bench/. Tests are not walked.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WALKED = ("textserve", "service", "model", "export", "bench")
GENERATED = (Path("textserve", "v1"), Path("textserve", "oip"))
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
MARKER = re.compile(r"#\s*size:\s*(?P<reason>.*\S)?")
MIN_REASON = 10  # characters: "# size: ok" is not a reason


def sources(root: Path = ROOT) -> list[Path]:
    """The project's Python sources, relative to root, generated code and symlinks left out."""
    found: list[Path] = []
    for top in WALKED:
        for folder, dirs, files in os.walk(root / top, followlinks=False):
            here = Path(folder).relative_to(root)
            dirs[:] = sorted(
                d for d in dirs if not (Path(folder) / d).is_symlink() and here / d not in GENERATED
            )
            found.extend(here / f for f in sorted(files) if f.endswith(".py"))
    return found


def _reasoned(line: str) -> bool:
    match = MARKER.search(line)
    return bool(match and match["reason"] and len(match["reason"]) >= MIN_REASON)


def _module_marked(lines: list[str], tree: ast.Module) -> bool:
    body = tree.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    opening = body[0].lineno - 1 if body else len(lines)
    return any(_reasoned(line) for line in lines[:opening])


def _function_marked(lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    if _reasoned(lines[node.lineno - 1]):
        return True
    index = _start(node) - 2  # the line above the def or its first decorator (0-based)
    while index >= 0 and lines[index].lstrip().startswith("#"):
        if _reasoned(lines[index]):
            return True
        index -= 1
    return False


def _start(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    return min([node.lineno, *(d.lineno for d in node.decorator_list)])


def offenders(path: Path, text: str) -> list[str]:
    """Each size over the limits in one module without a reason given, as a readable line."""
    lines = text.splitlines()
    tree = ast.parse(text, filename=str(path))
    found = []
    if len(lines) > MAX_MODULE_LINES and not _module_marked(lines, tree):
        found.append(f"{path}: module of {len(lines)} lines (limit {MAX_MODULE_LINES})")
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            size = (node.end_lineno or node.lineno) - _start(node) + 1
            if size > MAX_FUNCTION_LINES and not _function_marked(lines, node):
                found.append(
                    f"{path}:{node.lineno}: {node.name}() of {size} lines "
                    f"(limit {MAX_FUNCTION_LINES})"
                )
    return found


def test_no_module_or_function_is_oversized_without_a_reason() -> None:
    found = [
        line for path in sources() for line in offenders(path, (ROOT / path).read_text("utf-8"))
    ]
    assert not found, (
        "over the size limits (split it, or say why the size is earned in a "
        "'# size: <reason>' comment):\n  " + "\n  ".join(found)
    )


def test_the_walk_covers_the_role_folders_and_skips_generated_code() -> None:
    walked = {path.parts[0] for path in sources()}
    assert walked == set(WALKED)
    assert Path("service", "cli.py") in sources()
    assert not any(path.is_relative_to(generated) for path in sources() for generated in GENERATED)
    assert not any(path.parts[:2] == ("textserve", "service") for path in sources())


def _function(lines: int, above: str = "", trailing: str = "") -> str:
    body = "".join("    x = 1\n" for _ in range(lines - 1))
    return f"{above}def f():{trailing}\n{body}"


def test_a_long_function_is_found_unless_a_reason_is_given() -> None:
    assert offenders(Path("m.py"), _function(80)) == []
    assert offenders(Path("m.py"), _function(81)) == ["m.py:1: f() of 81 lines (limit 80)"]
    reason = "# size: one table of every flag, read top to bottom\n"
    assert offenders(Path("m.py"), _function(81, above=reason)) == []
    assert offenders(Path("m.py"), _function(81, above=reason + "# more words\n")) == []
    assert offenders(Path("m.py"), _function(81, trailing="  " + reason.strip())) == []
    assert len(offenders(Path("m.py"), _function(81, above="# size: ok\n"))) == 1
    assert len(offenders(Path("m.py"), _function(81, above=reason + "\n"))) == 1  # not touching


def test_a_long_module_is_found_unless_a_reason_is_given() -> None:
    long = '"""Doc."""\n' + "x = 1\n" * 600
    assert offenders(Path("m.py"), long) == ["m.py: module of 601 lines (limit 600)"]
    marked = '"""Doc."""\n# size: a generated table of every status code\n' + "x = 1\n" * 600
    assert offenders(Path("m.py"), marked) == []
    late = '"""Doc."""\n' + "x = 1\n" * 300 + "# size: too late to count\n" + "x = 1\n" * 300
    assert len(offenders(Path("m.py"), late)) == 1
