"""What an operator sees of a request the response cache answered: its span and its access log
line say how many of its texts were cached; a model without a cache adds neither (real
OpenTelemetry SDK and AccessLog, as tests/unit/service/test_request_report.py)."""

from __future__ import annotations

import numpy as np

from tests.unit.service.test_request_report import TIMINGS, Call, observer
from tests.unit.service.test_request_report import tracing as tracing  # the fixture
from textserve.service.engine.handle import ClassifyResult
from textserve.service.servicers.status import observed
from textserve.service.tracing import Tracing


def answer(cached: np.ndarray | None) -> ClassifyResult:
    return ClassifyResult(
        probabilities=np.full((3, 2), 0.5, dtype=np.float32),
        num_tokens=np.array([5, 7, 2], dtype=np.int64),
        truncated=np.zeros(3, dtype=bool),
        timings=TIMINGS,
        cached=cached,
    )


def test_the_span_and_the_access_log_say_how_many_texts_were_cached(tracing: Tracing) -> None:
    for cached, said in ((np.array([True, False, True]), 2), (None, None)):
        obs = observer(tracing)
        with observed(
            obs.metrics, "Classify", None, "m", context=Call(), telemetry=obs.telemetry
        ) as seen:
            seen.reached("m", 3, ["first text", "second", "third"])
            seen.result = answer(cached)
        (span,) = obs.spans()
        assert (span.attributes or {}).get("textserve.cached") == said
        assert obs.line().get("cached") == said
        assert ("cached" in obs.line()) is (said is not None)
