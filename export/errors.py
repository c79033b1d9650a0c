"""Errors of the export package: bad input (ExportError) and a model that failed a check."""

from __future__ import annotations


class ExportError(Exception):
    """Something the user must fix: a bad run directory, repository, name or option."""


class CheckFailed(ExportError):
    """A validation check failed: the model is not published.

    `check` names the check ("parity", "test-split argmax agreement", ...), `figure` is the
    measured value and `limit` the bound it broke, so the message says by how much.
    """

    def __init__(
        self, check: str, message: str, *, figure: float | None = None, limit: float | None = None
    ) -> None:
        super().__init__(f"{check} check failed: {message}")
        self.check = check
        self.figure = figure
        self.limit = limit


def first_line(exc: BaseException) -> str:
    """An exception's message as one line of ours: its first line (a library's message may go
    on for lines, a traceback among them), or its type's name where it says nothing."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
