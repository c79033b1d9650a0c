"""docs/reference/cli.md is the parsers' flags: a flag added, removed or changed without
regenerating the page fails here (regenerate: .venv/bin/python docs/reference.py)."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference", ROOT / "docs" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_reference_is_what_the_parsers_say() -> None:
    generator = _generator()
    committed = generator.PAGE.read_text(encoding="utf-8")
    assert committed == generator.render(), (
        f"docs/reference/cli.md differs from the parsers' flags: run {generator.REGENERATE} "
        "and commit docs/reference/cli.md"
    )


def test_every_flag_of_every_command_is_on_the_page() -> None:
    from textserve.cli import build_parser

    page = _generator().render()
    subparsers = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    missing = [
        f"textserve {name} {option}"
        for name, parser in subparsers.choices.items()
        for action in parser._actions
        for option in action.option_strings
        if option not in ("-h", "--help") and f"`{option}`" not in page
    ]
    assert not missing
    assert len(subparsers.choices) >= 7  # train, export, serve, classify, models, bench, setup


def test_defaults_come_from_the_code_not_the_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    generator = _generator()
    clean = generator.render()
    monkeypatch.setenv("TEXTSERVE_MAX_QUEUE_SIZE", "7")
    assert generator.render() == clean
    assert "| `--max-queue-size` | `TEXTSERVE_MAX_QUEUE_SIZE` | `4096` |" in clean


def test_a_new_flag_changes_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    import textserve.service.cli as serve_cli

    before = _generator().render()
    original = serve_cli.add_arguments

    def with_one_more(parser: argparse.ArgumentParser) -> None:
        original(parser)
        parser.add_argument("--undocumented", help="a flag nobody wrote down")

    monkeypatch.setattr(serve_cli, "add_arguments", with_one_more)
    after = _generator().render()
    assert after != before and "`--undocumented`" in after
