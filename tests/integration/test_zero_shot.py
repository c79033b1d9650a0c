"""Zero-shot classification (service/dataplane/zeroshot.py) against transformers' own
zero-shot-classification pipeline, on a tiny random-weight NLI BERT built here: single- and
multi-label, a custom hypothesis template, over HTTP (textserve's shape and the Hugging Face
Inference API's, read by huggingface_hub's InferenceClient) and gRPC (the textserve client)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from huggingface_hub import InferenceClient

from tests import foreign
from tests.serving import RunningServer, running_server
from textserve.client import Client
from textserve.results import ClientError

NLI = {0: "entailment", 1: "neutral", 2: "contradiction"}
TEXTS = ["the match went to penalties", "parliament passed the budget", "naïve café 🙂 北京"]
CANDIDATES = ["sport", "politics", "food", "travel"]
TEMPLATE = "This text is about {}."
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    wordpiece = foreign.tokenizer_for("bert")
    nli = foreign.build(
        "bert",
        root / "nli",
        tokenizer=wordpiece,
        id2label=NLI,
        label2id={label: i for i, label in NLI.items()},
    )
    return {"nli": nli, **foreign.classifier_and_reranker(root)}


@pytest.fixture(scope="module")
def running(
    folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    repo = foreign.export_all(folders, tmp_path_factory.mktemp("models"))
    with running_server(repo, metrics_port=0, model="nli") as srv:
        yield srv


def url(srv: RunningServer, path: str) -> str:
    return f"http://127.0.0.1:{srv.server.metrics_port}{path}"


def pipeline_answers(folder: Path, multi_label: bool, template: str) -> list[dict[str, Any]]:
    from transformers import pipeline

    classifier = pipeline("zero-shot-classification", model=str(folder), device="cpu")
    answers = classifier(
        TEXTS, candidate_labels=CANDIDATES, multi_label=multi_label, hypothesis_template=template
    )
    return [{"labels": a["labels"], "scores": a["scores"]} for a in answers]


def check(got: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    for one, want in zip(got, expected, strict=True):
        by_label = dict(zip(one["labels"], one["scores"], strict=True))
        wanted = dict(zip(want["labels"], want["scores"], strict=True))
        np.testing.assert_allclose(
            [by_label[c] for c in CANDIDATES], [wanted[c] for c in CANDIDATES], atol=TOLERANCE
        )
        assert one["scores"] == sorted(one["scores"], reverse=True)


@pytest.mark.parametrize("multi_label", [False, True])
def test_http_scores_equal_the_pipeline(
    running: RunningServer, folders: dict[str, Path], multi_label: bool
) -> None:
    expected = pipeline_answers(folders["nli"], multi_label, TEMPLATE)
    body = {
        "texts": TEXTS,
        "candidate_labels": CANDIDATES,
        "hypothesis_template": TEMPLATE,
        "multi_label": multi_label,
    }
    response = requests.post(url(running, "/v1/zero-shot"), json=body, timeout=60)
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    got = [
        {"labels": [x["label"] for x in r["labels"]], "scores": [x["score"] for x in r["labels"]]}
        for r in results
    ]
    check(got, expected)
    if not multi_label:
        assert all(abs(sum(g["scores"]) - 1) < 1e-5 for g in got)


def test_grpc_and_the_inference_client_agree_with_the_pipeline(
    running: RunningServer, folders: dict[str, Path]
) -> None:
    expected = pipeline_answers(folders["nli"], False, "This example is {}.")
    with Client(running.address) as client:
        answer = client.zero_shot(TEXTS, CANDIDATES, request_id="z")
    assert answer.id == "z" and answer.model == "nli"
    got = [
        {"labels": [x.label for x in r.labels], "scores": [x.score for x in r.labels]}
        for r in answer.results
    ]
    check(got, expected)
    hf = InferenceClient(model=url(running, "/v1/zero-shot"))
    first = hf.zero_shot_classification(TEXTS[0], CANDIDATES)
    check([{"labels": [e.label for e in first], "scores": [e.score for e in first]}], expected[:1])


def test_bad_zero_shot_requests_are_refused(running: RunningServer) -> None:
    for body, words in [
        ({"texts": TEXTS, "candidate_labels": []}, "at least one label"),
        ({"texts": TEXTS, "candidate_labels": ["a"], "hypothesis_template": "no slot"}, "{}"),
        ({"texts": TEXTS, "candidate_labels": ["a"], "model": "classifier"}, "no NLI model"),
        ({"texts": [], "candidate_labels": ["a"]}, "no texts"),
    ]:
        response = requests.post(url(running, "/v1/zero-shot"), json=body, timeout=30)
        assert response.status_code == 400, (body, response.text)
        assert words in response.json()["error"], response.json()
    with Client(running.address) as client, pytest.raises(ClientError) as refused:
        client.zero_shot(TEXTS, ["a"], model="reranker")
    assert refused.value.code == "INVALID_ARGUMENT" and "no NLI model" in refused.value.message
