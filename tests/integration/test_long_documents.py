"""Long texts by windows (service/dataplane/windows.py) on a real server: a ~10,000-token text
is split, every window is classified in the batches like any text (the batch metrics count
them), and the aggregate equals what the same windows give when sent one by one; for a pair
(rerank), the query stays whole in every window and the document scores its best window."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests import foreign
from tests.serving import RunningServer, poll, running_server
from textserve.artifact import TOKENIZER_FILE
from textserve.service.dataplane.windows import split
from textserve.tokenization import load_tokenizer
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

LABELS = foreign.LABELS
QUERY = "is this film any good"
WORDS = [
    "a",
    "gripping",
    "film",
    "with",
    "a",
    "fine",
    "cast",
    "but",
    "the",
    "plot",
    "is",
    "dull",
    "and",
    "the",
    "acting",
    "wooden",
]


def long_text(words: int, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(WORDS, size=words).tolist()) + " café 🙂 北京."


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Path]]:
    folders = foreign.classifier_and_reranker(tmp_path_factory.mktemp("hf"))
    repo = foreign.export_all(folders, tmp_path_factory.mktemp("models"))
    with running_server(repo, metrics_port=0, model="classifier") as srv:
        yield srv, repo


def url(srv: RunningServer, path: str) -> str:
    return f"http://127.0.0.1:{srv.server.metrics_port}{path}"


def post(srv: RunningServer, path: str, body: Any) -> Any:
    response = requests.post(url(srv, path), json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def tokenizer(repo: Path, name: str) -> Any:
    return load_tokenizer(repo / name / "1" / TOKENIZER_FILE)


def batch_counts(srv: RunningServer) -> tuple[float, float]:
    """(texts, tokens) the classifier's batches carried so far, from /metrics."""
    page = requests.get(url(srv, "/metrics"), timeout=10).text
    found = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.labels.get("model") == "classifier" and sample.name in (
                "textserve_batch_size_sum",
                "textserve_batch_tokens_sum",
            ):
                found[sample.name] = sample.value
    return found["textserve_batch_size_sum"], found["textserve_batch_tokens_sum"]


def softmax_of_mean_log(probs: np.ndarray) -> np.ndarray:
    mean = np.log(probs).mean(axis=0)
    e = np.exp(mean - mean.max())
    return e / e.sum()


def test_a_long_text_is_classified_by_its_windows(running: tuple[RunningServer, Path]) -> None:
    srv, repo = running
    text = long_text(9000)
    tok = tokenizer(repo, "classifier")
    assert len(tok.encode(text, add_special_tokens=False).ids) >= 10_000
    pieces = split(tok, foreign.MAX_LENGTH, text, None, 8)
    texts_before, tokens_before = batch_counts(srv)
    body = {"texts": [text, "a dull plot"], "all_scores": True}
    answers = {
        aggregate: post(
            srv, "/v1/classify", {**body, "windows": {"aggregate": aggregate, "stride": 8}}
        )
        for aggregate in ("mean", "max", "first")
    }
    texts_after, tokens_after = batch_counts(srv)
    # one by one: each window a text of its own, cut as any text
    alone = post(srv, "/v1/classify", {"texts": pieces, "all_scores": True})
    probs = np.array([r["scores"] for r in alone["results"]])
    tokens = sum(r["num_tokens"] for r in alone["results"])

    for aggregate, answer in answers.items():
        first, short = answer["results"]
        assert first["windows"] == len(pieces) > 100, aggregate
        assert first["num_tokens"] == tokens and not first["truncated"]
        assert short["windows"] == 1
        expected = {
            "mean": softmax_of_mean_log(probs),
            "max": probs.max(axis=0),
            "first": probs[0],
        }[aggregate]
        np.testing.assert_allclose(first["scores"], expected, atol=1e-5, err_msg=aggregate)
        assert first["label"] == LABELS[int(np.argmax(expected))]
    # every window of the three requests went through a batch (cached or not, the windows of
    # the 2nd and 3rd requests are cache misses unless --cache-size is set: it is not)
    assert texts_after - texts_before == 3 * (len(pieces) + 1)
    assert tokens_after - tokens_before >= 3 * tokens


def test_without_windows_a_long_text_is_cut(running: tuple[RunningServer, Path]) -> None:
    srv, _ = running
    answer = post(srv, "/v1/classify", {"texts": [long_text(500)]})
    result = answer["results"][0]
    assert result["truncated"] and result["num_tokens"] == foreign.MAX_LENGTH
    assert result["windows"] == 0  # not split


def test_rerank_scores_a_long_document_by_its_best_window(
    running: tuple[RunningServer, Path],
) -> None:
    srv, repo = running
    document = long_text(600, seed=1)
    pieces = split(tokenizer(repo, "reranker"), foreign.MAX_LENGTH, document, QUERY, 4)
    assert len(pieces) > 5
    alone = post(srv, "/rerank", {"model": "reranker", "query": QUERY, "texts": pieces})
    best = max(rank["score"] for rank in alone)
    body = {"model": "reranker", "query": QUERY, "documents": [document, "the weather"]}
    ranked = post(srv, "/v1/rerank", {**body, "windows": {"stride": 4}})
    by_index = {r["index"]: r["relevance_score"] for r in ranked["results"]}
    np.testing.assert_allclose(by_index[0], best, atol=1e-6)
    # the pair template survives: each window is (query, window), not the window alone
    single = post(srv, "/predict", {"inputs": [[p] for p in pieces[:3]], "model": "reranker"})
    assert not np.allclose([row[0]["score"] for row in single], [r["score"] for r in alone[:3]])


def test_grpc_classify_and_rerank_by_windows(running: tuple[RunningServer, Path]) -> None:
    srv, _ = running
    text = long_text(1000, seed=2)
    http = post(srv, "/v1/classify", {"texts": [text], "windows": True, "all_scores": True})
    with srv.channel() as channel:
        stub = pb_grpc.ClassifierStub(channel)
        answer = stub.Classify(
            pb.ClassifyRequest(texts=[text], all_scores=True, windows=pb.Windows()), timeout=60
        )
        ranked = stub.Rerank(
            pb.RerankRequest(
                query=QUERY, documents=[text], model="reranker", windows=pb.Windows(stride=2)
            ),
            timeout=60,
        )
    assert answer.results[0].windows == http["results"][0]["windows"] > 1
    np.testing.assert_allclose(answer.results[0].scores, http["results"][0]["scores"], atol=1e-6)
    assert ranked.results[0].windows > 1


def test_bad_windows_are_refused(running: tuple[RunningServer, Path]) -> None:
    srv, _ = running
    for windows, words in [
        ({"aggregate": "median"}, "windows.aggregate must be one of"),
        ({"stride": 40}, "stride under half"),
        ("yes", "`windows` must be true, false or an object"),
    ]:
        body = {"texts": [long_text(300)], "windows": windows}
        response = requests.post(url(srv, "/v1/classify"), json=body, timeout=30)
        assert response.status_code == 400, (windows, response.text)
        assert words in response.json()["error"], response.json()
    with srv.channel() as channel:
        stream = pb_grpc.ClassifierStub(channel).ClassifyStream(
            iter([pb.ClassifyRequest(id="s", texts=["a"], windows=pb.Windows())]), timeout=30
        )
        (response,) = list(stream)
    assert response.error.code != 0 and "unary Classify" in response.error.message
    # checked before any splitting, as without windows: pairs one per text (an INTERNAL
    # before), a token classifier's refusal, the texts' limit
    with srv.channel() as channel:
        stub = pb_grpc.ClassifierStub(channel)
        for request, words in [
            (pb.ClassifyRequest(texts=["a", "b"], text_pairs=["c"]), "1 text pairs for 2 texts"),
            (pb.ClassifyRequest(texts=[""] * 10_000), "10000 texts in one request"),
        ]:
            request.windows.CopyFrom(pb.Windows())
            with pytest.raises(grpc.RpcError) as refused:
                stub.Classify(request, timeout=30)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value
            assert words in (refused.value.details() or ""), refused.value.details()


def test_a_models_serving_json_makes_windows_its_default(
    running: tuple[RunningServer, Path], tmp_path: Path
) -> None:
    """serving.json's "windows" is the model's default: a request without `windows` is split,
    one with `"windows": false` cut; rerank takes the stride and scores the best window."""
    _, repo = running
    copy = tmp_path / "models"
    shutil.copytree(repo, copy)
    for name in ("classifier", "reranker"):
        (copy / name / "serving.json").write_text('{"windows": {"stride": 4}}')
    text = long_text(500, seed=4)
    with running_server(copy, metrics_port=0, model="classifier") as srv:
        default = post(srv, "/v1/classify", {"texts": [text]})["results"][0]
        cut = post(srv, "/v1/classify", {"texts": [text], "windows": False})["results"][0]
        body = {"model": "reranker", "query": QUERY, "documents": [text]}
        ranked = post(srv, "/v1/rerank", body)["results"][0]
        best = post(srv, "/v1/rerank", {**body, "windows": {"aggregate": "max", "stride": 4}})
    assert default["windows"] > 1 and not default["truncated"]
    assert cut["windows"] == 0 and cut["truncated"]
    assert ranked["relevance_score"] == best["results"][0]["relevance_score"]


def test_windows_are_cut_between_words(running: tuple[RunningServer, Path]) -> None:
    _, repo = running
    tok = tokenizer(repo, "classifier")
    # whitespace-separated words only (the tokenizer takes each CJK character for a word)
    text = long_text(400, seed=3).split(" café")[0].replace(" a ", " unbelievablyextraordinary ")
    pieces = split(tok, foreign.MAX_LENGTH, text, None, 6)
    budget = foreign.MAX_LENGTH - tok.num_special_tokens_to_add(False)
    words = set(text.split())
    for piece in pieces:
        assert len(tok.encode(piece, add_special_tokens=False).ids) <= budget
        assert set(piece.split()) <= words  # no word cut in two
    assert "".join(pieces).replace(" ", "").startswith(text.replace(" ", "")[:200])


def test_a_version_retired_while_a_text_is_split_waits_for_it(
    running: tuple[RunningServer, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hot reload while a request's long text is being split into windows (on a thread, off
    the loop): the version that took the request waits for it, as for any request in flight,
    and answers it; it is not closed under it (that was UNAVAILABLE, a request lost)."""
    import dataclasses
    import threading

    from textserve.artifact import Manifest
    from textserve.service.dataplane import windows

    _, source = running
    repository = tmp_path / "models"
    shutil.copytree(source, repository)
    entered, release = threading.Event(), threading.Event()
    real_split = windows.split

    def held_split(*args: Any, **kwargs: Any) -> list[str]:
        entered.set()
        release.wait(30)
        return real_split(*args, **kwargs)

    monkeypatch.setattr(windows, "split", held_split)
    answers: list[Any] = []
    with (
        running_server(repository, model="classifier", poll_interval=0.1) as srv,
        srv.channel() as channel,
    ):
        stub = pb_grpc.ClassifierStub(channel)
        request = pb.ClassifyRequest(texts=[long_text(400)], windows=pb.Windows())

        def call() -> None:
            try:
                answers.append(stub.Classify(request, timeout=60))
            except grpc.RpcError as exc:
                answers.append(exc)

        caller = threading.Thread(target=call)
        caller.start()
        assert entered.wait(30)
        taken = srv.server.repository.get("classifier")  # version 1, splitting the text
        staging = repository / "classifier" / ".tmp-2"
        shutil.copytree(repository / "classifier" / "1", staging)
        manifest = Manifest.read(staging)
        dataclasses.replace(manifest, version=2).write(staging)
        staging.rename(repository / "classifier" / "2")
        poll(lambda: srv.server.repository.get("classifier").version == 2, "version 2")
        # version 1 retired: waiting for its requests in flight, or (none counted) closed
        poll(lambda: taken._inactive is not None or taken.batcher._closed, "version 1 retired")
        release.set()
        caller.join(60)
    (answer,) = answers
    assert isinstance(answer, pb.ClassifyResponse), answer
    assert answer.model_version == 1 and answer.results[0].windows > 1
