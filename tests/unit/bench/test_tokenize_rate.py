"""Unit tests of the tokenization throughput figure (bench/tokenize_rate.py): one process per
thread count, texts/s per core, and one line with exit 2 on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.handmade import make_version
from textserve.bench import tokenize_rate


def test_each_thread_count_is_measured_in_its_own_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    version = make_version(tmp_path / "models", "m", 1)
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["a good film", "bad plot"]))
    out = tmp_path / "rate.json"
    argv = ["--model", str(version), "--texts", str(texts), "--count", "50", "--threads", "1,2"]
    assert (
        tokenize_rate.main([*argv, "--batch-size", "8,64", "--repeats", "1", "--json", str(out)])
        == 0
    )
    rows = json.loads(out.read_text())["rows"]
    assert [(r["threads"], r["batch_size"], r["texts"]) for r in rows] == [
        (1, 8, 50), (1, 64, 50), (2, 8, 50), (2, 64, 50),
    ]  # fmt: skip
    for row in rows:
        assert row["texts_per_second"] > 0 and row["tokens_per_text"] == pytest.approx(2.5)
        assert row["texts_per_second_per_core"] == pytest.approx(
            row["texts_per_second"] / row["threads"]
        )
    assert "per core" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--threads", "0", "--threads must be positive integers"),
        ("--batch-size", "x", "--batch-size must be positive integers"),
        ("--model", "nowhere", "is not a version folder"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, flag: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = {"--model": str(make_version(tmp_path, "m", 1)), "--texts": str(tmp_path)}
    args[flag] = value
    assert tokenize_rate.main([part for item in args.items() for part in item]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
