"""Watch the model repository: re-scan it every `interval` seconds on the event loop.

Polling rather than inotify: it works the same on every filesystem (network mounts, Kubernetes
volumes, Docker bind mounts on macOS) and a scan is a few stat calls. Exports publish a version
with one rename(2), so a scan sees no version or a whole one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

logger = logging.getLogger(__name__)


class RepositoryWatcher:
    """Calls `poll()` every `interval` seconds until stopped; a failing poll is logged and the
    next one runs as usual (a repository briefly unreadable must not end the watching)."""

    def __init__(self, poll: Callable[[], Awaitable[object]], interval: float) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be positive, got {interval}")
        self._poll = poll
        self.interval = interval
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="repository-watch")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self._poll()
            except OSError as exc:  # e.g. a network mount gone for a moment: no traceback
                logger.error("cannot scan the model repository (%s); retrying in %gs",
                             exc, self.interval)  # fmt: skip
            except Exception:
                logger.exception("scanning the model repository failed; retrying in %gs",
                                 self.interval)  # fmt: skip

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def stop(self) -> None:
        self.cancel()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
