"""The engine's batch-trace hook (service/engine/batcher.py): each batch is reported once to
the traced requests it ran, with its runs and the model's attributes; a trace that fails
never fails the batch (a fake trace, a fake batch function)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from textserve.service.config import BatcherConfig
from textserve.service.engine.batcher import Batcher, RunStats


class FakeTrace:
    def __init__(self, calls: list[Any], fail: bool = False) -> None:
        self.calls = calls
        self.fail = fail

    def on_batch(
        self,
        traces: Sequence[Any],
        started_ago: float,
        seconds: float,
        runs: Sequence[RunStats],
        attributes: Mapping[str, str | int],
    ) -> None:
        if self.fail:
            raise RuntimeError("tracing broke")
        self.calls.append((list(traces), started_ago, seconds, list(runs), dict(attributes)))


@pytest.mark.parametrize("fail", [False, True])
def test_the_engine_reports_each_batch_to_its_traced_requests(fail: bool) -> None:
    calls: list[Any] = []
    traces = [FakeTrace(calls, fail), FakeTrace(calls, fail)]

    async def main() -> list[Any]:
        batcher = Batcher(
            lambda payloads: np.ones((len(payloads), 2)),
            BatcherConfig(),
            trace_attributes={"textserve.model": "m"},
        )
        batcher.start()
        batcher.pause()
        submits = [
            batcher.submit(["a", "b"], [1, 2], trace=traces[0]),
            batcher.submit(["c"], [1]),  # not traced
            batcher.submit(["d"], [3], trace=traces[1]),
        ]
        tasks = [asyncio.ensure_future(s) for s in submits]
        await asyncio.sleep(0)
        batcher.resume()
        results = await asyncio.gather(*tasks)  # a broken trace never fails the batch
        await batcher.close()
        return results

    results = asyncio.run(main())
    assert [r.outputs.shape for r in results] == [(2, 2), (1, 2), (1, 2)]
    if fail:
        assert calls == []
        return
    assert len(calls) == 1
    linked, started_ago, seconds, runs, attributes = calls[0]
    assert linked == traces  # each traced request once
    assert started_ago >= seconds >= 0
    assert sum(run.size for run in runs) == 4
    assert attributes == {"textserve.model": "m"}
