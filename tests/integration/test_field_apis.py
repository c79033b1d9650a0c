"""The field's HTTP APIs (service/http/compat.py) against a real server and real clients: TEI's
/predict and /rerank, Cohere's /v1/rerank and /v2/rerank through the `cohere` SDK, Jina's shape,
vLLM's /classify, with scores checked against transformers on the same Hugging Face folders
(a 3-label BERT classifier and a one-output BERT cross-encoder, random weights, built here),
and each API's errors in its own shape."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cohere
import numpy as np
import pytest
import requests
from huggingface_hub import InferenceClient

from tests import foreign
from tests.serving import RunningServer, running_server
from textserve.client import Client
from textserve.results import ClientError
from textserve.service.engine.cache_size import CacheSize

QUERY = "is this film any good"
DOCUMENTS = [
    "a gripping film with a fine cast",
    "the weather in paris",
    "a dull plot and wooden acting",
    "Ünïcödé naïve café — 北京 🙂",
]
TEXTS = ["a gripping film", "a dull   plot", "naïve café 🙂"]
LABELS = foreign.LABELS
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return foreign.classifier_and_reranker(tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="module")
def repository(folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return foreign.export_all(folders, tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def running(repository: Path) -> Iterator[RunningServer]:
    with running_server(repository, metrics_port=0, model="classifier") as srv:
        yield srv


@pytest.fixture(scope="module")
def server(running: RunningServer) -> str:
    return base(running)


def base(srv: RunningServer) -> str:
    return f"http://127.0.0.1:{srv.server.metrics_port}"


def logits(folder: Path, texts: list[str], pairs: list[str] | None = None) -> np.ndarray:
    """transformers' own logits for the texts (and pairs), as the model computes them."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    batch = tokenizer(
        texts, pairs, truncation=True, max_length=foreign.MAX_LENGTH, padding=True,
        return_tensors="pt",
    )  # fmt: skip
    with torch.no_grad():
        return model(**batch).logits.double().numpy()


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def post(server: str, path: str, body: Any) -> requests.Response:
    return requests.post(server + path, json=body, timeout=30)


# -- TEI ------------------------------------------------------------------------------------------


def by_label(predictions: list[dict[str, Any]]) -> list[float]:
    scores = {p["label"]: p["score"] for p in predictions}
    return [scores[label] for label in LABELS]


def test_tei_predict_single_pair_and_batch(server: str, folders: dict[str, Path]) -> None:
    probs = softmax(logits(folders["classifier"], TEXTS))
    single = post(server, "/predict", {"inputs": TEXTS[0]})
    assert single.status_code == 200, single.text
    answer = single.json()
    assert [p["score"] for p in answer] == sorted((p["score"] for p in answer), reverse=True)
    np.testing.assert_allclose(by_label(answer), probs[0], atol=TOLERANCE)

    batch = post(server, "/predict", {"inputs": [[t] for t in TEXTS]}).json()
    np.testing.assert_allclose([by_label(row) for row in batch], probs, atol=TOLERANCE)

    pair_probs = softmax(logits(folders["classifier"], [TEXTS[0]], [TEXTS[1]]))
    pair = post(server, "/predict", {"inputs": [TEXTS[0], TEXTS[1]]}).json()
    np.testing.assert_allclose(by_label(pair), pair_probs[0], atol=TOLERANCE)
    pairs = post(server, "/predict", {"inputs": [[TEXTS[0], TEXTS[1]]] * 2}).json()
    np.testing.assert_allclose([by_label(r) for r in pairs], [pair_probs[0]] * 2, atol=TOLERANCE)


# A text longer than the models' 64 tokens whose start and end differ: the side cut matters.
LONG = "a gripping film with a fine cast " * 4 + "the weather in paris " * 12 + "a dull plot " * 5


def cut_logits(
    folder: Path, texts: list[str], pairs: list[str] | None = None, *, side: str = "right",
    max_length: int = foreign.MAX_LENGTH,
) -> np.ndarray:  # fmt: skip
    """transformers' logits with its tokenizer cutting on `side` at `max_length` tokens."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    tokenizer.truncation_side = side
    model = AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    batch = tokenizer(
        texts, pairs, truncation=True, max_length=max_length, padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        return model(**batch).logits.double().numpy()


def test_tei_truncation_direction_left_keeps_the_end(server: str, folders: dict[str, Path]) -> None:
    left = softmax(cut_logits(folders["classifier"], [LONG], side="left"))[0]
    right = softmax(cut_logits(folders["classifier"], [LONG]))[0]
    assert np.abs(left - right).max() > 1e-3  # the two cuts score differently
    body = {"inputs": LONG, "truncate": True}
    got = post(server, "/predict", {**body, "truncation_direction": "Left"}).json()
    np.testing.assert_allclose(by_label(got), left, atol=TOLERANCE)
    default = post(server, "/predict", body).json()
    np.testing.assert_allclose(by_label(default), right, atol=TOLERANCE)


def test_a_requests_own_cut_never_answers_another_from_the_cache(
    repository: Path, folders: dict[str, Path]
) -> None:
    """The response cache finds a text by the text before tokenizing, with the model's own
    truncation: an answer cut on the left must not be stored under the text, nor the other
    way round."""
    left = softmax(cut_logits(folders["classifier"], [LONG], side="left"))[0]
    right = softmax(cut_logits(folders["classifier"], [LONG]))[0]
    cache = CacheSize.parse("1MiB")
    with running_server(repository, metrics_port=0, model="classifier", cache_size=cache) as srv:
        server = base(srv)
        for direction, expected in [("Left", left), (None, right), ("Left", left), (None, right)]:
            body = {"inputs": LONG, "truncation_direction": direction}
            got = post(server, "/predict", body).json()
            np.testing.assert_allclose(by_label(got), expected, atol=TOLERANCE, err_msg=direction)


def test_tei_batch_mixing_single_texts_and_pairs(server: str, folders: dict[str, Path]) -> None:
    singles = softmax(logits(folders["classifier"], [TEXTS[0], TEXTS[2]]))
    pair = softmax(logits(folders["classifier"], [TEXTS[1]], [TEXTS[0]]))[0]
    inputs = [[TEXTS[0]], [TEXTS[1], TEXTS[0]], [TEXTS[2]]]
    got = post(server, "/predict", {"inputs": inputs}).json()
    np.testing.assert_allclose(
        [by_label(row) for row in got], [singles[0], pair, singles[1]], atol=TOLERANCE
    )


def test_vllm_truncate_prompt_tokens_keeps_the_last_tokens(
    server: str, folders: dict[str, Path]
) -> None:
    for keep in (10, 33):
        expected = softmax(cut_logits(folders["classifier"], [LONG], side="left", max_length=keep))
        body = {"input": LONG, "truncate_prompt_tokens": keep}
        answer = post(server, "/classify", body).json()
        np.testing.assert_allclose(answer["data"][0]["probs"], expected[0], atol=TOLERANCE)
        assert answer["usage"]["prompt_tokens"] == keep
    whole = softmax(cut_logits(folders["classifier"], [LONG], side="left"))[0]
    answer = post(server, "/classify", {"input": LONG, "truncate_prompt_tokens": -1}).json()
    np.testing.assert_allclose(answer["data"][0]["probs"], whole, atol=TOLERANCE)
    bad = post(server, "/classify", {"input": LONG, "truncate_prompt_tokens": 0})
    assert bad.status_code == 400 and "truncate_prompt_tokens" in bad.json()["error"]["message"]


def test_cohere_max_tokens_per_doc_cuts_each_document(
    server: str, folders: dict[str, Path]
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folders["reranker"]))
    limit = 3
    cut = []
    for doc in DOCUMENTS:
        spans = tokenizer(doc, add_special_tokens=False, return_offsets_mapping=True)
        offsets = spans["offset_mapping"]
        cut.append(doc if len(offsets) <= limit else doc[: offsets[limit - 1][1]])
    assert cut != DOCUMENTS
    expected = sigmoid(logits(folders["reranker"], [QUERY] * len(cut), cut)[:, 0])
    client = cohere.ClientV2(api_key="unused", base_url=server)
    answer = client.rerank(
        model="reranker", query=QUERY, documents=DOCUMENTS, max_tokens_per_doc=limit
    )
    got = {r.index: r.relevance_score for r in answer.results}
    np.testing.assert_allclose([got[i] for i in range(len(DOCUMENTS))], expected, atol=TOLERANCE)


def test_tei_predict_raw_scores_are_the_logits(server: str, folders: dict[str, Path]) -> None:
    raw = post(server, "/predict", {"inputs": TEXTS[1], "raw_scores": True}).json()
    expected = logits(folders["classifier"], [TEXTS[1]])[0]
    np.testing.assert_allclose(by_label(raw), expected, atol=1e-4)


def test_huggingface_inference_client_reads_predict(server: str) -> None:
    client = InferenceClient(model=server + "/predict")
    answer = client.text_classification(TEXTS[0])
    scores = post(server, "/predict", {"inputs": TEXTS[0]}).json()
    assert answer.label == scores[0]["label"]  # type: ignore[attr-defined]
    assert math.isclose(answer.score, scores[0]["score"], abs_tol=1e-6)  # type: ignore[attr-defined]


def test_tei_rerank_orders_by_the_cross_encoder(server: str, folders: dict[str, Path]) -> None:
    expected = logits(folders["reranker"], [QUERY] * len(DOCUMENTS), DOCUMENTS)[:, 0]
    body = {"query": QUERY, "texts": DOCUMENTS, "model": "reranker", "return_text": True}
    ranks = post(server, "/rerank", body).json()
    assert [r["index"] for r in ranks] == np.argsort(-expected, kind="stable").tolist()
    for rank in ranks:
        assert rank["text"] == DOCUMENTS[rank["index"]]
        assert math.isclose(rank["score"], sigmoid(expected[rank["index"]]), abs_tol=TOLERANCE)
    raw = post(server, "/rerank", {**body, "raw_scores": True, "return_text": False}).json()
    assert all("text" not in r for r in raw)
    np.testing.assert_allclose(
        [r["score"] for r in sorted(raw, key=lambda r: r["index"])], expected, atol=1e-4
    )


def test_tei_errors_are_in_tei_shape(server: str) -> None:
    for body, words in [
        ({}, "`inputs` is missing"),
        ({"inputs": ["a", "b", "c"]}, "is a pair"),
        ({"inputs": "a", "truncation_direction": "Middle"}, 'must be "Right" or "Left"'),
        ({"inputs": "a", "raw_scores": "yes"}, "must be a bool"),
        ({"inputs": "a", "model": "nope"}, "nope"),
    ]:
        response = post(server, "/predict", body)
        assert 400 <= response.status_code < 500, (body, response.status_code)
        error = response.json()
        assert set(error) == {"error", "error_type"}, error
        assert error["error_type"] == "Validation"
        assert words in error["error"], (words, error)
    three_labels = post(server, "/rerank", {"query": "q", "texts": ["a"]})
    assert three_labels.status_code == 400
    assert "rerank needs a cross-encoder" in three_labels.json()["error"]


# -- Cohere and Jina ------------------------------------------------------------------------------


def test_cohere_v2_client_reranks_with_top_n(server: str, folders: dict[str, Path]) -> None:
    expected = sigmoid(logits(folders["reranker"], [QUERY] * len(DOCUMENTS), DOCUMENTS)[:, 0])
    client = cohere.ClientV2(api_key="unused", base_url=server)
    answer = client.rerank(model="reranker", query=QUERY, documents=DOCUMENTS, top_n=2)
    order = np.argsort(-expected, kind="stable")[:2].tolist()
    assert [r.index for r in answer.results] == order
    for result in answer.results:
        assert math.isclose(result.relevance_score, expected[result.index], abs_tol=TOLERANCE)


def test_cohere_v1_client_returns_documents(server: str) -> None:
    client = cohere.Client(api_key="unused", base_url=server)
    answer = client.rerank(
        model="reranker", query=QUERY, documents=DOCUMENTS, return_documents=True
    )
    assert len(answer.results) == len(DOCUMENTS)
    for result in answer.results:
        assert result.document.text == DOCUMENTS[result.index]


def test_jina_shape_takes_text_objects(server: str) -> None:
    body = {
        "model": "reranker",
        "query": QUERY,
        "documents": [{"text": d} for d in DOCUMENTS],
        "top_n": 3,
        "return_documents": True,
    }
    answer = post(server, "/v1/rerank", body).json()
    assert len(answer["results"]) == 3
    assert answer["usage"]["total_tokens"] > 0
    assert answer["results"][0]["document"]["text"] in DOCUMENTS


def test_cohere_errors_are_in_cohere_shape(server: str) -> None:
    client = cohere.ClientV2(api_key="unused", base_url=server)
    with pytest.raises(cohere.errors.BadRequestError) as raised:
        client.rerank(model="classifier", query=QUERY, documents=DOCUMENTS)
    assert "rerank needs a cross-encoder" in str(raised.value.body)
    for body, status, words in [
        ({"model": "reranker", "query": QUERY, "documents": []}, 400, "at least one document"),
        ({"model": "reranker", "query": QUERY, "documents": [3]}, 400, "documents[0]"),
        ({"model": "gone", "query": QUERY, "documents": ["a"]}, 404, "gone"),
        ({"model": "reranker", "query": QUERY, "documents": ["a"], "top_n": -1}, 400, "top_n"),
        (
            {"model": "reranker", "query": QUERY, "documents": ["a"], "max_tokens_per_doc": 0},
            400,
            "max_tokens_per_doc",
        ),
    ]:
        response = post(server, "/v2/rerank", body)
        assert response.status_code == status, (body, response.text)
        error = response.json()
        assert set(error) == {"message", "detail"} and words in error["message"], error


# -- textserve.v1 Rerank over gRPC ---------------------------------------------------------------


def test_grpc_rerank_answers_as_the_http_routes(running: RunningServer, server: str) -> None:
    http = post(server, "/rerank", {"query": QUERY, "texts": DOCUMENTS, "model": "reranker"})
    with Client(running.address) as client:
        answer = client.rerank(
            QUERY, DOCUMENTS, model="reranker", top_n=3, return_documents=True, request_id="r1"
        )
        raw = client.rerank(QUERY, DOCUMENTS, model="reranker", raw_scores=True)
        with pytest.raises(ClientError) as refused:
            client.rerank(QUERY, DOCUMENTS, model="classifier")
        with pytest.raises(ClientError) as empty:
            client.rerank(QUERY, [], model="reranker")
    assert answer.id == "r1" and answer.model == "reranker" and answer.model_version == 1
    assert [r.index for r in answer.results] == [r["index"] for r in http.json()][:3]
    for result, rank in zip(answer.results, http.json(), strict=False):
        assert math.isclose(result.score, rank["score"], rel_tol=1e-6)
        assert result.document == DOCUMENTS[result.index] and result.num_tokens > 0
    assert answer.timing.total_seconds > 0
    assert len(raw.results) == len(DOCUMENTS) and not raw.results[0].document
    assert refused.value.code == "INVALID_ARGUMENT"
    assert "rerank needs a cross-encoder" in refused.value.message
    assert empty.value.code == "INVALID_ARGUMENT"


# -- vLLM -----------------------------------------------------------------------------------------


def test_vllm_classify(server: str, folders: dict[str, Path]) -> None:
    probs = softmax(logits(folders["classifier"], TEXTS))
    answer = post(server, "/classify", {"model": "classifier", "input": TEXTS}).json()
    assert answer["object"] == "list" and answer["model"] == "classifier"
    assert [d["index"] for d in answer["data"]] == [0, 1, 2]
    np.testing.assert_allclose([d["probs"] for d in answer["data"]], probs, atol=TOLERANCE)
    assert [d["label"] for d in answer["data"]] == [LABELS[i] for i in probs.argmax(axis=1)]
    assert all(d["num_classes"] == 3 for d in answer["data"])
    assert answer["usage"]["prompt_tokens"] == answer["usage"]["total_tokens"] > 0
    one = post(server, "/classify", {"input": TEXTS[0]}).json()
    np.testing.assert_allclose(one["data"][0]["probs"], probs[0], atol=TOLERANCE)


def test_vllm_errors_are_in_openai_shape(server: str) -> None:
    response = post(server, "/classify", {"model": "gone", "input": "a"})
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["type"] == "NotFoundError" and error["code"] == 404 and "gone" in error["message"]
    response = post(server, "/classify", {"input": [1]})
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "BadRequestError"


def test_the_field_apis_are_counted_and_described(server: str) -> None:
    post(server, "/rerank", {"query": "q", "texts": ["a"], "model": "reranker"})
    page = requests.get(server + "/metrics", timeout=10).text
    assert 'textserve_requests_total{method="HttpRerank",model="reranker"}' in page
    paths = requests.get(server + "/openapi.json", timeout=10).json()["paths"]
    for path in ("/predict", "/rerank", "/v1/rerank", "/v2/rerank", "/classify"):
        assert "requestBody" in paths[path]["post"], path


def test_a_model_no_operation_can_use_runs_nothing(running: RunningServer, server: str) -> None:
    """Rerank on a 3-label classifier and zero-shot on a non-NLI model are refused before any
    pair reaches a batch (the data plane's `admit`), not after the model ran them all."""
    registry = running.metrics.registry

    def batched() -> float:
        labels = {"model": "classifier"}
        return registry.get_sample_value("textserve_batch_size_sum", labels) or 0.0

    before = batched()
    body = {"model": "classifier", "query": QUERY, "documents": DOCUMENTS}
    assert post(server, "/v1/rerank", body).status_code == 400
    zero_shot = {"model": "classifier", "texts": ["a text"], "candidate_labels": ["a", "b"]}
    refused = post(server, "/v1/zero-shot", zero_shot)
    assert refused.status_code == 400 and "not exported as an NLI model" in refused.json()["error"]
    assert batched() == before


def test_a_cut_shorter_than_the_special_tokens_is_refused_alone(server: str) -> None:
    """vLLM's truncate_prompt_tokens below the tokenizer's special tokens ([CLS] and [SEP]
    here) leaves no token of the text: 400 in the API's shape, before any inference (it was a
    500 that failed every request of its batch); a request beside it is answered."""
    for keep in (1, 2):
        response = post(server, "/classify", {"input": ["a film"], "truncate_prompt_tokens": keep})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["type"] == "BadRequestError" and error["code"] == 400
        assert f"keeps {keep} token(s)" in error["message"] and "at least 3" in error["message"]
    fine = post(server, "/classify", {"input": ["a film"], "truncate_prompt_tokens": 3})
    assert fine.status_code == 200 and fine.json()["usage"]["prompt_tokens"] == 3
