"""`python -m textserve.bench.cache`: the response cache off and on, one run, one workload.

Repeated texts as classification traffic has them: each request's text is drawn from the test
split by a Zipf law (rank k with probability ∝ k^-s, s = 1.1 by default, the ranks a random
order of the split's texts), so a few texts come back often and most rarely. The same
request sequence goes to two `textserve serve` servers in turn, one without a cache and one
with `--cache-size`, each driven by the same closed loop (N callers), in interleaved rounds
(`--rounds`, default 3); the report gives both throughputs and p99 side by side (the medians,
and each round's), and the hit rate the server counted in the measured window
(textserve_cache_requests_total).

    python -m textserve.bench.cache --repository models --model default --texts runs/default
    python -m textserve.bench.cache ... --concurrency 128 --duration 20 --cache-size 64MiB
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from textserve.bench.describe import describe_machine, find_version
from textserve.bench.loadgen import closed_loop
from textserve.bench.process import start_server
from textserve.bench.requests import METHODS, RequestPool, _v1_request, load_texts
from textserve.bench.scrape import fetch
from textserve.bench.stats import summarize


def zipf_texts(texts: list[str], count: int, s: float, seed: int = 0) -> list[str]:
    """`count` texts drawn from the distinct `texts` by a Zipf law of exponent `s` over ranks
    1..len (a random order of the texts; bounded, unlike numpy's zipf).

    >>> draws = zipf_texts(["a", "b", "c", "d"], 10_000, 1.1)
    >>> counts = sorted((draws.count(t) for t in set(draws)), reverse=True)
    >>> counts[0] > 2 * counts[-1]   # rank 1 ~ 2.1x as often as rank 2 ~ ... rank 4
    True
    """
    distinct = sorted(set(texts))
    random.Random(seed).shuffle(distinct)
    weights = np.arange(1, len(distinct) + 1, dtype=np.float64) ** -s
    rng = np.random.default_rng(seed)
    ranks = rng.choice(len(distinct), size=count, p=weights / weights.sum())
    return [distinct[r] for r in ranks]


def cache_counts(url: str) -> tuple[float, float]:
    """(hits, misses) textserve_cache_requests_total says now, over every model."""
    found = {"hit": 0.0, "miss": 0.0}
    for family in text_string_to_metric_families(fetch(url)):
        for sample in family.samples:
            result = sample.labels.get("result", "")
            if sample.name == "textserve_cache_requests_total" and result in found:
                found[result] += float(sample.value)
    return found["hit"], found["miss"]


def measure(args: argparse.Namespace, pool: RequestPool, extra: list[str]) -> dict[str, Any]:
    """One server (`extra` flags), one closed-loop step; its summary and hit rate."""
    server_args = ["--workers", str(args.workers), *extra, *args.server_arg]
    with start_server(args.repository, args.model, server_args) as server:
        assert server.metrics_url is not None
        url = server.metrics_url

        async def probe() -> tuple[float, float]:
            return await asyncio.to_thread(cache_counts, url)

        raw, samples = asyncio.run(
            closed_loop(
                server.address,
                pool,
                args.concurrency,
                warmup=args.warmup,
                duration=args.duration,
                probe=probe,
                connections=args.connections,
            )
        )
    step = summarize(raw, os.cpu_count() or 1)
    (hits0, misses0), (hits1, misses1) = samples
    looked_up = (hits1 - hits0) + (misses1 - misses0)
    step["cache_hit_rate"] = (hits1 - hits0) / looked_up if looked_up else None
    step["server_args"] = server_args
    return step


def run(args: argparse.Namespace) -> dict[str, Any]:
    texts = load_texts(args.texts)
    drawn = zipf_texts(texts, args.requests, args.zipf, seed=args.seed)
    model = args.model or ""
    payloads = [_v1_request([t], model) for t in drawn]
    pool = RequestPool("v1", METHODS["v1"], 1, payloads)
    # Rounds of off then on, interleaved: on a shared machine the load changes by the minute,
    # and a ratio of medians over rounds says more than one pair of steps.
    rounds = []
    for _ in range(args.rounds):
        rounds.append(
            {
                "off": measure(args, pool, []),
                "on": measure(args, pool, ["--cache-size", args.cache_size]),
            }
        )
    off, on = _median(rounds, "off"), _median(rounds, "on")
    version = find_version(args.repository, args.model) if args.model else None
    return {
        "workload": {
            "texts": len(set(texts)),
            "requests": args.requests,
            "distinct_in_requests": len(set(drawn)),
            "zipf_s": args.zipf,
            "concurrency": args.concurrency,
            "duration_s": args.duration,
            "cache_size": args.cache_size,
        },
        "model_version": None if version is None else str(version),
        "machine": describe_machine(),
        "off": off,
        "on": on,
        "speedup": on["throughput_texts_per_s"] / off["throughput_texts_per_s"],
        "p99_ratio": on["latency_ms"]["p99"] / off["latency_ms"]["p99"],
        "rounds": rounds,
        "round_speedups": [
            r["on"]["throughput_texts_per_s"] / r["off"]["throughput_texts_per_s"] for r in rounds
        ],
        "round_p99_ratios": [
            r["on"]["latency_ms"]["p99"] / r["off"]["latency_ms"]["p99"] for r in rounds
        ],
    }


def _median(rounds: list[dict[str, Any]], arm: str) -> dict[str, Any]:
    """The median of the rounds' throughput, latency percentiles and hit rate for `arm`."""
    steps = [r[arm] for r in rounds]
    rates = [s["cache_hit_rate"] for s in steps if s["cache_hit_rate"] is not None]
    return {
        "throughput_texts_per_s": float(np.median([s["throughput_texts_per_s"] for s in steps])),
        "latency_ms": {
            q: float(np.median([s["latency_ms"][q] for s in steps])) for q in ("p50", "p99")
        },
        "cache_hit_rate": float(np.median(rates)) if rates else None,
        "errors": sum(sum(s["errors"].values()) for s in steps),
    }


def line(name: str, step: dict[str, Any]) -> str:
    rate = step.get("cache_hit_rate")
    return (
        f"cache {name:3}  {step['throughput_texts_per_s']:8.0f} texts/s  "
        f"p50 {step['latency_ms']['p50']:7.2f} ms  p99 {step['latency_ms']['p99']:7.2f} ms  "
        f"hit rate {'-' if rate is None else f'{rate:.1%}'}  errors {step['errors'] or 0}"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m textserve.bench.cache", description=__doc__)
    parser.add_argument("--repository", type=Path, default=Path("models"))
    parser.add_argument("--model", default="default")
    parser.add_argument("--texts", type=Path, default=Path("runs/default"),
                        help="a run dir (its test.jsonl) or a JSONL file of texts")  # fmt: skip
    parser.add_argument("--zipf", type=float, default=1.1, help="the Zipf exponent s")
    parser.add_argument("--requests", type=int, default=200_000,
                        help="requests drawn (one text each), sent round-robin")  # fmt: skip
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--workers", default="1", help="the servers' --workers")
    parser.add_argument("--duration", type=float, default=15.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--cache-size", default="64MiB")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of off then on; the report gives the medians")  # fmt: skip
    parser.add_argument("--server-arg", action="append", default=[],
                        help="one more flag for both servers (repeat)")  # fmt: skip
    parser.add_argument("--output", type=Path, default=None, help="write the JSON report here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    for number, pair in enumerate(report["rounds"], 1):
        print(f"round {number}: {line('off', pair['off'])}")
        print(f"round {number}: {line('on', pair['on'])}")
    print(f"median:  {line('off', report['off'])}")
    print(f"median:  {line('on', report['on'])}")
    speedups = ", ".join(f"{x:.2f}" for x in report["round_speedups"])
    print(
        f"cache on / off: {report['speedup']:.2f}x the throughput (rounds: {speedups}), "
        f"{report['p99_ratio']:.2f}x the p99 ({report['workload']['distinct_in_requests']} "
        f"distinct texts in {args.requests} requests, Zipf s={args.zipf}, "
        f"{args.concurrency} callers)"
    )
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
