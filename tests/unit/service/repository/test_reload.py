"""Hot reload in the repository on hand-built versions: switch, drain, refusals, policies, admin.

Real onnxruntime sessions on the milliseconds-to-build models of tests/handmade.py; no gRPC
(tests/integration/test_hot_reload.py drives a real server under load).
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto
from tokenizers import Tokenizer, models

from tests.handmade import WORDS, make_onnx, make_tokenizer, make_version
from tests.serving import run_repository as run
from tests.unit.service.repository.helpers import (
    break_checksum,
    drained,
    failures,
    ready_versions,
    rename_input,
    reseal,
)
from textserve.artifact import MODEL_FILE, TOKENIZER_FILE
from textserve.service.config import RuntimeConfig
from textserve.service.errors import LoadFailedError, ModelNotFoundError, NotReadyError
from textserve.service.metrics import Metrics
from textserve.service.repository.core import ModelRepository, ReloadEvent, StartupError, State
from textserve.service.repository.policy import parse_policies
from textserve.service.repository.watcher import RepositoryWatcher


def info(metrics: Metrics) -> list[str]:
    """The versions textserve_model_info reports as served."""
    return [
        s.labels["version"]
        for family in metrics.registry.collect()
        if family.name == "textserve_model_info"
        for s in family.samples
        if s.value == 1
    ]


def test_a_new_version_is_served_once_ready_and_the_old_one_released(tmp_path: Path) -> None:
    make_version(tmp_path, "m", 1)

    async def body(repository: ModelRepository) -> None:
        old = repository.get()
        make_version(tmp_path, "m", 2, seed=1)
        events = await repository.reconcile()
        assert events == [ReloadEvent("m", 2, "loaded"), ReloadEvent("m", 1, "unloaded")]
        assert repository.get().version == 2
        assert repository.models["m"].versions[1].state is State.UNLOADING
        with pytest.raises(NotReadyError, match="version 1 is unloading"):
            repository.get("m", 1)
        await drained(repository)
        entry = repository.models["m"].versions[1]
        assert entry.state is State.AVAILABLE and entry.handle is None
        assert old.runner.session._session is None  # the onnxruntime session was released
        assert await repository.reconcile() == []  # nothing more to do

    metrics = run(tmp_path, body)
    assert info(metrics) == ["2"]


def test_a_request_that_picked_the_old_version_finishes_there(tmp_path: Path) -> None:
    """Even when its batch is still waiting for the model as the switch happens."""
    make_version(tmp_path, "m", 1)

    async def body(repository: ModelRepository) -> None:
        gate = threading.Event()
        old = repository.get()
        # Hold the (single) inference thread: the request below waits for it.
        blocker = old.batcher._executor.submit(gate.wait, 30)
        request = asyncio.create_task(old.classify(["a good film"]))
        await asyncio.sleep(0)  # let it start: it is now waiting for the inference thread
        make_version(tmp_path, "m", 2, seed=1)
        await repository.reconcile()
        assert repository.get().version == 2
        drain = repository._drains[("m", 1)]
        await asyncio.sleep(0.05)  # give a wrong drain the chance to close v1 under the request
        assert not drain.done() and not request.done()
        gate.set()
        result = await request  # answered by version 1, no NotReadyError
        assert result.probabilities.shape == (1, 2)
        await drain
        assert old.stats().items == 1 and blocker.done()

    run(tmp_path, body)


def break_onnx(path: Path) -> None:
    (path / MODEL_FILE).write_bytes(b"\x08\x07not an onnx graph" * 10)
    reseal(path)


def int32_input(path: Path) -> None:
    model = onnx.load(str(path / MODEL_FILE))
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.INT32
    onnx.save(model, str(path / MODEL_FILE))
    reseal(path)


def drop_tokenizer(path: Path) -> None:
    (path / TOKENIZER_FILE).unlink()


def bad_tokenizer(path: Path) -> None:
    (path / TOKENIZER_FILE).write_text('{"model": "nonsense"}')
    reseal(path)


def too_many_labels(path: Path) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["labels"] = ["a", "b", "c"]  # the graph gives 2 logits: warm-up catches it
    (path / "manifest.json").write_text(json.dumps(manifest))


def bigger_tokenizer(path: Path) -> None:
    # Two words more than the model's embedding has rows: their ids would fail any batch.
    make_tokenizer([*WORDS, "zebra", "quokka"]).save(str(path / TOKENIZER_FILE))
    reseal(path)


def pad_outside_vocabulary(path: Path) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["pad_token_id"] = 999
    (path / "manifest.json").write_text(json.dumps(manifest))


def no_unk(path: Path) -> None:
    vocab = {"[PAD]": 0, **{w: i + 1 for i, w in enumerate(WORDS)}}
    Tokenizer(models.WordLevel(vocab)).save(str(path / TOKENIZER_FILE))
    reseal(path)


def short_positions(path: Path) -> None:
    # The graph takes 4 positions; the manifest promises max_length 8.
    onnx.save(make_onnx(len(WORDS) + 2, 2, max_positions=4), str(path / MODEL_FILE))
    reseal(path)


def wrong_manifest(path: Path) -> None:
    (path / "manifest.json").write_text('{"name": "m"}')


@pytest.mark.parametrize(
    ("breaker", "reason", "message"),
    [
        (break_checksum, "checksum_mismatch", "does not match the manifest"),
        (break_onnx, "session_error", "onnxruntime cannot load"),
        (rename_input, "contract_mismatch", r"inputs \['ids', 'attention_mask'\]"),
        (int32_input, "contract_mismatch", r"input_ids is tensor\(int32\)"),
        (drop_tokenizer, "tokenizer_error", "tokenizer.json is missing"),
        (bad_tokenizer, "tokenizer_error", "not a tokenizers file"),
        (too_many_labels, "contract_mismatch", "gives 2 logits but the manifest has 3 labels"),
        (bigger_tokenizer, "contract_mismatch", "ids go up to 13 .* cannot take id 13"),
        (pad_outside_vocabulary, "contract_mismatch", "pad_token_id 999 is not in the tok"),
        (no_unk, "tokenizer_error", r"tokenizer.json: the tokenizer has no \[UNK\] token"),
        (short_positions, "contract_mismatch", "max_length is 8 but the model cannot take 8"),
        (wrong_manifest, "invalid_manifest", "missing field"),
    ],
)
def test_a_broken_version_is_refused_and_the_serving_one_keeps_serving(
    tmp_path: Path, breaker: Callable[[Path], None], reason: str, message: str
) -> None:
    make_version(tmp_path, "m", 1)

    async def body(repository: ModelRepository) -> None:
        broken = make_version(tmp_path, "m", 2, seed=1)
        breaker(broken)
        [event] = await repository.reconcile()
        assert (event.version, event.action) == (2, "refused") and event.reason
        entry = repository.models["m"].versions[2]
        assert entry.state is State.FAILED
        assert re.search(message, entry.reason), entry.reason
        assert repository.get().version == 1
        assert (await repository.get().classify(["good"])).probabilities.shape == (1, 2)
        assert await repository.reconcile() == []  # not tried (nor counted) again unchanged

    metrics = run(tmp_path, body)
    assert failures(metrics, reason) == 1
    assert info(metrics) == ["1"]


def test_a_model_that_does_not_fit_its_tokenizer_is_refused_without_warm_up_too(
    tmp_path: Path,
) -> None:
    make_version(tmp_path, "m", 1)
    make_version(tmp_path, "m", 2, words=[*WORDS, "zebra"], embedding_rows=len(WORDS) + 2)

    async def body(repository: ModelRepository) -> None:
        entry = repository.models["m"].versions[2]
        assert entry.state is State.FAILED and "cannot take id 12" in entry.reason
        assert repository.get().version == 1
        result = await repository.get().classify(["a zebra film"])  # [UNK] for zebra in v1
        assert result.probabilities.shape == (1, 2)

    runtime = RuntimeConfig(device="cpu", intra_op_threads=1, warmup=False)
    metrics = run(tmp_path, body, runtime=runtime)
    assert failures(metrics, "contract_mismatch") == 1


def test_a_refused_version_is_tried_again_once_its_files_change(tmp_path: Path) -> None:
    make_version(tmp_path, "m", 1)

    async def body(repository: ModelRepository) -> None:
        good = make_version(tmp_path / "staging", "m", 2, seed=1)
        target = tmp_path / "m" / "2"
        target.mkdir()
        shutil.copy(good / "manifest.json", target)  # a copy still being written
        assert [e.action for e in await repository.reconcile()] == ["refused"]
        for name in (MODEL_FILE, TOKENIZER_FILE):
            shutil.copy(good / name, target)
        events = await repository.reconcile()
        assert [(e.version, e.action) for e in events] == [(2, "loaded"), (1, "unloaded")]

    run(tmp_path, body)


def test_a_served_version_rewritten_in_place_keeps_serving_its_copy_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    served = make_version(tmp_path, "m", 1)
    other = make_version(tmp_path / "elsewhere", "m", 1, seed=1)

    async def body(repository: ModelRepository) -> None:
        before = (await repository.get().classify(["good"])).probabilities
        assert await repository.reconcile() == [] and "changed on disk" not in caplog.text
        shutil.copy(other / MODEL_FILE, served / MODEL_FILE)  # overwritten in place
        caplog.clear()
        for _ in range(3):  # said once per change, not at every scan
            assert await repository.reconcile() == []
        assert caplog.text.count("model m version 1: its files changed on disk") == 1
        assert repository.get().version == 1
        after = (await repository.get().classify(["good"])).probabilities
        assert (after == before).all()  # still the copy verified at load

    with caplog.at_level("WARNING", logger="textserve.service.repository.core"):
        run(tmp_path, body)


def test_policy_all_and_latest_n(tmp_path: Path) -> None:
    for version in (1, 2, 3):
        make_version(tmp_path, "m", version)

    async def every(repository: ModelRepository) -> None:
        assert ready_versions(repository, "m") == [1, 2, 3]
        assert repository.get().version == 3

    run(tmp_path, every, version_policy=parse_policies("all"))

    async def two(repository: ModelRepository) -> None:
        assert ready_versions(repository, "m") == [2, 3]
        make_version(tmp_path, "m", 4)
        await repository.reconcile()
        assert ready_versions(repository, "m") == [3, 4]

    run(tmp_path, two, version_policy=parse_policies("m=latest:2"))


def test_serving_json_pins_a_version_and_a_bad_one_keeps_the_policy(tmp_path: Path) -> None:
    make_version(tmp_path, "m", 1)
    make_version(tmp_path, "m", 2)

    async def body(repository: ModelRepository) -> None:
        assert repository.get().version == 2
        (tmp_path / "m" / "serving.json").write_text('{"version_policy": "specific:1"}')
        await repository.reconcile()  # a rollback without a restart
        assert ready_versions(repository, "m") == [1]
        (tmp_path / "m" / "serving.json").write_text('{"version_policy": "newest"}')
        assert await repository.reconcile() == []
        assert str(repository.models["m"].policy) == "specific:1"
        assert "is not one of" in repository.models["m"].policy_problem

    run(tmp_path, body)


def test_a_bad_serving_json_is_a_startup_error(tmp_path: Path) -> None:
    make_version(tmp_path, "m", 1)
    (tmp_path / "m" / "serving.json").write_text("[]")
    with pytest.raises(StartupError, match="must be a JSON object"):
        run(tmp_path, drained)


def test_a_removed_version_drains_and_the_policy_falls_back(tmp_path: Path) -> None:
    make_version(tmp_path, "m", 1)
    make_version(tmp_path, "m", 2)

    async def body(repository: ModelRepository) -> None:
        shutil.rmtree(tmp_path / "m" / "2")
        events = await repository.reconcile()
        assert [(e.version, e.action) for e in events] == [(1, "loaded"), (2, "unloaded")]
        await drained(repository)
        assert sorted(repository.models["m"].versions) == [1]

    metrics = run(tmp_path, body)
    assert info(metrics) == ["1"]


def test_admin_load_pins_and_unload_rolls_back(tmp_path: Path) -> None:
    make_version(tmp_path, "m", 1)
    make_version(tmp_path, "m", 2)

    async def body(repository: ModelRepository) -> None:
        record, events = await repository.load_model("m", 1)
        assert events == [ReloadEvent("m", 1, "loaded")]
        assert ready_versions(repository, "m") == [1, 2] and repository.get().version == 2
        await repository.reconcile()  # a poll keeps the pinned version
        assert ready_versions(repository, "m") == [1, 2]
        record, events = await repository.unload_model("m", 2)  # a rollback
        assert events == [ReloadEvent("m", 2, "unloaded")]
        assert repository.get().version == 1
        assert record.versions[2].state is State.AVAILABLE  # drained before returning
        await repository.reconcile()
        assert ready_versions(repository, "m") == [1]  # the poll does not bring 2 back
        await repository.unload_model("m")
        assert ready_versions(repository, "m") == []
        with pytest.raises(NotReadyError, match="no ready version"):
            repository.get()
        await repository.load_model("m")  # the policy again
        assert ready_versions(repository, "m") == [2]

    metrics = run(tmp_path, body)
    assert info(metrics) == ["2"]


def test_admin_errors(tmp_path: Path) -> None:
    make_version(tmp_path, "m", 1)
    break_checksum(make_version(tmp_path, "m", 2))

    async def body(repository: ModelRepository) -> None:
        with pytest.raises(ModelNotFoundError, match="model 'x' not found"):
            await repository.load_model("x")
        with pytest.raises(ModelNotFoundError, match="no version 7 on disk"):
            await repository.unload_model("m", 7)
        with pytest.raises(LoadFailedError, match=r"version 2 was refused: .*does not match"):
            await repository.load_model("m", 2)  # tried again (asked for by hand), refused
        assert repository.get().version == 1
        assert 2 not in repository.models["m"].pinned

    metrics = run(tmp_path, body)
    assert failures(metrics, "checksum_mismatch") == 2  # at startup and by hand


def test_the_watcher_picks_up_a_new_version(tmp_path: Path) -> None:
    make_version(tmp_path, "m", 1)

    async def body(repository: ModelRepository) -> None:
        make_version(tmp_path, "m", 2, seed=1)
        deadline = time.monotonic() + 20
        while repository.get().version != 2:  # polling the outcome, not guessing a delay
            assert time.monotonic() < deadline, repository.models["m"].describe()
            await asyncio.sleep(0.01)

    metrics = run(tmp_path, body, poll_interval=0.05)
    assert info(metrics) == ["2"]


def test_close_cuts_a_drain_short(tmp_path: Path) -> None:
    """close() does not wait out a drain's grace: measured against that grace, it is cut."""
    grace = 20.0
    make_version(tmp_path, "m", 1)
    timings: dict[str, float] = {}

    async def body(repository: ModelRepository) -> None:
        old = repository.get()
        old.batcher.pause()
        request = asyncio.create_task(old.classify(["good"]))
        while not old._active:  # polling: the request is in the handle
            await asyncio.sleep(0)
        old._active += 1  # a request that never finishes: only close() ends the drain
        make_version(tmp_path, "m", 2)
        await repository.reconcile()
        drain = repository._drains[("m", 1)]
        assert not drain.done()
        await request  # flushed by the drain: queued work still runs
        assert not drain.done()  # still waiting for the request that never finishes
        started = time.monotonic()
        # wait_for: without the cut, fail at half the grace instead of waiting all of it
        await asyncio.wait_for(repository.close(), grace / 2)
        timings["close"] = time.monotonic() - started
        assert drain.done() and old.batcher._closed

    run(tmp_path, body, grace_period=grace)
    assert timings["close"] < grace / 4, timings


def test_the_watcher_survives_failing_scans(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []

    async def failing_scan() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("repository unmounted")
        if len(calls) == 2:
            raise RuntimeError("a bug")

    async def main() -> None:
        watcher = RepositoryWatcher(failing_scan, 0.001)
        watcher.start()
        while len(calls) < 3:
            await asyncio.sleep(0.001)
        await watcher.stop()
        await watcher.stop()  # idempotent

    asyncio.run(main())
    assert "cannot scan the model repository (repository unmounted)" in caplog.text
    assert "RuntimeError: a bug" in caplog.text  # with its traceback
    with pytest.raises(ValueError, match="interval must be positive"):
        RepositoryWatcher(failing_scan, 0)
