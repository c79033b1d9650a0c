"""`textserve serve`: serve a model repository over gRPC (textserve.v1, health, reflection).

Every flag (declared in flags.py) falls back to a TEXTSERVE_* environment variable (e.g.
TEXTSERVE_LISTEN), read at the edge only.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from textserve.cli import CliError
from textserve.service.config import (
    BatcherConfig,
    CudaConfig,
    RuntimeConfig,
    ServerConfig,
    batcher_defaults,
)
from textserve.service.flags import UNSET, add_arguments, cache_size, seconds_or_off

__all__ = ["add_arguments", "build_config", "run", "write_ready_file"]


def _on_cuda(device: str) -> bool:
    """Whether sessions will run on CUDA (for the device's batching defaults)."""
    if device != "auto":
        return device == "cuda"
    from textserve.service.engine.runtime import CUDA, available_providers

    return CUDA in available_providers(device)


def _http_port(args: argparse.Namespace) -> tuple[int | None, str, bool]:
    """(port or None, host, inference routes on) from --http-port/--http-host and their
    deprecated aliases --metrics-port/--metrics-host, which win when given (as before)."""
    port, inference = args.http_port, True
    if port is None:  # --http-port off: the probes and /metrics stay on the default port
        port, inference = ServerConfig().metrics_port, False
    host = args.http_host
    if args.metrics_host:
        print("textserve serve: --metrics-host is deprecated; use --http-host", file=sys.stderr)
        host = args.metrics_host
    if args.metrics_port != UNSET:
        # 'off' is not deprecated: it is the one way to have no HTTP port at all
        if args.metrics_port is not None:
            print("textserve serve: --metrics-port is deprecated; use --http-port", file=sys.stderr)
        port = args.metrics_port
    return port, host, inference


def build_config(args: argparse.Namespace) -> ServerConfig:
    from textserve.service.config import ConfigError, HttpConfig, SecurityConfig

    port, host, inference = _http_port(args)
    unset = args.max_batch_size is None or args.max_batch_tokens is None
    defaults = batcher_defaults(_on_cuda(args.device)) if unset else BatcherConfig()
    try:
        return ServerConfig(
            repository=Path(args.repository),
            model=args.model or None,
            listen=args.listen,
            metrics_port=port,
            metrics_host=host,
            http=HttpConfig(
                inference=inference,
                header_timeout=args.http_header_timeout,
                max_connections=args.http_max_connections,
            ),
            max_texts_per_request=args.max_texts_per_request,
            grace_period=args.grace_period,
            worker_timeout=args.worker_timeout,
            max_message_bytes=args.max_message_bytes,
            max_concurrent_rpcs=args.max_concurrent_rpcs or None,
            max_streams_per_connection=args.max_streams_per_connection or None,
            max_connection_age=args.max_connection_age or None,
            max_backlog_wait=seconds_or_off(args.max_backlog_wait_ms),
            backlog_target=seconds_or_off(args.backlog_target_ms),
            inflight_wait=seconds_or_off(args.inflight_wait_ms),
            stream_max_inflight=args.stream_max_inflight,
            security=SecurityConfig(
                tls_cert=Path(args.tls_cert) if args.tls_cert else None,
                tls_key=Path(args.tls_key) if args.tls_key else None,
                tls_client_ca=Path(args.tls_client_ca) if args.tls_client_ca else None,
                auth_token_file=Path(args.auth_token_file) if args.auth_token_file else None,
            ),
            poll_interval=args.poll_interval,
            version_policy=args.version_policy,
            cache_size=cache_size(args.cache_size),
            enable_admin=args.enable_admin,
            otlp_endpoint=args.otlp_endpoint or None,
            trace_sample_ratio=args.trace_sample_ratio,
            access_log=args.access_log,
            log_texts=args.log_texts,
            access_log_rate=args.access_log_rate,
            runtime=RuntimeConfig(
                device=args.device,
                intra_op_threads=args.intra_op_threads,
                inter_op_threads=args.inter_op_threads,
                inference_threads=args.inference_threads,
                inference_nice=args.inference_nice,
                cuda=CudaConfig(
                    device_id=args.cuda_device_id,
                    memory_limit=args.cuda_memory_limit,
                    arena_strategy=args.cuda_arena_strategy,
                    conv_algo_search=args.cudnn_conv_algo_search,
                ),
                io_binding=args.io_binding,
                engine=args.engine,
            ),
            batcher=BatcherConfig(
                max_batch_size=defaults.max_batch_size
                if args.max_batch_size is None
                else args.max_batch_size,
                max_batch_tokens=defaults.max_batch_tokens
                if args.max_batch_tokens is None
                else args.max_batch_tokens,
                max_queue_delay=args.max_queue_delay_ms / 1000.0,
                max_queue_size=args.max_queue_size,
                max_queue_wait=seconds_or_off(args.max_queue_wait_ms),
                max_padding_ratio=args.max_padding_ratio,
            ),
        )
    except ConfigError as exc:
        raise CliError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    import asyncio

    from textserve.service.config import ConfigError
    from textserve.service.engine.runtime import DeviceUnavailableError
    from textserve.service.repository.core import StartupError
    from textserve.service.server import serve
    from textserve.service.workers.errors import SupervisorError
    from textserve.service.workers.sizing import resolve_workers
    from textserve.service.workers.supervisor import serve_workers

    config = build_config(args)
    try:
        workers = resolve_workers(str(args.workers), config)
    except SupervisorError as exc:
        raise CliError(str(exc)) from None

    def ready(server: Any) -> None:
        # the HTTP port serves TLS with the gRPC port's certificate (service/http/server.py)
        tls = config.security.tls_cert is not None
        scheme = "https" if tls else "http"
        base = f"{scheme}://{config.metrics_host}:{server.metrics_port}"
        metrics = f"{base}/metrics" if server.metrics_port else None
        client_tls = " --tls-ca CA.pem" if tls else ""  # (--tls-ca implies --tls)
        curl_tls = " --cacert CA.pem" if tls else ""
        print(
            f"textserve is serving on {server.address} (metrics: {metrics or 'off'}). Try:\n"
            f"  textserve classify --server {server.address}{client_tls} "
            "'a gripping, beautifully acted film'"
            + (
                f"\n  curl -s{curl_tls} {base}/v1/classify "
                '-d \'{"texts": ["a gripping, beautifully acted film"]}\''
                if server.metrics_port and config.http.inference
                else ""
            ),
            flush=True,
        )
        if args.ready_file:  # after the line: whoever waits for the file finds it printed
            write_ready_file(Path(args.ready_file), server.address, metrics, workers)

    try:
        if workers > 1:
            return serve_workers(config, workers, str(args.log_level), on_ready=ready)
        return asyncio.run(serve(config, on_ready=ready))
    except SupervisorError as exc:
        if exc.status != 2:
            print(f"textserve serve: error: {exc}", file=sys.stderr)
            return exc.status
        raise CliError(str(exc)) from None
    except (StartupError, DeviceUnavailableError, OSError, ConfigError) as exc:
        raise CliError(str(exc)) from None
    finally:
        if args.ready_file:  # a file left behind would announce a server that is gone
            Path(args.ready_file).unlink(missing_ok=True)


def write_ready_file(path: Path, address: str, metrics: str | None, workers: int) -> None:
    """The --ready-file: written to a temporary name and renamed, so a reader never sees half
    of it. `{"pid": 123, "grpc": "127.0.0.1:50051", "metrics": URL or null, "workers": 2}`."""
    import json
    import os

    data = {"pid": os.getpid(), "grpc": address, "metrics": metrics, "workers": workers}
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(data) + "\n")
    os.replace(temporary, path)
