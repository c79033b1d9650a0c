"""Contract format 2 served by a real server (both gRPC APIs, real onnxruntime) on hand-built
foreign-style versions: a tokenizer with its own special tokens (<s> … </s>, <pad> = 1,
<unk> = 3, a pair template with type ids) and graphs that take token_type_ids. Multi-label
(sigmoid, labels over a threshold), regression (raw score), sentence pairs through Classify and
OIP, and the bad requests each gets INVALID_ARGUMENT for. Scores are checked against numpy
on the same graph weights; tokenization against transformers is tests/unit/textserve/
test_tokenization_v2.py's."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc
import numpy as np
import onnx
import pytest
import requests
from onnx import TensorProto, helper, numpy_helper
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from tests.handmade import make_version
from tests.serving import RunningServer, running_server
from textserve.artifact import (
    MANIFEST_FILE,
    MODEL_FILE,
    TOKENIZER_FILE,
    Manifest,
    Source,
    sha256_file,
)
from textserve.commands.models import list_versions
from textserve.oip import grpc_service_pb2 as oip
from textserve.oip import grpc_service_pb2_grpc as oip_grpc
from textserve.service.config import RuntimeConfig, ServerConfig
from textserve.service.repository.loader import LoadError, load_version_dir
from textserve.tokenization import Tokenization
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

WORDS = ["good", "bad", "film", "plot", "a", "the", "is", "man", "sleeps", "person", "rests"]
SPECIALS = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
MAX_LENGTH = 12
TEXTS = ["a good film", "the plot is bad bad bad", "zebra", "good " * 30]
PAIRS = ["a man sleeps", "a person rests", "good", "bad plot"]


def make_tokenizer() -> Tokenizer:
    vocab = {**SPECIALS, **{w: i + len(SPECIALS) for i, w in enumerate(WORDS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> $B:1 </s>:1",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    return tokenizer


def weights(num_labels: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    vocab = len(SPECIALS) + len(WORDS)
    return (
        rng.normal(size=(vocab, num_labels)).astype(np.float32),
        rng.normal(size=(2, num_labels)).astype(np.float32) * 3,  # type embeddings: matter
    )


def make_graph(num_labels: int, seed: int) -> onnx.ModelProto:
    """logits = mean over real tokens of W[input_ids] + T[token_type_ids]."""
    w, t = weights(num_labels, seed)
    nodes = [
        helper.make_node("Gather", ["W", "input_ids"], ["tok"], axis=0),
        helper.make_node("Gather", ["T", "token_type_ids"], ["typ"], axis=0),
        helper.make_node("Add", ["tok", "typ"], ["emb"]),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "axis2"], ["mask3"]),
        helper.make_node("Mul", ["emb", "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axis1"], ["summed"], keepdims=0),
        helper.make_node("ReduceSum", ["maskf", "axis1"], ["count"], keepdims=1),
        helper.make_node("Div", ["summed", "count"], ["logits"]),
    ]
    axes = ["batch_size", "sequence_length"]
    graph = helper.make_graph(
        nodes,
        "foreign",
        [
            helper.make_tensor_value_info(name, TensorProto.INT64, axes)
            for name in ("input_ids", "attention_mask", "token_type_ids")
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch_size", num_labels])],
        initializer=[
            numpy_helper.from_array(w, "W"),
            numpy_helper.from_array(t, "T"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
            numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def make_foreign_version(
    repository: Path, name: str, labels: Sequence[str], activation: str, *, seed: int,
    threshold: float | None = None,
) -> Path:  # fmt: skip
    path = repository / name / "1"
    path.mkdir(parents=True)
    make_tokenizer().save(str(path / TOKENIZER_FILE))
    onnx.save(make_graph(len(labels), seed), str(path / MODEL_FILE))
    Manifest(
        name=name,
        version=1,
        labels=list(labels),
        max_length=MAX_LENGTH,
        pad_token_id=1,
        opset=17,
        precision="fp32",
        sha256={f: sha256_file(path / f) for f in (MODEL_FILE, TOKENIZER_FILE)},
        source_checkpoint_sha256="0" * 64,
        parity={},
        test_accuracy=None,
        created_at="2026-12-01T00:00:00Z",
        source=Source("huggingface", "RobertaForSequenceClassification", "roberta"),
        inputs=["input_ids", "attention_mask", "token_type_ids"],
        activation=activation,
        threshold=threshold,
        unk_token_id=3,
    ).write(path)
    return path


def reference_logits(
    num_labels: int, seed: int, texts: Sequence[str], pairs: Sequence[str] | None = None,
    *, zero_types: bool = False,
) -> np.ndarray:  # fmt: skip
    """The graph's logits in numpy, one text at a time (no padding involved)."""
    w, t = weights(num_labels, seed)
    tokenization = Tokenization(make_tokenizer(), MAX_LENGTH, 1, unk_token_id=3)
    out = []
    for row in tokenization.rows(texts, pairs):
        types = np.zeros(len(row.ids), int) if zero_types else np.asarray(row.type_ids)
        out.append((w[row.ids] + t[types]).mean(axis=0))
    return np.asarray(out, np.float32)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


MULTI = ("toxic", "funny", "long")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repository = tmp_path_factory.mktemp("foreign")
    make_foreign_version(repository, "multi", MULTI, "sigmoid", seed=1, threshold=0.4)
    make_foreign_version(repository, "regress", ["stars"], "none", seed=2)
    make_foreign_version(repository, "nli", ["entail", "contradict"], "softmax", seed=3)
    make_version(repository, "plain", 1)  # our own kind: no pair template
    with running_server(repository, metrics_port=0) as srv:  # metrics_port: the HTTP front end
        yield srv


@pytest.fixture(scope="module")
def stub(server: RunningServer) -> pb_grpc.ClassifierStub:
    return pb_grpc.ClassifierStub(server.channel())


def classify(stub: pb_grpc.ClassifierStub, **fields: object) -> pb.ClassifyResponse:
    return stub.Classify(pb.ClassifyRequest(all_scores=True, **fields), timeout=30)


def test_multi_label_scores_each_label_and_lists_those_over_the_threshold(
    stub: pb_grpc.ClassifierStub,
) -> None:
    response = classify(stub, model="multi", texts=TEXTS)
    expected = sigmoid(reference_logits(3, 1, TEXTS))
    scores = np.asarray([list(r.scores) for r in response.results])
    np.testing.assert_allclose(scores, expected, atol=1e-5)
    assert not np.allclose(scores.sum(axis=1), 1.0)  # not softmax
    for result, row in zip(response.results, expected, strict=True):
        assert list(result.labels_over_threshold) == [
            label for label, score in zip(MULTI, row, strict=True) if score >= 0.4
        ]
        assert result.label == MULTI[int(row.argmax())]
    assert any(r.labels_over_threshold for r in response.results)
    strict = classify(stub, model="multi", texts=TEXTS, threshold=0.95)
    assert [list(r.labels_over_threshold) for r in strict.results] == [
        [label for label, score in zip(MULTI, row, strict=True) if score >= 0.95]
        for row in expected
    ]
    assert strict.results[3].truncated and strict.results[3].num_tokens == MAX_LENGTH


def test_regression_answers_the_raw_score(stub: pb_grpc.ClassifierStub) -> None:
    response = classify(stub, model="regress", texts=TEXTS)
    expected = reference_logits(1, 2, TEXTS)[:, 0]
    np.testing.assert_allclose([r.score for r in response.results], expected, atol=1e-5)
    assert {r.label for r in response.results} == {"stars"}
    assert not response.results[0].labels_over_threshold


def test_pairs_are_encoded_with_the_template_and_fed_their_type_ids(
    server: RunningServer, stub: pb_grpc.ClassifierStub
) -> None:
    response = classify(stub, model="nli", texts=TEXTS, text_pairs=PAIRS)
    expected = softmax(reference_logits(2, 3, TEXTS, PAIRS))
    scores = np.asarray([list(r.scores) for r in response.results])
    np.testing.assert_allclose(scores, expected, atol=1e-5)
    # what the graph would give with type ids left at zero: far from the served scores
    zero = softmax(reference_logits(2, 3, TEXTS, PAIRS, zero_types=True))
    assert np.abs(zero - scores).max() > 0.05
    single = classify(stub, model="nli", texts=TEXTS)
    np.testing.assert_allclose(
        [list(r.scores) for r in single.results], softmax(reference_logits(2, 3, TEXTS)), atol=1e-5
    )
    # the Open Inference Protocol: a second BYTES input, TEXT_PAIR, gives the same scores
    request = oip.ModelInferRequest(model_name="nli")
    for name, values in (("TEXT", TEXTS), ("TEXT_PAIR", PAIRS)):
        tensor = request.inputs.add(name=name, datatype="BYTES", shape=[len(values)])
        tensor.contents.bytes_contents.extend(v.encode() for v in values)
    request.outputs.add(name="PROBABILITIES")
    answer = oip_grpc.GRPCInferenceServiceStub(server.channel()).ModelInfer(request, timeout=30)
    probabilities = np.asarray(answer.outputs[0].contents.fp32_contents).reshape(-1, 2)
    np.testing.assert_allclose(probabilities, expected, atol=1e-5)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"model": "nli", "texts": ["a", "b"], "text_pairs": ["c"]}, "1 text pairs for 2 texts"),
        ({"model": "nli", "texts": ["a"], "text_pairs": [" "]}, "text_pairs[0] is empty"),
        ({"model": "plain", "texts": ["a"], "text_pairs": ["b"]}, "takes no sentence pairs"),
        ({"model": "multi", "texts": ["a"], "threshold": 1.5}, "threshold must be between 0 and 1"),
        ({"model": "multi", "texts": ["a"], "threshold": 0.0}, "threshold must be between 0 and 1"),
        ({"model": "nli", "texts": ["a"], "threshold": 0.5}, "'nli' is softmax"),
        ({"model": "nli", "texts": ["good " * 30], "truncate": False}, "texts[0] is 32 tokens"),
        (
            {"model": "nli", "texts": ["a"], "text_pairs": ["good " * 30], "truncate": False},
            "texts[0] with its text pair is 34 tokens",
        ),
    ],
)
def test_bad_requests_are_invalid_argument(
    stub: pb_grpc.ClassifierStub, fields: dict[str, object], message: str
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        classify(stub, **fields)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (caught.value.details() or ""), caught.value.details()


def test_oip_pair_shape_mismatch_is_invalid_argument(server: RunningServer) -> None:
    request = oip.ModelInferRequest(model_name="nli")
    for name, values in (("TEXT", ["a", "b"]), ("TEXT_PAIR", ["c"])):
        tensor = request.inputs.add(name=name, datatype="BYTES", shape=[len(values)])
        tensor.contents.bytes_contents.extend(v.encode() for v in values)
    with pytest.raises(grpc.RpcError) as caught:
        oip_grpc.GRPCInferenceServiceStub(server.channel()).ModelInfer(request, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'TEXT_PAIR' has shape [1] but 'TEXT' has [2]" in (caught.value.details() or "")


def test_get_model_and_models_show_source_activation_and_inputs(
    server: RunningServer, stub: pb_grpc.ClassifierStub
) -> None:
    info = stub.GetModel(pb.GetModelRequest(name="multi"), timeout=30)
    assert (info.source_kind, info.architecture, info.model_type) == (
        "huggingface", "RobertaForSequenceClassification", "roberta"
    )  # fmt: skip
    assert (info.activation, info.threshold) == ("sigmoid", pytest.approx(0.4))
    assert list(info.inputs) == ["input_ids", "attention_mask", "token_type_ids"]
    assert not info.HasField("test_accuracy")
    plain = stub.GetModel(pb.GetModelRequest(name="plain"), timeout=30)
    assert (plain.source_kind, plain.activation, list(plain.inputs)) == (
        "textserve", "softmax", ["input_ids", "attention_mask"]
    )  # fmt: skip
    listed = {v.name: v.to_dict() for v in list_versions(server.server.config.repository)}
    assert listed["regress"]["activation"] == "none"
    assert (
        listed["multi"]["threshold"] == 0.4 and listed["multi"]["source"]["kind"] == "huggingface"
    )


def test_http_classify_takes_pairs_and_a_threshold(server: RunningServer) -> None:
    url = f"http://127.0.0.1:{server.server.metrics_port}/v1/classify"
    body = {"model": "nli", "texts": TEXTS, "text_pairs": PAIRS, "all_scores": True}
    answer = requests.post(url, json=body, timeout=30).json()
    expected = softmax(reference_logits(2, 3, TEXTS, PAIRS))
    np.testing.assert_allclose([r["scores"] for r in answer["results"]], expected, atol=1e-5)
    multi = {"model": "multi", "texts": TEXTS, "threshold": 0.95}
    results = requests.post(url, json=multi, timeout=30).json()["results"]
    over = [r.get("labels_over_threshold", []) for r in results]
    assert over == [
        [label for label, s in zip(MULTI, row, strict=True) if s >= 0.95]
        for row in sigmoid(reference_logits(3, 1, TEXTS))
    ]
    refused = requests.post(
        url, json={"model": "nli", "texts": ["a"], "threshold": "x"}, timeout=30
    )
    assert refused.status_code == 400 and "`threshold` must be a number" in refused.text


@pytest.mark.parametrize("listed", [["input_ids", "attention_mask"], None])
def test_the_graph_must_take_exactly_the_manifests_inputs(
    tmp_path: Path, listed: list[str] | None
) -> None:
    # a graph with token_type_ids whose manifest does not list them, and (None) a graph
    # without them (ours) whose manifest does
    if listed is None:
        path = make_version(tmp_path, "m", 1)
        data = json.loads((path / MANIFEST_FILE).read_text())
        data["inputs"] = ["input_ids", "attention_mask", "token_type_ids"]
    else:
        path = make_foreign_version(tmp_path, "m", ["a", "b"], "softmax", seed=0)
        data = json.loads((path / MANIFEST_FILE).read_text())
        data["inputs"] = listed
    (path / MANIFEST_FILE).write_text(json.dumps(data))
    config = ServerConfig(repository=tmp_path, runtime=RuntimeConfig(intra_op_threads=1))
    with pytest.raises(LoadError, match="the contract is inputs") as caught:
        load_version_dir(path, config, metrics=None)
    assert caught.value.reason == "contract_mismatch"


def test_the_client_library_sends_pairs_and_a_threshold(server: RunningServer) -> None:
    from textserve.client import Client

    with Client(server.address) as client:
        result = client.classify(TEXTS, model="nli", text_pairs=PAIRS, all_scores=True)
        got = [[p.scores[label] for label in ("entail", "contradict")] for p in result.predictions]
        np.testing.assert_allclose(got, softmax(reference_logits(2, 3, TEXTS, PAIRS)), atol=1e-5)
        multi = client.classify(TEXTS, model="multi", threshold=0.95)
        expected = sigmoid(reference_logits(3, 1, TEXTS))
        assert [p.labels_over_threshold for p in multi.predictions] == [
            [label for label, s in zip(MULTI, row, strict=True) if s >= 0.95] for row in expected
        ]


def test_oip_metadata_lists_text_pair_for_a_model_that_takes_pairs(server: RunningServer) -> None:
    stub = oip_grpc.GRPCInferenceServiceStub(server.channel())
    nli = stub.ModelMetadata(oip.ModelMetadataRequest(name="nli"), timeout=30)
    assert [t.name for t in nli.inputs] == ["TEXT", "TEXT_PAIR"]
    plain = stub.ModelMetadata(oip.ModelMetadataRequest(name="plain"), timeout=30)
    assert [t.name for t in plain.inputs] == ["TEXT"]
    config = stub.ModelConfig(oip.ModelConfigRequest(name="nli"), timeout=30).config
    assert [(i.name, i.optional) for i in config.input] == [("TEXT", False), ("TEXT_PAIR", True)]


def test_classify_stream_takes_pairs_and_thresholds(stub: pb_grpc.ClassifierStub) -> None:
    requests_ = [
        pb.ClassifyRequest(id="p", model="nli", texts=TEXTS, text_pairs=PAIRS, all_scores=True),
        pb.ClassifyRequest(id="t", model="multi", texts=TEXTS, threshold=0.95),
        pb.ClassifyRequest(id="bad", model="nli", texts=TEXTS, threshold=0.5),
    ]
    answers = {r.id: r for r in stub.ClassifyStream(iter(requests_), timeout=30)}
    scores = [list(r.scores) for r in answers["p"].results]
    np.testing.assert_allclose(scores, softmax(reference_logits(2, 3, TEXTS, PAIRS)), atol=1e-5)
    assert [list(r.labels_over_threshold) for r in answers["t"].results] == [
        [label for label, s in zip(MULTI, row, strict=True) if s >= 0.95]
        for row in sigmoid(reference_logits(3, 1, TEXTS))
    ]
    assert answers["bad"].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "'nli' is softmax" in answers["bad"].error.message


@pytest.mark.parametrize("route", ["grpc", "grpc --stream", "http"])
def test_the_classify_cli_sends_pairs_and_a_threshold(
    server: RunningServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    route: str,
) -> None:
    """`textserve classify TEXT ... --pair TEXT ...` (or --pairs-file) over gRPC, its stream
    and HTTP: the scores of the pairs as numpy has them, and --threshold's labels."""
    from textserve.cli import main as cli_main

    where = (
        ["--server", f"http://127.0.0.1:{server.server.metrics_port}"]
        if route == "http"
        else ["--server", server.address, *route.split()[1:]]
    )
    pairs = [arg for pair in PAIRS for arg in ("--pair", pair)]
    common = [*where, "--json", "--all-scores", "--batch-size", "3"]
    assert cli_main(["classify", *TEXTS, *pairs, "--model", "nli", *common]) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    expected = softmax(reference_logits(2, 3, TEXTS, PAIRS))
    np.testing.assert_allclose([list(r["scores"].values()) for r in results], expected, atol=1e-5)
    assert [r["pair"] for r in results] == PAIRS
    # the same through --file and --pairs-file, as a table
    (tmp_path / "a.txt").write_text("\n".join(TEXTS) + "\n")
    (tmp_path / "b.txt").write_text("\n".join(PAIRS) + "\n")
    files = ["--file", str(tmp_path / "a.txt"), "--pairs-file", str(tmp_path / "b.txt")]
    assert cli_main(["classify", *files, "--model", "nli", *where]) == 0
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 1 + len(TEXTS) and table[1].endswith("a good film / a man sleeps")
    # multi-label: the labels over --threshold, in the JSON and the table
    multi = ["classify", *TEXTS, "--model", "multi", *where, "--threshold", "0.95"]
    assert cli_main([*multi, "--json"]) == 0
    listed = [r["labels_over_threshold"] for r in json.loads(capsys.readouterr().out)["results"]]
    assert listed == [
        [label for label, score in zip(MULTI, row, strict=True) if score >= 0.95]
        for row in sigmoid(reference_logits(3, 1, TEXTS))
    ]
    assert cli_main(multi) == 0
    shown = capsys.readouterr().out.splitlines()[1:]
    for line, labels in zip(shown, listed, strict=True):
        assert line.endswith("[" + ", ".join(labels) + "]") == bool(labels), line


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["a", "b", "--pair", "c"], "1 second texts (--pair/--pairs-file) for 2 texts"),
        (["a", "--pair", "b", "--pairs-file", "x"], "with --pair or with --pairs-file, not both"),
        (["a", "--pairs-file", "/no/such/file"], "cannot read /no/such/file"),
        (["a", "--threshold", "1.5"], "--threshold must be within (0, 1), got 1.5"),
        (["a", "--pair", "b", "--model", "plain"], "takes no sentence pairs"),
    ],
)
def test_bad_pairs_and_thresholds_are_one_line_and_exit_2(
    server: RunningServer, capsys: pytest.CaptureFixture[str], args: list[str], said: str
) -> None:
    from textserve.cli import main as cli_main

    assert cli_main(["classify", *args, "--server", server.address]) == 2
    err = capsys.readouterr().err.strip()
    assert said in err and len(err.splitlines()) == 1, err


def test_a_stream_whose_pairs_run_out_is_refused_by_the_client(server: RunningServer) -> None:
    from textserve.client import Client, ClientError

    with Client(server.address) as client:
        with pytest.raises(ClientError, match="INVALID_ARGUMENT") as refused:
            list(client.classify_stream(iter(TEXTS), model="nli", text_pairs=iter(PAIRS[:2])))
        assert "zip()" in refused.value.message
        streamed = list(client.classify_stream(TEXTS, model="nli", text_pairs=PAIRS, top_k=2))
        unary = client.classify(TEXTS, model="nli", text_pairs=PAIRS, top_k=2)
    tops = [p.top for r in streamed for p in r.predictions]
    assert [[label for label, _ in top] for top in tops] == [
        [label for label, _ in p.top] for p in unary.predictions
    ]  # the same pairs, batched otherwise: equal up to float rounding
    np.testing.assert_allclose(
        [[s for _, s in top] for top in tops],
        [[s for _, s in p.top] for p in unary.predictions],
        atol=1e-6,
    )


def test_the_cache_never_answers_or_stores_a_pair_under_its_first_text(tmp_path: Path) -> None:
    """A cached answer belongs to exactly one input: a pair is never answered from its first
    text's entry, nor stored under it (that would be a wrong answer, not a slow one)."""
    from textserve.service.engine.cache_size import CacheSize

    make_foreign_version(tmp_path, "nli", ["entail", "contradict"], "softmax", seed=3)
    first, second = "a good film", "the plot is bad"
    want_single = softmax(reference_logits(2, 3, [first]))[0]
    want_pair = softmax(reference_logits(2, 3, [first], [second]))[0]
    assert np.abs(want_single - want_pair).max() > 1e-3  # the two inputs score apart
    with running_server(tmp_path, cache_size=CacheSize.parse("1MiB")) as srv:
        stub = pb_grpc.ClassifierStub(srv.channel())

        def pair_is_computed() -> None:
            pair = classify(stub, model="nli", texts=[first], text_pairs=[second])
            assert not pair.results[0].cached
            np.testing.assert_allclose(pair.results[0].scores, want_pair, atol=1e-5)

        pair_is_computed()  # first: nothing of it may be stored under its first text
        for cached in (False, True):
            single = classify(stub, model="nli", texts=[first])
            assert single.results[0].cached is cached
            np.testing.assert_allclose(single.results[0].scores, want_single, atol=1e-5)
        pair_is_computed()  # and a cached first text never answers the pair
