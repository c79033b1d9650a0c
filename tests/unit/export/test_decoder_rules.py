"""A decoder classifier's pad token and max_length (export/decoders.py): which pad the server
pads with when config.json or the tokenizer names none, and how long a long context gets."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from textserve.export import decoders
from textserve.export.errors import ExportError

HERE = Path("folder")


class Config(SimpleNamespace):
    def get_text_config(self) -> Any:
        return self


def tokenizer(**ids: int | None) -> SimpleNamespace:
    """A tokenizer naming the pad, eos and unk tokens given as ids (`pad=2`)."""
    fields: dict[str, Any] = {}
    for role in ("pad", "eos", "unk"):
        value = ids.get(role)
        fields[f"{role}_token_id"] = value
        fields[f"{role}_token"] = None if value is None else f"<{role}>"
    fields["convert_ids_to_tokens"] = lambda i: f"<{i}>"
    return SimpleNamespace(**fields)


@pytest.mark.parametrize(
    ("config_pad", "ids", "want"),
    [
        (5, {"pad": 5, "eos": 2}, (5, "<5>", "config.json")),  # both name it
        (5, {"eos": 2}, (5, "<5>", "config.json")),  # config.json's: what the classifier skips
        (None, {"pad": 7, "eos": 2, "unk": 0}, (7, "<pad>", "pad_token")),  # Qwen3's
        (None, {"eos": 2, "unk": 0}, (2, "<eos>", "eos_token")),  # then its eos (Llama's)
        (None, {"unk": 0}, (0, "<unk>", "unk_token")),  # then its unk
    ],
)
def test_the_pad_is_configs_else_the_tokenizers_pad_eos_unk(
    config_pad: int | None, ids: dict[str, int], want: tuple[int, str, str]
) -> None:
    config = Config(pad_token_id=config_pad)
    pad = decoders.decide_pad(config, tokenizer(**ids), HERE)
    assert pad == want
    assert pad.note() == {"id": want[0], "token": want[1], "source": want[2]}
    assert config.pad_token_id == want[0]  # set where the classifier reads it


def test_a_decided_pad_is_logged_and_a_configured_one_is_not(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="textserve.export.decoders"):
        decoders.decide_pad(Config(pad_token_id=None), tokenizer(eos=2), HERE)
        decoders.decide_pad(Config(pad_token_id=2), tokenizer(eos=2), HERE)
    (record,) = caplog.records
    assert "tokenizer's eos token '<eos>' (id 2)" in record.getMessage()
    assert "manifest's pad_token_id is 2" in record.getMessage()


def test_a_tokenizer_padding_with_another_id_than_the_config_is_told(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="textserve.export.decoders"):
        assert decoders.decide_pad(Config(pad_token_id=0), tokenizer(pad=9), HERE).id == 0
    assert "the server pads with 0" in caplog.text


def test_no_pad_anywhere_is_refused() -> None:
    with pytest.raises(ExportError, match=r"neither config.json .* nor the tokenizer"):
        decoders.decide_pad(Config(pad_token_id=None), tokenizer(), HERE)


@pytest.mark.parametrize(
    ("derived", "asked", "want"),
    [
        (32768, None, decoders.DECODER_MAX_LENGTH),  # Qwen2's positions: capped
        (128, None, 128),  # below the cap: as derived
        (1024, 1024, 1024),  # --max-length 1024 (max_length() took it): over the cap, kept
        (40, 40, 40),
    ],
)
def test_a_long_context_is_capped_unless_asked(derived: int, asked: int | None, want: int) -> None:
    assert decoders.capped_length(derived, asked) == want


def test_only_an_empty_text_without_tokens_is_refused() -> None:
    def encoding(ids: list[int]) -> Any:
        return lambda text, add_special_tokens: {"input_ids": ids}

    assert decoders.refuses_empty_text(encoding([]))  # Qwen's: no BOS
    assert not decoders.refuses_empty_text(encoding([1]))  # Llama's <s>


def test_encoder_classifiers_do_not_pool_the_last_token() -> None:
    pytest.importorskip("transformers")
    assert not decoders.pools_last_token(SimpleNamespace())
