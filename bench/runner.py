"""The standard benchmark: a closed-loop concurrency sweep, multi-text requests, an open-loop
Poisson sweep, the server with batching off, a trivial-model server (load generator headroom)
and the in-process ceilings, all in one run so that ratios are honest on a noisy machine.

    results = run_benchmark(BenchConfig(repository=Path("models"), model="default"))
    results["efficiency"], results["targets"]

Everything runs sequentially: one load at a time on a machine whose cores the server, the load
generator and the ceilings all share.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from textserve.bench import ceilings, loadgen, scrape
from textserve.bench.describe import (
    default_run_dir,
    describe_machine,
    describe_model,
    find_version,
)
from textserve.bench.process import BenchServer, echo_command, start_process, start_server
from textserve.bench.report import evaluate_targets
from textserve.bench.requests import RequestPool, build_requests, load_texts
from textserve.bench.stats import RawStep, summarize
from textserve.service.config import usable_cpus

Log = Callable[[str], None]


@dataclass(frozen=True)
class BenchConfig:
    repository: Path = Path("models")  # the model repository the server (and ceilings) use
    model: str = "default"
    server: str | None = None  # host:port of a running server; None: start one per phase
    metrics_url: str | None = None  # that server's /metrics (CPU, batch sizes); None: no figures
    api: str = "v1"  # v1 (Classify), oip (inference ModelInfer) or stream (ClassifyStream)
    texts: Path | None = None  # a run dir (its test.jsonl) or JSONL; default runs/<model>
    run_dir: Path | None = None  # checkpoint for the PyTorch ceiling; default runs/<model>
    concurrency: tuple[int, ...] = (1, 4, 16, 64, 128, 256)  # closed-loop callers per step
    texts_per_request: int = 1
    multi_texts_per_request: int = 16  # a second closed sweep with this many texts; 0: off
    multi_concurrency: tuple[int, ...] = (4, 16)  # its callers (x16 texts: 64, 256 in flight)
    open_loop: tuple[float, ...] = (0.5, 0.9, 1.5)  # Poisson rates as fractions of the peak
    rates: tuple[float, ...] = ()  # or absolute rates (requests/s), replacing open_loop
    warmup: float = 1.0  # seconds per step before measuring
    duration: float = 5.0  # seconds measured per step
    timeout: float = 10.0  # per request
    batching_off_concurrency: int = 64  # closed step against --max-batch-size 1; 0: off
    # Tracing's cost: closed steps at this concurrency against a server without tracing and one
    # exporting to an OTLP sink in this process at trace_sample_ratio, side by side; 0: off.
    tracing_concurrency: int = 128
    trace_sample_ratio: float = 0.1
    loadgen_check: bool = True  # the trivial-model server at the peak's concurrency
    ceilings: bool = True  # in-process onnxruntime (and PyTorch, when installed)
    torch: bool = True
    intra_op_threads: int = 0  # server and in-process onnxruntime; 0: the usable CPUs
    server_args: tuple[str, ...] = ()  # more `textserve serve` flags
    seed: int = 0
    # --workers side by side: a server per count, closed loop at workers_concurrency callers
    # over `connections` connections (the same for every count; 0: 2 per worker of the largest)
    workers: tuple[int, ...] = ()
    workers_concurrency: tuple[int, ...] = (64, 128)
    connections: int = 0
    # --api stream: a closed step of `concurrency` C is min(streams, C) ClassifyStream calls
    # with C // streams messages in flight each; the same server also answers unary Classify
    # at unary_concurrency callers ("unary" rows), so unary and stream compare in one run
    streams: int = 4
    unary_concurrency: tuple[int, ...] = (128,)


class _Bench:
    def __init__(self, config: BenchConfig, log: Log) -> None:
        self.config = config
        self.log = log
        self.cpus = usable_cpus()
        self.steps: list[dict[str, Any]] = []
        self.providers: dict[str, str] = {}

    def pool(self, texts: list[str], per_request: int, model: str) -> RequestPool:
        return build_requests(texts, self.config.api, per_request, model, seed=self.config.seed)

    def step(
        self,
        server: BenchServer,
        label: str,
        pool: RequestPool,
        model: str,
        *,
        concurrency: int | None = None,
        rate: float | None = None,
        connections: int = 1,
        workers: int = 1,
    ) -> dict[str, Any]:
        """One measured step (closed loop with `concurrency`, or open loop at `rate`; over
        `connections` spread evenly over a server's `workers`)."""
        cfg = self.config
        url = server.metrics_url

        pid = server.pid

        async def probe() -> scrape.ServerSample | None:
            if url is not None:
                return await asyncio.to_thread(scrape.scrape, url, model)
            if pid is not None:  # no metrics (the echo server): its CPU from /proc
                return scrape.ServerSample(time.perf_counter(), scrape.process_cpu_seconds(pid))
            return None

        raw, samples, mode, streams = self._load(
            server, pool, probe, concurrency, rate, connections, workers
        )
        result: dict[str, Any] = {
            "server": label,
            "mode": mode,
            "api": cfg.api,
            "concurrency": concurrency,
            "rate_requests_per_s": rate,
            "texts_per_request": pool.texts_per_request,
            "connections": connections,
            **summarize(raw, self.cpus),
        }
        if streams is not None and concurrency is not None:
            result["api"] = "stream"
            result["streams"] = streams
            result["inflight_per_stream"] = concurrency // streams
        before, after = [*samples, None, None][:2]
        if before is not None and after is not None:
            if url is None:  # count the texts the load generator saw answered instead
                before = dataclasses.replace(before, items=0.0)
                after = dataclasses.replace(after, items=float(raw.texts))
            result["server_metrics"] = scrape.server_delta(before, after, self.cpus)
            self.providers.update(after.providers)
        machine = result["machine_cpu_share"]
        server_share = (result.get("server_metrics") or {}).get("cpu_share")
        if machine is not None and server_share is not None:
            # CPU taken by processes other than the server and the load generator: on a shared
            # machine this is what makes two runs differ
            result["others_cpu_share"] = max(
                0.0, machine - server_share - result["loadgen"]["cpu_share"]
            )
        self.steps.append(result)
        self.log(_one_line(result))
        return result

    def _load(
        self,
        server: BenchServer,
        pool: RequestPool,
        probe: loadgen.Probe,
        concurrency: int | None,
        rate: float | None,
        connections: int,
        workers: int,
    ) -> tuple[RawStep, list[Any], str, int | None]:
        """Run one step's load: streams, a closed loop or an open loop (raw, samples, mode,
        streams)."""
        cfg = self.config
        streams = None
        if concurrency is not None and pool.api == "stream":
            streams = min(cfg.streams, concurrency)
            raw, samples = asyncio.run(
                loadgen.stream_loop(
                    server.address, pool, streams, concurrency // streams, warmup=cfg.warmup,
                    duration=cfg.duration, timeout=cfg.timeout, probe=probe,
                    connections=connections, workers=workers,
                )
            )  # fmt: skip
            mode = "closed"
        elif concurrency is not None:
            raw, samples = asyncio.run(
                loadgen.closed_loop(
                    server.address, pool, concurrency, warmup=cfg.warmup,
                    duration=cfg.duration, timeout=cfg.timeout, probe=probe,
                    connections=connections, workers=workers,
                )
            )  # fmt: skip
            mode = "closed"
        else:
            assert rate is not None
            raw, samples = asyncio.run(
                loadgen.open_loop(
                    server.address, pool, rate, warmup=cfg.warmup, duration=cfg.duration,
                    timeout=cfg.timeout, seed=cfg.seed, probe=probe, connections=connections,
                    workers=workers, http_pool=loadgen.http_pool(None, workers),
                )
            )  # fmt: skip
            mode = "open"
        return raw, samples, mode, streams

    @contextlib.contextmanager
    def server(self, repository: Path, model: str, extra: Sequence[str]) -> Iterator[BenchServer]:
        cfg = self.config
        if cfg.server is not None:
            yield BenchServer(cfg.server, cfg.metrics_url, None, [])
            return
        # one process unless --server-args or `extra` say otherwise (the last --workers wins)
        args = ["--workers", "1", "--intra-op-threads", str(cfg.intra_op_threads)]
        if cfg.api == "stream":  # every message the load generator keeps in flight is read
            inflight = max(c // min(cfg.streams, c) for c in cfg.concurrency)
            args += ["--stream-max-inflight", str(inflight)]
        args += [*cfg.server_args, *extra]
        with start_server(repository, model, args) as server:
            self.log(f"server: {' '.join(server.command[2:])} (pid {server.pid})")
            yield server


def _one_line(step: dict[str, Any]) -> str:
    load = (
        f"c={step['concurrency']}"
        if step["mode"] == "closed"
        else f"rate={step['rate_requests_per_s']:.0f}/s"
    )
    if step.get("streams"):
        load += f" ({step['streams']}x{step['inflight_per_stream']})"
    lat = step["latency_ms"]
    srv = step.get("server_metrics") or {}
    batch = srv.get("mean_batch_size")
    return (
        f"  {step['server']:<12} {step['mode']:<6} {load:<14} x{step['texts_per_request']:<3} "
        f"{step['throughput_texts_per_s']:8.0f} texts/s  p50 {lat['p50']:7.1f} ms  "
        f"p99 {lat['p99']:7.1f} ms  batch {batch if batch is None else round(batch, 1)}  "
        f"errors {sum(step['errors'].values())}"
    )


def _peak(steps: list[dict[str, Any]], server: str, per_request: int) -> dict[str, Any] | None:
    candidates = [
        s
        for s in steps
        if s["server"] == server and s["mode"] == "closed" and s["texts_per_request"] == per_request
    ]
    return max(candidates, key=lambda s: s["throughput_texts_per_s"], default=None)


def run_benchmark(config: BenchConfig, log: Log = print) -> dict[str, Any]:
    """Run the whole benchmark; returns every figure (see report.write_results for files)."""
    cfg = config
    started = time.time()
    bench = _Bench(cfg, log)
    machine = describe_machine()
    version_dir = find_version(cfg.repository, cfg.model)
    if cfg.server is None and version_dir is None:
        raise FileNotFoundError(
            f"no complete version of model {cfg.model!r} in {cfg.repository}: run `make serve` "
            "(or `textserve setup-default`) first, or pass --repository/--model"
        )
    run_dir = cfg.run_dir or default_run_dir(version_dir, cfg.model)
    texts = load_texts(cfg.texts or run_dir)
    log(f"{len(texts)} texts; model {cfg.model} ({version_dir}); api {cfg.api}; {bench.cpus} CPUs")
    main_pool = bench.pool(texts, cfg.texts_per_request, cfg.model)

    # 1. the server as configured: closed sweep, multi-text requests, open loop
    peak = _configured_steps(bench, texts, main_pool)

    # 2. the same server with batching off
    if cfg.batching_off_concurrency and cfg.server is None:
        with bench.server(cfg.repository, cfg.model, ["--max-batch-size", "1"]) as server:
            bench.step(
                server, "batching-off", main_pool, cfg.model,
                concurrency=cfg.batching_off_concurrency,
            )  # fmt: skip

    # 2b. --workers side by side: the same load over the same connections, one server per count
    workers = _workers_steps(bench, main_pool) if cfg.workers and cfg.server is None else {}

    # 2b. tracing off vs on (exporting to a real OTLP endpoint), back to back
    tracing: dict[str, Any] = {}
    if cfg.tracing_concurrency and cfg.server is None:
        tracing = _tracing_cost(bench, main_pool)

    # 3. load generator headroom: a server whose model costs next to nothing
    loadgen_check: dict[str, Any] = {}
    if cfg.loadgen_check and cfg.server is None and version_dir is not None and peak is not None:
        loadgen_check = _loadgen_check(bench, version_dir, texts, peak)

    # 4. ceilings at the batch size the server reached
    ceiling_results = _ceilings(bench, version_dir, run_dir, texts) if cfg.ceilings else {}

    results: dict[str, Any] = {
        "command": None,  # filled in by the CLI
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
        "machine": {**machine, "load_average_end": os.getloadavg(), "providers": bench.providers},
        "model": describe_model(version_dir, run_dir),
        # `textserve serve` reads these as flag defaults: they shape the servers started here
        "server_environment": {k: v for k, v in os.environ.items() if k.startswith("TEXTSERVE_")},
        "steps": bench.steps,
        "loadgen_check": loadgen_check,
        "tracing": tracing,
        "ceilings": ceiling_results,
        "efficiency": _efficiency(bench.steps, ceiling_results),
        # --api stream: the same figure for the unary rows of the same server
        "efficiency_unary": _efficiency(bench.steps, ceiling_results, "unary"),
        "workers": workers,
        "duration_s": time.time() - started,
    }
    results["targets"] = evaluate_targets(results)
    return results


def _configured_steps(
    bench: _Bench, texts: list[str], main_pool: RequestPool
) -> dict[str, Any] | None:
    """The server as configured: the closed sweep, multi-text requests, the unary comparison of
    --api stream, the open loop; returns the closed-loop peak step."""
    cfg = bench.config
    with bench.server(cfg.repository, cfg.model, []) as server:
        for concurrency in cfg.concurrency:
            bench.step(server, "batching", main_pool, cfg.model, concurrency=concurrency)
        if cfg.multi_texts_per_request:
            multi_pool = bench.pool(texts, cfg.multi_texts_per_request, cfg.model)
            for concurrency in cfg.multi_concurrency:
                bench.step(server, "batching", multi_pool, cfg.model, concurrency=concurrency)
        if cfg.api == "stream":  # the same server, one text per unary call, for comparison
            unary_pool = build_requests(
                texts, "v1", cfg.texts_per_request, cfg.model, seed=cfg.seed
            )
            for concurrency in cfg.unary_concurrency:
                bench.step(server, "unary", unary_pool, cfg.model, concurrency=concurrency)
        peak = _peak(bench.steps, "batching", cfg.texts_per_request)
        rates = list(cfg.rates)
        if cfg.api == "stream":  # an open loop of stream messages is not built: closed only
            rates = []
        elif not rates and peak is not None:
            rates = [f * peak["throughput_requests_per_s"] for f in cfg.open_loop]
        for rate in rates:
            if rate > 0:
                bench.step(server, "batching", main_pool, cfg.model, rate=rate)
    return peak


def _workers_steps(bench: _Bench, pool: RequestPool) -> dict[str, Any]:
    """`textserve serve --workers N` for each N of the config, at the same callers over the
    same connections; returns the comparison at the largest concurrency (N vs the first)."""
    cfg = bench.config
    counts = list(dict.fromkeys(cfg.workers))
    connections = cfg.connections or 2 * max(counts)
    # --intra-op-threads 0 (the default): each worker takes its share of the CPUs
    for count in counts:
        with bench.server(cfg.repository, cfg.model, ["--workers", str(count)]) as server:
            for concurrency in cfg.workers_concurrency:
                bench.step(
                    server, f"workers-{count}", pool, cfg.model,
                    concurrency=concurrency, connections=connections, workers=count,
                )  # fmt: skip
    top = max(cfg.workers_concurrency)
    by_count = {
        s["server"]: s
        for s in bench.steps
        if s["server"].startswith("workers-") and s["concurrency"] == top
    }
    base = by_count.get(f"workers-{counts[0]}")
    out: dict[str, Any] = {"counts": counts, "connections": connections, "concurrency": top}
    for count in counts[1:]:
        step = by_count.get(f"workers-{count}")
        if base is None or step is None or not base["throughput_texts_per_s"]:
            continue
        out[str(count)] = {
            "throughput_ratio": step["throughput_texts_per_s"] / base["throughput_texts_per_s"],
            "p99_ms": [base["latency_ms"]["p99"], step["latency_ms"]["p99"]],
            "server_cpu_share": [
                (s.get("server_metrics") or {}).get("cpu_share") for s in (base, step)
            ],
            "machine_cpu_share": [base["machine_cpu_share"], step["machine_cpu_share"]],
        }
    return out


def _tracing_cost(bench: _Bench, pool: RequestPool) -> dict[str, Any]:
    """The same closed step against a server without tracing and one with --otlp-endpoint
    (a sink in this process) at the configured sampling ratio."""
    from textserve.bench.otlp_sink import otlp_sink

    cfg = bench.config
    ratio = f"{cfg.trace_sample_ratio:g}"
    label = f"tracing-{cfg.trace_sample_ratio * 100:g}%"
    steps: dict[str, Any] = {}
    with bench.server(cfg.repository, cfg.model, []) as server:
        steps["off"] = bench.step(
            server, "tracing-off", pool, cfg.model, concurrency=cfg.tracing_concurrency
        )
    with otlp_sink() as sink:
        extra = ["--otlp-endpoint", sink.endpoint, "--trace-sample-ratio", ratio]
        with bench.server(cfg.repository, cfg.model, extra) as server:
            steps["on"] = bench.step(
                server, label, pool, cfg.model, concurrency=cfg.tracing_concurrency
            )
        spans = sink.spans
    off, on = steps["off"], steps["on"]
    cost = {
        "sample_ratio": cfg.trace_sample_ratio,
        "concurrency": cfg.tracing_concurrency,
        "spans_received": spans,
        "throughput_change": on["throughput_texts_per_s"] / off["throughput_texts_per_s"] - 1,
        "p99_ms": {"off": off["latency_ms"]["p99"], "on": on["latency_ms"]["p99"]},
    }
    bench.log(
        f"  tracing at {ratio}: throughput {cost['throughput_change'] * 100:+.1f}%, p99 "
        f"{cost['p99_ms']['off']:.1f} -> {cost['p99_ms']['on']:.1f} ms, {spans} spans exported"
    )
    return cost


def _loadgen_check(
    bench: _Bench, version_dir: Path, texts: list[str], peak: dict[str, Any]
) -> dict[str, Any]:
    """At the peak's concurrency: a model-less echo server (the load generator's own ceiling on
    this machine) and textserve on a trivial model (the server's cost without the model)."""
    from textserve.bench.trivial import TRIVIAL_NAME, write_trivial_version

    concurrency = peak["concurrency"]
    per_request = bench.config.texts_per_request
    out: dict[str, Any] = {
        "concurrency": concurrency,
        "real_peak_texts_per_s": peak["throughput_texts_per_s"],
    }
    with start_process(echo_command()) as server:
        bench.log(f"server: model-less echo server (pid {server.pid})")
        pool = bench.pool(texts, per_request, "echo")
        echo = bench.step(server, "echo", pool, "echo", concurrency=concurrency)
        if bench.config.api == "stream":  # the transport's floor per unary call, same run
            unary = build_requests(texts, "v1", per_request, "echo", seed=bench.config.seed)
            for unary_concurrency in bench.config.unary_concurrency:
                step = bench.step(
                    server, "echo-unary", unary, "echo", concurrency=unary_concurrency
                )
                out["echo_unary_cpu_per_text_ms"] = (step.get("server_metrics") or {}).get(
                    "cpu_per_text_ms"
                )
    out["real_cpu_per_text_ms"] = (peak.get("server_metrics") or {}).get("cpu_per_text_ms")
    out["echo_cpu_per_text_ms"] = (echo.get("server_metrics") or {}).get("cpu_per_text_ms")
    out["echo_texts_per_s"] = echo["throughput_texts_per_s"]
    out["headroom"] = echo["throughput_texts_per_s"] / peak["throughput_texts_per_s"]
    out["loadgen_cpu_share_at_echo"] = echo["loadgen"]["cpu_share"]
    try:
        with tempfile.TemporaryDirectory(prefix="textserve-bench-") as scratch:
            write_trivial_version(version_dir, Path(scratch))
            pool = bench.pool(texts, per_request, TRIVIAL_NAME)
            with bench.server(Path(scratch), TRIVIAL_NAME, []) as server:
                trivial = bench.step(server, "trivial", pool, TRIVIAL_NAME, concurrency=concurrency)
        out["trivial_texts_per_s"] = trivial["throughput_texts_per_s"]
        out["trivial_cpu_per_text_ms"] = (trivial.get("server_metrics") or {}).get(
            "cpu_per_text_ms"
        )
    except ModuleNotFoundError as exc:
        out["trivial_skipped"] = f"{exc.name} is not installed (pip install 'textserve[train]')"
    return out


def _ceilings(
    bench: _Bench, version_dir: Path | None, run_dir: Path, texts: list[str]
) -> dict[str, Any]:
    cfg = bench.config
    if version_dir is None:
        return {"skipped": f"no local copy of model {cfg.model!r} in {cfg.repository}"}
    out: dict[str, Any] = {"onnxruntime": {}, "torch": {}}
    sizes = set()
    for server, per_request in [
        *(("batching", n) for n in {cfg.texts_per_request, cfg.multi_texts_per_request} - {0}),
        ("unary", cfg.texts_per_request),
    ]:
        peak = _peak(bench.steps, server, per_request)
        batch = (peak or {}).get("server_metrics", {}).get("mean_batch_size")
        if batch:
            sizes.add(max(1, round(batch)))
    out["onnxruntime_sorted"] = {}
    for size in sorted(sizes):
        for key, order in (("onnxruntime", "arrival"), ("onnxruntime_sorted", "length")):
            result = ceilings.onnxruntime_ceiling(
                version_dir, texts, size, intra_op_threads=cfg.intra_op_threads, order=order
            )
            out[key][str(size)] = result
            bench.log(
                f"  ceiling onnxruntime batch {size} ({order} order): "
                f"{result['texts_per_s']:.0f} texts/s, {result['cpu_per_text_ms']:.3f} ms "
                f"CPU/text, padding {result['padding_ratio']:.2f}"
            )
    if cfg.torch and sizes:
        size = max(sizes)
        result = ceilings.torch_ceiling(
            run_dir, version_dir, texts, size,
            threads=cfg.intra_op_threads or usable_cpus(),
        )  # fmt: skip
        out["torch"][str(size)] = result
        bench.log(
            f"  ceiling torch batch {size}: "
            + (result["skipped"] if "skipped" in result else f"{result['texts_per_s']:.0f} texts/s")
        )
    return out


def _efficiency(
    steps: list[dict[str, Any]], ceiling_results: dict[str, Any], server: str = "batching"
) -> dict[str, Any]:
    """in-process CPU per text / server CPU per text, at each texts-per-request's peak step."""
    out: dict[str, Any] = {}
    ort = ceiling_results.get("onnxruntime") or {}
    for per_request in sorted({s["texts_per_request"] for s in steps if s["server"] == server}):
        peak = _peak(steps, server, per_request)
        srv = (peak or {}).get("server_metrics") or {}
        batch, server_cpu = srv.get("mean_batch_size"), srv.get("cpu_per_text_ms")
        if not batch or not server_cpu:
            continue
        ceiling = ort.get(str(max(1, round(batch))))
        if ceiling is None:
            continue
        entry = out[str(per_request)] = {
            "concurrency": peak["concurrency"] if peak else None,
            "batch_size": round(batch),
            "server_cpu_per_text_ms": server_cpu,
            "server_padding_ratio": srv.get("padding_ratio"),
            "inprocess_cpu_per_text_ms": ceiling["cpu_per_text_ms"],
            "inprocess_padding_ratio": ceiling["padding_ratio"],
            # the acceptance figure: same texts, same batch size, in the order they come
            "ratio": ceiling["cpu_per_text_ms"] / server_cpu,
        }
        best = (ceiling_results.get("onnxruntime_sorted") or {}).get(str(round(batch)))
        if best is not None:
            # against batches of similar lengths (least padding): a stricter bound, since
            # the server's length bucketing pads more than a sorted batch and less than a
            # random one
            entry["inprocess_sorted_cpu_per_text_ms"] = best["cpu_per_text_ms"]
            entry["ratio_sorted"] = best["cpu_per_text_ms"] / server_cpu
    return out
