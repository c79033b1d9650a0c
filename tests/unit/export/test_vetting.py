"""What no export publishes whatever its source (export/vetting.py), what config.json values
are refused before transformers reads them (export/config_values.py), and the export's errors
as one line (export/cli.py)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from textserve.export import config_values, vetting
from textserve.export.cli import one_line
from textserve.export.errors import ExportError

HERE = Path("folder/config.json")


@pytest.mark.parametrize(
    "labels",
    [
        ["negative", "positive"],
        ["B-PER", "I-PER", "O"],
        ["très bien", "北京", "🙂 happy", "a\u200db"],  # letters, emoji, a zero-width joiner
        ["x" * vetting.LABEL_MOST],
    ],
)
def test_labels_a_client_and_a_log_line_carry_pass(labels: list[str]) -> None:
    vetting.check_labels(labels, "--labels")


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (["a", "b\nc"], r"--labels: label 1 ('b\nc') holds the control character '\n'"),
        (["\x7f"], r"label 0 ('\x7f') holds the control character '\x7f'"),
        (["a", "", "b"], "label 1 ('') is empty"),
        (["a", "b", "a"], "label 2 ('a') is label 0's name too"),
        (["é" * 1025], "is 1,025 characters long, over the 1,024 a manifest takes"),
    ],
)
def test_labels_that_cannot_be_served_as_they_are_are_refused(
    labels: list[str], message: str
) -> None:
    with pytest.raises(ExportError) as refused:
        vetting.check_labels(labels, "--labels")
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_tokenizer_id_without_an_embedding_row_is_refused(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models

    path = tmp_path / "tokenizer.json"
    Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 7}, unk_token="[UNK]")).save(str(path))
    vetting.check_vocabulary(path, rows=8)  # ids 0..7: every one has its row
    with pytest.raises(ExportError) as refused:
        vetting.check_vocabulary(path, rows=7)
    assert str(refused.value) == (
        f"{path}: the tokenizer's ids go up to 7 ('b'), the model's embedding has 7 rows (ids 0 "
        "to 6): the server could not run such a token; resize the model's embeddings to the "
        "tokenizer (transformers: model.resize_token_embeddings(len(tokenizer))) and save it again"
    )


def test_every_source_is_vetted_before_anything_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    from textserve.export import pipeline
    from textserve.export.description import Description

    class Source:
        def describe(self, options: Any) -> Description:
            return Description(
                model=None, inputs=["input_ids", "attention_mask"], labels=["ok", "a\x00b"],
                labels_origin="runs/x/labels.json", activation="softmax", max_length=8,
                pad_token_id=0, unk_token_id=None, tokenizer_file=tmp_path / "tokenizer.json",
                checkpoint=tmp_path, source={}, vocab_size=10,
            )  # fmt: skip

    def build(*args: Any) -> None:
        raise AssertionError("built a model whose labels are refused")

    monkeypatch.setattr(pipeline, "build", build)
    with pytest.raises(ExportError, match=r"^runs/x/labels.json: label 1 \('a\\x00b'\)"):
        pipeline.export_source(Source(), tmp_path / "models", "m")
    assert not (tmp_path / "models").exists()


@pytest.mark.parametrize(
    "raw",
    [
        {"vocab_size": 30522, "max_position_embeddings": 512, "type_vocab_size": 2},
        {"vocab_size": 250002, "pad_token_id": 1, "id2label": {"0": "NEG", "10": "POS"}},
        {"intermediate_size": [64, 128], "head_dim": None, "num_hidden_layers": 0},
        {"problem_type": "multi_label_classification", "pad_token_id": -1},
    ],
)
def test_configs_as_models_have_them_pass(raw: dict[str, Any]) -> None:
    config_values.check_config(raw, HERE)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"vocab_size": True}, '"vocab_size" is a boolean: expected an integer from 1 to '),
        ({"intermediate_size": [64, -1]}, '"intermediate_size" is -1: expected'),
        ({"id2label": {"01": "a"}}, "\"id2label\" has the key '01': its keys are label indices"),
        ({"id2label": {"١": "a"}}, "\"id2label\" has the key '١'"),  # int() takes it
        ({"pad_token_id": 5, "vocab_size": 5}, '"pad_token_id" 5 is past the vocabulary'),
    ],
)
def test_config_values_no_model_is_built_from_are_refused(
    raw: dict[str, Any], message: str
) -> None:
    with pytest.raises(ExportError) as refused:
        config_values.check_config(raw, HERE)
    assert str(refused.value).startswith(f"{HERE}'s ") and message in str(refused.value)


@pytest.mark.parametrize("length", [None, 512, 10**30, 1e30])  # unset: a huge int, old files' float
def test_a_model_max_length_as_tokenizers_save_it_passes(length: object) -> None:
    config_values.check_tokenizer_config({"model_max_length": length}, HERE)


def test_a_manifest_its_schema_refuses_is_an_export_error_and_nothing_is_published(
    tmp_path: Path,
) -> None:
    pytest.importorskip("onnx")
    from tests.handmade import make_version
    from textserve.artifact import MANIFEST_FILE, Manifest
    from textserve.export import publish

    source = make_version(tmp_path / "source", "m", 1)
    model_dir = tmp_path / "models" / "m"
    tmp = publish.make_temp_dir(model_dir)
    for path in source.iterdir():
        if path.name != MANIFEST_FILE:
            shutil.copyfile(path, tmp / path.name)
    too_long = dataclasses.replace(Manifest.read(source), max_length=2**21)
    with pytest.raises(ExportError, match=r"^the manifest would not pass its schema: "):
        publish.publish(tmp, model_dir, too_long)
    assert [p.name for p in model_dir.iterdir()] == [tmp.name]  # no version


def test_an_export_error_is_one_line_whatever_it_quotes() -> None:
    said = one_line(json.dumps("x") + " folder\nname\r\x00\x85\u2028 é 🙂")
    assert said == '"x" folder\\nname\\r\\x00\\x85\\u2028 é 🙂'
