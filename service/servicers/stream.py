"""textserve.v1 ClassifyStream: one `ClassifyStreamCall` per call, answering each request of the
stream as it completes (each response carries its request's id).

    await ClassifyStreamCall(parts, request_iterator, context).run()

The fast path for bulk clients: a request goes from the reader straight into the batcher with a
callback (ModelHandle.classify_nowait), no task per message; its answer is built in that
callback, on the loop, as its batch finishes, and written in arrival order of the answers. Per
message that is one read, one queue entry and one write.

Backpressure: a request holds one of `stream_max_inflight` permits from the moment it is read
until its response has been written to grpc. Without a permit the stream reads no more
requests, so a client that stops reading its responses stops the server reading its requests,
and HTTP/2 flow control slows the client; the server holds at most that many requests and
responses per stream, whatever the client does.

Errors of one request become that response's `error` (one bad request must not end the
stream), with the status and message a unary call would have had.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from textserve.service.dataplane.classify import (
    Classification,
    ClassifyCall,
    Prepared,
    prologue,
    v1_response,
)
from textserve.service.dataplane.codes import log_unexpected, public_message
from textserve.service.dataplane.observe import Observation
from textserve.service.dataplane.prologue import truncation
from textserve.service.dataplane.tag import TagCall, Tagged, v1_tag_response
from textserve.service.dataplane.tag import prologue as tag_prologue
from textserve.service.errors import ValidationError
from textserve.service.servicers.status import deadline_of, grpc_code
from textserve.v1 import classifier_pb2 as pb

if TYPE_CHECKING:
    from textserve.service.dataplane.context import ServingContext
    from textserve.service.engine.handle import ClassifyResult

logger = logging.getLogger(__name__)

METHOD = "ClassifyStream"  # the `method` label of the metrics

# decode(request) -> the data plane's call (classifier.call_of)
Decode = Callable[[Any], ClassifyCall | TagCall]


class _Message:
    """One request of the stream on its way: what its answer is built and counted with."""

    __slots__ = ("call", "future", "observation", "prepared", "request")

    def __init__(
        self, request: pb.ClassifyRequest, call: ClassifyCall, observation: Observation
    ) -> None:
        self.request = request
        self.call = call
        self.observation = observation
        self.prepared: Prepared | None = None
        self.future: asyncio.Future[None] | None = None  # None until it is in the batcher


class ClassifyStreamCall:
    """The state of one ClassifyStream call: its permits, the answers waiting to be written and
    the requests still in the batcher."""

    method = METHOD
    response_type: Any = pb.ClassifyResponse

    def __init__(
        self,
        ctx: ServingContext,
        decode: Decode,
        requests: AsyncIterator[Any],
        context: Any,
    ) -> None:
        self._ctx = ctx
        self._decode = decode
        max_inflight = ctx.config.stream_max_inflight
        self._requests = requests
        self._context = context
        self._deadline = deadline_of(context)
        self._permits = asyncio.Semaphore(max_inflight)
        # At most one response per permit, plus the end marker: put_nowait never finds it full.
        self._responses: asyncio.Queue[Any] = asyncio.Queue(max_inflight + 1)
        self._pending: set[asyncio.Future[Any]] = set()  # requests in the batcher
        self._reading = True
        self._ended = False  # the handler returned: late answers (cancelled ones) go nowhere

    async def run(self) -> None:
        """Read, answer and write until the request stream ends and every answer is written."""
        reader = asyncio.create_task(self._read())
        try:
            while (response := await self._responses.get()) is not None:
                await _write(self._context, response)  # returns once grpc took it
                self._permits.release()
            await reader  # surfaces a failure of the request stream itself
        except asyncio.CancelledError:
            # The client cancelled, its deadline passed or its connection went: not an error.
            logger.debug(
                "ClassifyStream cancelled by the client or its deadline (%d requests in flight)",
                len(self._pending),
            )
            raise
        finally:
            self._ended = True
            reader.cancel()
            for future in list(self._pending):
                future.cancel()  # dropped by the batcher; counted as cancelled (or expired)

    async def _read(self) -> None:
        requests = aiter(self._requests)
        try:
            while True:
                await self._permits.acquire()  # no permit, no read: the backpressure
                request = await anext(requests, None)
                if request is None:
                    break
                self._start(request)
        finally:
            # A request stream that breaks (an undecodable message) ends the response stream
            # too, instead of leaving it waiting; `await reader` re-raises.
            self._reading = False
            if not self._pending:
                self._responses.put_nowait(None)

    def _start(self, request: pb.ClassifyRequest) -> None:
        """Validate `request` and queue its texts; its answer (or error) comes through
        `_answered`, counted in the metrics like a unary call's."""
        ctx = self._ctx
        observation = Observation(
            ctx.metrics, METHOD, self._deadline, context=self._context, telemetry=ctx.telemetry
        )
        seen = observation.seen
        try:
            message = _Message(request, self._decode(request), observation)  # type: ignore[arg-type]
            call = message.call
            if call.windows is not None:
                raise ValidationError(
                    "windows are for the unary Classify (a windowed text waits for all its "
                    "windows); send long texts there, or leave windows unset to cut them"
                )
            message.prepared = prepared = prologue(ctx, call, seen)
            message.future = prepared.handle.classify_nowait(
                call.texts,
                functools.partial(self._done, message),
                pairs=call.pairs,
                truncate=prepared.truncate,
                deadline=self._deadline,
                trace=seen.trace,
            )
        except Exception as exc:
            self._failed(request, observation, exc)
            return
        self._pending.add(message.future)

    def _done(
        self, message: _Message, result: ClassifyResult | None, exc: BaseException | None
    ) -> None:
        """The batcher's answer to one request: its response, or its error."""
        if message.future is not None:
            self._pending.discard(message.future)
        if result is None:
            assert exc is not None
            self._failed(message.request, message.observation, exc)
            return
        prepared = message.prepared
        assert prepared is not None  # a result comes only from the batcher
        try:
            response = v1_response(
                Classification(message.call, prepared.handle, result, prepared.threshold)
            )
        except Exception as error:
            self._failed(message.request, message.observation, error)
            return
        message.observation.seen.result = result
        message.observation.finish(None)
        self._answered(response)

    def _failed(self, request: Any, observation: Observation, exc: BaseException) -> None:
        observation.finish(exc)
        if not isinstance(exc, asyncio.CancelledError):  # the stream is ending
            log_unexpected(exc, self.method)
            self._answered(
                self.response_type(
                    id=request.id,
                    error=pb.Status(code=grpc_code(exc).value[0], message=public_message(exc)),
                )
            )

    def _answered(self, response: Any) -> None:
        if self._ended:
            return
        self._responses.put_nowait(response)
        if not self._reading and not self._pending:
            self._responses.put_nowait(None)  # the last answer of a finished request stream


async def _write(context: Any, response: pb.ClassifyResponse) -> None:
    """context.write, where a failure means the call has ended under us (the client cancelled,
    its deadline passed, its connection went) and ends the handler as cancelled: grpc logs a
    failed write of a handler (e.g. a response generator's) as an ERROR with a traceback, and a
    cancelled handler at DEBUG, which is what a client going away is."""
    try:
        await context.write(response)
    except Exception as exc:
        raise asyncio.CancelledError(f"writing a response failed: {exc!r}") from exc


class TagStreamCall(ClassifyStreamCall):
    """textserve.v1 TagStream: ClassifyStream's permits, order and errors; each request a task
    of the data plane's tag (a token classifier's answer is built on the inference thread)."""

    method = "TagStream"
    response_type = pb.TagResponse

    def _start(self, request: Any) -> None:
        ctx = self._ctx
        observation = Observation(
            ctx.metrics, self.method, self._deadline, context=self._context,
            telemetry=ctx.telemetry,
        )  # fmt: skip
        seen = observation.seen
        try:
            call: TagCall = self._decode(request)  # type: ignore[assignment]
            handle, options = tag_prologue(ctx, call, seen)
            running = handle.tag(
                call.texts,
                options,
                truncate=truncation(call.truncate),
                deadline=self._deadline,
                trace=seen.trace,
            )
        except Exception as exc:
            self._failed(request, observation, exc)
            return
        future = asyncio.ensure_future(running)
        self._pending.add(future)
        future.add_done_callback(
            functools.partial(self._tagged, request, Tagged(call, handle, None), observation)  # type: ignore[arg-type]
        )

    def _tagged(
        self, request: Any, answer: Tagged, observation: Observation, future: asyncio.Future[Any]
    ) -> None:
        self._pending.discard(future)
        if future.cancelled():
            self._failed(request, observation, asyncio.CancelledError())
            return
        exc = future.exception()
        if exc is not None:
            self._failed(request, observation, exc)
            return
        result = future.result()
        try:
            response = v1_tag_response(answer._replace(result=result))
        except Exception as error:
            self._failed(request, observation, error)
            return
        observation.seen.result = result
        observation.finish(None)
        self._answered(response)
