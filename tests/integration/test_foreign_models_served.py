"""Hugging Face classifiers served for real, what tests/integration/test_foreign_served.py
(every score of BERT, multi-label, RoBERTa and regression models vs transformers' pipeline; int8,
hot reload, --workers 2) does not cover: sentence pairs through textserve.v1 (text_pairs) and
OIP (TEXT_PAIR) equal transformers' pipeline on {"text", "text_pair"} inputs within 1e-4 (BERT:
its graph takes token_type_ids), and a multi-label model's labels over the threshold (the
manifest's and a request's) and GetModel's contract fields. Tiny random-weight models built
here (tests/foreign.py), published by `textserve export DIR`; nothing is downloaded."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests import foreign
from tests.serving import RunningServer, running_server
from textserve import cli
from textserve.artifact import Manifest
from textserve.oip import grpc_service_pb2 as oip
from textserve.oip import grpc_service_pb2_grpc as oip_grpc
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

TEXTS = [
    "a gripping film with a thin plot",
    "dull",
    "Ünïcödé naïve café — 北京 🙂",
    "the film " * 200 + "dull",  # far over max_length (64): cut, its [SEP] kept
    "word " * 300,
]
# pairs over the limit, not far over (transformers builds every combination of overflowing
# pieces of a pair whose both texts are over it)
PAIRS = [
    ("a man sleeps on the couch", "a person rests"),
    ("the plot is thin", "the film is dull " * 8),
    ("great acting " * 10, "terrible acting " * 10),
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf-served")
    wordpiece = foreign.tokenizer_for("bert")
    return {
        "bert": foreign.build("bert", root / "bert", num_labels=2, tokenizer=wordpiece),
        "multi": foreign.build(
            "bert",
            root / "multi",
            seed=1,
            tokenizer=wordpiece,
            problem_type="multi_label_classification",
            id2label={0: "action", 1: "comedy", 2: "drama"},
            label2id={"action": 0, "comedy": 1, "drama": 2},
        ),
    }


@pytest.fixture(scope="module")
def repository(folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("models")
    for name, folder in folders.items():
        export(folder, repo, name)
    return repo


def export(folder: Path, repo: Path, name: str) -> None:
    argv = ["export", str(folder), "--repository", str(repo), "--name", name, "--threads", "1"]
    assert cli.main(argv) == 0, name


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[RunningServer]:
    with running_server(repository) as srv:
        yield srv


def pipeline_scores(
    folder: Path, inputs: Sequence[Any], labels: Sequence[str], activation: str
) -> np.ndarray:
    from transformers import pipeline

    pipe = pipeline(
        "text-classification", model=str(folder), top_k=None, function_to_apply=activation,
        device="cpu",
    )  # fmt: skip
    answers = pipe(list(inputs), truncation=True, max_length=foreign.MAX_LENGTH)
    return np.array(
        [[{a["label"]: a["score"] for a in row}[label] for label in labels] for row in answers]
    )


def served(stub: pb_grpc.ClassifierStub, model: str, **fields: Any) -> pb.ClassifyResponse:
    request = pb.ClassifyRequest(model=model, all_scores=True, **fields)
    return stub.Classify(request, timeout=60)


def scores(response: pb.ClassifyResponse) -> np.ndarray:
    return np.array([list(result.scores) for result in response.results])


def test_bert_graph_takes_token_type_ids_and_pairs_use_the_template(
    server: RunningServer, folders: dict[str, Path], repository: Path
) -> None:
    manifest = Manifest.read(repository / "bert" / "1")
    assert manifest.takes_token_type_ids and manifest.source.model_type == "bert"
    texts, pairs = zip(*PAIRS, strict=True)
    response = served(
        pb_grpc.ClassifierStub(server.channel()), "bert", texts=texts, text_pairs=pairs
    )
    inputs = [{"text": a, "text_pair": b} for a, b in PAIRS]
    want = pipeline_scores(folders["bert"], inputs, manifest.labels, "softmax")
    np.testing.assert_allclose(scores(response), want, rtol=0, atol=1e-4)
    # the same through the Open Inference Protocol: TEXT and TEXT_PAIR
    request = oip.ModelInferRequest(model_name="bert")
    for tensor_name, values in (("TEXT", texts), ("TEXT_PAIR", pairs)):
        tensor = request.inputs.add(name=tensor_name, datatype="BYTES", shape=[len(values)])
        tensor.contents.bytes_contents.extend(v.encode() for v in values)
    request.outputs.add(name="PROBABILITIES")
    answer = oip_grpc.GRPCInferenceServiceStub(server.channel()).ModelInfer(request, timeout=60)
    got = np.asarray(answer.outputs[0].contents.fp32_contents).reshape(len(PAIRS), -1)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)


def test_multi_label_answers_the_labels_over_the_threshold(
    server: RunningServer, repository: Path
) -> None:
    stub = pb_grpc.ClassifierStub(server.channel())
    manifest = Manifest.read(repository / "multi" / "1")
    assert (manifest.activation, manifest.decision_threshold) == ("sigmoid", 0.5)
    response = served(stub, "multi", texts=TEXTS)
    for result in response.results:
        over = [label for label, s in zip(manifest.labels, result.scores, strict=True) if s >= 0.5]
        assert list(result.labels_over_threshold) == over
    lowest = float(scores(response).min())
    everything = served(stub, "multi", texts=TEXTS, threshold=max(lowest, 1e-6))
    assert all(len(r.labels_over_threshold) == 3 for r in everything.results)
    info = stub.GetModel(pb.GetModelRequest(name="multi"), timeout=30)
    assert (info.source_kind, info.architecture, info.activation) == (
        "huggingface", "BertForSequenceClassification", "sigmoid"
    )  # fmt: skip
    assert list(info.inputs) == ["input_ids", "attention_mask", "token_type_ids"]
