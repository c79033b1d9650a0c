"""Client.classify_stream's bookkeeping (textserve.client): the texts read once, shared by
the streams' request generators within an in-flight limit, answers filed by message id and
yielded in the input's order."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import grpc

from textserve.results import CODE_NAMES, ClassifyResult, ClientError, to_result
from textserve.v1 import classifier_pb2 as pb


def aligned(texts: Iterable[str], pairs: Iterable[str]) -> Iterator[tuple[str, str]]:
    """(text, its pair) as the stream reads them; a ValueError when one runs out first."""
    if isinstance(texts, str):
        raise TypeError("texts must be an iterable of strings, not one string")
    yield from zip(texts, pairs, strict=True)


class StreamFeed:
    """Client.classify_stream's bookkeeping: one shared input, request generators for the
    streams (each takes the next message, within the in-flight limit), reader threads that
    file answers by id, and the ordered results."""

    def __init__(
        self,
        texts: Iterable[str] | Iterable[tuple[str, str]],
        build: Any,
        texts_per_message: int,
        max_inflight: int,
        *,
        streams: int,
    ) -> None:
        if isinstance(texts, str):
            raise TypeError("texts must be an iterable of strings, not one string")
        self._texts = iter(texts)
        self._build = build
        self._per_message = texts_per_message
        self._lock = threading.Lock()
        self._permits = threading.Semaphore(max_inflight)
        self._answers: dict[int, pb.ClassifyResponse] = {}
        self._ready = threading.Condition(self._lock)
        self._sent = 0  # messages taken from the input so far
        self._exhausted = False
        self._readers_left = streams  # reader threads still reading
        self._failure: BaseException | None = None
        self._stopped = False

    def requests(self) -> Iterator[pb.ClassifyRequest]:
        while True:
            # the permit is returned when the message's answer is yielded to the caller
            while not self._permits.acquire(timeout=0.1):
                if self._stopped:
                    return
            with self._lock:
                if self._stopped or self._exhausted:
                    self._permits.release()
                    return
                try:
                    chunk = list(itertools.islice(self._texts, self._per_message))
                except (TypeError, ValueError) as exc:  # the input itself, e.g. pairs run out
                    self._refuse(exc)
                    return
                if not chunk:
                    self._exhausted = True
                    self._ready.notify_all()
                    self._permits.release()
                    return
                index = self._sent
            try:
                request = self._build(chunk, str(index))
            except (TypeError, ValueError) as exc:  # a text that cannot be sent
                with self._lock:
                    self._refuse(exc)
                return
            with self._lock:
                self._sent += 1
            yield request

    def _refuse(self, exc: Exception) -> None:
        """End the feed on bad input (lock held): results() raises it as INVALID_ARGUMENT at
        its next wait, as a server would refuse the request, and sends nothing more."""
        self._permits.release()
        self._exhausted = True
        if self._failure is None:
            self._failure = ClientError("INVALID_ARGUMENT", str(exc))
        self._ready.notify_all()

    def read(self, call: Any) -> None:
        try:
            for response in call:
                with self._lock:
                    self._answers[int(response.id)] = response
                    self._ready.notify_all()
        except grpc.RpcError as exc:
            with self._lock:
                if not self._stopped and self._failure is None:
                    self._failure = ClientError.from_rpc(exc)
        finally:
            with self._lock:
                self._readers_left -= 1
                self._ready.notify_all()

    def results(self) -> Iterator[ClassifyResult]:
        index = 0
        while True:
            with self._lock:
                while index not in self._answers:
                    if self._failure is not None:
                        raise self._failure
                    if self._exhausted and index >= self._sent:
                        return
                    if self._readers_left <= 0:  # every stream ended, this answer missing
                        raise ClientError("UNAVAILABLE", "the stream ended before every answer")
                    self._ready.wait(0.5)
                response = self._answers.pop(index)
            self._permits.release()
            if response.HasField("error"):
                code = CODE_NAMES.get(response.error.code, "UNKNOWN")
                first = index * self._per_message  # its texts' positions in the input
                raise ClientError(code, f"texts {first}..: {response.error.message}")
            yield to_result(response)
            index += 1

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            self._ready.notify_all()
