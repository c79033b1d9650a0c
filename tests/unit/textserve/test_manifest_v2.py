"""The manifest, format 2 (source, inputs, activation, threshold, unk_token_id, truncation
side; test_accuracy optional), and format 1 still read and served: a manifest.json written as
the exporter wrote it before format 2 takes the defaults."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.handmade import make_tokenizer, make_version
from textserve.artifact import (
    MANIFEST_FILE,
    UNK_BY_NAME,
    Manifest,
    ManifestError,
    Source,
    read_version,
)
from textserve.service.config import RuntimeConfig, ServerConfig
from textserve.service.repository.core import ModelRepository
from textserve.tokenization import Tokenization

# A format 1 manifest as `textserve export` wrote it before format 2 (only the hashes differ).
V1 = {
    "created_at": "2026-11-30T12:00:00+00:00",
    "extra": {"optimization": "padding-free"},
    "format_version": 1,
    "labels": ["negative", "positive"],
    "max_length": 8,
    "name": "m",
    "opset": 17,
    "pad_token_id": 0,
    "parity": {"argmax_agreement": 1.0, "max_abs_logit_diff": 1e-06, "tolerance": 0.0001},
    "precision": "fp32",
    "sha256": {},
    "source_checkpoint_sha256": "0" * 64,
    "test_accuracy": 0.78,
    "version": 1,
}
V2 = {
    "source": {"kind": "huggingface", "architecture": "BertForSequenceClassification",
               "model_type": "bert"},
    "inputs": ["input_ids", "attention_mask", "token_type_ids"],
    "activation": "sigmoid",
    "threshold": 0.3,
    "unk_token_id": 1,
    "truncation_side": "left",
    "test_accuracy": None,
    "format_version": 2,
}  # fmt: skip


NLI = {"entailment": 1, "contradiction": 0}  # of V1's labels: "positive" entails, "negative" not


def write_v1(version_dir: Path, **changes: Any) -> None:
    """Replace a version's manifest with a format 1 one (its files' hashes kept)."""
    sha = json.loads((version_dir / MANIFEST_FILE).read_text())["sha256"]
    data = {**V1, "sha256": sha, "version": int(version_dir.name), **changes}
    (version_dir / MANIFEST_FILE).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def test_a_format_1_manifest_takes_the_defaults(tmp_path: Path) -> None:
    version_dir = make_version(tmp_path, "m", 1)
    write_v1(version_dir)
    manifest, _ = read_version(version_dir)
    assert manifest.format_version == 1
    assert manifest.source == Source("textserve", "TransformerClassifier", None)
    assert manifest.inputs == ["input_ids", "attention_mask"]
    assert (manifest.activation, manifest.decision_threshold) == ("softmax", 0.5)
    assert (manifest.unk_token_id, manifest.truncation_side) == (UNK_BY_NAME, "right")
    assert manifest.test_accuracy == 0.78 and not manifest.takes_token_type_ids
    # written back as format 1: no format 2 field appears
    again = json.loads(manifest.to_json())
    assert again == json.loads((version_dir / MANIFEST_FILE).read_text())
    # and without format_version at all (the field was optional in format 1)
    del again["format_version"]
    assert Manifest.from_dict(again).format_version == 1


def test_a_format_1_version_is_served(tmp_path: Path) -> None:
    write_v1(make_version(tmp_path, "m", 1))

    async def main() -> list[float]:
        config = ServerConfig(
            repository=tmp_path, metrics_port=None, runtime=RuntimeConfig(intra_op_threads=1)
        )
        repository = ModelRepository.from_server(config)
        try:
            await repository.load_all()
            handle = repository.get()
            assert handle.manifest.format_version == 1
            result = await handle.classify(["good film", "\u0000"])  # the latter: one [UNK]
            return [float(p) for p in result.probabilities.sum(axis=1)]
        finally:
            await repository.close()

    assert asyncio.run(main()) == pytest.approx([1.0, 1.0])


def test_format_2_round_trips(tmp_path: Path) -> None:
    version_dir = make_version(tmp_path, "m", 1)
    data = {**json.loads((version_dir / MANIFEST_FILE).read_text()), **V2}
    manifest = Manifest.from_dict(data)
    assert manifest.source.model_type == "bert" and manifest.takes_token_type_ids
    assert (manifest.decision_threshold, manifest.unk_token_id) == (0.3, 1)
    assert manifest.test_accuracy is None
    assert json.loads(manifest.to_json()) == data
    manifest.check()
    tokenization = Tokenization.for_manifest(make_tokenizer(), manifest)
    assert (tokenization.unk_token_id, tokenization.truncation_side) == (1, "left")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"source": {"kind": "textserve"}}, "format 2 field(s) source but format_version 1"),
        ({"format_version": 3}, "format_version 3 is not one this server reads (1, 2)"),
        ({"format_version": "2"}, "format_version '2' is not one"),
        ({"test_accuracy": None}, "test_accuracy: None is not of type 'number'"),
        ({"zero_shot": NLI}, "format 2 field(s) zero_shot but format_version 1"),
    ],
)
def test_format_1_rules(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ManifestError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Manifest.from_dict(
            {**V1, "sha256": {"model.onnx": "0" * 64, "tokenizer.json": "0" * 64}, **change}
        )


TAGGING = {"scheme": "BIO", "aggregation": "simple", "ignore_labels": ["O"], "stride": 16}


def test_a_token_classifier_manifest_round_trips() -> None:
    sha = {"model.onnx": "0" * 64, "tokenizer.json": "0" * 64}
    token = {"task": "token-classification", "tagging": TAGGING, "activation": "softmax"}
    data = {**V1, "sha256": sha, **V2, **token, "threshold": None}
    manifest = Manifest.from_dict(data)
    assert manifest.tags_tokens and manifest.tagging == TAGGING
    assert Manifest.from_dict(manifest.to_dict()) == manifest
    plain = Manifest.from_dict({**V1, "sha256": sha, **V2})
    assert not plain.tags_tokens and "task" not in plain.to_dict()  # as classifiers wrote it


def test_an_nli_manifest_round_trips() -> None:
    sha = {"model.onnx": "0" * 64, "tokenizer.json": "0" * 64}
    for zero_shot in (NLI, {"entailment": 0, "contradiction": None}):
        manifest = Manifest.from_dict({**V1, "sha256": sha, **V2, "zero_shot": zero_shot})
        assert manifest.zero_shot == zero_shot and manifest.to_dict()["zero_shot"] == zero_shot
        assert Manifest.from_dict(manifest.to_dict()) == manifest
    plain = Manifest.from_dict({**V1, "sha256": sha, **V2})
    assert plain.zero_shot is None and "zero_shot" not in plain.to_dict()  # as before


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"source": None}, "missing field(s): source"),
        ({"inputs": None}, "missing field(s): inputs"),
        ({"activation": "tanh"}, "activation: 'tanh' is not one of"),
        ({"activation": "none"}, "activation 'none' (regression, one raw score) takes exactly"),
        ({"threshold": 1.0}, "threshold: 1.0 is greater than or equal to the maximum of 1"),
        ({"threshold": 0}, "threshold: 0 is less than or equal to the minimum of 0"),
        ({"unk_token_id": -1}, "unk_token_id: -1 is less than the minimum of 0"),
        ({"unk_token_id": 1.0}, "unk_token_id: 1.0 is not of type 'integer', 'null'"),
        ({"truncation_side": "middle"}, "truncation_side: 'middle' is not one of"),
        ({"inputs": ["input_ids"]}, "inputs: ['input_ids'] does not contain items"),
        ({"inputs": ["input_ids", "attention_mask", "position_ids"]}, "'position_ids' is not"),
        ({"inputs": ["input_ids", "attention_mask"] * 2}, "has non-unique elements"),
        ({"source": {"kind": "hub", "architecture": "X", "model_type": None}}, "source/kind"),
        ({"source": {"kind": "module", "architecture": ""}}, "'model_type' is a required"),
        ({"test_accuracy": 1.5}, "test_accuracy: 1.5 is greater than the maximum of 1"),
        ({"task": "ner"}, "task: 'ner' is not one of"),
        ({"task": "token-classification", "activation": "softmax"}, "and only it, has 'tagging"),
        ({"task": "token-classification", "tagging": TAGGING, "activation": "sigmoid"}, "softmax"),
        ({"tagging": TAGGING}, "and only it, has 'tagging' defaults"),
        ({"tagging": {**TAGGING, "scheme": "IOB9"}}, "tagging/scheme: 'IOB9' is not one of"),
        ({"tagging": {**TAGGING, "stride": -1}}, "tagging/stride: -1 is less than the minimum"),
        ({"zero_shot": {"entailment": 0}}, "zero_shot: 'contradiction' is a required property"),
        ({"zero_shot": {**NLI, "neutral": 2}}, "zero_shot: Additional properties"),
        ({"zero_shot": {**NLI, "entailment": None}}, "zero_shot/entailment: None is not of type"),
        ({"zero_shot": {**NLI, "entailment": -1}}, "zero_shot/entailment: -1 is less than"),
        ({"zero_shot": {**NLI, "entailment": 2}}, "label index 2 is past the model's 2 label(s)"),
        ({"zero_shot": {**NLI, "contradiction": 5}}, "label index 5 is past the model's 2"),
        ({"zero_shot": {**NLI, "contradiction": 1}}, "must be two different labels"),
    ],
)
def test_format_2_rules(change: dict[str, Any], message: str) -> None:
    sha = {"model.onnx": "0" * 64, "tokenizer.json": "0" * 64}
    data = {**V1, "sha256": sha, **V2, **change}
    data = {k: v for k, v in data.items() if v is not None or k not in ("source", "inputs")}
    with pytest.raises(ManifestError) as caught:
        Manifest.from_dict(data)
    assert message in str(caught.value), caught.value
