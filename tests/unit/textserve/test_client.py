"""The Python client's own pieces without a server (textserve/client.py): a response becomes a
ClassifyResult, one string is refused (a list of texts is asked for), a ClientError carries
its code, and the caller's current span travels as `traceparent` metadata."""

from __future__ import annotations

import pytest

from textserve.client import ClientError, _traced, to_result
from textserve.v1 import classifier_pb2 as pb


def test_client_result_conversion() -> None:
    response = pb.ClassifyResponse(
        model="m",
        model_version=3,
        labels=["neg", "pos"],
        results=[pb.TextResult(label="pos", score=0.75, scores=[0.25, 0.75], num_tokens=4)],
    )
    result = to_result(response)
    assert (result.model, result.version) == ("m", 3)
    assert result.predictions[0].scores == {"neg": 0.25, "pos": 0.75}
    assert result.predictions[0].num_tokens == 4


def test_client_refuses_a_single_string() -> None:
    from textserve.messages import classify_request as _request

    with pytest.raises(TypeError, match="not one string"):
        _request("abc", None, None, None, 0, False, "")


def test_client_error_carries_the_code() -> None:
    err = ClientError("NOT_FOUND", "model 'x' not found")
    assert err.code == "NOT_FOUND" and str(err) == "NOT_FOUND: model 'x' not found"


def test_the_client_sends_the_current_span_as_traceparent() -> None:
    from opentelemetry.sdk.trace import TracerProvider

    token = (("authorization", "Bearer x"),)
    assert _traced(token) == token  # no current span
    tracer = TracerProvider().get_tracer("caller")
    with tracer.start_as_current_span("caller") as span:
        metadata = dict(_traced(token))
    context = span.get_span_context()
    assert metadata["authorization"] == "Bearer x"
    version, trace_id, span_id, flags = metadata["traceparent"].split("-")
    assert (version, trace_id, span_id) == (
        "00",
        f"{context.trace_id:032x}",
        f"{context.span_id:016x}",
    )
    assert int(flags, 16) & 1  # sampled
