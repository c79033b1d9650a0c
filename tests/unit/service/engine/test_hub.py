"""The engine processes' wire (service/engine/remote.py) and the shared engine's merging
(service/engine/hub.py) without processes: batches queued while the session is busy run as one,
each front end gets back exactly its rows, its failed rows renumbered, and the session's runs are
reported once."""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np

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


class Conn:
    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.done = threading.Event()

    def send_bytes(self, part: bytes) -> None:
        self.parts.append(part)
        if len(self.parts) == 2 or b'"error"' in part:
            self.done.set()


ROWS = row_dtype(2)


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

    version = _Version("m-1", run, limit=100)
    conns = [Conn() for _ in range(4)]
    texts = [["0"], ["1", "2"], ["3", "4", "5"], ["6"]]
    version.submit(_Job(conns[0], [TextItem(t, True, i, None) for i, t in enumerate(texts[0])]))  # type: ignore[arg-type]
    assert busy.wait(10)
    for conn, batch in zip(conns[1:], texts[1:], strict=True):
        version.submit(_Job(conn, [TextItem(t, True, i, None) for i, t in enumerate(batch)]))  # type: ignore[arg-type]
    release.set()
    for conn in conns:
        assert conn.done.wait(10)
    version.stop()
    assert calls == [["0"], ["1", "2", "3", "4", "5", "6"]]
    heads = [json.loads(conn.parts[0]) for conn in conns]
    assert [h["merged"] for h in heads] == [1, 3, 3, 3]
    # the merged run's stats go to its first front end only: summed, each run counts once
    assert [len(h["runs"]) for h in heads] == [1, 1, 0, 0]
    for conn, batch, head in zip(conns, texts, heads, strict=True):
        rows = np.frombuffer(conn.parts[1], dtype=ROWS)
        assert rows["probabilities"][:, 0].tolist() == [float(t) for t in batch]
        failed = {int(row): rebuilt(error) for row, error in head["errors"].items()}
        assert {row: str(e) for row, e in failed.items()} == ({1: "text 4"} if "4" in batch else {})
        assert all(isinstance(e, ValidationError) for e in failed.values())


def test_a_failed_run_fails_every_merged_batch_and_the_limit_holds() -> None:
    seen: list[int] = []
    gate = threading.Event()

    def run(payloads: list[TextItem]) -> Any:
        seen.append(len(payloads))
        gate.wait(10)
        raise RuntimeError("the session broke")

    version = _Version("m-1", run, limit=3)
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
