"""`make mutate`'s groups (tests/mutation/run.py) name files that exist: a module or a test
moved to another folder must be renamed in its group too, or the group would mutate nothing
or run without the tests that kill its mutants."""

from __future__ import annotations

from pathlib import Path

from tests.mutation.run import GROUPS, ROOT


def test_every_group_names_existing_modules_and_tests() -> None:
    missing = [
        f"{group}: {path}"
        for group, (modules, tests) in GROUPS.items()
        for path in [*(str(Path("textserve", m)) for m in modules), *tests]
        if not (ROOT / path).is_file()
    ]
    assert missing == []
    assert all(tests for _, tests in GROUPS.values())
