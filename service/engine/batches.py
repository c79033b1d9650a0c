"""What passes between the batcher, its batch function and its watchers: results, statistics, hooks.

Plain data and protocols (numpy only), so the batch function (inference.TextRunner), the
batcher (batcher.Batcher), the metrics and the tracing share them without importing each other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np


class BatchObserver(Protocol):
    """Hooks for metrics; called on the event loop. Implementations must be cheap."""

    def on_batch(
        self, size: int, padded_tokens: int, padding_ratio: float, seconds: float
    ) -> None: ...

    def on_queue_waits(self, waits: Sequence[float]) -> None: ...

    def on_queue_depth(self, depth: int) -> None: ...

    def on_inflight(self, texts: int) -> None: ...

    def on_expected_wait(self, seconds: float) -> None: ...

    def on_refused(self, reason: str) -> None: ...


class BatchTrace(Protocol):
    """A traced request's handle on its trace (service/tracing.py's RequestTrace): the engine
    reports each batch that carried traced requests to one of them, with all of them."""

    def on_batch(
        self,
        traces: Sequence[BatchTrace],
        started_ago: float,
        seconds: float,
        runs: Sequence[RunStats],
        attributes: Mapping[str, str | int],
    ) -> None: ...


class NullObserver:
    def on_batch(self, size: int, padded_tokens: int, padding_ratio: float, seconds: float) -> None:
        pass

    def on_queue_waits(self, waits: Sequence[float]) -> None:
        pass

    def on_queue_depth(self, depth: int) -> None:
        pass

    def on_inflight(self, texts: int) -> None:
        pass

    def on_expected_wait(self, seconds: float) -> None:
        pass

    def on_refused(self, reason: str) -> None:
        pass


@dataclass
class BatchStats:
    """Counters since the batcher started (read by GetModel and tests)."""

    batches: int = 0  # model runs (a batch that run_batch splits into runs counts each run)
    items: int = 0  # items that reached the model
    max_batch_size_seen: int = 0
    dropped_deadline: int = 0
    dropped_cancelled: int = 0
    rejected_overloaded: int = 0  # requests refused: the queue was full, or held too long a wait
    rejected_deadline: int = 0  # requests refused up front: their deadline was nearer than the wait
    padded_tokens: int = 0
    padding_tokens: int = 0
    queue_depth: int = 0

    @property
    def mean_batch_size(self) -> float:
        return self.items / self.batches if self.batches else 0.0


class RunStats(NamedTuple):
    """One model run inside a batch, as `run_batch` reports it (see BatchOutput)."""

    size: int  # items in the run
    padded_tokens: int  # items x the run's padded length
    real_tokens: int  # tokens of the items themselves (the rest is padding)
    seconds: float  # the run's duration


@dataclass(frozen=True)
class Timings:
    queue_seconds: float  # longest wait of any of the texts before its batch started
    tokenize_seconds: float  # tokenization of the batches that carried the texts (the longest)
    inference_seconds: float  # summed run time of those batches, less the tokenization
    total_seconds: float  # from the call to its answer


class BatchOutput(NamedTuple):
    """What a `run_batch` that does more than run the model once returns."""

    outputs: np.ndarray  # (n, ...) one row per payload (rows in `errors` may hold anything)
    runs: Sequence[RunStats] | None = None  # the model runs it made; None: the batch, once
    errors: Mapping[int, Exception] | None = None  # row -> why it failed (its request fails)


@dataclass(frozen=True)
class BatchResult:
    outputs: np.ndarray  # (n, ...) one row per submitted payload, in submission order
    queue_seconds: float  # longest wait of any of the request's items before its batch started
    inference_seconds: float  # summed run time of the batches that carried the request's items
