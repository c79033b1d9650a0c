"""Overload, as issue 39's acceptance states it: open loop at 1.5x the measured peak, over gRPC
and HTTP, with one worker and two.

    python -m textserve.bench.overload --repository models --model default \\
        --workers 1,2 --apis v1,http --load 1.5 --duration 60 --output bench/results/overload

For each worker count a fresh `textserve serve` (its defaults otherwise); for each API, on that
server (after `--settle` seconds of quiet, the row before's overload over): a closed loop at
`--concurrency` callers (the peak and its p99), then Poisson arrivals at `--load` x that peak
for `--duration` seconds (latency from the scheduled arrival). Per row: arrivals, what was
answered, the accepted requests' p50/p99 and p99 / the closed loop's, every other outcome by
code (gRPC names; HTTP_429, HTTP_503, ...) with how fast it came (p50/p99 ms),
and the verdict of each promise: nothing CANCELLED, nothing INTERNAL (or 500), every arrival
answered (no timeouts, nothing unsent), the accepted p99 within `--p99-bound` x the closed
loop's, and refusals within `--refusal-bound-ms`. Writes OUTPUT/overload.json and .txt; the
load generator shares the machine, and its own CPU share is in each row. Each row's open loop
second by second (bench/timeline.py: arrivals, answered, refused, the accepted p50/p99 and the
refusals' p99 by the second they arrived in) is in the JSON and plotted in overload.png, with
the bounds as dashed lines: when a promise fails, the plot says when.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from textserve import procfs
from textserve.bench.loadgen import HTTP_POOL, closed_loop, http_pool, open_loop
from textserve.bench.process import ServerProcess, serve_command, spawn
from textserve.bench.requests import build_requests, load_texts
from textserve.bench.stats import summarize
from textserve.bench.timeline import per_second, plot

REFUSALS = ("RESOURCE_EXHAUSTED", "UNAVAILABLE", "HTTP_429", "HTTP_503")
BROKEN = ("CANCELLED", "INTERNAL", "UNKNOWN", "HTTP_500", "HTTP_CONNECTION", "TIMEOUT")


def _target(server: ServerProcess, api: str) -> str:
    if api != "http":
        return server.address
    assert server.metrics_url is not None
    return server.metrics_url.split("//", 1)[1].split("/", 1)[0]


def measure(
    server: ServerProcess, workers: int, api: str, texts: list[str], args: argparse.Namespace
) -> dict:
    """The closed loop, then the open loop at args.load x its peak, on one server (of
    `workers` processes: two gRPC connections on each, loadgen.spread_channels) and API."""
    pool = build_requests(texts, api, 1, args.model)
    target, connections = _target(server, api), 2 * workers
    closed, _ = asyncio.run(
        closed_loop(
            target, pool, args.concurrency, warmup=2, duration=args.peak_duration,
            connections=connections, workers=workers,
        )
    )  # fmt: skip
    peak = summarize(closed, os.cpu_count() or 1)
    rate = args.load * peak["throughput_requests_per_s"]
    raw, _ = asyncio.run(
        open_loop(
            target, pool, rate, warmup=2, duration=args.duration, timeout=args.timeout,
            connections=connections, http_pool=http_pool(args.http_pool, workers),
            workers=workers,
        )
    )  # fmt: skip
    step = summarize(raw, os.cpu_count() or 1)
    arrivals = len(raw.latencies) + sum(raw.errors.values()) + raw.not_sent
    return verdict(
        {
            "workers": workers, "api": api, "rate": rate, "arrivals": arrivals,
            "closed": peak, "open": step,
            "timeline": per_second(raw.outcomes, args.duration, REFUSALS),
        },
        args,
    )  # fmt: skip


def plot_rows(rows: list[dict[str, Any]], args: argparse.Namespace, path: Path) -> None:
    """overload.png: each row's timeline, the accepted p99's bound and the refusals' drawn."""
    timelines = {
        f"{row['workers']} worker(s), {row['api']}: {'met' if row['met'] else 'NOT met'}": (
            row["timeline"],
            {
                f"{args.p99_bound:g}x closed p99": args.p99_bound
                * row["closed"]["latency_ms"]["p99"],
                "refusal bound": args.refusal_bound_ms,
            },
        )
        for row in rows
    }
    plot(timelines, path)


def verdict(row: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The promises of issue 39's open-loop acceptance, judged on one row."""
    closed, step = row["closed"], row["open"]
    errors: dict[str, int] = step["errors"]
    refused = {c: n for c, n in errors.items() if c in REFUSALS}
    slow = [c for c in refused if step["error_latency_ms"][c]["p99"] > args.refusal_bound_ms]
    ratio = step["latency_ms"]["p99"] / closed["latency_ms"]["p99"]
    row["p99_ratio"] = ratio
    row["checks"] = {
        "no_cancelled_or_internal": not any(errors.get(c) for c in BROKEN),
        "every_arrival_answered": step["not_sent"] == 0 and set(errors) <= set(REFUSALS),
        "accepted_p99_within_bound": ratio <= args.p99_bound,
        "refusals_fast": not slow,
    }
    row["met"] = all(row["checks"].values())
    return row


def table(rows: list[dict[str, Any]], machine: str) -> str:
    lines = [
        f"open loop at the load x the closed-loop peak ({machine})",
        "| workers | api | peak req/s | closed p99 ms | arrivals/s | OK/s | accepted p50 / p99 ms "
        "| p99 ÷ closed | refused (p99 ms) | other errors | lg cpu | met |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c, o = r["closed"], r["open"]
        refused = ", ".join(
            f"{code} {n} ({o['error_latency_ms'][code]['p99']:.0f})"
            for code, n in o["errors"].items()
            if code in REFUSALS
        )
        other = ", ".join(f"{k} {n}" for k, n in o["errors"].items() if k not in REFUSALS)
        lines.append(
            f"| {r['workers']} | {r['api']} | {c['throughput_requests_per_s']:,.0f} "
            f"| {c['latency_ms']['p99']:.1f} | {r['rate']:,.0f} "
            f"| {o['throughput_requests_per_s']:,.0f} "
            f"| {o['latency_ms']['p50']:.1f} / {o['latency_ms']['p99']:.1f} "
            f"| {r['p99_ratio']:.2f}× | {refused or '0'} | {other or '0'} "
            f"| {o['loadgen']['cpu_share']:.0%} | {'yes' if r['met'] else 'NO'} |"
        )
    return "\n".join(lines)


def cpu_list(text: str) -> frozenset[int]:
    """'0', '0-1' or '0,2-3': CPUs this machine has (argparse's type: a bad one is one line)."""
    cpus: set[int] = set()
    for part in text.split(","):
        bounds = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if bounds is None:
            raise argparse.ArgumentTypeError(f"{text!r} is not a CPU list like 0 or 0-1")
        first, last = bounds.group(1), bounds.group(2) or bounds.group(1)
        cpus.update(range(int(first), int(last) + 1))
    usable = os.sched_getaffinity(0)
    if not cpus or not cpus <= usable:
        raise argparse.ArgumentTypeError(f"{text!r}: CPUs this process may use are {_cpus(usable)}")
    return frozenset(cpus)


def pin(server: frozenset[int] | None, loadgen: frozenset[int] | None) -> frozenset[int] | None:
    """Pin this process (the load generator) to `loadgen`, before it starts a thread (they
    inherit it); the CPUs to pin the server to: `server`, or every CPU this process had when
    only the load generator is pinned (the server, its child, would inherit the pinning)."""
    if loadgen is None:
        return server
    before = frozenset(os.sched_getaffinity(0))
    os.sched_setaffinity(0, loadgen)
    return before if server is None else server


def _cpus(cpus: frozenset[int] | set[int] | None) -> str:
    return "any" if cpus is None else ",".join(map(str, sorted(cpus)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m textserve.bench.overload", description=__doc__)
    parser.add_argument("--repository", type=Path, default=Path("models"))
    parser.add_argument("--model", default="default")
    parser.add_argument("--texts", type=Path, help="JSONL with 'text' (default: runs/<model>)")
    parser.add_argument("--workers", default="1,2", help="comma-separated --workers counts")
    parser.add_argument("--apis", default="v1,http", help="v1 (gRPC Classify), http, oip")
    parser.add_argument("--server-args", default="", help="more `textserve serve` flags")
    parser.add_argument("--concurrency", type=int, default=256, help="closed-loop callers")
    parser.add_argument("--peak-duration", type=float, default=10.0)
    parser.add_argument("--load", type=float, default=1.5, help="x the closed-loop peak")
    parser.add_argument("--duration", type=float, default=60.0, help="open-loop seconds")
    parser.add_argument("--timeout", type=float, default=10.0, help="a call's own timeout")
    parser.add_argument(
        "--settle", type=float, default=5.0,
        help="seconds of quiet between two APIs' rows on one server (its door opens again)",
    )  # fmt: skip
    parser.add_argument(
        "--http-pool", type=int, default=None,
        help=f"the HTTP client's connections at most (default: {HTTP_POOL} per server worker, "
        "twice what each lets in at once; 0: unbounded)",
    )  # fmt: skip
    parser.add_argument(
        "--server-nice", type=int, default=0,
        help="niceness added to the server's processes, so that the load generator on the same "
        "cores is not the one starved (0: same priority)",
    )  # fmt: skip
    parser.add_argument(
        "--server-cpus", type=cpu_list, metavar="LIST",
        help="pin the server to these CPUs (e.g. 0 or 0-1), so that a load generator pinned "
        "elsewhere (--loadgen-cpus) never takes the server's CPU",
    )  # fmt: skip
    parser.add_argument(
        "--loadgen-cpus", type=cpu_list, metavar="LIST", help="pin the load generator here"
    )  # fmt: skip
    parser.add_argument("--p99-bound", type=float, default=3.0)
    parser.add_argument("--refusal-bound-ms", type=float, default=50.0)
    parser.add_argument("--output", type=Path, help="write overload.json and overload.txt here")
    args = parser.parse_args(argv)
    args.server_cpus = pin(args.server_cpus, args.loadgen_cpus)
    texts = load_texts(args.texts or Path("runs") / args.model)
    rows = []
    for workers in (int(w) for w in args.workers.split(",")):
        flags = ["--workers", str(workers), *args.server_args.split()]
        command = serve_command(args.repository, args.model, flags)
        with spawn(
            command, cwd=Path.cwd(), niceness=args.server_nice, cpus=args.server_cpus
        ) as server:
            for index, api in enumerate(args.apis.split(",")):
                if index:  # the last row's overload over: this row's peak is the server's own
                    time.sleep(args.settle)
                rows.append(measure(server, workers, api, texts, args))
                print(table(rows[-1:], "").splitlines()[-1], flush=True)
    machine = f"{procfs.cpu_model() or 'unknown CPU'}, {os.cpu_count()} CPUs"
    if args.server_cpus is not None or args.loadgen_cpus is not None:
        machine += f"; server on CPUs {_cpus(args.server_cpus)}"
        machine += f", load generator on {_cpus(args.loadgen_cpus)}"
    text = table(rows, machine)
    print(text)
    if args.output is not None:
        args.output.mkdir(parents=True, exist_ok=True)
        meta = {"machine": machine, "at": time.strftime("%F %T"), "args": vars(args)}
        payload = {"meta": meta, "rows": rows}
        (args.output / "overload.json").write_text(json.dumps(payload, indent=1, default=str))
        (args.output / "overload.txt").write_text(text + "\n")
        plot_rows(rows, args, args.output / "overload.png")
    met = sum(r["met"] for r in rows)
    print(f"{met} of {len(rows)} rows meet every promise (a benchmark reports, it does not fail)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
