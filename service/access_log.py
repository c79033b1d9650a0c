"""Structured access logs: one JSON line per request (`--access-log json`), rate-limited.

    log = AccessLog(rate=1000, metrics=metrics)        # lines to stdout via "textserve.access"
    log.write(method="Classify", peer="ipv4:127.0.0.1:5123", model="default", version=3,
              texts=["..."], tokens=17, status="OK", timings=result.timings, seconds=0.004,
              trace_id="4bf9...")

A line: {"time", "peer", "method", "model", "version", "texts" (how many), "tokens", "status",
"queue_ms", "tokenize_ms", "inference_ms", "total_ms", "trace_id"}; with `log_texts` (the
`--log-texts` flag) also "input": the texts themselves. That is a privacy risk: the texts users
send end up wherever the logs go. Off by default.

A token bucket (`rate` lines a second, bursts of as many) keeps logging from becoming the
bottleneck under overload: lines over the rate are dropped and counted in
textserve_access_log_dropped_total. No grpc here (the caller passes the peer as text).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from textserve.service.engine.handle import Timings
    from textserve.service.metrics import Metrics

LOGGER = "textserve.access"
FORMATS = ("off", "json")  # --access-log


def _stdout_logger() -> logging.Logger:
    """The "textserve.access" logger writing bare lines to stdout (not the server's log format:
    each line is one JSON document). A handler set up by the user is left alone."""
    logger = logging.getLogger(LOGGER)
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


class TokenBucket:
    """`rate` tokens a second, at most `burst` saved up; take() is False when empty."""

    def __init__(
        self, rate: float, burst: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate}")
        self.rate = rate
        self.burst = max(1.0, rate if burst is None else burst)
        self._clock = clock
        self._tokens = self.burst
        self._last = clock()
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
            if self._tokens < 1.0:
                return False
            self._tokens -= 1.0
            return True


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 3)


class AccessLog:
    """Writes one JSON line per request through `emit` (default: the "textserve.access"
    logger on stdout), at most `rate` lines a second."""

    def __init__(
        self,
        *,
        rate: float = 1000.0,
        log_texts: bool = False,
        metrics: Metrics | None = None,
        emit: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log_texts = log_texts
        self._bucket = TokenBucket(rate, clock=clock)
        self._metrics = metrics
        self._emit = emit or _stdout_logger().info
        self.dropped = 0

    def write(
        self,
        *,
        method: str,
        peer: str,
        model: str,
        version: int | None,
        texts: Sequence[str] | None,
        tokens: int | None,
        status: str,
        timings: Timings | None,
        seconds: float,
        trace_id: str | None,
        cached: int | None = None,
    ) -> None:
        if not self._bucket.take():
            self.dropped += 1
            if self._metrics is not None:
                self._metrics.access_log_dropped.inc()
            return
        line: dict[str, object] = {
            "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "peer": peer,
            "method": method,
            "model": model or None,
            "version": version,
            "texts": None if texts is None else len(texts),
            "tokens": tokens,
            "status": status,
            "queue_ms": _ms(None if timings is None else timings.queue_seconds),
            "tokenize_ms": _ms(None if timings is None else timings.tokenize_seconds),
            "inference_ms": _ms(None if timings is None else timings.inference_seconds),
            "total_ms": _ms(seconds),
            "trace_id": trace_id,
        }
        if cached is not None:  # the model has a response cache: texts it answered
            line["cached"] = cached
        if self.log_texts and texts is not None:
            line["input"] = list(texts)
        self._emit(json.dumps(line, ensure_ascii=False))
