"""Unit tests of the model repository and model handles on hand-built model versions."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from tests.handmade import make_version
from tests.unit.service.repository.helpers import nothing
from textserve.service.config import RuntimeConfig, ServerConfig
from textserve.service.engine.subbatches import softmax
from textserve.service.errors import ModelNotFoundError, NotReadyError, ValidationError
from textserve.service.metrics import Metrics
from textserve.service.repository.core import ModelRepository, StartupError, State, scan
from textserve.tokenization import pad


def with_repository(
    root: Path, body: Callable[[ModelRepository], Awaitable[Any]], **overrides: Any
) -> tuple[Any, Metrics]:
    overrides.setdefault("runtime", RuntimeConfig(device="cpu", intra_op_threads=1))
    config = ServerConfig(repository=root, metrics_port=None, **overrides)
    metrics = Metrics(CollectorRegistry())

    async def main() -> Any:
        repository = ModelRepository.from_server(config, metrics)
        try:
            await repository.load_all()
            return await body(repository)
        finally:
            await repository.close()

    return asyncio.run(main()), metrics


def test_scan_finds_versions_with_manifests_only(tmp_path: Path) -> None:
    make_version(tmp_path, "m", 1)
    make_version(tmp_path, "m", 3)
    (tmp_path / "m" / "4").mkdir()  # being written: no manifest yet
    (tmp_path / "m" / "latest").mkdir()
    (tmp_path / "empty").mkdir()
    assert {name: sorted(v) for name, v in scan(tmp_path).items()} == {"m": [1, 3]}


def test_loads_the_newest_version_and_makes_the_only_model_default(tmp_path: Path) -> None:
    make_version(tmp_path, "m", 1)
    make_version(tmp_path, "m", 2)

    async def body(repository: ModelRepository) -> None:
        handle = repository.get()
        assert (handle.name, handle.version) == ("m", 2)
        assert repository.models["m"].versions[1].state is State.AVAILABLE
        with pytest.raises(NotReadyError, match="version 1 is available"):
            repository.get("m", 1)

    _, metrics = with_repository(tmp_path, body)
    labels = {"model": "m", "version": "2", "provider": "CPUExecutionProvider", "precision": "fp32"}
    assert metrics.registry.get_sample_value("textserve_model_info", labels) == 1


def test_the_model_info_series_names_the_served_versions_precision(tmp_path: Path) -> None:
    path = make_version(tmp_path, "m", 1)
    data = json.loads((path / "manifest.json").read_text())
    data["precision"] = "fp16"  # the manifest's word: the label says what was published
    (path / "manifest.json").write_text(json.dumps(data))

    _, metrics = with_repository(tmp_path, nothing)
    labels = {"model": "m", "version": "1", "provider": "CPUExecutionProvider", "precision": "fp16"}
    assert metrics.registry.get_sample_value("textserve_model_info", labels) == 1


def test_refuses_a_version_whose_checksum_does_not_match(tmp_path: Path) -> None:
    make_version(tmp_path, "m", 1)
    newest = make_version(tmp_path, "m", 2)
    with open(newest / "model.onnx", "ab") as fh:
        fh.write(b"tampered")

    async def body(repository: ModelRepository) -> None:
        assert repository.get().version == 1  # served the older, intact version
        record = repository.models["m"].versions[2]
        assert record.state is State.FAILED and "does not match the manifest" in record.reason

    _, metrics = with_repository(tmp_path, body)
    labels = {"model": "m", "reason": "checksum_mismatch"}
    assert metrics.registry.get_sample_value("textserve_model_load_failures_total", labels) == 1


def test_refuses_a_manifest_for_another_place(tmp_path: Path) -> None:
    path = make_version(tmp_path, "m", 1)
    data = json.loads((path / "manifest.json").read_text())
    data["version"] = 5
    (path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(StartupError, match="says m version 5"):
        with_repository(tmp_path, nothing)


def test_several_models_need_a_name_without_a_default(tmp_path: Path) -> None:
    make_version(tmp_path, "a", 1)
    make_version(tmp_path, "b", 1)

    async def body(repository: ModelRepository) -> None:
        assert repository.get("b").name == "b"
        with pytest.raises(ModelNotFoundError, match=r"no default model; name one of: a \["):
            repository.get()
        with pytest.raises(ModelNotFoundError, match=r"model 'c' not found; models: a .*, b "):
            repository.get("c")
        with pytest.raises(ModelNotFoundError, match="has no version 9"):
            repository.get("a", 9)

    with_repository(tmp_path, body)

    async def default_b(repository: ModelRepository) -> None:
        assert repository.get().name == "b"

    with_repository(tmp_path, default_b, model="b")


def test_classify_matches_direct_inference_and_reports_truncation(tmp_path: Path) -> None:
    make_version(tmp_path, "m", 1, max_length=4)

    async def body(repository: ModelRepository) -> Any:
        handle = repository.get()
        texts = ["a good film", "the plot is bad and awful", "zzz qqq"]
        result = await handle.classify(texts)
        # one text at a time, straight through the contract's tokenization and the session
        tokenization, session = handle.runner.tokenization, handle.runner.session
        expected = np.concatenate([softmax(session.run(*tokenization.batch([t]))) for t in texts])
        np.testing.assert_allclose(result.probabilities, expected, atol=1e-6)
        assert result.num_tokens.tolist() == [3, 4, 2]
        assert result.truncated.tolist() == [False, True, False]
        assert result.timings.total_seconds >= result.timings.inference_seconds > 0

    with_repository(tmp_path, body)


@pytest.mark.parametrize(
    ("texts", "message"),
    [
        ([], "no texts"),
        (["ok", ""], r"texts\[1\] is empty"),
        (["ok", "ok", "  \n"], r"texts\[2\] is empty"),
        (["x"] * 5, "5 texts in one request; the limit is 4"),
    ],
)
def test_classify_validates(tmp_path: Path, texts: list[str], message: str) -> None:
    make_version(tmp_path, "m", 1)

    async def body(repository: ModelRepository) -> None:
        with pytest.raises(ValidationError, match=message):
            await repository.get().classify(texts)

    with_repository(tmp_path, body, max_texts_per_request=4)


def test_too_long_without_truncation_names_index_and_limit(tmp_path: Path) -> None:
    make_version(tmp_path, "m", 1, max_length=3)

    async def body(repository: ModelRepository) -> None:
        with pytest.raises(ValidationError, match=r"texts\[1\] is 5 tokens long; .* at most 3"):
            await repository.get().classify(["good", "a good film and plot"], truncate=False)
        assert repository.get().stats().items == 0  # refused before the queue

    with_repository(tmp_path, body)


def test_metrics_see_batches_queue_and_tokenization(tmp_path: Path) -> None:
    make_version(tmp_path, "m", 1)

    async def body(repository: ModelRepository) -> None:
        await repository.get().classify(["good", "bad film"])

    _, metrics = with_repository(tmp_path, body)
    value = metrics.registry.get_sample_value
    assert value("textserve_batch_size_count", {"model": "m"}) >= 1
    assert value("textserve_batch_size_sum", {"model": "m"}) >= 2
    assert value("textserve_queue_duration_seconds_count", {"model": "m"}) >= 2
    assert value("textserve_tokenize_duration_seconds_count", {"model": "m"}) >= 1
    assert value("textserve_inference_duration_seconds_count", {"model": "m"}) >= 1


def test_pad_and_softmax() -> None:
    ids, mask = pad([[5, 6, 7], [8]], pad_token_id=0)
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    probs = softmax(np.array([[0.0, 0.0], [1000.0, 0.0]], dtype=np.float32))
    np.testing.assert_allclose(probs, [[0.5, 0.5], [1.0, 0.0]])
    assert probs.dtype == np.float32


def test_a_request_before_startup_has_loaded_is_unavailable_not_not_found(tmp_path: Path) -> None:
    # A client can reach a bound port before it is SERVING (a round_robin client on a replica
    # that restarts): it must get UNAVAILABLE (NotReadyError), which clients retry, not
    # NOT_FOUND for the model that is loading.
    make_version(tmp_path, "m", 1)
    repository = ModelRepository.from_server(
        ServerConfig(repository=tmp_path), Metrics(CollectorRegistry())
    )
    for name in (None, "m"):
        with pytest.raises(NotReadyError, match="starting"):
            repository.get(name)

    async def body(repository: ModelRepository) -> None:
        assert repository.get().name == "m"  # once loaded

    with_repository(tmp_path, body, model="m")
