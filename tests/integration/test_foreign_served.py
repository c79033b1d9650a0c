"""Foreign models exported by `textserve export` and served by a real server: every score the
server answers (textserve.v1 and OIP) equals transformers' pipeline on the same texts, over-long
ones included; int8 and a hot-reloaded new version of a foreign model are served too.

Models are tiny and random (tests/foreign.py), built and exported once per module.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests import foreign
from tests.serving import RunningServer, poll, running_server, serve_subprocess
from textserve import cli
from textserve.client import Client
from textserve.oip import grpc_service_pb2 as pb
from textserve.oip import grpc_service_pb2_grpc as pb_grpc

TEXTS = [
    "a gripping, beautifully acted film",
    "ok",  # the server refuses an empty text (INVALID_ARGUMENT)
    "dull. dull!",
    "北京 🙂 café",
    "the story " * 300,
]
MODELS = {  # name -> (architecture, build options)
    "bert": (
        "bert",
        {"num_labels": 2, "id2label": {0: "neg", 1: "pos"}, "label2id": {"neg": 0, "pos": 1}},
    ),
    "multi": ("bert", {"num_labels": 3, "problem_type": "multi_label_classification"}),
    "roberta": ("roberta", {"num_labels": 2}),
    "regression": ("distilbert", {"num_labels": 1, "problem_type": "regression"}),
}
ACTIVATION = {"bert": "softmax", "multi": "sigmoid", "roberta": "softmax", "regression": "none"}


def export(folder: Path, repository: Path, name: str, *extra: str) -> None:
    argv = [
        "export",
        str(folder),
        "--repository",
        str(repository),
        "--name",
        name,
        "--threads",
        "1",
        *extra,
    ]
    assert cli.main(argv) == 0


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("served-hf")
    return {name: foreign.build(arch, root / name, **kw) for name, (arch, kw) in MODELS.items()}


@pytest.fixture(scope="module")
def server(folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    repository = tmp_path_factory.mktemp("served-models")
    for name, folder in folders.items():
        export(folder, repository, name)
    export(folders["bert"], repository, "bert8", "--quantize", "int8", "--max-accuracy-drop", "50")
    with running_server(repository, poll_interval=0.2) as running:
        yield running, repository


def pipeline(folder: Path, activation: str, texts: list[str]) -> list[dict[str, float]]:
    from transformers import pipeline as make

    pipe = make(
        "text-classification",
        model=str(folder),
        top_k=None,
        function_to_apply=activation,
        device="cpu",
    )
    answers = pipe(texts, truncation=True, max_length=foreign.MAX_LENGTH)
    return [{a["label"]: a["score"] for a in row} for row in answers]


@pytest.mark.parametrize("name", list(MODELS))
def test_classify_scores_equal_the_pipeline(
    name: str, server: tuple[RunningServer, Path], folders: dict[str, Path]
) -> None:
    running, _ = server
    with Client(running.address) as client:
        result = client.classify(TEXTS, model=name, all_scores=True)
    want = pipeline(folders[name], ACTIVATION[name], TEXTS)
    for got, expected in zip(result.predictions, want, strict=True):
        assert set(got.scores) == set(expected)
        assert max(abs(got.scores[k] - v) for k, v in expected.items()) <= 1e-4
    assert result.predictions[-1].truncated  # the over-long text was cut, its </s> kept


def test_oip_probabilities_equal_the_pipeline(
    server: tuple[RunningServer, Path], folders: dict[str, Path]
) -> None:
    running, _ = server
    request = pb.ModelInferRequest(model_name="bert", id="r1")
    tensor = request.inputs.add(name="TEXT", datatype="BYTES", shape=[len(TEXTS)])
    tensor.contents.bytes_contents.extend(t.encode() for t in TEXTS)
    with running.channel() as channel:
        response = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    index = [o.name for o in response.outputs].index("PROBABILITIES")
    output = response.outputs[index]
    if response.raw_output_contents:
        flat = np.frombuffer(response.raw_output_contents[index], "<f4")
    else:
        flat = np.asarray(output.contents.fp32_contents, dtype=np.float32)
    got = flat.reshape(list(output.shape))
    want = pipeline(folders["bert"], "softmax", TEXTS)
    assert np.abs(got - np.array([[row["neg"], row["pos"]] for row in want])).max() <= 1e-4


def test_int8_is_served(server: tuple[RunningServer, Path]) -> None:
    running, _ = server
    with Client(running.address) as client:
        fp32 = client.classify(TEXTS, model="bert", all_scores=True)
        int8 = client.classify(TEXTS, model="bert8", all_scores=True)
    assert [p.label for p in int8.predictions] == [p.label for p in fp32.predictions]


def test_a_new_version_of_a_foreign_model_is_hot_reloaded(
    server: tuple[RunningServer, Path], folders: dict[str, Path], tmp_path: Path
) -> None:
    running, repository = server
    other = foreign.build("roberta", tmp_path / "roberta2", num_labels=2, seed=7)
    export(other, repository, "roberta")
    with Client(running.address) as client:
        poll(lambda: client.classify(["a film"], model="roberta").version == 2, "version 2")
        result = client.classify(TEXTS, model="roberta", all_scores=True)
    want = pipeline(other, "softmax", TEXTS)
    for got, expected in zip(result.predictions, want, strict=True):
        assert max(abs(got.scores[k] - v) for k, v in expected.items()) <= 1e-4
    shutil.rmtree(tmp_path / "roberta2")


def test_workers_serve_a_foreign_model(
    server: tuple[RunningServer, Path], folders: dict[str, Path]
) -> None:
    _, repository = server
    want = pipeline(folders["multi"], "sigmoid", TEXTS)
    with serve_subprocess(repository, "--workers", "2") as process:
        for _ in range(2):  # a connection each, so both workers answer (the kernel spreads them)
            with Client(process.address) as client:
                result = client.classify(TEXTS, model="multi", all_scores=True)
            for got, expected in zip(result.predictions, want, strict=True):
                assert max(abs(got.scores[k] - v) for k, v in expected.items()) <= 1e-4
