"""`textserve serve`'s flags: each declared once, its default spelled from the config dataclasses
(the one source of defaults), its TEXTSERVE_* environment variable beside it.

    parser = argparse.ArgumentParser()
    add_arguments(parser)          # every flag, group by group, in the order --help lists them
    args = parser.parse_args()     # service/cli.py turns args into a ServerConfig

A bad value is argparse's one line and exit 2 (types raise ArgumentTypeError).
"""

from __future__ import annotations

import argparse
import functools

from textserve.cli import CliError, env_flag, env_switch
from textserve.service.config import (
    ARENA_STRATEGIES,
    CONV_ALGO_SEARCHES,
    DEVICES,
    ENGINES,
    IO_BINDINGS,
    BatcherConfig,
    CudaConfig,
    RuntimeConfig,
    ServerConfig,
    batcher_defaults,
    parse_bytes,
)
from textserve.service.engine.cache_size import CacheSize, CacheSizeError
from textserve.service.repository.policy import PolicyError, PolicySet, parse_policies


def _port_or_off(value: str) -> int | None:
    if value.lower() in ("off", "none", "-1"):
        return None
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a port number or 'off', got {value!r}"
        ) from None


UNSET = "unset"  # a deprecated alias that was not given


def _alias_port(value: str) -> int | str | None:
    return UNSET if value == "" else _port_or_off(value)


def _text(value: float | None) -> str:
    """A config default as the flag would spell it: 30.0 -> "30", None -> "off"."""
    if value is None:
        return "off"
    return str(int(value)) if float(value).is_integer() else str(value)


def ms_text(seconds: float | None) -> str:
    """A wait's config default as its `-ms` flag spells it: 0.1 -> "100", None (off) -> "0"."""
    return "0" if seconds is None else _text(seconds * 1e3)


def seconds_or_off(ms: float) -> float | None:
    """An `-ms` flag's value as the config holds it: 250 -> 0.25, 0 (off) -> None."""
    return ms / 1e3 if ms else None


def _int_or_auto(value: str) -> int | None:
    """A count, or auto (None): the device's default (config.batcher_defaults)."""
    if value.strip().lower() == "auto":
        return None
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or auto, got {value!r}") from None


def _bytes(value: str) -> int:
    try:
        return parse_bytes(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_cuda_arguments(parser: argparse.ArgumentParser) -> None:
    """The CUDA execution provider's options (used only when a session runs on CUDA)."""
    flag = functools.partial(env_flag, parser, "TEXTSERVE_")
    cuda, runtime = CudaConfig(), RuntimeConfig()
    flag("cuda-device-id", _text(cuda.device_id), "CUDA: the GPU to run on", type=int)
    flag(
        "cuda-memory-limit",
        _text(cuda.memory_limit),
        "CUDA: bytes the provider's memory arena may hold per session, e.g. 8GiB; 0: no limit",
        type=_bytes,
    )
    flag(
        "cuda-arena-strategy",
        cuda.arena_strategy,
        "CUDA: how the memory arena grows (same-as-requested keeps workers sharing a GPU small)",
        choices=ARENA_STRATEGIES,
    )
    flag(
        "cudnn-conv-algo-search",
        cuda.conv_algo_search,
        "CUDA: cuDNN convolution algorithm search (default: none; the models have no convolutions)",
        choices=CONV_ALGO_SEARCHES,
    )
    flag(
        "io-binding",
        runtime.io_binding,
        "run through an onnxruntime IOBinding; auto: with CUDA, not on CPU",
        choices=IO_BINDINGS,
    )
    flag(
        "engine",
        runtime.engine,
        "where batches are tokenized and run: thread (in the serving process), process (a "
        "process per model version, off the event loop's GIL) or shared (with --workers N: "
        "one process for every worker, merging their batches)",
        choices=ENGINES,
    )


def _policies(value: str) -> PolicySet:
    try:
        return parse_policies(value)
    except PolicyError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def cache_size(value: str) -> CacheSize | None:
    """--cache-size / TEXTSERVE_CACHE_SIZE: off, or a size; a bad one is one line, exit 2."""
    if value.strip().lower() in ("off", "none", ""):
        return None
    try:
        return CacheSize.parse(value)
    except CacheSizeError as exc:
        raise CliError(f"--cache-size (TEXTSERVE_CACHE_SIZE): {exc}") from None


def _add_serving_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the models are, which one is the default, the gRPC address."""
    flag = functools.partial(env_flag, parser, "TEXTSERVE_")
    server = ServerConfig()
    flag(
        "repository",
        str(server.repository),
        "model repository: <dir>/<name>/<version>/ (default: models)",
    )
    flag("model", None, "the default model (default: the only model in the repository)")
    flag("listen", server.listen, "gRPC address HOST:PORT; port 0 picks a free one")


def _add_process_arguments(parser: argparse.ArgumentParser) -> None:
    """The server processes (--workers and their supervision), the ready file, the device."""
    flag = functools.partial(env_flag, parser, "TEXTSERVE_")
    server, runtime = ServerConfig(), RuntimeConfig()
    flag(
        "workers",
        "auto",
        "server processes sharing the port (SO_REUSEPORT), each with its share of the CPUs; "
        "auto: one per usable CPU up to 8 on CPU, up to 4 with CUDA, as many "
        "as the memory holds; 1: a single process, no supervisor",
    )
    flag(
        "worker-timeout",
        _text(server.worker_timeout),
        "--workers N: seconds a worker may leave the supervisor's heartbeat unanswered "
        "(stopped, or its event loop blocked) before it is killed and restarted",
        type=float,
    )
    flag(
        "ready-file",
        None,
        "once serving, write PATH (JSON: pid, grpc address, metrics URL; removed at exit): "
        "how scripts and tests learn the ports picked by port 0",
    )
    flag(
        "device",
        runtime.device,
        "auto: CUDA when available else CPU; cpu; cuda (fails without CUDA)",
        choices=DEVICES,
    )


def _add_http_arguments(parser: argparse.ArgumentParser) -> None:
    """The HTTP port: REST front ends, probes and /metrics."""
    flag = functools.partial(env_flag, parser, "TEXTSERVE_")
    server = ServerConfig()
    flag(
        "http-port",
        _text(server.metrics_port),
        "HTTP port: KServe v2 REST, POST /v1/classify, /healthz, /readyz, /metrics; 0 picks a "
        "free one; off: only the probes and /metrics",
        type=_port_or_off,
    )
    flag("http-host", server.metrics_host, "address of the HTTP port")
    flag(
        "metrics-port",
        "",
        "deprecated alias of --http-port, except 'off': no HTTP port at all",
        type=_alias_port,
    )
    flag("metrics-host", "", "deprecated alias of --http-host")
    flag(
        "http-header-timeout",
        _text(server.http.header_timeout),
        "seconds an HTTP request's line and headers may take (slow clients are closed)",
        type=float,
    )
    flag(
        "http-max-connections",
        _text(server.http.max_connections),
        "open HTTP connections at most; past it new ones are closed at once",
        type=int,
    )


def _add_batching_arguments(parser: argparse.ArgumentParser) -> None:
    """How texts are gathered into batches, and how many may wait."""
    flag = functools.partial(env_flag, parser, "TEXTSERVE_")
    batcher = BatcherConfig()
    gpu = batcher_defaults(cuda=True)
    flag(
        "max-batch-size",
        "auto",
        f"texts per batch; auto: {batcher.max_batch_size} on CPU, {gpu.max_batch_size} with CUDA",
        type=_int_or_auto,
    )
    flag(
        "max-batch-tokens",
        "auto",
        f"padded tokens per batch (texts x longest); auto: {batcher.max_batch_tokens} on "
        f"CPU, {gpu.max_batch_tokens} with CUDA",
        type=_int_or_auto,
    )
    flag(
        "max-queue-delay-ms",
        ms_text(batcher.max_queue_delay),
        "how long a text may wait for its batch to fill",
        type=float,
    )
    flag(
        "max-padding-ratio",
        _text(batcher.max_padding_ratio),
        "padding a batch may have once it holds 8 texts (1: any; "
        "each batch runs as length-sorted sub-batches anyway)",
        type=float,
    )
    flag(
        "max-queue-size",
        _text(batcher.max_queue_size),
        "texts waiting per model before requests are refused",
        type=int,
    )
    flag(
        "max-queue-wait-ms",
        "0",
        "milliseconds of work a model's queue may hold ahead of a new request (queued tokens "
        "over the measured drain rate) before the request is refused at once "
        "(RESOURCE_EXHAUSTED / 429, retryable), and a deadline nearer than that wait is "
        "refused up front; 0: off",
        type=float,
    )


def _add_request_arguments(parser: argparse.ArgumentParser) -> None:
    """What one request or stream may carry."""
    flag = functools.partial(env_flag, parser, "TEXTSERVE_")
    server = ServerConfig()
    flag(
        "max-texts-per-request",
        _text(server.max_texts_per_request),
        "texts one request may carry",
        type=int,
    )
    flag(
        "stream-max-inflight",
        _text(server.stream_max_inflight),
        "requests of one ClassifyStream read and not yet answered "
        "(processing or queued for the client); at the limit the server stops reading the "
        "stream",
        type=int,
    )
    flag(
        "max-message-bytes",
        _text(server.max_message_bytes),
        "largest request message in bytes; larger ones get RESOURCE_EXHAUSTED",
        type=int,
    )
    flag(
        "max-concurrent-rpcs",
        _text(server.max_concurrent_rpcs),
        "gRPC calls handled at once; beyond it a call is answered RESOURCE_EXHAUSTED "
        "(retryable) as soon as the server takes it from grpc; gRPC calls and HTTP inference "
        "requests together the same (429 with Retry-After over HTTP), per process; 0: no limit",
        type=int,
    )
    flag(
        "max-streams-per-connection",
        _text(server.max_streams_per_connection),
        "gRPC calls one connection may have open (HTTP/2 max concurrent streams): a client "
        "holds its further calls until one ends, so grpc never holds more calls than it can "
        "without cancelling them; a call sent past it anyway is refused UNAVAILABLE "
        "(REFUSED_STREAM: it never ran, retryable); 0: no limit",
        type=int,
    )
    flag(
        "max-connection-age",
        _text(server.max_connection_age or 0),
        "seconds after which a gRPC connection is asked to close (GOAWAY, give or take a tenth; "
        "its calls in flight run to their end) so that its client reconnects: the "
        "kernel then hands the new connection to any worker of --workers N (a restarted one "
        "included) and a client's name lookup finds new replicas; 0: off",
        type=float,
    )
    flag(
        "max-backlog-wait-ms",
        ms_text(server.max_backlog_wait),
        "milliseconds a gRPC call may wait in grpc before the server takes it (a busy event "
        "loop); one that waited longer is answered RESOURCE_EXHAUSTED (retryable) instead of "
        "being cancelled by grpc; 0: off",
        type=float,
    )
    flag(
        "backlog-target-ms",
        ms_text(server.backlog_target),
        "milliseconds of wait in grpc an overload is shed to: calls that waited longer, for a "
        "second, while calls arrive faster than the server has served them (overload, not a "
        "stall), are answered RESOURCE_EXHAUSTED; 0: off (only --max-backlog-wait-ms)",
        type=float,
    )
    flag(
        "inflight-wait-ms",
        ms_text(server.inflight_wait),
        "milliseconds of work the requests in flight may hold under overload: once requests "
        "arrive faster than the server has ever answered them, it lets in what it answers in "
        "this long and answers the rest RESOURCE_EXHAUSTED (HTTP 429) at once, instead of "
        "letting --max-concurrent-rpcs of them wait; 0: off (the count alone)",
        type=float,
    )


def _add_security_arguments(parser: argparse.ArgumentParser) -> None:
    """TLS, mutual TLS and bearer tokens."""
    flag = functools.partial(env_flag, parser, "TEXTSERVE_")
    flag("tls-cert", None, "PEM certificate (chain) of the server: serve TLS (with --tls-key)")
    flag("tls-key", None, "PEM private key of --tls-cert")
    flag("tls-client-ca", None, "PEM CA bundle: mutual TLS, clients need a certificate it signed")
    flag(
        "auth-token-file",
        None,
        "require 'authorization: Bearer <token>': tokens, one per line "
        "(health and reflection stay open)",
    )


def _add_runtime_arguments(parser: argparse.ArgumentParser) -> None:
    """onnxruntime's threads, then the CUDA provider's options."""
    flag = functools.partial(env_flag, parser, "TEXTSERVE_")
    runtime = RuntimeConfig()
    flag(
        "intra-op-threads",
        _text(runtime.intra_op_threads),
        "onnxruntime threads per operator (0: usable CPUs - 1)",
        type=int,
    )
    flag(
        "inter-op-threads",
        _text(runtime.inter_op_threads),
        "onnxruntime operators run in parallel",
        type=int,
    )
    flag(
        "inference-threads",
        _text(runtime.inference_threads),
        "batches run at once per model (1 on CPU)",
        type=int,
    )
    flag(
        "inference-nice",
        _text(runtime.inference_nice),
        "niceness added to the threads that tokenize and run batches, so the event loop "
        "takes and refuses calls first on a busy core (0: the same priority)",
        type=int,
    )
    _add_cuda_arguments(parser)


def _add_lifecycle_arguments(parser: argparse.ArgumentParser) -> None:
    """Shutdown grace, repository watching, version policies, response caches."""
    flag = functools.partial(env_flag, parser, "TEXTSERVE_")
    server = ServerConfig()
    flag(
        "grace-period",
        _text(server.grace_period),
        "seconds to finish in-flight work on SIGTERM/SIGINT",
        type=float,
    )
    flag(
        "poll-interval",
        _text(server.poll_interval),
        "seconds between scans of the repository for new or removed versions; 0: no watching",
        type=float,
    )
    flag(
        "version-policy",
        "latest:1",
        "versions to serve: latest[:N], all, specific:V[,V...]; "
        "NAME=POLICY for one model (space-separated)",
        type=_policies,
    )
    flag(
        "cache-size",
        "off",
        "each model's response cache: a repeated text is answered without inference; "
        "a size such as 64MiB or 10000entries (a model's serving.json may set its own)",
    )


def _add_observability_arguments(parser: argparse.ArgumentParser) -> None:
    """Tracing and the access log."""
    flag = functools.partial(env_flag, parser, "TEXTSERVE_")
    server = ServerConfig()
    flag(
        "otlp-endpoint",
        None,
        "OpenTelemetry: export traces over OTLP/gRPC to this collector "
        "(e.g. http://127.0.0.1:4317); default: no tracing",
    )
    flag(
        "trace-sample-ratio",
        _text(server.trace_sample_ratio),
        "fraction of traces kept (a caller's sampled traceparent is always followed)",
        type=float,
    )
    flag(
        "access-log",
        server.access_log,
        "off, or json: one JSON line per request on stdout",
        choices=("off", "json"),
    )
    flag(
        "access-log-rate",
        _text(server.access_log_rate),
        "access log lines a second at most; lines over it are dropped and counted",
        type=float,
    )
    parser.add_argument(
        "--log-texts",
        action="store_true",
        default=env_switch("TEXTSERVE_LOG_TEXTS"),
        help="put the request's texts in the access log: a PRIVACY RISK (user text ends up "
        "wherever the logs go) [TEXTSERVE_LOG_TEXTS=1]",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every `serve` flag, group by group, in the order --help lists them."""
    # Each group takes its defaults from the config dataclasses, the one source of them
    # (flags only spell them as text).
    _add_serving_arguments(parser)
    _add_process_arguments(parser)
    _add_http_arguments(parser)
    _add_batching_arguments(parser)
    _add_request_arguments(parser)
    _add_security_arguments(parser)
    _add_runtime_arguments(parser)
    _add_lifecycle_arguments(parser)
    _add_observability_arguments(parser)
    parser.add_argument(
        "--enable-admin",
        action="store_true",
        default=env_switch("TEXTSERVE_ENABLE_ADMIN"),
        help="serve textserve.v1.Admin: LoadModel, UnloadModel, ReloadRepository "
        "(`textserve models load|unload|reload`) [TEXTSERVE_ENABLE_ADMIN=1]",
    )
