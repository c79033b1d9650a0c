"""The response cache in a real server: repeated texts answered without inference over both
gRPC APIs and the stream, with the scores of a miss; never stale across a hot reload to other
weights; serving.json's own size; the CLI's one-line refusal of a bad size.

Real onnxruntime, the real exported tiny model (tiny_repository) or hand-made versions with
different weights (tests/handmade.py); counters read from the server's own registry.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.handmade import make_version
from tests.integration.test_oip_servicer import infer_request, probabilities
from tests.serving import ROOT, RunningServer, running_server
from textserve.oip import grpc_service_pb2_grpc as oip_grpc
from textserve.service.engine.cache import CacheSize
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

TEXTS = ["a gripping, beautifully acted film", "dull and far too long"]


def sample(srv: RunningServer, name: str, **labels: str) -> float:
    value = srv.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def inferred(srv: RunningServer) -> int:
    """Texts that reached the model (every handle's batcher counts them)."""
    return sum(handle.stats().items for handle in srv.server.repository.handles())


def classify(
    stub: pb_grpc.ClassifierStub, texts: list[str], **fields: object
) -> pb.ClassifyResponse:
    return stub.Classify(pb.ClassifyRequest(texts=texts, all_scores=True, **fields), timeout=30)


def test_a_repeated_text_is_answered_from_the_cache_with_the_scores_of_a_miss(
    tiny_repository: Path,
) -> None:
    with running_server(tiny_repository, cache_size=CacheSize.parse("1MiB")) as srv:
        model = srv.server.repository.get().name
        with srv.channel() as channel:
            stub = pb_grpc.ClassifierStub(channel)
            first = classify(stub, TEXTS)
            assert [r.cached for r in first.results] == [False, False]
            assert inferred(srv) == 2
            again = classify(stub, TEXTS)
            assert [r.cached for r in again.results] == [True, True]
            assert [list(r.scores) for r in again.results] == [
                list(r.scores) for r in first.results
            ]
            assert [(r.label, r.num_tokens) for r in again.results] == [
                (r.label, r.num_tokens) for r in first.results
            ]
            assert inferred(srv) == 2  # no inference for the hits
            assert again.timing.queue_seconds == 0.0  # answered before the queue
            # One hit, one miss in one request: only the miss is queued.
            mixed = classify(stub, [TEXTS[1], "a new text nobody sent"])
            assert [r.cached for r in mixed.results] == [True, False] and inferred(srv) == 3
            # A text that tokenizes like a cached one (the tokenizer lowercases) shares its
            # entry: answered without inference, though it went through the queue.
            alike = classify(stub, [TEXTS[0].upper()])
            assert alike.results[0].cached and list(alike.results[0].scores) == list(
                first.results[0].scores
            )
            assert inferred(srv) == 3
            # The Open Inference Protocol: the same cache.
            oip = oip_grpc.GRPCInferenceServiceStub(channel)
            answer = oip.ModelInfer(infer_request(model, [TEXTS[0]], raw=False), timeout=30)
            assert probabilities(answer)[0].tolist() == list(first.results[0].scores)
            # The stream: the same cache.
            (streamed,) = stub.ClassifyStream(
                iter([pb.ClassifyRequest(id="s", texts=[TEXTS[1]], all_scores=True)]), timeout=30
            )
            assert streamed.results[0].cached
            assert inferred(srv) == 3
        hits = sample(srv, "textserve_cache_requests_total", model=model, result="hit")
        misses = sample(srv, "textserve_cache_requests_total", model=model, result="miss")
        assert (hits, misses) == (2 + 1 + 1 + 1 + 1, 2 + 1)
        assert sample(srv, "textserve_cache_entries", model=model) == 4  # texts
        assert 0 < sample(srv, "textserve_cache_bytes", model=model) <= 2**20


def test_the_clients_say_which_texts_came_from_the_cache(tiny_repository: Path) -> None:
    """Client and HttpClient (POST /v1/classify) carry each text's `cached` flag, and so does
    `textserve classify --json`."""
    from textserve.client import Client
    from textserve.http_client import HttpClient

    with running_server(tiny_repository, cache_size=CacheSize.parse("1MiB"), metrics_port=0) as srv:
        http = f"http://127.0.0.1:{srv.server.metrics_port}"
        with Client(srv.address) as client, HttpClient(http) as over_http:
            assert [p.cached for p in client.classify(TEXTS).predictions] == [False, False]
            assert [p.cached for p in over_http.classify(TEXTS).predictions] == [True, True]
            mixed = over_http.classify([TEXTS[0], "not sent before"]).predictions
            assert [p.cached for p in mixed] == [True, False]
            streamed = [p.cached for r in client.classify_stream(TEXTS) for p in r.predictions]
            assert streamed == [True, True]
        command = [sys.executable, "-m", "textserve.cli", "classify", "--json", *TEXTS]
        done = subprocess.run(
            [*command, "--server", http], capture_output=True, text=True, timeout=60, cwd=ROOT
        )
        assert done.returncode == 0, done.stderr
        assert [r["cached"] for r in json.loads(done.stdout)["results"]] == [True, True]


def test_without_a_size_nothing_is_cached(tiny_repository: Path) -> None:
    with running_server(tiny_repository) as srv, srv.channel() as channel:
        stub = pb_grpc.ClassifierStub(channel)
        classify(stub, TEXTS)
        assert not any(r.cached for r in classify(stub, TEXTS).results)
        assert inferred(srv) == 4
        model = srv.server.repository.get().name
        assert sample(srv, "textserve_cache_requests_total", model=model, result="hit") == 0


def test_after_a_hot_reload_to_other_weights_the_same_text_gets_the_new_scores(
    tmp_path: Path,
) -> None:
    make_version(tmp_path, "m", 1, seed=0)
    text = ["a good film"]
    cache = CacheSize.parse("1MiB")
    with running_server(tmp_path, cache_size=cache, poll_interval=0) as srv, srv.channel() as ch:
        stub = pb_grpc.ClassifierStub(ch)
        old = classify(stub, text)
        assert classify(stub, text).results[0].cached  # cached under version 1
        make_version(tmp_path, "m", 2, seed=1)  # other weights
        srv.run(srv.server.repository.reconcile())
        new = classify(stub, text)
        assert new.model_version == 2 and not new.results[0].cached
        assert list(new.results[0].scores) != list(old.results[0].scores)
        assert classify(stub, text).results[0].cached  # cached again, under version 2
        # Version 2 unloaded by hand (a rollback): version 1 serves again, and its
        # entries went when it retired: answered by inference, with version 1's scores.
        srv.run(srv.server.repository.unload_model("m", 2))
        back = classify(stub, text)
        assert back.model_version == 1 and not back.results[0].cached
        assert list(back.results[0].scores) == list(old.results[0].scores)
        # The worst case: version 2 removed, and another model published under its number.
        srv.run(srv.server.repository.load_model("m"))
        assert classify(stub, text).model_version == 2
        shutil.rmtree(tmp_path / "m" / "2")
        srv.run(srv.server.repository.reconcile())
        make_version(tmp_path, "m", 2, seed=2)
        srv.run(srv.server.repository.reconcile())
        other = classify(stub, text)
        assert other.model_version == 2 and not other.results[0].cached
        assert list(other.results[0].scores) not in (
            list(new.results[0].scores),
            list(old.results[0].scores),
        )


def test_serving_json_sets_a_models_own_size_or_turns_it_off(tmp_path: Path) -> None:
    make_version(tmp_path, "on", 1)
    make_version(tmp_path, "off", 1)
    (tmp_path / "on" / "serving.json").write_text(json.dumps({"cache_size": "2 entries"}))
    (tmp_path / "off" / "serving.json").write_text(json.dumps({"cache_size": "off"}))
    cache = CacheSize.parse("1MiB")
    with running_server(tmp_path, cache_size=cache, poll_interval=0) as srv, srv.channel() as ch:
        stub = pb_grpc.ClassifierStub(ch)
        for model in ("on", "off"):
            for words in ("good", "bad", "film", "good"):
                classify(stub, [words], model=model)
        assert sample(srv, "textserve_cache_entries", model="on") == 2  # its own bound
        # "good" was evicted by "film" (two entries): a miss again
        assert sample(srv, "textserve_cache_requests_total", model="on", result="hit") == 0
        # "off": no cache for this model, whatever --cache-size says
        assert sample(srv, "textserve_cache_requests_total", model="off", result="miss") == 0
        assert classify(stub, ["film"], model="on").results[0].cached
        assert not classify(stub, ["film"], model="off").results[0].cached
        # Read again at every scan: a smaller size evicts at once, "off" drops the cache, a
        # size again starts an empty one for the versions already serving.
        (tmp_path / "on" / "serving.json").write_text(json.dumps({"cache_size": "1 entries"}))
        srv.run(srv.server.repository.reconcile())
        assert sample(srv, "textserve_cache_entries", model="on") == 1
        (tmp_path / "on" / "serving.json").write_text(json.dumps({"cache_size": "off"}))
        srv.run(srv.server.repository.reconcile())
        assert sample(srv, "textserve_cache_entries", model="on") == 0
        assert not classify(stub, ["film"], model="on").results[0].cached
        assert not classify(stub, ["film"], model="on").results[0].cached
        (tmp_path / "off" / "serving.json").unlink()  # the flag's size from now on
        srv.run(srv.server.repository.reconcile())
        classify(stub, ["film"], model="off")
        assert classify(stub, ["film"], model="off").results[0].cached


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "a cache of 0 holds nothing"),
        ("64XB", "is not a size in bytes such as 64MiB"),
        ("-5", "is not a size"),
    ],
)
def test_a_cache_size_of_0_or_a_bad_value_is_one_line_and_exit_2(
    tmp_path: Path, value: str, message: str
) -> None:
    for how in (["--cache-size", value], []):
        env = {"TEXTSERVE_CACHE_SIZE": value} if not how else {}
        result = subprocess.run(
            [sys.executable, "-m", "textserve.cli", "serve", "--repository", str(tmp_path), *how],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**{k: v for k, v in os.environ.items() if k != "TEXTSERVE_CACHE_SIZE"}, **env},
            timeout=60,
        )
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0] and "TEXTSERVE_CACHE_SIZE" in lines[0]
