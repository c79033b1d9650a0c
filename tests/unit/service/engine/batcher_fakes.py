"""What the dynamic batcher's tests share (tests/unit/service/engine/test_batcher_*.py): a fake
run_batch, a recording observer, a clock moved by hand, and `run`/`wait_until` to drive a
started batcher from a test."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from textserve.service.config import BatcherConfig
from textserve.service.engine.batcher import Batcher


class FakeModel:
    """run_batch: echoes each payload's value in column 0 and the batch's size in column 1."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.batches: list[list[int]] = []
        self.gate = gate

    def __call__(self, payloads: list[int]) -> np.ndarray:
        if self.gate is not None:
            self.gate.wait(5)
        self.batches.append(list(payloads))
        out = np.zeros((len(payloads), 2), dtype=np.float32)
        out[:, 0] = payloads
        out[:, 1] = len(payloads)
        return out


class GatedByPayload:
    """run_batch for one-item batches: notes each batch's payload as it enters, then holds the
    batch until that payload's gate is set (5 s at most); echoes the payloads in column 0."""

    def __init__(self, *payloads: int) -> None:
        self.gates = {payload: threading.Event() for payload in payloads}
        self.entered: list[int] = []

    def __call__(self, payloads: list[int]) -> np.ndarray:
        self.entered.append(payloads[0])
        self.gates[payloads[0]].wait(5)
        return np.asarray(payloads, dtype=np.float32).reshape(-1, 1)


class Recorder:
    """An observer that records each batch (size, padded tokens, padding ratio), queue wait,
    queue depth and in-flight count it is told."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, int, float]] = []
        self.waits: list[float] = []
        self.depths: list[int] = []
        self.inflight: list[int] = []

    def on_batch(self, size: int, padded_tokens: int, padding_ratio: float, seconds: float) -> None:
        self.batches.append((size, padded_tokens, padding_ratio))

    def on_queue_waits(self, waits: Any) -> None:
        self.waits.extend(waits)

    def on_queue_depth(self, depth: int) -> None:
        self.depths.append(depth)

    def on_expected_wait(self, seconds: float) -> None:
        pass

    def on_refused(self, reason: str) -> None:
        pass

    def on_inflight(self, texts: int) -> None:
        self.inflight.append(texts)


class FullRecorder(Recorder):
    """Also records each batch's seconds."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: list[float] = []

    def on_batch(self, size: int, padded_tokens: int, padding_ratio: float, seconds: float) -> None:
        super().on_batch(size, padded_tokens, padding_ratio, seconds)
        self.seconds.append(seconds)


class FakeClock:
    """The batcher's clock, moved by hand: deadlines expire when the test says."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class TimedModel(FakeModel):
    """A FakeModel whose every batch takes 0.25 s on the batcher's (fake) clock."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock

    def __call__(self, payloads: list[int]) -> np.ndarray:
        self.clock.now += 0.25
        return super().__call__(payloads)


def run(
    body: Callable[[Batcher[int], FakeModel], Awaitable[Any]],
    model: FakeModel | None = None,
    observer: Recorder | None = None,
    **config: Any,
) -> Any:
    """Run `body` on a started batcher of `model` (a FakeModel by default) and the given
    BatcherConfig fields, closing the batcher after it; returns what `body` returns."""
    model = model or FakeModel()

    async def main() -> Any:
        batcher: Batcher[int] = Batcher(
            model, BatcherConfig(**config), observer=observer, name="fake"
        )
        batcher.start()
        try:
            return await body(batcher, model)
        finally:
            await batcher.close()

    return asyncio.run(main())


async def wait_until(predicate: Callable[[], bool]) -> None:
    """Turn the loop until `predicate` holds (about 10 s at most, then fail)."""
    for _ in range(10_000):
        if predicate():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition never became true")
