"""Admission by time: refuse a request at once when the work queued ahead of it would keep it
waiting longer than the bound, or longer than its own deadline. Pure: no asyncio, no clock of
its own (the Batcher passes `now`), so it is tested with numbers.

    admission = Admission(max_wait=0.25, name="default", workers=1)
    admission.drained(tokens=1200, seconds=0.04)       # after each batch: 30,000 tokens/s
    admission.check(queued_tokens=9000, deadline=None, now=0.0)   # 0.3 s ahead: OverloadedError

The queue's bound in texts (`--max-queue-size`) says how much may wait; this says how long. A
request that would wait two seconds is refused in microseconds with a retryable status
(RESOURCE_EXHAUSTED, HTTP 429) instead of being accepted and then cancelled by its caller, a
gateway or grpc itself (Triton's queue policy, TEI's 429 and gRPC's admission control work the
same way). The wait is the queued tokens (each text's estimated length, the queue's own unit)
over the tokens per second the model has drained, a moving average over batches.
"""

from __future__ import annotations

from textserve.service.errors import DeadlineExceededError, OverloadedError

# Weight of the newest batch in the drain rate's moving average: ~10 batches of memory, so a
# change of load or of text lengths shows within a few tens of milliseconds under load.
DRAIN_SMOOTHING = 0.1


class QueueWaitError(OverloadedError):
    """Refused: the queue holds more work than the bound (reason "queue_wait")."""

    reason = "queue_wait"


class Admission:
    """The drain rate of one model version's batcher and the decisions it makes."""

    def __init__(self, max_wait: float | None, name: str = "model", workers: int = 1) -> None:
        self.max_wait = max_wait  # seconds; None: admission by time is off
        self.name = name
        self.workers = workers  # inference workers draining the queue side by side
        self.rate: float | None = None  # tokens per second of one worker; None: no batch yet

    def drained(self, tokens: int, seconds: float) -> None:
        """One batch of `tokens` (estimated) ran in `seconds`."""
        if seconds <= 0 or tokens <= 0:
            return
        rate = tokens / seconds
        self.rate = rate if self.rate is None else self.rate + DRAIN_SMOOTHING * (rate - self.rate)

    def expected_wait(self, queued_tokens: int) -> float:
        """Seconds the queued tokens keep a new request waiting (0 before the first batch)."""
        if not self.rate or queued_tokens <= 0:
            return 0.0
        return queued_tokens / (self.rate * self.workers)

    def check(self, queued_tokens: int, deadline: float | None, now: float) -> None:
        """QueueWaitError when the wait ahead exceeds max_wait; DeadlineExceededError when the
        deadline (absolute, the same clock as `now`) comes before the wait is over. Nothing
        when admission by time is off."""
        if self.max_wait is None:
            return
        wait = self.expected_wait(queued_tokens)
        if wait > self.max_wait:
            raise QueueWaitError(
                f"model {self.name!r} is overloaded: its queue holds about {wait * 1e3:.0f} ms "
                f"of work (limit {self.max_wait * 1e3:.0f} ms); retry later"
            )
        if deadline is not None and now + wait > deadline:
            raise DeadlineExceededError(
                f"model {self.name!r}'s queue holds about {wait * 1e3:.0f} ms of work, more "
                f"than the {max(0.0, deadline - now) * 1e3:.0f} ms left before the deadline"
            )
