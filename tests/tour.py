"""The README's quick tour as a script: its marked blocks, parsed, run and their output checked.

A fenced block right after a line `<!-- tour -->` (or `<!-- tour: OPTIONS -->`, options
separated by `;`) is part of the tour. Console blocks hold `$ COMMAND` lines (a trailing `\\`
continues one), each followed by the output it prints; Python blocks are run as a script and
must exit 0. Options: `background` (the block's one command keeps running, a server: its log is
matched once it says it serves), `retry` (rerun a command until its output matches, for up to
30 s: a hot reload has to notice the new version first), `append=ARGS` (added to every command
of the block when the test runs it, e.g. a tiny preset instead of the default training: the
README's source shows it).

Output is matched by shape, not by value: timestamps and numbers are any number, except
version numbers (after `version`, `version="`, `"model_version":` or a `/`: models/reviews/2);
labels are any label of the same model (fresh or rotten, negative or positive), and the
training presets' names any preset (the test trains the tiny one); KB/MB/GB any unit; runs of
spaces any spacing; a line `...` is any number of lines. Everything else must be as the README
prints it: words, version numbers, the order of lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MARKED = re.compile(
    r"^<!-- tour(?:: (?P<options>[^>]*?))? -->\n```(?P<lang>\w+)\n(?P<body>.*?)^```",
    re.MULTILINE | re.DOTALL,
)
_PIECES = re.compile(
    r"(?P<timestamp>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[,.]\d+)?(?:[+-]\d\d:\d\d|Z)?)"
    r"|(?P<number>\d[\d,]*\.\d+(?:e[-+]?\d+)?|\d+e[-+]?\d+|\d{1,3}(?:,\d{3})+|\d+)"
    r"|(?P<label>\b(?:fresh|rotten)\b)"
    r"|(?P<sentiment>\b(?:negative|positive)\b)"
    r"|(?P<preset>\b(?:tiny|small|base)(?= preset\b))"
    r"|(?P<unit>\b[KMG]B\b)"
    r"|(?P<space>\s+)"
)
_ANY_NUMBER = r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?"
_REPLACEMENT = {
    "timestamp": r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[,.]\d+)?(?:[+-]\d\d:\d\d|Z)?",
    "number": _ANY_NUMBER,
    "label": r"(?:fresh|rotten)",
    "sentiment": r"(?:negative|positive)",
    "preset": r"(?:tiny|small|base)",
    "unit": r"(?:[KMG]?B)",
    "space": r"\s+",
}


# What comes right before a version number: "version 2", version="2", "model_version":2, and
# path segments such as models/reviews/2.
_VERSION = re.compile(r"(?:version[\s=\"':]*|/)$")


@dataclass
class Command:
    text: str  # the shell command, continuation lines joined
    expected: list[str]  # the output lines the README shows


@dataclass
class Block:
    lang: str
    options: dict[str, str]
    body: str
    commands: list[Command] = field(default_factory=list)


def parse(readme: str) -> list[Block]:
    blocks = []
    for match in MARKED.finditer(readme):
        options = {}
        for option in (match.group("options") or "").split(";"):
            key, _, value = option.strip().partition("=")
            if key:
                options[key] = value.strip()
        block = Block(match.group("lang"), options, match.group("body"))
        if block.lang == "console":
            block.commands = _commands(block.body)
        blocks.append(block)
    return blocks


def _commands(body: str) -> list[Command]:
    commands: list[Command] = []
    lines = body.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("$ "):
            if not commands:
                raise ValueError(f"output before any command in a tour block: {line!r}")
            commands[-1].expected.append(line)
            i += 1
            continue
        text = line[2:]
        while text.endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text[:-1] + " " + lines[i].strip()
        commands.append(Command(text, []))
        i += 1
    return commands


def line_pattern(expected: str) -> re.Pattern[str]:
    """The shape of one expected line, as a regular expression."""
    out, pos = [], 0
    text = expected.strip()
    for match in _PIECES.finditer(text):
        out.append(re.escape(text[pos : match.start()]))
        kind = match.lastgroup or "space"
        if kind == "number" and _VERSION.search(text[: match.start()]) and match.group().isdigit():
            out.append(match.group())  # a version number: the point of a hot reload
        else:
            out.append(_REPLACEMENT[kind])
        pos = match.end()
    out.append(re.escape(text[pos:]))
    return re.compile("".join(out))


def output_lines(output: str) -> list[str]:
    """Lines as a terminal would show them last: progress bars rewrite theirs with \\r."""
    lines = []
    for line in output.replace("\r\n", "\n").split("\n"):
        for piece in line.split("\r"):
            if piece.strip():
                lines.append(piece.rstrip())
    return lines


def matches(expected: list[str], actual: list[str]) -> bool:
    """Whether `actual` has the shape of `expected` (`...` lines: any lines in between)."""
    wanted = [e for e in expected if e.strip()]

    def match_from(i: int, j: int) -> bool:
        if i == len(wanted):
            return j == len(actual)
        if wanted[i].strip() == "...":
            return any(match_from(i + 1, k) for k in range(j, len(actual) + 1))
        if j < len(actual) and line_pattern(wanted[i]).fullmatch(actual[j].strip()):
            return match_from(i + 1, j + 1)
        return False

    return match_from(0, 0)
