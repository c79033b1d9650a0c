"""A model version's batch function in a process of its own (`--engine process`).

    engine = EngineProcess(model_bytes, tokenizer_bytes, manifest, runtime, max_batch_tokens)
    output = engine(payloads)      # the batcher's executor thread: tokenize + run, over a pipe
    engine.close()

Why: with the batch function in the serving process, its event loop (gRPC, HTTP, the data
plane) and the inference thread share one GIL, and the profile says the loop is the bottleneck
(docs/performance.md, "Where a request's time goes"): the inference thread's Python (tokenized
rows, padding, activation, the batch's bookkeeping) takes the GIL from the loop for ~0.15 ms a
text. Here that work runs in another process on another core; the serving process's executor
thread only sends the batch's texts and waits for its rows (a pipe read releases the GIL).

The engine process gets the bytes the repository verified (model.onnx and tokenizer.json), not
paths, so it runs exactly what was hashed; it builds the same Session and TextRunner as the
serving process (check and warm-up stay there, on its own session) and answers one batch at a
time. Nothing on the pipe is pickled: texts go as JSON, a batch's rows come back as the raw
bytes of their numpy records, its runs and failures as JSON (errors by taxonomy class name).
It ends when told to, or when its pipe closes (the serving process died): never an orphan.
A batch it cannot answer (the process died) fails with InternalError, and the next batch
starts a new engine process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from textserve.service import errors
from textserve.service.engine.batches import BatchOutput, RunStats
from textserve.service.errors import InternalError

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from textserve.artifact import Manifest
    from textserve.service.config import RuntimeConfig
    from textserve.service.engine.inference import TextItem

logger = logging.getLogger(__name__)

START_TIMEOUT = 120.0  # seconds an engine process may take to load its model
STOP_TIMEOUT = 5.0

# One payload on the pipe: (text, truncate, position, request key, pair, cut). The request
# object of a TextItem groups the texts of one request; it travels as a small key per batch. The
# cut is a request's own truncation (inference.Cut as a list), null for the model's.
Wire = tuple[str, bool, int, int, "str | None", "list[Any] | None"]


def to_wire(payloads: Sequence[TextItem]) -> list[Wire]:
    keys: dict[int, int] = {}
    return [_wire(p, keys.setdefault(id(p.request), len(keys))) for p in payloads]


def _wire(p: TextItem, key: int) -> Wire:
    cut = None if p.options is None else list(p.options)  # type: ignore[call-overload]
    return (p.text, p.truncate, p.position, key, p.pair, cut)


def from_wire(data: bytes) -> list[TextItem]:
    """The engine's side of to_wire: a batch's TextItems (a new request object per key)."""
    from textserve.service.engine.inference import TextItem

    requests: dict[int, object] = {}
    return [
        TextItem(text, truncate, position, requests.setdefault(key, object()), pair, _cut(cut))
        for text, truncate, position, key, pair, cut in json.loads(data)
    ]


def _cut(cut: list[Any] | None) -> Any:
    from textserve.service.engine.inference import Cut

    return None if cut is None else Cut(*cut)


def reply(
    output: BatchOutput | None, error: Exception | None = None, merged: int = 1
) -> list[bytes]:
    """What the engine sends back for a batch: a JSON head (runs, failed rows, how many front
    ends' batches ran together) and the rows' raw bytes; or the error that failed it all."""
    if output is None:
        return [json.dumps({"kind": "error", "error": portable(error or InternalError())}).encode()]
    head = {
        "kind": "ok",
        "runs": [list(run) for run in output.runs or ()],
        "errors": {str(row): portable(e) for row, e in (output.errors or {}).items()},
        "merged": merged,
    }
    return [json.dumps(head).encode(), output.outputs.tobytes()]


def spawn_ready(target: Any, args: Sequence[Any], name: str) -> tuple[Connection, Any, str]:
    """`target(conn, *args)` in a spawned daemon process (never a fork of one running grpc),
    once it said "ready [VALUE]" on `conn`: (this end of the pipe, the process, VALUE).
    InternalError naming `name` when it says anything else or nothing within START_TIMEOUT."""
    context = multiprocessing.get_context("spawn")
    conn, child = context.Pipe()
    process = context.Process(target=target, args=(child, *args), name=name, daemon=True)
    process.start()
    child.close()
    if not conn.poll(START_TIMEOUT):
        process.kill()
        raise InternalError(f"{name} did not start within {START_TIMEOUT:.0f} s")
    kind, _, value = conn.recv_bytes().decode().partition(" ")
    if kind != "ready":
        process.join(STOP_TIMEOUT)
        raise InternalError(f"{name} failed to start: {value}")
    return conn, process, value


def stop_child(process: Any) -> None:
    """Wait up to STOP_TIMEOUT for a child told to stop, then kill it."""
    process.join(STOP_TIMEOUT)
    if process.is_alive():
        process.kill()
        process.join(STOP_TIMEOUT)


class EngineProcess:
    """The batch function of one version, run by a child process (see the module docstring)."""

    def __init__(
        self,
        model: bytes,
        tokenizer: bytes,
        manifest: Manifest,
        runtime: RuntimeConfig,
        max_batch_tokens: int,
    ) -> None:
        self._spec = (model, tokenizer, manifest, runtime, max_batch_tokens)
        from textserve.service.engine.inference import row_dtype

        self._rows = row_dtype(len(manifest.labels))
        self._name = f"engine-{manifest.name}-{manifest.version}"
        self._lock = threading.Lock()  # one batch on the pipe at a time
        self._conn: Connection | None = None
        self._process: Any = None
        self._closed = False
        self._start()

    def _start(self) -> None:
        self._conn, self._process, _ = spawn_ready(serve, self._spec, self._name)

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def __call__(self, payloads: list[TextItem]) -> BatchOutput:
        """Executor thread: the batch's BatchOutput, computed by the engine process."""
        wire = to_wire(payloads)
        with self._lock:
            if self._closed:
                raise InternalError(f"{self._name} is closed")
            if self._conn is None:
                self._start()  # the last one died: a new one for this batch
            assert self._conn is not None
            try:
                self._conn.send_bytes(json.dumps(wire).encode())
                head = json.loads(self._conn.recv_bytes())
                rows = self._conn.recv_bytes() if head["kind"] == "ok" else b""
            except (EOFError, OSError, ValueError) as exc:
                self._reap()
                raise InternalError(f"{self._name} died during a batch ({exc!r})") from None
        if head["kind"] == "error":
            raise rebuilt(head["error"])
        outputs = np.frombuffer(rows, dtype=self._rows).copy()
        runs = [RunStats(*run) for run in head["runs"]]
        failed = {int(row): rebuilt(error) for row, error in head["errors"].items()}
        return BatchOutput(outputs, runs, failed or None)

    def _reap(self) -> None:
        logger.error("%s (pid %s) died; the next batch starts a new one", self._name, self.pid)
        if self._conn is not None:
            self._conn.close()
        if self._process is not None:
            self._process.join(STOP_TIMEOUT)
        self._conn, self._process = None, None

    def close(self) -> None:
        """Stop the engine process (idempotent): asked first, killed if it does not go."""
        with self._lock:
            self._closed = True
            conn, process = self._conn, self._process
            self._conn, self._process = None, None
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.send_bytes(b"")  # stop
            conn.close()
        if process is not None:
            stop_child(process)


def serve(
    conn: Connection,
    model: bytes,
    tokenizer_bytes: bytes,
    manifest: Manifest,
    runtime: RuntimeConfig,
    max_batch_tokens: int,
) -> None:
    """The engine process: build the version's batch function, then answer batches until told
    to stop or the pipe closes."""
    from textserve.service.engine.memory import pin_malloc_thresholds
    from textserve.service.engine.priority import lower_process

    pin_malloc_thresholds()  # as the serving process (engine/memory.py)
    # Below the serving process's loop, as its inference thread would be; before the session,
    # so that onnxruntime's threads inherit it (engine/priority.py).
    lower_process(runtime.inference_nice, base_pid=os.getppid())
    try:
        runner = runner_from_bytes(model, tokenizer_bytes, manifest, runtime, max_batch_tokens)
    except BaseException as exc:
        conn.send_bytes(f"failed {type(exc).__name__}: {exc}".encode())
        return
    del model
    conn.send_bytes(b"ready")
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return  # the serving process is gone
        if not data:
            return  # told to stop
        try:
            parts = reply(runner(from_wire(data)))
        except Exception as exc:  # the serving process fails the batch with it
            parts = reply(None, exc)
        try:
            for part in parts:
                conn.send_bytes(part)
        except (EOFError, OSError):
            return


# The taxonomy's errors a batch can fail with, by class name (service/errors.py).
PORTABLE: Mapping[str, type[Exception]] = {
    cls.__name__: cls
    for cls in (errors.ValidationError, errors.NotReadyError, errors.OverloadedError,
                errors.DeadlineExceededError, errors.CancelledError, InternalError)
}  # fmt: skip


def portable(exc: Exception) -> list[str]:
    """An error as it crosses the pipe: its taxonomy class (else InternalError) and message."""
    for cls in type(exc).__mro__:
        if cls.__name__ in PORTABLE and PORTABLE[cls.__name__] is cls:
            return [cls.__name__, str(exc)]
    return ["InternalError", f"{type(exc).__name__}: {exc}"]


def rebuilt(error: Sequence[str]) -> Exception:
    """The error `portable` sent."""
    name, message = error
    return PORTABLE.get(name, InternalError)(message)


def runner_from_bytes(
    model: bytes,
    tokenizer_bytes: bytes,
    manifest: Manifest,
    runtime: RuntimeConfig,
    max_batch_tokens: int,
) -> Any:
    from tokenizers import Tokenizer

    from textserve.service.engine.inference import TextRunner
    from textserve.service.engine.runtime import Session
    from textserve.tokenization import Tokenization

    session = Session(model, runtime, inputs=manifest.inputs)
    tokenizer = Tokenizer.from_buffer(tokenizer_bytes)
    return TextRunner(
        session,
        Tokenization.for_manifest(tokenizer, manifest),
        labels=manifest.labels,
        max_batch_tokens=max_batch_tokens,
        activation=manifest.activation,
        name=manifest.name,
        version=manifest.version,
    )
