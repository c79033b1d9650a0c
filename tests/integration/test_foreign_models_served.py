"""Hugging Face classifiers served for real: tiny random-weight models built here (tests/foreign.py,
nothing downloaded), published by `textserve export DIR`, served by a real server, and every
served score compared with transformers' pipeline("text-classification", top_k=None,
function_to_apply=the manifest's activation) on the same texts, within 1e-4: a BERT (graph with
token_type_ids), a multi-label BERT (sigmoid, labels over the threshold), a regression
DistilBERT (raw score), a RoBERTa (<pad> = 1, <unk>), sentence pairs, texts over max_length;
through textserve.v1 and OIP, across a hot reload and with two worker processes."""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests import foreign
from tests.serving import RunningServer, poll, running_server, serve_subprocess
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
        "regress": foreign.build(
            "distilbert", root / "regress", num_labels=1, problem_type="regression"
        ),
        "roberta": foreign.build("roberta", root / "roberta", num_labels=3),
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
    with running_server(repository, poll_interval=0.2) as srv:
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


@pytest.mark.parametrize("name", ["bert", "multi", "regress", "roberta"])
def test_served_scores_equal_the_transformers_pipeline(
    name: str, server: RunningServer, folders: dict[str, Path], repository: Path
) -> None:
    manifest = Manifest.read(repository / name / "1")
    response = served(pb_grpc.ClassifierStub(server.channel()), name, texts=TEXTS)
    want = pipeline_scores(folders[name], TEXTS, manifest.labels, manifest.activation)
    assert list(response.labels) == manifest.labels
    np.testing.assert_allclose(scores(response), want, rtol=0, atol=1e-4)
    assert [r.truncated for r in response.results] == [False, False, False, True, True]
    assert response.results[3].num_tokens == foreign.MAX_LENGTH


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


def test_oip_scores_a_foreign_model_as_classify_does(server: RunningServer) -> None:
    request = oip.ModelInferRequest(model_name="roberta")
    tensor = request.inputs.add(name="TEXT", datatype="BYTES", shape=[len(TEXTS)])
    tensor.contents.bytes_contents.extend(t.encode() for t in TEXTS)
    request.outputs.add(name="PROBABILITIES")
    answer = oip_grpc.GRPCInferenceServiceStub(server.channel()).ModelInfer(request, timeout=60)
    got = np.asarray(answer.outputs[0].contents.fp32_contents).reshape(len(TEXTS), -1)
    want = scores(served(pb_grpc.ClassifierStub(server.channel()), "roberta", texts=TEXTS))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_a_foreign_version_is_hot_reloaded(
    server: RunningServer, folders: dict[str, Path], repository: Path, tmp_path: Path
) -> None:
    # a new version of "regress", exported from another architecture while serving
    stub = pb_grpc.ClassifierStub(server.channel())
    newer = foreign.build("distilbert", tmp_path / "newer", num_labels=1, seed=7,
                          problem_type="regression")  # fmt: skip
    export(newer, repository, "regress")
    poll(
        lambda: stub.GetModel(pb.GetModelRequest(name="regress"), timeout=10).version == 2,
        "version 2 of regress served",
        timeout=60,
    )
    want = pipeline_scores(newer, TEXTS, ["LABEL_0"], "none")
    np.testing.assert_allclose(
        scores(served(stub, "regress", texts=TEXTS)), want, rtol=0, atol=1e-4
    )


def test_two_workers_serve_a_foreign_model(
    folders: dict[str, Path], repository: Path, tmp_path: Path
) -> None:
    only = tmp_path / "models"
    shutil.copytree(repository / "bert", only / "bert")
    manifest = Manifest.read(only / "bert" / "1")
    want = pipeline_scores(folders["bert"], TEXTS, manifest.labels, "softmax")
    with serve_subprocess(only, "--workers", "2") as process:
        for _ in range(4):  # new connections: the kernel spreads them over the workers
            with grpc.insecure_channel(process.address) as channel:
                response = served(pb_grpc.ClassifierStub(channel), "bert", texts=TEXTS)
                np.testing.assert_allclose(scores(response), want, rtol=0, atol=1e-4)
