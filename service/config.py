"""Serving configuration: one frozen dataclass per component, built once at the edge
(service/cli.py).

Nothing below the edge reads os.environ or flags; components get these objects. Each
dataclass validates itself and says what to do when a value is wrong.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from textserve.cli import ConfigError  # one type for every bad setting: re-exported
from textserve.service.engine.cache_size import CacheSize
from textserve.service.repository.policy import PolicySet

__all__ = ["ConfigError"]  # and the dataclasses below

DEVICES = ("auto", "cpu", "cuda")
ARENA_STRATEGIES = ("same-as-requested", "next-power-of-two")
CONV_ALGO_SEARCHES = ("default", "heuristic", "exhaustive")
IO_BINDINGS = ("auto", "on", "off")
# Where a version's batches run (service/engine/remote.py, service/engine/hub.py).
ENGINES = ("thread", "process", "shared")


def usable_cpus() -> int:
    """CPUs this process may run on (cgroup/affinity aware where the OS tells)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def check_wait(flag: str, seconds: float | None, most: float) -> None:
    """A wait set in milliseconds with 0 for off: None, or above 0 and at most `most` s."""
    if seconds is not None and not 0 < seconds <= most:
        raise ConfigError(
            f"{flag} must be between 1 and {most * 1e3:g} (0: off), got {seconds * 1e3:g}"
        )


@dataclass(frozen=True)
class BatcherConfig:
    max_batch_size: int = 64  # texts per batch
    max_batch_tokens: int = 8192  # padded tokens per batch: n_texts x longest text in the batch
    # Seconds the oldest text may wait for its batch to fill. 0: a batch starts as soon as the
    # model is free (under load batches form from what queued while the last one ran).
    max_queue_delay: float = 0.0
    max_queue_size: int = 4096  # texts waiting per model; beyond it requests are refused at once
    # Admission by time: seconds of work the queue may hold ahead of a new request (its queued
    # tokens over the tokens per second the model has been draining) before the request is
    # refused at once (RESOURCE_EXHAUSTED, HTTP 429), and a request whose deadline is nearer
    # than that wait is refused up front (DEADLINE_EXCEEDED). None: off (the count bound only).
    max_queue_wait: float | None = None
    # Once a batch has min_fill texts, a text that would make more than this fraction of the
    # batch's tokens padding waits for a batch of its own length instead (padding is compute).
    # 1: no such wait. ModelHandle runs each batch as length-sorted sub-batches, which pad
    # little whatever the mix, so holding texts back only makes batches smaller and the wait of
    # the texts held back longer (measured: lower throughput and a longer p99 at 0.25).
    max_padding_ratio: float = 1.0
    min_fill: int = 8

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ConfigError(f"--max-batch-size must be at least 1, got {self.max_batch_size}")
        if self.max_batch_tokens < 1:
            raise ConfigError(f"--max-batch-tokens must be at least 1, got {self.max_batch_tokens}")
        if not 0 <= self.max_queue_delay <= 10:
            raise ConfigError(
                "--max-queue-delay-ms must be between 0 and 10000, "
                f"got {self.max_queue_delay * 1e3:g}"
            )
        if self.max_queue_size < 1:
            raise ConfigError(f"--max-queue-size must be at least 1, got {self.max_queue_size}")
        check_wait("--max-queue-wait-ms", self.max_queue_wait, 600)
        if not 0 <= self.max_padding_ratio <= 1:
            raise ConfigError(
                f"--max-padding-ratio must be between 0 and 1, got {self.max_padding_ratio}"
            )


def batcher_defaults(cuda: bool) -> BatcherConfig:
    """The batching defaults for a device (docs/engine.md, "GPU-sized batches"). On a GPU one
    run's fixed cost (launches, copies, the Python around it) dwarfs a token's, so batches are
    8x larger: 512 texts and 65536 padded tokens (512 x 128). At the H200 anchor of ~94 k
    sequences/s (fp16, 128 tokens, batch 1024) a full batch of 512 x 128 runs in ~5.5 ms, so a
    text waits at most about one such batch behind a full one, while the batch stays large
    enough for most of the batch-1024 throughput. The queue holds 8 such batches."""
    if not cuda:
        return BatcherConfig()
    return BatcherConfig(max_batch_size=512, max_batch_tokens=65536, max_queue_size=4096)


@dataclass(frozen=True)
class CudaConfig:
    """The CUDA execution provider's options (onnxruntime's names in cuda_provider_options)."""

    device_id: int = 0  # which GPU (CUDA_VISIBLE_DEVICES numbering)
    memory_limit: int = 0  # bytes the provider's arena may hold (gpu_mem_limit); 0: no limit
    # How the arena grows: by what a run asks (kSameAsRequested: workers sharing one GPU do not
    # reserve up to twice what they use) or to the next power of two (onnxruntime's default).
    arena_strategy: str = "same-as-requested"
    # cuDNN convolution algorithm search: our transformer graphs have no convolutions, so the
    # search (exhaustive is onnxruntime's default) would only cost time at the first runs.
    conv_algo_search: str = "default"

    def __post_init__(self) -> None:
        if self.device_id < 0:
            raise ConfigError(f"--cuda-device-id must be 0 or more, got {self.device_id}")
        if self.memory_limit < 0:
            raise ConfigError(
                f"--cuda-memory-limit must be 0 (no limit) or more bytes, got {self.memory_limit}"
            )
        if self.arena_strategy not in ARENA_STRATEGIES:
            raise ConfigError(
                f"--cuda-arena-strategy must be one of {', '.join(ARENA_STRATEGIES)}, "
                f"got {self.arena_strategy!r}"
            )
        if self.conv_algo_search not in CONV_ALGO_SEARCHES:
            raise ConfigError(
                f"--cudnn-conv-algo-search must be one of {', '.join(CONV_ALGO_SEARCHES)}, "
                f"got {self.conv_algo_search!r}"
            )

    def provider_options(self) -> dict[str, str]:
        """onnxruntime's CUDAExecutionProvider options.

        >>> CudaConfig(device_id=1, memory_limit=2**30).provider_options()["gpu_mem_limit"]
        '1073741824'
        """
        options = {
            "device_id": str(self.device_id),
            "arena_extend_strategy": {
                "same-as-requested": "kSameAsRequested",
                "next-power-of-two": "kNextPowerOfTwo",
            }[self.arena_strategy],
            "cudnn_conv_algo_search": self.conv_algo_search.upper(),
        }
        if self.memory_limit:
            options["gpu_mem_limit"] = str(self.memory_limit)
        return options


def parse_bytes(value: str) -> int:
    """A size in bytes, with an optional binary or decimal unit: 8GiB, 512MiB, 2GB, 1048576.

    >>> parse_bytes("8GiB"), parse_bytes("1.5 kB"), parse_bytes("0")
    (8589934592, 1500, 0)
    """
    units = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
             "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip
    text = value.strip().lower()
    number = text.rstrip("kmgtib ")
    unit = text[len(number) :].strip()
    try:
        size = float(number)
    except ValueError:
        size = -1.0
    if unit not in units or not 0 <= size < float("inf"):
        raise ValueError(f"expected a size such as 8GiB, 512MiB or a byte count, got {value!r}")
    return int(size * units[unit])


@dataclass(frozen=True)
class RuntimeConfig:
    device: str = "auto"  # auto: CUDA when onnxruntime offers it, else CPU; cpu; cuda (or fail)
    intra_op_threads: int = 0  # threads inside one operator; 0: the usable CPUs less one
    inter_op_threads: int = 1  # operators run in parallel; 1 because our graphs are sequential
    inference_threads: int = 1  # batches run at the same time per model (one is right on CPU)
    # Niceness added to the threads that tokenize and run batches (engine/priority.py), so the
    # event loop takes and refuses calls first on a busy core; 0: the same priority.
    inference_nice: int = 10
    warmup: bool = True  # run a few batches before reporting SERVING
    cuda: CudaConfig = field(default_factory=CudaConfig)  # used when a session runs on CUDA
    # Runs through an onnxruntime IOBinding (inputs as OrtValues, logits bound to host memory):
    # auto: with CUDA (it saves the session's own copies of the feeds), off on CPU (no copy to
    # save there: measured the same); on/off force it.
    io_binding: str = "auto"
    # Where batches are tokenized and run: "thread", the serving process's inference thread;
    # "process", a process of their own per version, off the event loop's GIL (remote.py);
    # "shared", one process for every worker, merging their batches (hub.py).
    engine: str = "thread"
    # --engine shared: the hub's socket and key, set by the supervisor for its workers.
    engine_hub: str = ""
    engine_hub_key: str = field(default="", repr=False)  # never in a log line

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ConfigError(f"--engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.device not in DEVICES:
            raise ConfigError(f"--device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.io_binding not in IO_BINDINGS:
            raise ConfigError(
                f"--io-binding must be one of {', '.join(IO_BINDINGS)}, got {self.io_binding!r}"
            )
        if self.intra_op_threads < 0 or self.inter_op_threads < 0:
            raise ConfigError("--intra-op-threads and --inter-op-threads must be 0 (auto) or more")
        if not 0 <= self.inference_nice <= 19:
            raise ConfigError(
                f"--inference-nice must be between 0 and 19, got {self.inference_nice}"
            )
        if self.inference_threads < 1:
            raise ConfigError(
                f"--inference-threads must be at least 1, got {self.inference_threads}"
            )

    def resolved_intra_op_threads(self) -> int:
        # One core is left to the event loop (gRPC) and the tokenizer thread, which are busy
        # whenever the server is: an intra-op thread sharing a core with them stalls every
        # parallel section of the graph (a busy 2-core machine: 1.7 vs 2.1 ms CPU per text).
        return self.intra_op_threads or max(1, usable_cpus() - 1)


@dataclass(frozen=True)
class SecurityConfig:
    """Transport security and authentication of the gRPC port (see service/security.py)."""

    tls_cert: Path | None = None  # PEM certificate chain of the server; with tls_key: TLS
    tls_key: Path | None = None  # PEM private key of tls_cert
    tls_client_ca: Path | None = None  # PEM CA bundle: clients must present a cert it signed
    auth_token_file: Path | None = None  # bearer tokens, one per line; None: no authentication

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("--tls-cert and --tls-key go together: give both, or neither")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ConfigError(
                "--tls-client-ca (mutual TLS) needs TLS itself: give --tls-cert and --tls-key too"
            )

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None


@dataclass(frozen=True)
class HttpConfig:
    """The HTTP port's routes and bounds (service/http/; the port is ServerConfig.metrics_port)."""

    inference: bool = True  # --http-port off: only the probes and /metrics answer
    header_timeout: float = 10.0  # seconds a request's line and headers may take to arrive
    body_timeout: float = 30.0  # seconds its body may take after the headers
    max_connections: int = 2048  # open HTTP connections; past it new ones are closed at once
    # --workers: host:port of the supervisor's private endpoint, whose /metrics (every worker
    # summed) and /readyz each worker's HTTP port answers with. Set by the supervisor only.
    upstream: str | None = None

    def __post_init__(self) -> None:
        if not 0 < self.header_timeout <= 3600 or not 0 < self.body_timeout <= 3600:
            raise ConfigError(
                "--http-header-timeout and the body timeout must be between 0 and 3600 seconds"
            )
        if self.max_connections < 1:
            raise ConfigError(
                f"--http-max-connections must be at least 1, got {self.max_connections}"
            )


@dataclass(frozen=True)
class ServerConfig:
    repository: Path = Path("models")  # models/<name>/<version>/
    model: str | None = None  # the default model; None: the only model in the repository
    listen: str = "127.0.0.1:50051"  # host:port; port 0 picks a free one
    # The HTTP port (--http-port): /metrics, the probes and the HTTP/JSON inference routes;
    # 0 picks a free one; None: no HTTP at all (--metrics-port off)
    metrics_port: int | None = 8000
    metrics_host: str = "127.0.0.1"  # --http-host
    http: HttpConfig = field(default_factory=HttpConfig)
    max_texts_per_request: int = 1024
    grace_period: float = 30.0  # seconds to finish in-flight work on SIGTERM/SIGINT
    # Largest request message accepted; larger ones get RESOURCE_EXHAUSTED from grpc itself.
    max_message_bytes: int = 4 * 1024 * 1024
    # gRPC calls handled at once (per process); a call beyond it is answered RESOURCE_EXHAUSTED
    # by grpc.aio as soon as the loop takes it from grpc core (retryable), instead of waiting
    # behind the others. The calls grpc core holds until then are max_backlog_wait's. None: no
    # limit. 512, measured
    # (docs/performance.md, "Overload"): at 1.5x the peak rate on 2 cores it sheds the excess
    # with 0 CANCELLED and the accepted calls' p99 at 2.7x the closed-loop p99 (256: 1.4x,
    # 1024: 3.9x; no limit: 7,062 CANCELLED and 17x).
    max_concurrent_rpcs: int | None = 512
    # gRPC calls one connection may have open (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS): a client
    # holds its further calls until one ends, so that a few connections cannot fill grpc core
    # past the calls it holds without cancelling them (backlog.PENDING_CAP: 14,000 calls in a
    # 6 s stall over 4 connections, 3,998 CANCELLED without it, 0 with 1,024;
    # docs/operations.md, "Calls grpc holds"). One a client sends past it is refused
    # UNAVAILABLE (RST_STREAM REFUSED_STREAM: it never ran; retryable). None: grpc's default,
    # no limit. 1,024: twice max_concurrent_rpcs, so one connection can still fill the server.
    max_streams_per_connection: int | None = 1024
    # Seconds after which grpc asks a connection to close (GOAWAY, jittered ±10 % by grpc; its
    # calls in flight run to their end, however long): its client reconnects, and the kernel
    # hands the new connection to any worker (SO_REUSEPORT), so load comes back to a restarted
    # worker, which otherwise serves nothing until clients reconnect for another reason (the
    # soak: every connection of a killed worker went to the survivor, docs/operations.md); the
    # same makes a client's DNS lookup find new replicas. None: off, grpc's default.
    max_connection_age: float | None = None
    # Seconds a gRPC call may wait in grpc core before the server takes it (while its event loop
    # is busy): one that waited longer is answered RESOURCE_EXHAUSTED as soon as it is taken,
    # instead of grpc cancelling the calls it holds (CANCELLED, past 1,000 held calls or 30 s;
    # service/backlog.py, docs/operations.md "Calls grpc holds"). None: off. 2 s: longer than
    # the stalls of a hot reload on 2 shared cores at 70 % of the peak (1 s refused 3,700 calls
    # in 90 s at the peak where grpc had cancelled 496), and 2 s of calls stay under grpc's
    # memory cap (backlog.PENDING_CAP) up to 5,000 calls/s a process.
    max_backlog_wait: float | None = 2.0
    # Seconds of wait in grpc core an overload's backlog is shed down to: once calls have waited
    # longer than this at every sample for a second while calls arrive faster than the server
    # has served them (overload, not a stall), those calls are refused as they are taken
    # (service/backlog.py). None: off (only max_backlog_wait).
    backlog_target: float | None = 0.1
    # Seconds of work the requests in flight of one process may hold under overload (the door,
    # service/door.py): once calls arrive faster than the process has ever answered them, it
    # lets in what it answers in this long (Little's law) and refuses the rest at once, where
    # max_concurrent_rpcs alone lets them wait max_concurrent_rpcs / goodput. None: off (the
    # count alone). 200 ms: at 1.5x the peak on 2 shared vCPUs an accepted call's p99 1.5-1.6x
    # the closed-loop p99 where the count gave 2.0-2.9x (300 ms: 2.2-2.8x; docs/performance.md,
    # "The door").
    inflight_wait: float | None = 0.2
    security: SecurityConfig = field(default_factory=SecurityConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    batcher: BatcherConfig = field(default_factory=BatcherConfig)
    poll_interval: float = 5.0  # seconds between scans for new/removed versions; 0: no watching
    version_policy: PolicySet = field(default_factory=PolicySet)  # which versions are served
    # Each model's response cache (docs/cache.md), unless its serving.json says otherwise;
    # None: no cache (a repeated text runs again, as without one).
    cache_size: CacheSize | None = None
    enable_admin: bool = False  # serve textserve.v1.Admin (LoadModel, UnloadModel, Reload...)
    # Requests of one ClassifyStream read but not yet answered (processing, or their response
    # waiting for the client to read it). At the limit the stream stops reading its requests,
    # so a client that never reads is slowed by HTTP/2 flow control instead of growing memory.
    stream_max_inflight: int = 32
    # Observability (README "Observability"). OTLP/gRPC endpoint of a trace collector (e.g.
    # http://otel-collector:4317); None: no tracing, and opentelemetry is never imported.
    otlp_endpoint: str | None = None
    # Fraction of the traces started here that are kept (a caller's sampled flag wins).
    trace_sample_ratio: float = 0.1
    access_log: str = "off"  # "json": one JSON line per request on stdout
    log_texts: bool = False  # put the texts in the access log: a privacy risk, off by default
    access_log_rate: float = 1000.0  # access log lines a second at most; over it, dropped
    # --workers N: seconds a worker may leave the supervisor's heartbeat unanswered before it
    # is killed and restarted (docs/operations.md says how the default was chosen)
    worker_timeout: float = 10.0

    def __post_init__(self) -> None:
        check_wait("--backlog-target-ms", self.backlog_target, 30)
        check_wait("--max-backlog-wait-ms", self.max_backlog_wait, 30)
        check_wait("--inflight-wait-ms", self.inflight_wait, 600)
        if self.otlp_endpoint is not None and not self.otlp_endpoint.strip():
            raise ConfigError("--otlp-endpoint must be an address (e.g. http://collector:4317)")
        if not 0 <= self.trace_sample_ratio <= 1:
            raise ConfigError(
                f"--trace-sample-ratio must be between 0 and 1, got {self.trace_sample_ratio}"
            )
        if self.runtime.engine != "thread" and self.cache_size is not None:
            raise ConfigError(
                f"--engine {self.runtime.engine} does not take --cache-size yet: the cache lives "
                "with the "
                "tokenizer, in the engine process (leave one of them out)"
            )
        if self.access_log not in ("off", "json"):
            raise ConfigError(f"--access-log must be off or json, got {self.access_log!r}")
        if not self.access_log_rate > 0:
            raise ConfigError(
                f"--access-log-rate must be more than 0 lines a second, got {self.access_log_rate}"
            )
        host, sep, port = self.listen.rpartition(":")
        if not sep or not host or not (port.isascii() and port.isdigit()) or int(port) > 65535:
            raise ConfigError(
                f"--listen must be HOST:PORT (e.g. 127.0.0.1:50051), got {self.listen!r}"
            )
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError(
                f"--http-port (--metrics-port) must be 0-65535 or 'off', got {self.metrics_port}"
            )
        if self.max_texts_per_request < 1:
            raise ConfigError(
                f"--max-texts-per-request must be at least 1, got {self.max_texts_per_request}"
            )
        if self.grace_period < 0:
            raise ConfigError(f"--grace-period must be 0 or more, got {self.grace_period}")
        if self.max_message_bytes < 1024:
            raise ConfigError(
                f"--max-message-bytes must be at least 1024, got {self.max_message_bytes}"
            )
        if self.max_concurrent_rpcs is not None and self.max_concurrent_rpcs < 1:
            raise ConfigError(
                f"--max-concurrent-rpcs must be at least 1 (0: no limit), "
                f"got {self.max_concurrent_rpcs}"
            )
        if self.max_streams_per_connection is not None and not (
            1 <= self.max_streams_per_connection < 2**31
        ):
            raise ConfigError(
                f"--max-streams-per-connection must be 1 to 2147483647 (0: no limit), "
                f"got {self.max_streams_per_connection}"
            )
        if self.max_connection_age is not None and not 0 < self.max_connection_age < 2**31 / 1e3:
            raise ConfigError(
                f"--max-connection-age must be 0 (off) or seconds up to 2147483, "
                f"got {self.max_connection_age:g}"
            )
        if self.stream_max_inflight < 1:
            raise ConfigError(
                f"--stream-max-inflight must be at least 1, got {self.stream_max_inflight}"
            )
        if not 0 < self.worker_timeout <= 3600:
            raise ConfigError(
                f"--worker-timeout must be more than 0 and at most 3600 seconds, "
                f"got {self.worker_timeout:g}"
            )
        if not self.poll_interval >= 0:
            raise ConfigError(
                f"--poll-interval must be 0 (no watching) or more seconds, got {self.poll_interval}"
            )
