"""Zero-shot classification (service/dataplane/zeroshot.py) against transformers' own
zero-shot-classification pipeline, on a tiny random-weight NLI BERT built here: single- and
multi-label, a custom hypothesis template, over HTTP (textserve's shape and the Hugging Face
Inference API's, read by huggingface_hub's InferenceClient) and gRPC (the textserve client).
The export records the NLI model's entailment and contradiction labels in its manifest (two
labels of one class refuse it) and the server scores by the manifest's indexes; a manifest
without them (a version exported before they were recorded) has its labels searched."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from huggingface_hub import InferenceClient

from tests import foreign
from tests.serving import RunningServer, running_server
from textserve import cli
from textserve.artifact import MANIFEST_FILE, Manifest
from textserve.client import Client
from textserve.commands.models import list_versions
from textserve.results import ClientError

NLI = {0: "entailment", 1: "neutral", 2: "contradiction"}
SWAPPED = ["contradiction", "neutral", "entailment"]  # NLI's with entailment and contradiction
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
def exported(
    folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, str]:
    """Each folder exported (`textserve export`) into one repository, and what the exports
    printed; beside them, two copies of the NLI version that must score alike (SWAPPED's
    classes): "recorded", its manifest naming label 2 the entailment class and label 0 the
    contradiction one (the labels searched would give 0 and 2), and "legacy", labels SWAPPED
    and no zero_shot, as a version exported before the manifest recorded it."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        repo = foreign.export_all(folders, tmp_path_factory.mktemp("models"))
    source = repo / "nli" / "1"
    nli = Manifest.read(source)
    for name, changes in [
        ("recorded", {"zero_shot": {"entailment": 2, "contradiction": 0}}),
        ("legacy", {"labels": SWAPPED, "zero_shot": None}),
    ]:
        shutil.copytree(source, repo / name / "1")
        dataclasses.replace(nli, name=name, **changes).write(repo / name / "1")
    return repo, printed.getvalue()


@pytest.fixture(scope="module")
def running(exported: tuple[Path, str]) -> Iterator[RunningServer]:
    with running_server(exported[0], metrics_port=0, model="nli") as srv:
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


def zero_shot_http(srv: RunningServer, model: str, multi_label: bool) -> list[dict[str, Any]]:
    """POST /v1/zero-shot of TEXTS and CANDIDATES (TEMPLATE) to `model`: labels and scores."""
    body = {
        "texts": TEXTS,
        "candidate_labels": CANDIDATES,
        "hypothesis_template": TEMPLATE,
        "multi_label": multi_label,
        "model": model,
    }
    response = requests.post(url(srv, "/v1/zero-shot"), json=body, timeout=60)
    assert response.status_code == 200, response.text
    return [
        {"labels": [x["label"] for x in r["labels"]], "scores": [x["score"] for x in r["labels"]]}
        for r in response.json()["results"]
    ]


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
    got = zero_shot_http(running, "nli", multi_label)
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
        (
            {"texts": TEXTS, "candidate_labels": ["a"], "model": "classifier"},
            "model 'classifier' was not exported as an NLI model: no entailment label in its "
            "manifest (labels 'negative', 'neutral', 'positive')",
        ),
        ({"texts": [], "candidate_labels": ["a"]}, "no texts"),
    ]:
        response = requests.post(url(running, "/v1/zero-shot"), json=body, timeout=30)
        assert response.status_code == 400, (body, response.text)
        assert words in response.json()["error"], response.json()
    with Client(running.address) as client, pytest.raises(ClientError) as refused:
        client.zero_shot(TEXTS, ["a"], model="reranker")
    assert refused.value.code == "INVALID_ARGUMENT"
    assert "'reranker' was not exported as an NLI model" in refused.value.message


def test_the_export_records_the_nli_labels(exported: tuple[Path, str]) -> None:
    repo, printed = exported
    written = json.loads((repo / "nli" / "1" / MANIFEST_FILE).read_text())
    assert written["zero_shot"] == {"entailment": 0, "contradiction": 2}
    for other in ("classifier", "reranker"):  # no entailment label: no zero_shot written
        assert "zero_shot" not in json.loads((repo / other / "1" / MANIFEST_FILE).read_text())
    line = "  zero-shot (NLI): entailment label 0 'entailment', contradiction label 2 "
    line += "'contradiction'"
    assert printed.count("zero-shot (NLI)") == 1 and f"{line}\n" in printed, printed
    listed = {v.name: v.to_dict()["zero_shot"] for v in list_versions(repo)}  # textserve models
    assert listed["nli"] == {"entailment": 0, "contradiction": 2} and listed["classifier"] is None


@pytest.mark.parametrize("multi_label", [False, True])
def test_the_manifests_indexes_are_what_is_scored(
    running: RunningServer, folders: dict[str, Path], tmp_path: Path, multi_label: bool
) -> None:
    """Model "recorded" names label 2 the entailment class in its manifest, its labels as
    exported: scored as transformers scores the NLI folder with entailment and contradiction
    swapped in id2label, and as "legacy" (labels so swapped, no zero_shot: its labels searched)."""
    swapped = shutil.copytree(folders["nli"], tmp_path / "swapped")
    config = json.loads((swapped / "config.json").read_text())
    config["id2label"] = dict(enumerate(SWAPPED))
    config["label2id"] = {label: i for i, label in enumerate(SWAPPED)}
    (swapped / "config.json").write_text(json.dumps(config))
    expected = pipeline_answers(swapped, multi_label, TEMPLATE)
    recorded = zero_shot_http(running, "recorded", multi_label)
    check(recorded, expected)
    check(zero_shot_http(running, "legacy", multi_label), expected)
    as_exported = zero_shot_http(running, "nli", multi_label)
    with pytest.raises(AssertionError):  # the label names' columns score otherwise
        check(as_exported, expected)


def test_get_model_says_the_recorded_nli_labels(running: RunningServer) -> None:
    with Client(running.address) as client:
        nli, recorded = client.get_model("nli"), client.get_model("recorded")
        legacy, classifier = client.get_model("legacy"), client.get_model("classifier")
    assert (nli.entailment_label, nli.contradiction_label) == (0, 2)
    assert (recorded.entailment_label, recorded.contradiction_label) == (2, 0)
    for unrecorded in (legacy, classifier):
        assert not unrecorded.HasField("entailment_label")
        assert not unrecorded.HasField("contradiction_label")


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (
            ["entailment", "neutral", "Entailed"],
            "labels 'entailment' (0) and 'Entailed' (2) start with 'entail': zero-shot cannot "
            "tell which is the entailment class",
        ),
        (
            ["entailment", "contradiction", "CONTRARY"],
            "labels 'contradiction' (1) and 'CONTRARY' (2) start with 'contra'",
        ),
    ],
    ids=["entailment", "contradiction"],
)
def test_two_labels_of_one_nli_class_refuse_the_export(
    labels: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = foreign.build(
        "bert",
        tmp_path / "ambiguous",
        tokenizer=foreign.tokenizer_for("bert"),
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
    )
    capsys.readouterr()
    argv = ["export", str(folder), "--repository", str(tmp_path / "m"), "--name", "a"]
    assert cli.main([*argv, "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("textserve export: error: "), err
    assert message in err and "config.json's id2label" in err, err
    assert not (tmp_path / "m" / "a").exists() or not any((tmp_path / "m" / "a").iterdir())
