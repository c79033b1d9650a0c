"""The textserve client library: a synchronous `Client`, an asyncio `AsyncClient`, and an
`AdminClient` for the textserve.v1.Admin service (servers run with --enable-admin).

    with Client("127.0.0.1:50051") as client:
        result = client.classify(["a gripping, beautifully acted film"])
        print(result.predictions[0].label, result.predictions[0].score)

    async with AsyncClient("127.0.0.1:50051") as client:
        result = await client.classify(["..."], all_scores=True)

    with AdminClient("127.0.0.1:50051") as admin:
        admin.load_model("default", 3)          # serve version 3 beside the policy's choice
        admin.unload_model("default", 4)        # roll back: retire 4, the policy picks again
        admin.reload_repository()               # scan now instead of at the next poll

Several connections (`connections=N`): a server run with `--workers N` is N processes behind
one port, and the kernel spreads *connections* over them, not requests, each to a worker at
random; one channel is one connection, so a client that should use every worker opens several,
takes them in turn, and spreads them evenly (`spread()`: each connection is asked which worker
holds it, and those past a worker's share are opened again; textserve.spread)::

    client = Client("127.0.0.1:50051", connections=4)
    client.spread()                         # [2, 2] on a two-worker server

TLS, mutual TLS and bearer tokens (see textserve.connect)::

    Client("host:50051", ca="ca.pem", cert="client.pem", key="client.key", token="...")

Server errors arrive as `ClientError` with the gRPC code name and the server's message; the
Admin calls answer NOT_FOUND, FAILED_PRECONDITION (the version was refused, the message says
why) or UNIMPLEMENTED (the server runs without --enable-admin).
"""

from __future__ import annotations

import itertools
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import grpc

from textserve.connect import bearer_metadata, open_channel
from textserve.messages import classify_request as _request
from textserve.messages import redact as redact
from textserve.messages import rerank_request as _rerank_request
from textserve.messages import tag_request as _tag_request
from textserve.messages import zero_shot_request as _zero_shot_request
from textserve.results import ClassifyResult as ClassifyResult
from textserve.results import ClientError as ClientError
from textserve.results import Prediction as Prediction
from textserve.results import to_result as to_result
from textserve.spread import check_async, check_blocking, spread_async, spread_blocking
from textserve.stream_feed import StreamFeed, aligned
from textserve.v1 import admin_pb2, admin_pb2_grpc
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

DEFAULT_SERVER = "127.0.0.1:50051"
_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]


def connection_options(index: int, connections: int) -> list[tuple[str, Any]]:
    """Channel options that make channel `index` of `connections` its own connection: gRPC
    shares one connection between channels with equal arguments (the global subchannel
    pool), so each gets a local pool and an argument of its own."""
    if connections == 1:
        return list(_OPTIONS)
    return [*_OPTIONS, ("grpc.use_local_subchannel_pool", 1), ("textserve.connection", index)]


def _open_channels(
    target: str | Sequence[str], connections: int, *, aio: bool, **tls: Any
) -> list[Any]:
    """`connections` channels to `target`, each its own connection (see connection_options);
    `tls`: open_channel's tls/ca/cert/key/server_name."""
    if not isinstance(connections, int) or connections < 1:
        raise ValueError(f"connections must be a positive integer, got {connections!r}")
    return [
        open_channel(target, options=connection_options(i, connections), aio=aio, **tls)
        for i in range(connections)
    ]


def _traced(metadata: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """`metadata` plus the caller's W3C trace context (traceparent), when it has a current
    span. A process that never imported opentelemetry has none: nothing is imported then."""
    if "opentelemetry.context" not in sys.modules:
        return metadata
    from opentelemetry.propagate import inject

    carrier: dict[str, str] = {}
    inject(carrier)
    if not carrier:
        return metadata
    return (*metadata, *((key.lower(), value) for key, value in carrier.items()))


class _Rotation:
    """The channels a textserve.v1 client serves from: the first for reads (`stub`), every one
    in turn for classify calls (`_next`)."""

    def _use(self, channels: list[Any]) -> None:
        self._channels, self._channel = channels, channels[0]
        self.stub = pb_grpc.ClassifierStub(channels[0])
        self._stubs = [pb_grpc.ClassifierStub(c) for c in channels]
        self._next = itertools.cycle(self._stubs).__next__  # thread-safe under the GIL


class BlockingClient:
    """What every blocking client shares: one channel (closed on exit if it opened it), the
    bearer token sent with each call, a default timeout, and gRPC errors as ClientError."""

    def __init__(
        self,
        target: str | Sequence[str],
        channel: grpc.Channel,
        *,
        timeout: float | None,
        token: str | None,
        own_channel: bool = True,
    ) -> None:
        self.target = target
        self.timeout = timeout
        self._metadata = bearer_metadata(token)
        self._channel = channel
        self._own_channel = own_channel

    def _call(self, method: Any, request: Any, timeout: float | None = None) -> Any:
        try:
            return method(
                request, timeout=timeout or self.timeout, metadata=_traced(self._metadata)
            )
        except grpc.RpcError as exc:
            raise ClientError.from_rpc(exc) from None

    def close(self) -> None:
        if self._own_channel:
            self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Client(_Rotation, BlockingClient):
    """Blocking client over one channel; thread-safe (gRPC channels are)."""

    def __init__(
        self,
        target: str | Sequence[str] = DEFAULT_SERVER,
        *,
        timeout: float | None = 30.0,
        tls: bool = False,
        ca: str | Path | None = None,
        cert: str | Path | None = None,
        key: str | Path | None = None,
        server_name: str | None = None,
        token: str | None = None,
        connections: int = 1,
    ) -> None:
        """TLS when `tls` or `ca` (PEM CA bundle; None: the system's roots) is given; `cert` and
        `key`: a client certificate for mutual TLS; `server_name`: the name to check the
        server's certificate against, if not the target's host; `token`: sent as
        `authorization: Bearer <token>` with every call; `connections`: channels (each its own
        connection) that classify calls take in turn, so that every worker of a
        `--workers N` server gets some (evenly after `spread()`)."""
        self._tls: dict[str, Any] = {
            "tls": tls, "ca": ca, "cert": cert, "key": key, "server_name": server_name,
        }  # fmt: skip
        channels = _open_channels(target, connections, aio=False, **self._tls)
        super().__init__(target, channels[0], timeout=timeout, token=token)
        self._use(channels)

    def close(self) -> None:
        for channel in self._channels:
            channel.close()

    def spread(self) -> list[int]:
        """Connect now, and spread this client's connections as evenly as they divide over
        the processes of a `--workers N` server: the kernel hands each connection to a worker
        at random, so connections opened blindly load the workers unevenly (textserve.spread).
        Each connection is asked where it landed (a health Check); one past its worker's share
        is closed and another opened in its place. Returns the connections on each worker,
        most first ([] from a server of one process). For one server address (a channel then
        holds one connection); call it before the client is shared between threads. A worker
        restarted later gets its connections back at random."""

        def check(channel: grpc.Channel) -> Any:
            return check_blocking(channel, self.timeout, self._metadata)

        def open_one(index: int) -> grpc.Channel:
            return open_channel(self.target, options=connection_options(index, 2), **self._tls)

        try:
            serve, close, plan = spread_blocking(self._channels, open_one, check)
        except grpc.RpcError as exc:
            raise ClientError.from_rpc(exc) from None
        for channel in close:
            channel.close()
        self._use(serve)
        return plan.split()

    def classify(
        self,
        texts: Sequence[str],
        *,
        model: str | None = None,
        version: int | None = None,
        truncate: bool | None = None,
        top_k: int = 0,
        all_scores: bool = False,
        request_id: str = "",
        timeout: float | None = None,
        text_pairs: Sequence[str] | None = None,
        threshold: float | None = None,
    ) -> ClassifyResult:
        request = _request(
            texts, model, version, truncate, top_k, all_scores, request_id, text_pairs, threshold
        )
        return to_result(self._call(self._next().Classify, request, timeout))

    def classify_stream(
        self,
        texts: Iterable[str],
        *,
        model: str | None = None,
        version: int | None = None,
        truncate: bool | None = None,
        top_k: int = 0,
        all_scores: bool = False,
        texts_per_message: int = 1,
        max_inflight: int = 64,
        timeout: float | None = None,
        text_pairs: Iterable[str] | None = None,
        threshold: float | None = None,
    ) -> Iterator[ClassifyResult]:
        """Classify a long (or endless) iterable of texts over ClassifyStream: one result per
        message of `texts_per_message` texts, yielded in the order of `texts`, as they come.

            for result in client.classify_stream(open("texts.txt").read().splitlines()):
                print(result.predictions[0].label)

        The bulk path: the server batches the messages of every stream together and answers
        each as its batch finishes, at less CPU per text than a unary call. One stream per
        connection of the client (messages dealt out in turn), at most `max_inflight`
        messages unanswered in all (the client's memory stays bounded whatever the input's
        length). A message the server refuses raises ClientError (its texts' positions in the
        message) and ends every stream; `timeout`: for the whole stream (None: none)."""
        if texts_per_message < 1 or max_inflight < 1:
            raise ValueError("texts_per_message and max_inflight must be at least 1")

        def build(chunk: Sequence[Any], request_id: str) -> pb.ClassifyRequest:
            if text_pairs is None:
                return _request(
                    chunk, model, version, truncate, top_k, all_scores, request_id, None, threshold
                )
            firsts, seconds = [a for a, _ in chunk], [b for _, b in chunk]
            return _request(
                firsts, model, version, truncate, top_k, all_scores, request_id, seconds, threshold
            )

        if isinstance(text_pairs, str):
            raise TypeError("text_pairs must be an iterable of strings, not one string")
        feed = StreamFeed(
            texts if text_pairs is None else aligned(texts, text_pairs),
            build,
            texts_per_message,
            max_inflight,
            streams=len(self._stubs),
        )
        metadata = _traced(self._metadata)  # the caller's span, as classify() sends it
        calls = [
            stub.ClassifyStream(feed.requests(), timeout=timeout, metadata=metadata)
            for stub in self._stubs
        ]
        readers = [
            threading.Thread(target=feed.read, args=(call,), daemon=True, name="classify-stream")
            for call in calls
        ]
        for reader in readers:
            reader.start()
        try:
            yield from feed.results()
        finally:
            feed.stop()
            for call in calls:
                call.cancel()  # a no-op on a finished call; ends the others on an early exit
            for reader in readers:
                reader.join()

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        model: str | None = None,
        version: int | None = None,
        truncate: bool | None = None,
        top_n: int = 0,
        raw_scores: bool = False,
        return_documents: bool = False,
        request_id: str = "",
        timeout: float | None = None,
    ) -> pb.RerankResponse:
        """`documents` ordered by relevance to `query` (a cross-encoder model): results, most
        relevant first, each with its index, score and (return_documents) text."""
        request = _rerank_request(
            query, documents, model, version, truncate, top_n, raw_scores, return_documents,
            request_id,
        )  # fmt: skip
        return self._call(self._next().Rerank, request, timeout)

    def zero_shot(
        self,
        texts: Sequence[str],
        candidate_labels: Sequence[str],
        *,
        hypothesis_template: str = "",
        multi_label: bool = False,
        model: str | None = None,
        version: int | None = None,
        truncate: bool | None = None,
        request_id: str = "",
        timeout: float | None = None,
    ) -> pb.ZeroShotResponse:
        """Each text scored against `candidate_labels` by an NLI model: per text, every label
        with its score, best first."""
        request = _zero_shot_request(
            texts, candidate_labels, hypothesis_template, multi_label, model, version, truncate,
            request_id,
        )  # fmt: skip
        return self._call(self._next().ZeroShot, request, timeout)

    def tag(
        self,
        texts: Sequence[str],
        *,
        model: str | None = None,
        version: int | None = None,
        aggregation: str = "",
        ignore_labels: Sequence[str] | None = None,
        threshold: float = 0.0,
        windows: bool | None = None,
        stride: int | None = None,
        truncate: bool | None = None,
        request_id: str = "",
        timeout: float | None = None,
    ) -> pb.TagResponse:
        """A token classifier's entities per text (results[i].entities: label, score, word,
        start, end); `aggregation` as transformers' pipeline's aggregation_strategy ("" : the
        model's default). `redact(text, result.entities)` masks them."""
        request = _tag_request(
            texts, model, version, aggregation, ignore_labels, threshold, windows, stride,
            truncate, request_id,
        )  # fmt: skip
        return self._call(self._next().Tag, request, timeout)

    def list_models(self) -> pb.ListModelsResponse:
        return self._call(self.stub.ListModels, pb.ListModelsRequest())

    def get_model(self, name: str | None = None, version: int | None = None) -> pb.ModelInfo:
        return self._call(
            self.stub.GetModel, pb.GetModelRequest(name=name or "", version=version or 0)
        )


class AsyncClient(_Rotation):
    """asyncio client over one grpc.aio channel; create it inside the running loop."""

    def __init__(
        self,
        target: str | Sequence[str] = DEFAULT_SERVER,
        *,
        timeout: float | None = 30.0,
        tls: bool = False,
        ca: str | Path | None = None,
        cert: str | Path | None = None,
        key: str | Path | None = None,
        server_name: str | None = None,
        token: str | None = None,
        connections: int = 1,
    ) -> None:
        """The same options as Client's."""
        self.target = target
        self.timeout = timeout
        self._metadata = bearer_metadata(token)
        self._tls: dict[str, Any] = {
            "tls": tls, "ca": ca, "cert": cert, "key": key, "server_name": server_name,
        }  # fmt: skip
        self._use(_open_channels(target, connections, aio=True, **self._tls))

    async def classify(
        self,
        texts: Sequence[str],
        *,
        model: str | None = None,
        version: int | None = None,
        truncate: bool | None = None,
        top_k: int = 0,
        all_scores: bool = False,
        request_id: str = "",
        timeout: float | None = None,
        text_pairs: Sequence[str] | None = None,
        threshold: float | None = None,
    ) -> ClassifyResult:
        request = _request(
            texts, model, version, truncate, top_k, all_scores, request_id, text_pairs, threshold
        )
        try:
            response = await self._next().Classify(
                request, timeout=timeout or self.timeout, metadata=_traced(self._metadata)
            )
        except grpc.RpcError as exc:
            raise ClientError.from_rpc(exc) from None
        return to_result(response)

    async def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        model: str | None = None,
        version: int | None = None,
        truncate: bool | None = None,
        top_n: int = 0,
        raw_scores: bool = False,
        return_documents: bool = False,
        request_id: str = "",
        timeout: float | None = None,
    ) -> pb.RerankResponse:
        """As Client.rerank."""
        request = _rerank_request(
            query, documents, model, version, truncate, top_n, raw_scores, return_documents,
            request_id,
        )  # fmt: skip
        try:
            return await self._next().Rerank(
                request, timeout=timeout or self.timeout, metadata=_traced(self._metadata)
            )
        except grpc.RpcError as exc:
            raise ClientError.from_rpc(exc) from None

    async def tag(
        self,
        texts: Sequence[str],
        *,
        model: str | None = None,
        version: int | None = None,
        aggregation: str = "",
        ignore_labels: Sequence[str] | None = None,
        threshold: float = 0.0,
        windows: bool | None = None,
        stride: int | None = None,
        truncate: bool | None = None,
        request_id: str = "",
        timeout: float | None = None,
    ) -> pb.TagResponse:
        """As Client.tag."""
        request = _tag_request(
            texts, model, version, aggregation, ignore_labels, threshold, windows, stride,
            truncate, request_id,
        )  # fmt: skip
        try:
            return await self._next().Tag(
                request, timeout=timeout or self.timeout, metadata=_traced(self._metadata)
            )
        except grpc.RpcError as exc:
            raise ClientError.from_rpc(exc) from None

    async def list_models(self) -> pb.ListModelsResponse:
        return await self._call(self.stub.ListModels, pb.ListModelsRequest())

    async def get_model(self, name: str | None = None, version: int | None = None) -> pb.ModelInfo:
        return await self._call(
            self.stub.GetModel, pb.GetModelRequest(name=name or "", version=version or 0)
        )

    async def _call(self, method: Any, request: Any) -> Any:
        try:
            return await method(request, timeout=self.timeout, metadata=_traced(self._metadata))
        except grpc.RpcError as exc:
            raise ClientError.from_rpc(exc) from None

    async def spread(self) -> list[int]:
        """Client.spread, awaited."""

        async def check(channel: grpc.aio.Channel) -> Any:
            return await check_async(channel, self.timeout, self._metadata)

        def open_one(index: int) -> grpc.aio.Channel:
            options = connection_options(index, 2)
            return open_channel(self.target, options=options, aio=True, **self._tls)

        try:
            serve, close, plan = await spread_async(self._channels, open_one, check)
        except grpc.RpcError as exc:
            raise ClientError.from_rpc(exc) from None
        for channel in close:
            await channel.close()
        self._use(serve)
        return plan.split()

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


# Loading waits for the version's checks and warm-up, unloading for its requests to finish
# (up to the server's --grace-period, 30 s by default): allow more than a classify call.
ADMIN_TIMEOUT = 120.0


class AdminClient(BlockingClient):
    """Blocking Admin client over one channel (its own, or `channel` if given). TLS and token
    arguments as for textserve.client.Client."""

    def __init__(
        self,
        target: str = "127.0.0.1:50051",
        *,
        timeout: float | None = ADMIN_TIMEOUT,
        channel: grpc.Channel | None = None,
        tls: bool = False,
        ca: str | Path | None = None,
        cert: str | Path | None = None,
        key: str | Path | None = None,
        server_name: str | None = None,
        token: str | None = None,
    ) -> None:
        own = channel is None
        if channel is None:
            channel = open_channel(  # admin must reach a server that serves no model
                target, tls=tls, ca=ca, cert=cert, key=key, server_name=server_name,
                health_checked=False,
            )  # fmt: skip
        super().__init__(
            target,
            channel,
            timeout=timeout,
            token=token,
            own_channel=own,
        )
        self.stub = admin_pb2_grpc.AdminStub(self._channel)

    def load_model(self, name: str, version: int | None = None) -> admin_pb2.LoadModelResponse:
        return self._call(
            self.stub.LoadModel, admin_pb2.LoadModelRequest(name=name, version=version or 0)
        )

    def unload_model(self, name: str, version: int | None = None) -> admin_pb2.UnloadModelResponse:
        return self._call(
            self.stub.UnloadModel, admin_pb2.UnloadModelRequest(name=name, version=version or 0)
        )

    def reload_repository(self) -> admin_pb2.ReloadRepositoryResponse:
        return self._call(self.stub.ReloadRepository, admin_pb2.ReloadRepositoryRequest())
