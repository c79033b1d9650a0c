"""`--engine shared`: one engine process for every worker, merging their batches.

    hub = HubProcess(runtime, max_batch_tokens, max_merge_texts)   # the supervisor
    hub.start(); hub.address, hub.authkey                          # passed to the workers
    engine = SharedEngine(hub.address, hub.authkey, model, tokenizer, manifest)   # a worker
    output = engine(payloads)        # the worker's batcher thread: a batch, answered by the hub

Why (issue 37, "many front ends, one device"): with `--engine thread` or `process`, N workers
hold N sessions and each batches only its own requests, so a device is time-sliced between N
small batches. Here the workers stay the front ends (gRPC, HTTP, the data plane, the queue, the
metrics, hot reload, drain) and send their batches to one process that holds one session per
model version: whatever batches are waiting when the session comes free run as one (up to
`max_merge_texts` texts), and each worker gets its own rows back.

The hub listens on a Unix socket in a private directory (0700) and authenticates every
connection with a random key (multiprocessing's HMAC challenge, made in the connection's thread
so a peer that never answers holds nothing else). One connection is one version in one worker:
it opens with the version's key (the SHA-256 of its manifest, graph and tokenizer, all bytes the
worker verified); the hub asks for the bytes only if no other worker has opened that version, so
a version is loaded once however many workers serve it, and dropped when its last connection
closes (hot reload, stop, a worker's death). Batches travel as in remote.py (JSON texts, the
rows' raw bytes back; nothing pickled). The hub exits when the supervisor does (its pipe
closes); a hub that dies is started again by the supervisor, and each worker's next batch
reconnects (the batch that was in it fails INTERNAL, as with `--engine process`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import queue
import shutil
import tempfile
import threading
from dataclasses import dataclass
from multiprocessing.connection import (
    Client,
    Connection,
    Listener,
    answer_challenge,
    deliver_challenge,
)
from typing import TYPE_CHECKING, Any, Protocol

from textserve.service.engine.memory import pin_malloc_thresholds, release_freed_memory
from textserve.service.engine.priority import lower_process
from textserve.service.engine.remote import (
    START_TIMEOUT,
    EngineProcess,
    from_wire,
    reply,
    runner_from_bytes,
    spawn_ready,
    stop_child,
)
from textserve.service.errors import InternalError

if TYPE_CHECKING:
    from textserve.artifact import Manifest
    from textserve.service.config import RuntimeConfig
    from textserve.service.engine.batches import BatchOutput
    from textserve.service.engine.inference import TextItem

logger = logging.getLogger(__name__)

SOCKET_NAME = "engine.sock"


def version_key(model: bytes, tokenizer: bytes, manifest: Manifest) -> str:
    digest = hashlib.sha256()
    for part in (manifest.to_json().encode(), model, tokenizer):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


class SharedEngine(EngineProcess):
    """A worker's end of one version in the hub: EngineProcess's batch call and close, over a
    connection to the hub instead of a pipe to a child of its own."""

    def __init__(
        self,
        address: str,
        authkey: bytes,
        model: bytes,
        tokenizer: bytes,
        manifest: Manifest,
    ) -> None:
        self._hub = (address, authkey, version_key(model, tokenizer, manifest))
        self._hub_pid: int | None = None
        self._manifest = manifest.to_dict()
        super().__init__(model, tokenizer, manifest, None, 0)  # type: ignore[arg-type]

    def _start(self) -> None:
        address, authkey, key = self._hub
        try:
            conn = Client(address, family="AF_UNIX", authkey=authkey)
        except (OSError, EOFError) as exc:
            message = f"{self._name}: the shared engine is not answering: {exc}"
            raise InternalError(message) from None
        try:
            conn.send_bytes(json.dumps({"open": key, "manifest": self._manifest}).encode())
            answer = _receive(conn, START_TIMEOUT)
            if answer == b"need":  # the first worker to open this version sends its bytes
                for part in self._spec[:2]:  # the model's and the tokenizer's bytes
                    conn.send_bytes(part)
                answer = _receive(conn, START_TIMEOUT)
        except (OSError, EOFError, TimeoutError) as exc:
            conn.close()
            message = f"{self._name}: the shared engine did not open it: {exc!r}"
            raise InternalError(message) from None
        kind, _, value = answer.decode().partition(" ")
        if kind != "ready":
            conn.close()
            raise InternalError(f"{self._name}: the shared engine failed to load it: {value}")
        self._conn, self._hub_pid = conn, int(value)

    @property
    def pid(self) -> int | None:
        return self._hub_pid


def _receive(conn: Connection, timeout: float) -> bytes:
    if not conn.poll(timeout):
        raise TimeoutError(f"no answer within {timeout:.0f} s")
    return conn.recv_bytes()


# -- the hub process -----------------------------------------------------------------------------


@dataclass
class _Job:
    conn: Connection
    payloads: list[TextItem]


class Runner(Protocol):
    """A version's batch function in two halves (inference.TextRunner's prepare and run)."""

    def prepare(self, payloads: list[TextItem]) -> Any: ...

    def run(self, prepared: Any) -> BatchOutput: ...


class _Version:
    """One version's session in the hub, and a pipeline of two threads in front of it: the
    first merges whatever every front end sent while the session was busy into one batch and
    prepares it (tokenized, padded), the second runs it and sends each front end its rows; so
    the next batch is tokenized while this one runs (tokenizers and onnxruntime release the
    GIL). One prepared batch waits at most: while it waits, what arrives stays in the queue,
    where it merges."""

    def __init__(self, name: str, runner: Runner, limit: int) -> None:
        self.name = name
        self.refs = 0
        self._runner = runner
        self._limit = limit
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._ready: queue.SimpleQueue[tuple[list[_Job], Any] | None] = queue.SimpleQueue()
        # The one prepared batch that may wait for the session: taken before the queue is read,
        # so that whatever arrives while it waits merges into the next batch.
        self._slot = threading.Semaphore(1)
        for target, stage in ((self._merge, "prepare"), (self._runs, "run")):
            name = f"hub-{stage}-{self.name}"
            threading.Thread(target=target, name=name, daemon=True).start()

    def submit(self, job: _Job) -> None:
        self._jobs.put(job)

    def stop(self) -> None:
        self._jobs.put(None)

    def _merge(self) -> None:
        while True:
            first = self._jobs.get()
            if first is None:
                self._ready.put(None)
                return
            self._slot.acquire()
            jobs, texts = [first], len(first.payloads)
            while texts < self._limit:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    self._jobs.put(None)  # stop after this batch
                    break
                jobs.append(job)
                texts += len(job.payloads)
            merged = [payload for job in jobs for payload in job.payloads]
            try:
                prepared = self._runner.prepare(merged)
            except Exception as exc:  # every front end's batch fails with it
                self._slot.release()
                _fail(jobs, exc)
                continue
            self._ready.put((jobs, prepared))

    def _runs(self) -> None:
        while True:
            item = self._ready.get()
            if item is None:  # stopped, and the merging thread is done with the session too
                del self._runner
                release_freed_memory()
                return
            self._slot.release()  # the next batch may be prepared while this one runs
            jobs, prepared = item
            try:
                output = self._runner.run(prepared)
            except Exception as exc:
                _fail(jobs, exc)
                continue
            _answer(jobs, output)


def _fail(jobs: list[_Job], exc: Exception) -> None:
    for job in jobs:
        _send(job.conn, reply(None, exc))


def _answer(jobs: list[_Job], output: BatchOutput) -> None:
    """Each front end its own rows of the merged batch, its failed rows renumbered."""
    start = 0
    for index, job in enumerate(jobs):
        end = start + len(job.payloads)
        failed = (output.errors or {}).items()
        errors = {row - start: e for row, e in failed if start <= row < end}
        # The session's runs are reported once, by the first front end: summed over the
        # workers (their metrics are one registry) each run counts once.
        runs = output.runs if index == 0 else []
        part = type(output)(output.outputs[start:end], runs, errors or None)
        _send(job.conn, reply(part, merged=len(jobs)))
        start = end


def _send(conn: Connection, parts: list[bytes]) -> None:
    with contextlib.suppress(OSError, EOFError):  # that front end is gone: nothing to answer
        for part in parts:
            conn.send_bytes(part)


class Hub:
    """The hub's versions by key and the connections that hold them (the hub process)."""

    def __init__(
        self, runtime: RuntimeConfig, max_batch_tokens: int, limit: int, key: bytes
    ) -> None:
        self._spec = (runtime, max_batch_tokens)
        self._limit = limit
        self._authkey = key
        self._versions: dict[str, _Version] = {}
        self._lock = threading.Lock()

    def connection(self, conn: Connection) -> None:
        """One front end's connection for one version: open it, then take batches until the
        connection closes or says stop (an empty message)."""
        try:
            deliver_challenge(conn, self._authkey)
            answer_challenge(conn, self._authkey)
            version, key = self._open(conn)
        except Exception as exc:
            logger.warning("shared engine: a connection failed to open: %r", exc)
            _send(conn, [f"failed {type(exc).__name__}: {exc}".encode()])
            conn.close()
            return
        try:
            _send(conn, [f"ready {os.getpid()}".encode()])
            while True:
                data = conn.recv_bytes()
                if not data:
                    break
                version.submit(_Job(conn, from_wire(data)))
        except (OSError, EOFError, ValueError):
            pass  # the front end went away (or sent garbage): its version is let go
        finally:
            conn.close()
            self._release(key)

    def _open(self, conn: Connection) -> tuple[_Version, str]:
        from textserve.artifact import Manifest

        head = json.loads(conn.recv_bytes())
        key, manifest = str(head["open"]), Manifest.from_dict(head["manifest"])
        with self._lock:
            version = self._versions.get(key)
            if version is not None:
                version.refs += 1
                return version, key
        conn.send_bytes(b"need")
        model, tokenizer = conn.recv_bytes(), conn.recv_bytes()
        if version_key(model, tokenizer, manifest) != key:
            raise ValueError("the bytes sent are not those of the key")
        with self._lock:  # built once: another front end may have sent the same version
            version = self._versions.get(key)
            if version is None:
                runner = runner_from_bytes(model, tokenizer, manifest, *self._spec)
                name = f"{manifest.name}-{manifest.version}"
                version = self._versions[key] = _Version(name, runner, self._limit)
                logger.info("shared engine: %s loaded (%d versions)", name, len(self._versions))
            version.refs += 1
            return version, key

    def _release(self, key: str) -> None:
        with self._lock:
            version = self._versions[key]
            version.refs -= 1
            if version.refs:
                return
            del self._versions[key]
        version.stop()
        logger.info("shared engine: %s released", version.name)


def hub_main(
    parent: Connection,
    address: str,
    authkey: bytes,
    runtime: RuntimeConfig,
    max_batch_tokens: int,
    limit: int,
    log_level: str = "INFO",
) -> None:
    """The hub process: listen, say ready on `parent`, serve connections; exit when `parent`
    closes (the supervisor is gone or stops it)."""
    os.setpgrp()  # a terminal's Ctrl-C is the supervisor's to handle
    logging.basicConfig(
        level=getattr(logging, log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s engine %(name)s: %(message)s",
    )
    pin_malloc_thresholds()  # before any version loads: a released one's memory goes back
    # Below the workers' loops (engine/priority.py), before any thread or session is made.
    lower_process(runtime.inference_nice, base_pid=os.getppid())
    hub = Hub(runtime, max_batch_tokens, limit, authkey)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(address)  # a previous hub's
    listener = Listener(address, family="AF_UNIX")  # authenticated per connection, in its thread
    threading.Thread(target=_exit_with, args=(parent,), name="hub-parent", daemon=True).start()
    parent.send_bytes(f"ready {os.getpid()}".encode())
    while True:
        try:
            conn = listener.accept()
        except OSError as exc:
            logger.warning("shared engine: accept failed: %r", exc)
            continue
        threading.Thread(target=hub.connection, args=(conn,), name="hub-conn", daemon=True).start()


def _exit_with(parent: Connection) -> None:
    with contextlib.suppress(EOFError, OSError):
        parent.recv_bytes()
    os._exit(0)


class HubProcess:
    """The supervisor's handle on the hub: its socket, key and process; started again when it
    dies (`restart`)."""

    def __init__(
        self, runtime: RuntimeConfig, max_batch_tokens: int, limit: int, log_level: str
    ) -> None:
        self._dir = tempfile.mkdtemp(prefix="textserve-engine-")  # 0700: this user's only
        self.address = os.path.join(self._dir, SOCKET_NAME)
        self.authkey = os.urandom(32)
        self._spec = (runtime, max_batch_tokens, limit)
        self._log_level = log_level
        self._process: Any = None
        self._conn: Connection | None = None
        self.pid = 0

    def start(self) -> None:
        runtime, tokens, limit = self._spec
        args = (self.address, self.authkey, runtime, tokens, limit, self._log_level)
        self._conn, self._process, pid = spawn_ready(hub_main, args, "textserve-engine")
        self.pid = int(pid)
        logger.info("shared engine (pid %d) on %s", self.pid, self.address)

    @property
    def sentinel(self) -> int:
        return int(self._process.sentinel)

    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def restart(self) -> None:
        code = None if self._process is None else self._process.exitcode
        logger.error("shared engine (pid %d) exited with %s: starting it again", self.pid, code)
        self._stop_process()
        self.start()

    def _stop_process(self) -> None:
        if self._conn is not None:
            self._conn.close()  # the hub exits when its pipe closes
            self._conn = None
        if self._process is not None:
            stop_child(self._process)
            self._process = None

    def stop(self) -> None:
        self._stop_process()
        shutil.rmtree(self._dir, ignore_errors=True)
