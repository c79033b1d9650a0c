"""The strict parsing of version strings and the quoting of request-provided text in messages."""

from __future__ import annotations

import pytest

from textserve import artifact
from textserve.artifact import MAX_VERSION, shown
from textserve.service.dataplane.prologue import MAX_NAME_CHARS, model_name, parse_version
from textserve.service.errors import ModelNotFoundError

NOT_VERSIONS = ["", "0", "01", "²", "١", "٣", "+1", "-1", " 1", "1 ", "1_000", "1e3", "0x1"]
NOT_VERSIONS += [str(MAX_VERSION + 1), "9" * 19, "1" * 10_000]


@pytest.mark.parametrize(
    ("text", "number"),
    [("1", 1), ("42", 42), (str(MAX_VERSION), MAX_VERSION), *((t, None) for t in NOT_VERSIONS)],
)
def test_parse_version(text: str, number: int | None) -> None:
    assert artifact.parse_version(text) == number


def test_oip_parse_version_refuses_what_no_folder_can_be_named() -> None:
    assert parse_version("m", "") is None
    assert parse_version("m", "7") == 7
    with pytest.raises(ModelNotFoundError, match=r"model 'm' has no version '²'"):
        parse_version("m", "²")
    with pytest.raises(ModelNotFoundError) as info:
        parse_version("m", "9" * 100_000)
    assert "(100000 characters)" in str(info.value) and len(str(info.value)) < 300


def test_shown_quotes_and_cuts() -> None:
    assert shown("abc") == "'abc'"
    assert shown("a" * 64) == repr("a" * 64)
    assert shown("a" * 65) == f"'{'a' * 64}…' (65 characters)"
    assert shown("x'y\n", limit=2) == '"x\'…" (4 characters)'


def test_model_name_refuses_names_no_folder_can_have() -> None:
    assert model_name("") is None
    assert model_name("m" * MAX_NAME_CHARS) == "m" * MAX_NAME_CHARS
    with pytest.raises(ModelNotFoundError, match=r"\(256 characters\)"):
        model_name("m" * (MAX_NAME_CHARS + 1))
