"""The one error of `--workers N` the user sees: a line and an exit status."""

from __future__ import annotations


class SupervisorError(Exception):
    """The server could not start (a bad --workers value, more workers than the memory holds,
    a worker that failed before serving), or its workers kept dying: one line for the user."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status
