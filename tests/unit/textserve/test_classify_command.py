"""`textserve classify` without a server (textserve/commands/classify.py): texts from the
arguments, a file or stdin, and the table it prints."""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import pytest

from textserve.cli import CliError, build_parser
from textserve.client import Prediction
from textserve.commands import classify as classify_cli


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def test_classify_reads_arguments_file_or_stdin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert classify_cli.read_texts(parse(["classify", "a", "b"])) == ["a", "b"]
    path = tmp_path / "texts.txt"
    path.write_text("one\n\n two \n")
    assert classify_cli.read_texts(parse(["classify", "--file", str(path)])) == ["one", " two "]
    monkeypatch.setattr("sys.stdin", io.StringIO("x\ny\n"))
    assert classify_cli.read_texts(parse(["classify"])) == ["x", "y"]
    with pytest.raises(CliError, match="cannot read"):
        classify_cli.read_texts(parse(["classify", "--file", str(tmp_path / "nope")]))
    monkeypatch.setattr("sys.stdin", io.StringIO("\n \n"))
    with pytest.raises(CliError, match="only blank lines"):
        classify_cli.read_texts(parse(["classify"]))


def test_classify_table_is_readable() -> None:
    predictions = [
        Prediction("positive", 0.9876, scores={"negative": 0.0124, "positive": 0.9876}),
        Prediction("negative", 0.5),
    ]
    table = classify_cli.format_table(["a fine film", "x" * 100], predictions, True, 0)
    lines = table.splitlines()
    assert lines[0].split() == ["LABEL", "SCORE", "TEXT"]
    assert lines[1].startswith("positive  0.9876  a fine film  negative=0.0124 positive=0.9876")
    assert lines[2].endswith("...") and len(lines[2]) < 90
