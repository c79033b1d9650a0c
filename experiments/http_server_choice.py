"""Which asynchronous HTTP server carries textserve's HTTP routes: server CPU per request of
uvicorn + httptools (the bare ASGI app of service/http/app.py) against aiohttp's low-level
server running the same app, each in the serving process's own event loop beside grpc.aio,
driven by perf_analyzer -i http (KServe v2 REST infer, one text per request).

    python experiments/http_server_choice.py --repository models --model default \\
        --texts texts.jsonl --requests 2000 --concurrency 8

Prints one line per candidate: requests, server CPU seconds (this process: the event loop,
the tokenizer and onnxruntime threads alike, so the difference between candidates is the
HTTP stack's), and CPU per request.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

from textserve.bench.perf_analyzer import (
    ensure_perf_analyzer,
    load_texts,
    perf_analyzer_command,
    write_input_data,
)
from textserve.bench.perf_analyzer_setup import tool_env


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _aiohttp(app: Any, port: int) -> Any:
    """aiohttp's low-level server (no router, no middleware) calling the same ASGI app."""
    from aiohttp import web

    async def handler(request: web.BaseRequest) -> web.Response:
        body = await request.read()
        peer = request.transport.get_extra_info("peername") if request.transport else None
        scope = {
            "type": "http",
            "method": request.method,
            "path": request.path,
            "headers": [(k.lower().encode(), v.encode()) for k, v in request.headers.items()],
            "client": peer,
        }
        sent: dict[str, Any] = {}

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.setdefault("start" if "status" in message else "body", message)

        await app(scope, receive, send)
        start = sent["start"]
        headers = {k.decode(): v.decode() for k, v in start["headers"] if k != b"content-length"}
        return web.Response(status=start["status"], body=sent["body"]["body"], headers=headers)

    server = web.Server(handler, access_log=None)
    loop = asyncio.get_running_loop()
    return await loop.create_server(server, "127.0.0.1", port)


async def _measure(args: argparse.Namespace, candidate: str, binary: Path, data: Path) -> None:
    from textserve.service.config import RuntimeConfig, ServerConfig
    from textserve.service.http.app import HttpApp, HttpLimits
    from textserve.service.server import create_server

    config = ServerConfig(
        repository=args.repository,
        model=args.model,
        listen="127.0.0.1:0",
        metrics_port=0 if candidate == "uvicorn" else None,
        runtime=RuntimeConfig(intra_op_threads=1),
    )
    server, _ = create_server(config)
    await server.start()
    closer: Any = None
    if candidate == "uvicorn":
        assert server.http is not None
        port = server.http.port
    else:
        app = HttpApp(server.ctx, HttpLimits())
        app.set_readiness("serving")
        closer = await _aiohttp(app, 0)
        port = closer.sockets[0].getsockname()[1]
    csv_path = args.output / f"http_choice_{candidate}.csv"
    command = perf_analyzer_command(
        binary, url=f"127.0.0.1:{port}", model=args.model, concurrency=args.concurrency,
        input_data=data, csv_path=csv_path, request_count=args.requests, stability=100,
        protocol="http",
    )  # fmt: skip
    before = _cpu()
    process = await asyncio.create_subprocess_exec(
        *command, env=tool_env(args.tools), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, err = await process.communicate()
    cpu = _cpu() - before
    if process.returncode != 0:
        sys.exit(f"perf_analyzer failed for {candidate}: {err.decode()[-2000:]}")
    counted = server.metrics.registry.get_sample_value(
        "textserve_requests_total", {"method": "HttpInfer", "model": args.model}
    )
    requests = int(counted or 0)
    print(
        f"{candidate}: {requests} requests, server CPU {cpu:.2f} s, "
        f"{cpu / max(1, requests) * 1e6:.0f} µs per request",
        flush=True,
    )
    if closer is not None:
        closer.close()
    await server.stop(grace=5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, required=True)
    parser.add_argument("--model", default="default")
    parser.add_argument("--texts", type=Path, required=True)
    parser.add_argument("--requests", type=int, default=2000, help="per measurement window")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--candidates", default="uvicorn,aiohttp")
    parser.add_argument("--output", type=Path, default=Path("bench/results"))
    parser.add_argument("--tools", type=Path, default=Path(".tools/perf_analyzer"))
    args = parser.parse_args(argv)
    args.output.mkdir(parents=True, exist_ok=True)
    binary = ensure_perf_analyzer(args.tools)
    data = write_input_data(load_texts(args.texts, 200), args.output / "http_choice_input.json")
    for candidate in args.candidates.split(","):
        asyncio.run(_measure(args, candidate.strip(), binary, data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
