"""ExportOptions: one frozen, self-validating set of export options whose defaults are the CLI's."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from textserve.cli import CliError
from textserve.export import options
from textserve.export.errors import ExportError
from textserve.export.options import ExportOptions


def parse(argv: list[str], *, all_sources: bool = True) -> ExportOptions:
    parser = argparse.ArgumentParser()
    options.add_arguments(parser, all_sources=all_sources)
    return options.from_args(parser.parse_args(argv))


@pytest.mark.parametrize("all_sources", [True, False])
def test_no_flags_give_the_dataclass_defaults(all_sources: bool) -> None:
    assert parse([], all_sources=all_sources) == ExportOptions()


def test_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEXTSERVE_EXPORT_QUANTIZE", "int8")
    monkeypatch.setenv("TEXTSERVE_EXPORT_NO_OPTIMIZE", "yes")
    monkeypatch.setenv("TEXTSERVE_EXPORT_THREADS", "3")
    got = parse(["--threads", "2", "--no-padding-free", "--max-length", "40",
                 "--truncation-side", "left", "--trust-remote-code"])  # fmt: skip
    assert got == ExportOptions(
        quantize="int8", optimize=False, threads=2, padding_free=False, max_length=40,
        truncation_side="left", trust_remote_code=True,
    )  # fmt: skip


def test_remote_code_is_never_trusted_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TEXTSERVE_EXPORT_TRUST_REMOTE_CODE", "1")
    assert parse([]).trust_remote_code is False


def test_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        ExportOptions().opset = 17  # type: ignore[misc]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"threads": 0}, "--threads must be >= 1, got 0"),
        ({"max_length": 0}, "--max-length must be >= 1, got 0"),
        ({"truncation_side": "middle"}, "--truncation-side must be one of right, left"),
        ({"rtol": float("nan")}, "tolerances must be >= 0"),
        ({"max_accuracy_drop": float("nan")}, "max accuracy drop must be >= 0 points"),
    ],
)
def test_bad_values_are_refused(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ExportError, match=message):
        ExportOptions(**changes)  # type: ignore[arg-type]
    with pytest.raises(ExportError, match=message):
        dataclasses.replace(ExportOptions(), **changes)


def test_a_bad_flag_value_is_a_cli_error() -> None:
    with pytest.raises(CliError, match="--max-length must be >= 1"):
        parse(["--max-length", "-3"])
