"""Generate docs/reference/cli.md, the flag reference, from the console script's own parsers.

    .venv/bin/python docs/reference.py           # rewrite docs/reference/cli.md
    .venv/bin/python docs/reference.py --check   # exit 1 if it differs from the parsers

Every subcommand of `textserve` (textserve.cli.COMMANDS) with every argument: flag, the
TEXTSERVE_* variable it falls back to (read from its help, where env_flag names it), default
and help. The parsers are built with no TEXTSERVE_* variable set, so the page shows the
defaults of the code (the config dataclasses), not of the shell that ran it.
tests/unit/docs/test_cli_reference.py fails when the page and the parsers disagree.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "reference" / "cli.md"
REGENERATE = ".venv/bin/python docs/reference.py"
_ENV = re.compile(r"\s*\[(TEXTSERVE_[A-Z0-9_]+)(=1)?\]\s*$")

HEADER = f"""# Command-line reference

Generated from the parsers of `textserve` (`{REGENERATE}`; a test fails when a flag is
added, removed or changed without regenerating this page). Every flag with a variable in the
*environment* column falls back to it when the flag is not given (`=1` marks a switch that
`1`, `true`, `yes` or `on` turns on); a bad value there is one error line and exit status 2.
`textserve COMMAND --help` prints the same.
"""


@contextmanager
def _clean_environment():
    """Hide TEXTSERVE_* variables while parsers are built: their defaults would come from them."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("TEXTSERVE_")}
    for key in saved:
        del os.environ[key]
    try:
        yield
    finally:
        os.environ.update(saved)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _default(action: argparse.Action) -> str:
    if isinstance(action, argparse._StoreTrueAction):
        return "on" if action.default else "off"
    if isinstance(action, argparse._StoreFalseAction):  # a switch that turns something off
        return "off" if action.default else "on"
    if action.default is None or action.default is argparse.SUPPRESS:
        return "—"
    if isinstance(action, argparse.BooleanOptionalAction):
        return "on" if action.default else "off"
    value = action.default
    if isinstance(value, list | tuple):
        value = ",".join(map(str, value))
    return f"`{value}`" if str(value) != "" else '`""`'


def _row(action: argparse.Action, prog: str) -> str:
    raw = action.help or ""
    if "%(" in raw:
        raw = raw % {"default": action.default, "prog": prog}
    match = _ENV.search(raw)
    env = f"`{match.group(1)}{match.group(2) or ''}`" if match else ""
    help_text = _ENV.sub("", raw) if match else raw
    if action.option_strings:
        names = ", ".join(f"`{o}`" for o in action.option_strings)
        if action.choices is not None:
            help_text = f"{help_text} (one of: {', '.join(map(str, action.choices))})"
        return f"| {names} | {env} | {_default(action)} | {_cell(help_text)} |"
    shown = action.metavar or action.dest
    if action.choices is not None:
        help_text = f"{help_text} (one of: {', '.join(map(str, action.choices))})"
    return f"| `{shown}` (positional) | {env} | {_default(action)} | {_cell(help_text)} |"


def _section(name: str, summary: str, example: str, parser: argparse.ArgumentParser) -> list[str]:
    lines = [f"## textserve {name}", "", summary[:1].upper() + summary[1:] + ".", ""]
    lines += ["```bash", *[line.strip() for line in example.splitlines()], "```", ""]
    groups: list[Any] = parser._action_groups
    for group in groups:
        actions = [
            a
            for a in group._group_actions
            if not isinstance(a, argparse._HelpAction) and a.help is not argparse.SUPPRESS
        ]
        if not actions:
            continue
        if group.title not in ("options", "optional arguments", "positional arguments"):
            lines += [f"### {group.title}", ""]
        lines += ["| argument | environment | default | meaning |", "|---|---|---|---|"]
        lines += [_row(a, parser.prog) for a in actions]
        lines.append("")
    return lines


def render() -> str:
    """The page, as the parsers say it today."""
    if str(ROOT) not in sys.path:  # run as a script: import this checkout's textserve
        sys.path.insert(0, str(ROOT))
    with _clean_environment():
        from textserve.cli import COMMANDS, build_parser

        parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    lines = [HEADER, "Global: `textserve --log-level LEVEL COMMAND …` (DEBUG, INFO, WARNING,"]
    lines += ["ERROR; default INFO).", ""]
    for name, command in COMMANDS.items():
        lines += _section(name, command.summary, command.example, subparsers.choices[name])
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
        if current != text:
            print(f"{PAGE.relative_to(ROOT)} is out of date: run {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
