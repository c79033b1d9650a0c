"""`textserve export` of decoder sequence classifiers (issue #40): tiny random Qwen2, Qwen3,
Llama and Gemma folders (tests/foreign.py: each with its own transformers tokenizer class)
exported through the CLI into one repository, then served by a real server, whose scores over
gRPC and HTTP equal transformers' pipeline on the untouched folder.

transformers scores such a model at its last token that is not config.pad_token_id; the
server pads on the right with the manifest's pad_token_id, and the graph finds that token
itself. So a padded batch (texts of different lengths, one over max_length) must score each
text as the pipeline scores it alone, unpadded; and a version whose manifest pads with another
id than the graph skips must not. Nothing is downloaded.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")
requests = pytest.importorskip("requests")

from tests import foreign  # noqa: E402
from tests.serving import RunningServer, running_server  # noqa: E402
from textserve import cli  # noqa: E402
from textserve.artifact import MANIFEST_FILE, MODEL_FILE, TOKENIZER_FILE, Manifest  # noqa: E402
from textserve.client import Client  # noqa: E402
from textserve.export.checks import CHECK_TEXTS, apply_activation  # noqa: E402
from textserve.tokenization import Tokenization, load_tokenizer  # noqa: E402

TEXTS = [
    "a gripping, beautifully acted film",
    "Ünïcödé naïve café — crème brûlée, e\u0301 vs é",
    "北京欢迎你 東京 서울 🙂🎬👍🏽",
    "two  spaces,   three   and\tcontrol\u200bcharacters",
    "ok",
    "the story " * 300,  # far over max_length (128 tokens): cut, on the right
]
LONG = len(TEXTS) - 1
# name -> (architecture, build options, activation the manifest must get)
MODELS: dict[str, tuple[str, dict[str, Any], str]] = {
    "qwen2": (
        "qwen2",
        {
            "id2label": {0: "neg", 1: "mixed", 2: "pos"},
            "label2id": {"neg": 0, "mixed": 1, "pos": 2},
        },
        "softmax",
    ),
    "qwen3": ("qwen3", {"problem_type": "multi_label_classification"}, "sigmoid"),
    "llama": ("llama", {"num_labels": 2}, "softmax"),
    "gemma": ("gemma", {}, "softmax"),
}
# the pad each export must decide: the manifest's pad_token_id and extra.pad_token
PADS = {
    # <|endoftext|>, named by config.json and the tokenizer
    "qwen2": {"id": 0, "token": "<|endoftext|>", "source": "config.json"},
    # config.json names none: the tokenizer's pad token
    "qwen3": {"id": 0, "token": "<|endoftext|>", "source": "pad_token"},
    # neither names one: the tokenizer's eos token
    "llama": {"id": 2, "token": "</s>", "source": "eos_token"},
    "gemma": {"id": 0, "token": "<pad>", "source": "config.json"},
}
WRONG_PAD = "llama-wrong-pad"  # llama's version, its manifest padding with <unk> (0), not </s>


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("decoders")
    qwen = foreign.decoder_tokenizer("qwen2")  # one trained vocabulary for both Qwens
    built = {}
    for name, (arch, options, _) in MODELS.items():
        tokenizer = qwen if arch.startswith("qwen") else None
        built[name] = foreign.build_decoder(arch, root / name, tokenizer=tokenizer, **options)
    return built


@pytest.fixture(scope="module")
def exported(folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The repository with every folder exported by the CLI, and what the exports logged."""
    repository = tmp_path_factory.mktemp("decoder-models")
    records = _Records()
    logger = logging.getLogger("textserve.export")
    logger.addHandler(records)
    try:
        for name, folder in folders.items():
            argv = ["export", str(folder), "--repository", str(repository), "--name", name]
            assert cli.main([*argv, "--threads", "1"]) == 0, name
    finally:
        logger.removeHandler(records)
    shutil.copytree(repository / "llama", repository / WRONG_PAD)
    manifest = repository / WRONG_PAD / "1" / MANIFEST_FILE
    data = json.loads(manifest.read_text(encoding="utf-8"))
    data.update(name=WRONG_PAD, pad_token_id=0)
    manifest.write_text(json.dumps(data), encoding="utf-8")
    return repository, records.messages


@pytest.fixture(scope="module")
def server(exported: Any) -> Iterator[RunningServer]:
    repository, _ = exported
    with running_server(repository, metrics_port=0, model="qwen2") as running:
        yield running


def pipeline_scores(folder: Path, name: str, texts: list[str], labels: list[str]) -> np.ndarray:
    """transformers' pipeline on the folder as saved (no pad set by us), one text at a time."""
    from transformers import pipeline

    pipe = pipeline(
        "text-classification",
        model=str(folder),
        top_k=None,
        function_to_apply=MODELS[name][2],
        device="cpu",
    )
    answers = pipe(texts, truncation=True, max_length=foreign.DECODER_POSITIONS)
    return np.array(
        [[{a["label"]: a["score"] for a in row}[lab] for lab in labels] for row in answers]
    )


def grpc_scores(server: RunningServer, name: str, labels: list[str]) -> tuple[np.ndarray, Any]:
    with Client(server.address) as client:
        result = client.classify(TEXTS, model=name, all_scores=True)
    scores = np.array([[p.scores[label] for label in labels] for p in result.predictions])
    return scores, result


def http_scores(server: RunningServer, name: str, labels: list[str]) -> np.ndarray:
    url = f"http://127.0.0.1:{server.server.metrics_port}/v1/classify"
    answer = requests.post(
        url, json={"model": name, "texts": TEXTS, "all_scores": True}, timeout=60
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert [row["truncated"] for row in body["results"]] == [i == LONG for i in range(len(TEXTS))]
    order = [body["labels"].index(label) for label in labels]  # scores: in body["labels"] order
    return np.array([[row["scores"][i] for i in order] for row in body["results"]])


@pytest.mark.parametrize("name", list(MODELS))
def test_served_scores_equal_transformers_pipeline(
    name: str, server: RunningServer, folders: dict[str, Path], exported: Any
) -> None:
    repository, _ = exported
    manifest = Manifest.read(repository / name / "1")
    want = pipeline_scores(folders[name], name, TEXTS, manifest.labels)
    got, result = grpc_scores(server, name, manifest.labels)
    assert got.shape == want.shape == (len(TEXTS), len(manifest.labels))
    assert np.abs(got - want).max() <= 1e-4
    assert np.abs(http_scores(server, name, manifest.labels) - want).max() <= 1e-4
    assert [p.truncated for p in result.predictions] == [i == LONG for i in range(len(TEXTS))]


def published_scores(version: Path) -> tuple[np.ndarray, Any]:
    """TEXTS scored from the published files alone (the tokenizer, the manifest's pad id and
    activation, the graph) in one right-padded batch, as the server scores a batch."""
    manifest = Manifest.read(version)
    tokenization = Tokenization.for_manifest(load_tokenizer(version / TOKENIZER_FILE), manifest)
    batch = tokenization.arrays(TEXTS)
    session = ort.InferenceSession(str(version / MODEL_FILE), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {n: getattr(batch, n) for n in manifest.inputs})
    return apply_activation(np.asarray(logits, dtype=np.float64), manifest.activation), batch


@pytest.mark.parametrize("name", list(MODELS))
def test_a_padded_batch_scores_each_text_as_transformers_does_alone(
    name: str, folders: dict[str, Path], exported: Any
) -> None:
    repository, _ = exported
    manifest = Manifest.read(repository / name / "1")
    got, batch = published_scores(repository / name / "1")
    mask = batch.attention_mask
    assert mask.shape[1] == manifest.max_length == foreign.DECODER_POSITIONS
    assert (mask[:, -1] == 0).sum() == len(TEXTS) - 1  # every row but the cut one is padded
    assert np.all(batch.input_ids[mask == 0] == manifest.pad_token_id)
    want = pipeline_scores(folders[name], name, TEXTS, manifest.labels)
    assert np.abs(got - want).max() <= 1e-4


@pytest.mark.parametrize("name", list(MODELS))
def test_the_manifest_records_the_pad_decision(name: str, exported: Any) -> None:
    repository, logged = exported
    manifest = Manifest.read(repository / name / "1")
    pad = PADS[name]
    assert manifest.pad_token_id == pad["id"]
    assert manifest.extra["pad_token"] == pad
    assert manifest.inputs == ["input_ids", "attention_mask"]  # no token_type_ids
    assert manifest.activation == MODELS[name][2]
    assert manifest.source is not None and manifest.source.model_type == MODELS[name][0]
    assert manifest.source.architecture.endswith("ForSequenceClassification")
    decided = [m for m in logged if f"/{name}: config.json has no pad_token_id" in m]
    if pad["source"] == "config.json":
        assert not decided
    else:
        (message,) = decided
        assert f"the tokenizer's {pad['source'].replace('_', ' ')} {pad['token']!r}" in message
        assert f"manifest's pad_token_id is {pad['id']}" in message
    # graph parity at 12 shapes (batch 1/7/64 × 1/5/37/128 tokens, full and padded rows)
    assert len(manifest.extra["parity_shapes"]) == 12
    assert manifest.parity["max_abs_logit_diff"] <= 1e-4
    assert manifest.parity["served_max_abs_score_diff"] <= 1e-4


def test_an_empty_text_is_refused_where_it_has_no_tokens(exported: Any) -> None:
    """Qwen's tokenizer adds no token: an empty text has none, transformers cannot score it,
    and the manifest names no unknown token to score instead; Llama's gets its <s>."""
    repository, _ = exported
    qwen, llama = (Manifest.read(repository / n / "1") for n in ("qwen2", "llama"))
    assert qwen.unk_token_id is None
    assert qwen.parity["tokenization_texts"] == len(CHECK_TEXTS) - 1  # all but ""
    assert llama.unk_token_id == 0
    assert llama.parity["tokenization_texts"] == len(CHECK_TEXTS)
    # Llama's pair template (<s> A <s> B) sets two texts apart: pairs were checked too
    assert llama.parity["tokenization_pairs"] > 0 and "tokenization_pairs" not in qwen.parity


def test_a_manifest_padding_with_another_id_breaks_the_scores(
    server: RunningServer, folders: dict[str, Path], exported: Any
) -> None:
    """The same graph served with a pad id it does not skip: the padded texts are scored at
    their padding, so the comparison above is one that padding can fail."""
    repository, _ = exported
    manifest = Manifest.read(repository / WRONG_PAD / "1")
    want = pipeline_scores(folders["llama"], "llama", TEXTS, manifest.labels)
    got, _ = published_scores(repository / WRONG_PAD / "1")
    diff = np.abs(got - want).max(axis=1)
    assert diff[LONG] <= 1e-4  # the cut text fills the batch: no padding, the same score
    assert diff[:LONG].min() > 1e-3  # every padded one is scored at its padding
    # the server batches by length (some texts may run unpadded), but not all of these alone
    served, _ = grpc_scores(server, WRONG_PAD, manifest.labels)
    assert np.abs(served - want).max() > 1e-3


def test_a_long_context_is_capped_unless_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """4096 positions (a real one: 32768 and more) give max_length 512; --max-length 40, 40."""
    folder = foreign.build_decoder("qwen2", tmp_path / "long", max_position_embeddings=4096)
    repository = tmp_path / "models"
    for name, extra in (("capped", []), ("asked", ["--max-length", "40"])):
        argv = ["export", str(folder), "--repository", str(repository), "--name", name, *extra]
        assert cli.main([*argv, "--threads", "1", "--no-optimize"]) == 0
    capsys.readouterr()
    assert Manifest.read(repository / "capped" / "1").max_length == 512
    assert Manifest.read(repository / "asked" / "1").max_length == 40
