"""Token classification served (issue 41): entities equal transformers' token-classification
pipeline, for every aggregation strategy, over every API.

Tiny random-weight token classifiers built here from config classes (tests/foreign.py
build_token): BERT with WordPiece and BIO labels, RoBERTa with byte-level BPE and plain labels,
XLM-R with a Unigram (SentencePiece-like) tokenizer and BIO labels; exported by `textserve
export` and served by a real server. Texts with accents, emoji, CJK, repeated spaces and one
longer than the models' 64 tokens (windows, compared with the pipeline's `stride`)."""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import requests

from tests import foreign
from tests.serving import RunningServer, running_server
from textserve.client import Client, redact
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[2]
STRATEGIES = ("none", "simple", "first", "average", "max")
STRIDE = 16
TOLERANCE = 1e-4
LONG = " ".join(
    f"Ada Lovelace wrote {i} letters to Charles Babbage in London and Paris." for i in range(9)
)
TEXTS = [
    "Ada Lovelace met  Charles Babbage in London.",
    "Café naïve résumé: José Müller à Zürich 😀 and Ñandú!",
    "東京 and 北京 are cities; Mr. 山田 lives   there 🙂.",
    "   repeated    spaces   between   words   ",
    LONG,
]
MODELS = {
    "bert-ner": ("bert", foreign.TOKEN_LABELS),
    "roberta-plain": ("roberta", ("O", "PER", "LOC", "ORG")),
    "xlmr-ner": ("xlm-roberta", foreign.TOKEN_LABELS),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    built = {
        name: foreign.build_token(arch, root / name, labels=labels)
        for name, (arch, labels) in MODELS.items()
    }
    built["classifier"] = foreign.build("bert", root / "classifier")
    return built


@pytest.fixture(scope="module")
def running(
    folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    repo = foreign.export_all(folders, tmp_path_factory.mktemp("models"))
    with running_server(repo, metrics_port=0, model="bert-ner") as srv:
        yield srv


def url(srv: RunningServer, path: str) -> str:
    return f"http://127.0.0.1:{srv.server.metrics_port}{path}"


def pipeline_entities(folder: Path, strategy: str) -> list[list[dict[str, Any]]]:
    """transformers' own answer: stride for the long text, except with 'none' (which the
    pipeline refuses with a stride: both then cut the long text)."""
    from transformers import pipeline

    tagger = pipeline(
        "token-classification", model=str(folder), device="cpu", aggregation_strategy=strategy
    )
    extra = {} if strategy == "none" else {"stride": STRIDE}
    return [list(tagger(text, **extra)) for text in TEXTS]


def request_body(strategy: str) -> dict[str, Any]:
    if strategy == "none":
        return {"texts": TEXTS, "aggregation": "none", "windows": False}
    return {"texts": TEXTS, "aggregation": strategy, "stride": STRIDE}


def assert_same(got: list[dict[str, Any]], expected: list[dict[str, Any]], where: str) -> None:
    """The same entities, in order: every field equal, scores within TOLERANCE."""
    assert len(got) == len(expected), (where, got, expected)
    for one, want in zip(got, expected, strict=True):
        assert set(one) == set(want), (where, one, want)
        for key, value in want.items():
            if key == "score":
                assert abs(one[key] - float(value)) <= TOLERANCE, (where, one, want)
            else:
                assert one[key] == value, (where, key, one, want)


def v1_entities(result: dict[str, Any], strategy: str) -> list[dict[str, Any]]:
    """A TagResponse's JSON entities in the pipeline's keys."""
    key = "entity" if strategy == "none" else "entity_group"
    out = []
    for entity in result.get("entities", []):
        one = {
            key: entity["label"],
            "score": entity["score"],
            "word": entity["word"],
            "start": entity.get("start", 0),
            "end": entity["end"],
        }
        if strategy == "none":
            one["index"] = entity.get("index", 0)
        out.append(one)
    return out


@pytest.mark.parametrize("model", list(MODELS))
def test_served_entities_equal_the_pipeline(
    running: RunningServer, folders: dict[str, Path], model: str
) -> None:
    found = 0
    for strategy in STRATEGIES:
        expected = pipeline_entities(folders[model], strategy)
        response = requests.post(
            url(running, "/v1/tag"), json={**request_body(strategy), "model": model}, timeout=60
        )
        assert response.status_code == 200, response.text
        results = response.json()["results"]
        for index, (result, want) in enumerate(zip(results, expected, strict=True)):
            assert_same(v1_entities(result, strategy), want, f"{model} {strategy} texts[{index}]")
            found += len(want)
        long = results[TEXTS.index(LONG)]
        if strategy == "none":
            assert long["truncated"] and long["windows"] == 1
        else:
            assert long["windows"] > 1 and not long.get("truncated", False)
    assert found > 50, "the models must report entities for the comparison to mean something"


def test_grpc_oip_and_the_inference_client_agree(
    running: RunningServer, folders: dict[str, Path]
) -> None:
    from huggingface_hub import InferenceClient

    expected = pipeline_entities(folders["xlmr-ner"], "first")
    with Client(running.address) as client:
        answer = client.tag(TEXTS, model="xlmr-ner", aggregation="first", stride=STRIDE)
    for result, want in zip(answer.results, expected, strict=True):
        got = [
            {"entity_group": e.label, "score": e.score, "word": e.word, "start": e.start,
             "end": e.end}
            for e in result.entities
        ]  # fmt: skip
        assert_same(got, want, "grpc")
    # KServe v2 (HTTP JSON): ENTITIES, one JSON document per text, the pipeline's shape
    body = {
        "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [2], "data": TEXTS[:2]}],
        "parameters": {"aggregation": "first"},
    }
    response = requests.post(url(running, "/v2/models/xlmr-ner/infer"), json=body, timeout=60)
    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    assert output["name"] == "ENTITIES" and output["shape"] == [2]
    for document, want in zip(output["data"], expected[:2], strict=True):
        assert_same(json.loads(document), want, "oip")
    # Hugging Face's InferenceClient against the same route (its token-classification shape)
    hf = InferenceClient(model=url(running, "/v1/tag"))
    entities = hf.token_classification(TEXTS[0], model=None, aggregation_strategy="first")
    got = [
        {"entity_group": e.entity_group, "score": e.score, "word": e.word, "start": e.start,
         "end": e.end}
        for e in entities
    ]  # fmt: skip
    bert = pipeline_entities(folders["bert-ner"], "first")[0]  # the server's default model
    assert_same(got, bert, "InferenceClient (default model bert-ner)")


def test_tag_stream_answers_each_request_and_survives_a_bad_one(running: RunningServer) -> None:
    requests_ = [
        pb.TagRequest(id="a", texts=TEXTS[:2], aggregation="simple"),
        pb.TagRequest(id="bad", texts=TEXTS[:1], aggregation="bogus"),
        pb.TagRequest(id="c", texts=TEXTS[2:3], model="xlmr-ner", aggregation="max"),
    ]
    with grpc.insecure_channel(running.address) as channel:
        stub = pb_grpc.ClassifierStub(channel)
        answers = {r.id: r for r in stub.TagStream(iter(requests_), timeout=60)}
    assert set(answers) == {"a", "bad", "c"}
    assert answers["bad"].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "bogus" in answers["bad"].error.message
    assert len(answers["a"].results) == 2 and answers["c"].model == "xlmr-ner"


def test_redaction_example_in_the_docs_runs(running: RunningServer) -> None:
    """docs/token-classification.md's redaction example, run against this server."""
    page = (ROOT / "docs" / "token-classification.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- redaction example -->\s*```python\n(.*?)```", page, re.S)
    assert block is not None, "the redaction example is missing from the docs"
    code = block.group(1).replace('"localhost:50051"', repr(running.address))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/token-classification.md", "exec"), {})
    printed = out.getvalue().strip()
    text = re.search(r'^text = "(.*)"$', code, re.M)
    assert text is not None
    with Client(running.address) as client:
        answer = client.tag([text.group(1)], model="bert-ner", aggregation="first")
    entities = answer.results[0].entities
    assert entities, "the example's text must have entities to mask"
    assert printed == redact(text.group(1), entities)
    assert all(f"[{e.label}]" in printed for e in entities)


@pytest.mark.parametrize(
    ("path", "body", "words"),
    [
        ("/v1/tag", {"texts": TEXTS, "aggregation": "bogus"}, "not one of none, simple"),
        ("/v1/tag", {"texts": TEXTS, "aggregation": "none"}, "cannot merge windows"),
        ("/v1/tag", {"texts": TEXTS, "stride": 500}, "at most"),
        ("/v1/tag", {"texts": TEXTS, "threshold": 2}, "threshold"),
        ("/v1/tag", {"texts": [LONG], "windows": False, "truncate": False}, "texts[0]"),
        ("/v1/tag", {"texts": ["x", ""]}, "texts[1] is empty"),
        ("/v1/tag", {"texts": TEXTS, "model": "classifier"}, "sequence classifier"),
        ("/v1/classify", {"texts": TEXTS}, "token classifier"),
    ],
)
def test_bad_requests_are_refused_naming_what_is_wrong(
    running: RunningServer, path: str, body: dict[str, Any], words: str
) -> None:
    response = requests.post(url(running, path), json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert words in response.json()["error"]


def test_grpc_refusals_are_invalid_argument(running: RunningServer) -> None:
    with grpc.insecure_channel(running.address) as channel:
        stub = pb_grpc.ClassifierStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Classify(pb.ClassifyRequest(texts=["Ada"]), timeout=30)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "token classifier" in (caught.value.details() or "")
        with pytest.raises(grpc.RpcError) as caught:
            stub.Tag(pb.TagRequest(texts=[LONG], windows=False, truncate=False), timeout=30)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "texts[0]" in (caught.value.details() or "")


def test_entities_are_counted_by_label(running: RunningServer) -> None:
    def counted() -> dict[str, float]:
        text = requests.get(url(running, "/metrics"), timeout=30).text
        pattern = (
            r'^textserve_entities_total\{label="([^"]+)",model="roberta-plain",version="1"\} '
            r"(\S+)$"
        )
        return {m.group(1): float(m.group(2)) for m in re.finditer(pattern, text, re.M)}

    before = counted()
    assert {"PER", "LOC", "ORG"} <= set(before)  # every label's series from the start
    response = requests.post(
        url(running, "/v1/tag"),
        json={"texts": TEXTS, "model": "roberta-plain", "aggregation": "simple"},
        timeout=60,
    )
    found: dict[str, int] = {}
    for result in response.json()["results"]:
        for entity in result.get("entities", []):
            found[entity["label"]] = found.get(entity["label"], 0) + 1
    assert found
    after = counted()
    for label, count in found.items():
        assert after[label] - before.get(label, 0.0) == count, label


def test_the_cli_prints_entities_in_a_table_and_as_json(
    running: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    from textserve import cli

    argv = ["classify", "--server", running.address, "--model", "bert-ner", "--aggregation"]
    assert cli.main([*argv, "first", "--json", *TEXTS[:2]]) == 0
    document = json.loads(capsys.readouterr().out)
    with Client(running.address) as client:
        answer = client.tag(TEXTS[:2], model="bert-ner", aggregation="first")
    assert document["model"] == "bert-ner"
    for result, expected in zip(document["results"], answer.results, strict=True):
        assert [(e["label"], e["start"], e["end"]) for e in result["entities"]] == [
            (e.label, e.start, e.end) for e in expected.entities
        ]
    assert cli.main([*argv, "first", *TEXTS[:2]]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["TEXT", "ENTITY", "SCORE", "START", "END", "WORD"]
    assert len(table) == 1 + sum(len(r.entities) for r in answer.results)
