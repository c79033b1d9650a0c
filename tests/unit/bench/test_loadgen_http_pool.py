"""The load generator's HTTP client holds at most its pool's connections (loadgen.HTTP_POOL):
past it a request waits for a free connection instead of opening another. A real aiohttp
server on 127.0.0.1:0 holds every answer 50 ms and counts the requests it holds at once: over
HTTP/1.1 (no pipelining) one per connection."""

from __future__ import annotations

import asyncio

from aiohttp import web

from textserve.bench.loadgen import _http_calls


async def _most_at_once(pool: int, requests: int) -> int:
    now = most = 0

    async def held(request: web.Request) -> web.Response:
        nonlocal now, most
        now += 1
        most = max(most, now)
        await asyncio.sleep(0.05)
        now -= 1
        return web.Response(text="{}")

    app = web.Application()
    app.router.add_post("/v1/classify", held)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with _http_calls(f"127.0.0.1:{port}", "/v1/classify", pool) as (call,):
            await asyncio.gather(*(call(b"{}", 10.0) for _ in range(requests)))
    finally:
        await runner.cleanup()
    return most


def test_the_pool_bounds_the_connections() -> None:
    assert asyncio.run(_most_at_once(pool=4, requests=40)) == 4


def test_unbounded_opens_one_per_request_in_flight() -> None:
    assert asyncio.run(_most_at_once(pool=0, requests=40)) == 40
