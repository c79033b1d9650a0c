"""The one status table and its helpers (service/servicers/status.py) without a server."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import grpc
import pytest

from textserve.service.dataplane.codes import CODES, code_name, log_unexpected, public_message
from textserve.service.dataplane.observe import Seen
from textserve.service.errors import (
    CancelledError,
    DeadlineExceededError,
    InternalError,
    LoadFailedError,
    ModelNotFoundError,
    NotReadyError,
    OverloadedError,
    ServiceError,
    ValidationError,
)
from textserve.service.servicers.status import (
    DEADLINE_MARGIN_S,
    deadline_of,
    grpc_code,
    grpc_errors,
)


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (ValidationError("x"), "INVALID_ARGUMENT"),
        (ModelNotFoundError("x"), "NOT_FOUND"),
        (NotReadyError("x"), "UNAVAILABLE"),
        (OverloadedError("x"), "RESOURCE_EXHAUSTED"),
        (DeadlineExceededError("x"), "DEADLINE_EXCEEDED"),
        (CancelledError("x"), "CANCELLED"),
        (LoadFailedError("x"), "FAILED_PRECONDITION"),
        (InternalError("x"), "INTERNAL"),
        (ServiceError("x"), "INTERNAL"),
        (RuntimeError("x"), "INTERNAL"),
        (KeyError("secret internals"), "INTERNAL"),
    ],
)
def test_each_error_has_its_code(exc: Exception, code: str) -> None:
    assert code_name(exc) == code
    assert grpc_code(exc) is grpc.StatusCode[code]


def test_every_code_in_the_table_is_a_grpc_code() -> None:
    assert all(name in grpc.StatusCode.__members__ for name in CODES.values())


def test_a_subclass_takes_its_parents_code() -> None:
    class TooLong(ValidationError):
        pass

    assert code_name(TooLong("x")) == "INVALID_ARGUMENT"


def test_callers_see_our_messages_never_an_unexpected_exceptions() -> None:
    assert public_message(ValidationError("texts[0] is empty")) == "texts[0] is empty"
    assert "secret" not in public_message(KeyError("secret internals"))
    assert public_message(OverloadedError("queue full; retry later")) == "queue full; retry later"
    assert public_message(KeyError("/secret/path")) == "internal error (logged on the server)"


def test_only_unexpected_errors_are_logged_with_their_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log_unexpected(ValidationError("bad input"), "Classify")
    assert caplog.records == []
    try:
        raise RuntimeError("a bug")
    except RuntimeError as exc:
        log_unexpected(exc, "Classify")
    (record,) = caplog.records
    assert record.levelno == logging.ERROR
    assert record.getMessage() == "unexpected error in Classify"
    assert record.exc_info is not None and record.exc_info[0] is RuntimeError


class Context:
    def __init__(self, remaining: float | None = None) -> None:
        self.remaining = remaining
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    def time_remaining(self) -> float | None:
        return self.remaining

    def cancelled(self) -> bool:
        return False

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise grpc.aio.AbortError()


def test_the_deadline_is_the_callers_a_margin_early() -> None:
    assert deadline_of(Context(None)) is None
    before = time.monotonic()
    deadline = deadline_of(Context(2.0))
    after = time.monotonic()
    assert deadline is not None
    assert before + 2.0 - DEADLINE_MARGIN_S <= deadline <= after + 2.0 - DEADLINE_MARGIN_S
    assert 0 < DEADLINE_MARGIN_S < 0.1


def test_grpc_errors_aborts_with_the_tables_code(caplog: pytest.LogCaptureFixture) -> None:
    class Servicer:
        @grpc_errors
        async def Method(self, request: Any, context: Any) -> Any:
            raise request

    def abort_of(exc: Exception) -> tuple[grpc.StatusCode, str] | None:
        context = Context()
        with pytest.raises(grpc.aio.AbortError):
            asyncio.run(Servicer().Method(exc, context))
        return context.aborted

    assert abort_of(ValidationError("no texts")) == (grpc.StatusCode.INVALID_ARGUMENT, "no texts")
    assert caplog.records == []
    assert abort_of(ZeroDivisionError("x")) == (
        grpc.StatusCode.INTERNAL,
        "internal error (logged on the server)",
    )
    assert [r.getMessage() for r in caplog.records] == [
        "unexpected error in test_grpc_errors_aborts_with_the_tables_code.<locals>.Servicer.Method"
    ]


def test_seen_carries_the_model_reached() -> None:
    assert Seen("tiny").model == "tiny"
