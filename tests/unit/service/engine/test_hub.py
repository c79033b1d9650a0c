"""The engine processes' wire (service/engine/remote.py) and the shared engine's merging
(service/engine/hub.py) without processes: batches queued while the session is busy run as one,
each front end gets back exactly its rows, its failed rows renumbered, and the session's runs are
reported once."""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np

from tests.serving import poll
from textserve.service.engine.batches import BatchOutput, RunStats
from textserve.service.engine.hub import _Job, _Version
from textserve.service.engine.inference import Cut, TextItem, row_dtype
from textserve.service.engine.remote import from_wire, rebuilt, to_wire
from textserve.service.errors import ValidationError


def test_the_wire_keeps_pairs_cuts_and_requests() -> None:
    first, second = object(), object()
    payloads = [
        TextItem("a", True, 0, first),
        TextItem("b", False, 1, first, "pair b", Cut(max_tokens=5, side="left")),
        TextItem("c", True, 0, second, None, Cut(document_tokens=3)),
    ]
    back = from_wire(json.dumps(to_wire(payloads)).encode())
    assert [(*p[:3], p.pair, p.options) for p in back] == [
        (*p[:3], p.pair, p.options) for p in payloads
    ]
    assert back[0].request is back[1].request and back[2].request is not back[0].request
    assert back[1].options == Cut(5, "left", None)


class Runner:
    """A batch function in two halves; `prepare` records what it was given."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self.prepared: list[list[str]] = []

    def prepare(self, payloads: list[TextItem]) -> list[TextItem]:
        self.prepared.append([p.text for p in payloads])
        return payloads


class Conn:
    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.done = threading.Event()

    def send_bytes(self, part: bytes) -> None:
        self.parts.append(part)
        if len(self.parts) == 2 or b'"error"' in part:
            self.done.set()


ROWS = row_dtype(2)


def test_the_next_batch_is_prepared_while_one_runs() -> None:
    """A pipeline: while the session runs a batch, the next is merged and prepared (and
    waits); the one after that waits in the queue, where it merges with what comes next."""
    running, release = threading.Event(), threading.Event()

    def run(payloads: list[TextItem]) -> BatchOutput:
        running.set()
        release.wait(10)
        return BatchOutput(np.zeros(len(payloads), ROWS), [], None)

    runner = Runner(run)
    version = _Version("m-1", runner, limit=100)
    conns = [Conn() for _ in range(4)]
    version.submit(_Job(conns[0], [TextItem("a", True, 0, None)]))  # type: ignore[arg-type]
    assert running.wait(10)
    version.submit(_Job(conns[1], [TextItem("b", True, 0, None)]))  # type: ignore[arg-type]
    poll(lambda: runner.prepared == [["a"], ["b"]], "b prepared while a runs")
    for conn, text in zip(conns[2:], "cd", strict=True):
        version.submit(_Job(conn, [TextItem(text, True, 0, None)]))  # type: ignore[arg-type]
    release.set()
    for conn in conns:
        assert conn.done.wait(10)
    version.stop()
    assert runner.prepared == [["a"], ["b"], ["c", "d"]]


def test_what_waits_runs_as_one_and_each_gets_its_rows() -> None:
    calls: list[list[str]] = []
    busy, release = threading.Event(), threading.Event()

    def run(payloads: list[TextItem]) -> BatchOutput:
        calls.append([p.text for p in payloads])
        if len(calls) == 1:
            busy.set()
            release.wait(10)
        out = np.zeros(len(payloads), ROWS)
        out["probabilities"][:, 0] = [float(p.text) for p in payloads]
        errors = {
            i: ValidationError(f"text {p.text}") for i, p in enumerate(payloads) if p.text == "4"
        }
        return BatchOutput(out, [RunStats(len(payloads), 10, 8, 0.1)], errors)

    runner = Runner(run)
    version = _Version("m-1", runner, limit=100)
    conns = [Conn() for _ in range(5)]
    texts = [["0"], ["1"], ["2", "3"], ["4", "5"], ["6"]]

    def submit(index: int) -> None:
        items = [TextItem(t, True, i, None) for i, t in enumerate(texts[index])]
        version.submit(_Job(conns[index], items))  # type: ignore[arg-type]

    submit(0)
    assert busy.wait(10)
    submit(1)  # prepared while 0 runs: the pipeline's one waiting batch
    poll(lambda: len(runner.prepared) == 2, "the second batch prepared")
    for index in (2, 3, 4):  # these wait in the queue for the pipeline: merged
        submit(index)
    release.set()
    for conn in conns:
        assert conn.done.wait(10)
    version.stop()
    assert calls == [["0"], ["1"], ["2", "3", "4", "5", "6"]]
    heads = [json.loads(conn.parts[0]) for conn in conns]
    assert [h["merged"] for h in heads] == [1, 1, 3, 3, 3]
    # the merged run's stats go to its first front end only: summed, each run counts once
    assert [len(h["runs"]) for h in heads] == [1, 1, 1, 0, 0]
    for conn, batch, head in zip(conns, texts, heads, strict=True):
        rows = np.frombuffer(conn.parts[1], dtype=ROWS)
        assert rows["probabilities"][:, 0].tolist() == [float(t) for t in batch]
        failed = {int(row): rebuilt(error) for row, error in head["errors"].items()}
        assert {row: str(e) for row, e in failed.items()} == ({0: "text 4"} if "4" in batch else {})
        assert all(isinstance(e, ValidationError) for e in failed.values())


def test_a_failed_run_fails_every_merged_batch_and_the_limit_holds() -> None:
    seen: list[int] = []
    gate = threading.Event()

    def run(payloads: list[TextItem]) -> Any:
        seen.append(len(payloads))
        gate.wait(10)
        raise RuntimeError("the session broke")

    version = _Version("m-1", Runner(run), limit=3)
    conns = [Conn() for _ in range(3)]
    for conn in conns:
        version.submit(_Job(conn, [TextItem("x", True, 0, None)] * 2))  # type: ignore[arg-type]
    gate.set()
    for conn in conns:
        assert conn.done.wait(10)
    version.stop()
    assert sum(seen) == 6 and max(seen) <= 4  # past the limit by at most the last batch taken
    for conn in conns:
        head = json.loads(conn.parts[0])
        assert head == {
            "kind": "error",
            "error": ["InternalError", "RuntimeError: the session broke"],
        }
