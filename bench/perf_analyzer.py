"""Load-test a running textserve with NVIDIA's perf_analyzer over the Open Inference Protocol.

A second load generator, independent of ``textserve bench``: Triton's own C++ client drives
the KServe v2 gRPC API with real texts and reports throughput and p50/p90/p95/p99 latency per
concurrency level, plus the server-side queue/compute split it reads from ModelStatistics.

    python -m textserve.bench.perf_analyzer --url 127.0.0.1:50051 --model default \\
        --texts runs/<run>/test.jsonl --concurrency 1,2,4,8 --output bench/results
    python -m textserve.bench.perf_analyzer --repository models --model default   # starts a server
    python -m textserve.bench.perf_analyzer --repository models --concurrency 1,128 \\
        --request-rates half-peak

``--request-rates`` adds open-loop levels: Poisson arrivals at a fixed rate (requests/s), or
``half-peak`` for half the highest throughput of the concurrency sweep just run. The summary
line then compares p99 there with p50 at concurrency 1, measured by a C++ client whose own
latency tail is far shorter than a Python asyncio load generator's on a small machine.
``--floor`` then drives the model-less echo server (textserve.bench.echo) at concurrency 1 and
the same rates, for the same ratio with no model, batching or textserve in the way.

Setup is idempotent (``--setup-only`` does just that): the perf_analyzer that loads on glibc
2.36 is the one inside the tritonclient 2.51.0 wheel (newer ones need glibc 2.38), so that
wheel is downloaded with ``pip download --no-deps`` (never installed: it pins old protobuf and
numpy) and the binary extracted into .tools/perf_analyzer/, next to libcudart.so.12 from
nvidia-cuda-runtime-cu12 (linked in, though no GPU is used); libb64 comes from apt.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import json
import shlex
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

# Setting the tool up and running one level are modules of their own; these names are
# ensure_perf_analyzer is re-exported from here.
from textserve.bench.perf_analyzer_levels import measure_level
from textserve.bench.perf_analyzer_setup import DEFAULT_TOOLS, ensure_perf_analyzer

LATENCY_COLUMNS = ("p50 latency", "p90 latency", "p95 latency", "p99 latency")
SERVER_COLUMNS = ("Server Queue", "Server Compute Input", "Server Compute Infer")


def load_texts(path: Path, limit: int) -> list[str]:
    """Up to ``limit`` non-empty texts from JSONL (field "text"), CSV (column "text") or lines."""
    texts: list[str] = []
    with path.open(encoding="utf-8", newline="") as handle:
        if path.suffix == ".jsonl":
            rows: Iterable[str] = (json.loads(line)["text"] for line in handle if line.strip())
        elif path.suffix == ".csv":
            rows = (row["text"] for row in csv.DictReader(handle))
        else:
            rows = (line.rstrip("\n") for line in handle)
        for text in rows:
            if text.strip():
                texts.append(text)
            if len(texts) == limit:
                break
    if not texts:
        raise ValueError(f"{path} holds no texts (JSONL needs a 'text' field, CSV a 'text' column)")
    return texts


def write_input_data(texts: Sequence[str], path: Path) -> Path:
    """perf_analyzer's --input-data JSON: one TEXT tensor of shape [1] (the dims) per text.

    With the model's max_batch_size > 0 perf_analyzer adds the batch dimension, so each
    request carries TEXT of shape [batch, 1], taking the texts round-robin.
    """
    data = {"data": [{"TEXT": {"content": [text], "shape": [1]}} for text in texts]}
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return path


def perf_analyzer_command(
    binary: Path,
    *,
    url: str,
    model: str,
    concurrency: int | None = None,
    request_rate: float | None = None,
    input_data: Path,
    csv_path: Path,
    request_count: int,
    batch_size: int = 1,
    stability: int = 25,
    percentile: int | None = None,
    protocol: str = "grpc",
    verbose: bool = False,
) -> list[str]:
    """The perf_analyzer command line for one level over `protocol` (grpc, or http: KServe v2
    REST): `concurrency` callers (closed loop) or Poisson arrivals at `request_rate`
    requests/s (open loop)."""
    if (concurrency is None) == (request_rate is None):
        raise ValueError("give exactly one of concurrency and request_rate")
    if request_rate is not None:
        load = ["--request-rate-range", f"{request_rate:g}:{request_rate:g}"]
        load += ["--request-distribution", "poisson"]
    else:
        load = ["--concurrency-range", f"{concurrency}:{concurrency}"]
    return [
        str(binary),
        "-m",
        model,
        "-u",
        url,
        "-i",
        protocol,
        "-b",
        str(batch_size),
        "--input-data",
        str(input_data),
        *load,
        # count_windows: each window holds a number of requests, not a stretch of time, which
        # keeps windows comparable on a noisy, shared 2-core machine.
        "--measurement-mode",
        "count_windows",
        "--measurement-request-count",
        str(request_count),
        # Stable when three windows in a row agree within this many per cent; 25 rather
        # than perf_analyzer's 10 because CPU neighbours make p95 jump between windows.
        "--stability-percentage",
        str(stability),
        "-f",
        str(csv_path),
        # Stabilize on this latency percentile instead of the average; the CSV reports
        # p50/p90/p95/p99 either way.
        *(["--percentile", str(percentile)] if percentile else []),
        # -v prints every window's throughput: the spread reported when a level is unstable.
        *(["-v"] if verbose else []),
    ]


def parse_report(csv_path: Path) -> dict[str, float]:
    """Throughput (texts/s) and latencies (ms) of perf_analyzer's CSV row (µs in the file)."""
    with csv_path.open(newline="") as handle:
        (row,) = list(csv.DictReader(handle))
    load = (
        ("concurrency", "Concurrency") if "Concurrency" in row else ("request_rate", "Request Rate")
    )
    report = {load[0]: float(row[load[1]]), "throughput": float(row["Inferences/Second"])}
    for column in LATENCY_COLUMNS + SERVER_COLUMNS:
        key = column.lower().replace(" latency", "").replace(" ", "_") + "_ms"
        if column in row or column in LATENCY_COLUMNS:  # no server columns: a server that
            report[key] = float(row[column]) / 1000.0  # counts nothing (the echo server)
    return report


def format_table(reports: Sequence[dict[str, float]]) -> str:
    """A Markdown table of the reports, ready for the README; a level whose windows never
    agreed says so, with their spread."""
    lines = [
        "| load | texts/s | p50 ms | p90 ms | p95 ms | p99 ms "
        "| server queue ms | server infer ms |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in reports:
        load = (
            f"c={r['concurrency']:.0f}"
            if "concurrency" in r
            else f"{r['request_rate']:.0f}/s Poisson"
        )
        if "spread_pct" in r:  # figures of windows that never agreed (see measure_level)
            load += f" **unstable** (windows ±{r['spread_pct'] / 2:.0f}%)"
        lines.append(
            f"| {load} | {r['throughput']:.1f} | {r['p50_ms']:.2f} | "
            f"{r['p90_ms']:.2f} | {r['p95_ms']:.2f} | {r['p99_ms']:.2f} | "
            f"{_ms(r.get('server_queue_ms'))} | {_ms(r.get('server_compute_infer_ms'))} |"
        )
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


@contextlib.contextmanager
def local_server(
    repository: Path,
    model: str,
    log_path: Path,
    extra: Sequence[str] = (),
    timeout: float = 300,
    http: dict[str, str] | None = None,
) -> Iterator[str]:
    """`textserve serve` on 127.0.0.1 (a free port) for the run, its output in `log_path`;
    yields its address once it is SERVING (its --ready-file); SIGTERM (the graceful drain) at
    the end, killed if it does not stop. With `http` (a dict) the HTTP port is on too (a free
    port), its host:port put in http["http"]."""
    from textserve.bench.process import ServerStartError, spawn

    command = [
        *(sys.executable, "-m", "textserve.cli", "serve", "--repository", str(repository)),
        *("--model", model, "--listen", "127.0.0.1:0"),
        *(("--http-port", "0") if http is not None else ("--metrics-port", "off")),
        *("--workers", "1", *extra),  # one process unless `extra` says --workers N
    ]
    try:
        with spawn(command, timeout=timeout, log=log_path, stop_timeout=60) as server:
            if http is not None and server.metrics_url is not None:
                http["http"] = server.metrics_url.removeprefix("http://").removesuffix("/metrics")
            yield server.address
    except ServerStartError as exc:
        raise RuntimeError(f"textserve serve did not start; see {log_path}\n{exc}") from None


def default_texts() -> Path:
    """The test split of the newest training run: real held-out texts."""
    runs = sorted(Path("runs").glob("*/test.jsonl"), key=lambda p: p.stat().st_mtime)
    if not runs:
        raise SystemExit("no runs/*/test.jsonl found: pass --texts FILE (JSONL, CSV or lines)")
    return runs[-1]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="127.0.0.1:50051", help="textserve's gRPC host:port")
    parser.add_argument(
        "--repository", type=Path, help="start `textserve serve` on this repository instead"
    )
    parser.add_argument("--server-args", default="", help="more `textserve serve` flags")
    parser.add_argument("--model", default="default")
    parser.add_argument("--texts", type=Path, help="JSONL/CSV/lines of real texts")
    parser.add_argument("--num-texts", type=int, default=500, help="texts to cycle through")
    parser.add_argument("--concurrency", default="1,2,4,8", help="comma-separated levels")
    parser.add_argument(
        "--request-rates",
        default="",
        help="comma-separated Poisson rates (requests/s) after the sweep; 'half-peak' is half "
        "the sweep's highest throughput",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="then drive the model-less echo server at concurrency 1 and the same rates: the "
        "transport's own tail ratio",
    )
    parser.add_argument(
        "--workers",
        default="",
        help="with --repository: comma-separated `textserve serve --workers` counts, one server "
        "each in turn, compared with the first at each concurrency level (e.g. 1,2)",
    )
    parser.add_argument(
        "--http",
        action="store_true",
        help="with --repository: drive the same server over HTTP too (perf_analyzer -i http, "
        "KServe v2 REST) at the same levels, and compare it with gRPC",
    )
    parser.add_argument("--batch-size", type=int, default=1, help="texts per request")
    parser.add_argument("--request-count", type=int, default=300, help="requests per window")
    parser.add_argument("--stability", type=int, default=25, help="allowed variation, %%")
    parser.add_argument("--percentile", type=int, help="stabilize on this percentile, not mean")
    parser.add_argument("--level-timeout", type=float, default=600, help="seconds per level")
    parser.add_argument("--output", type=Path, default=Path("bench/results"))
    parser.add_argument("--tools", type=Path, default=DEFAULT_TOOLS)
    parser.add_argument("--setup-only", action="store_true", help="install perf_analyzer, exit")
    args = parser.parse_args(argv)
    counts: list[int | None] = [None]
    if args.workers.strip():
        if args.repository is None:
            parser.error("--workers needs --repository: the script starts one server per count")
        try:
            numbers = [int(n) for n in args.workers.split(",") if n.strip()]
        except ValueError:
            parser.error(f"--workers: expected counts like 1,2, got {args.workers!r}")
        if not numbers or min(numbers) < 1:
            parser.error(f"--workers: counts must be at least 1, got {args.workers!r}")
        counts = list(numbers)

    binary = ensure_perf_analyzer(args.tools)
    if args.setup_only:
        print(binary)
        return 0
    args.output.mkdir(parents=True, exist_ok=True)
    for stale in args.output.glob("perf_analyzer_*.csv"):  # a previous run's levels
        stale.unlink()
    texts = load_texts(args.texts or default_texts(), args.num_texts)
    input_data = write_input_data(texts, args.output / "perf_analyzer_input.json")
    if args.repository is None:
        return sweep(binary, args, input_data, [(None, lambda: contextlib.nullcontext(args.url))])
    repository, extra = args.repository, shlex.split(args.server_args)
    if args.http:
        args.http_address = {}

    def server(count: int | None) -> contextlib.AbstractContextManager[str]:
        if count is None:
            log = args.output / "perf_analyzer_server.log"
            http = getattr(args, "http_address", None)
            return local_server(repository, args.model, log, extra, http=http)
        log = args.output / f"perf_analyzer_server_w{count}.log"
        return local_server(repository, args.model, log, [*extra, "--workers", str(count)])

    return sweep(binary, args, input_data, [(n, functools.partial(server, n)) for n in counts])


def sweep(
    binary: Path,
    args: argparse.Namespace,
    input_data: Path,
    servers: Sequence[tuple[int | None, Callable[[], contextlib.AbstractContextManager[str]]]],
) -> int:
    """perf_analyzer at each level against each server in turn (started one at a time: a
    `--workers N` count, or None for the one server); the tables on stdout, the figures in
    JSON. With several worker counts, a line per closed-loop level compares each count's
    throughput and p99 with the first's.

    With --floor, the model-less echo server (textserve.bench.echo) is then driven at
    concurrency 1 and at the same Poisson rates: its tail ratio is what the transport and this
    machine allow before any model or batching, the floor under textserve's."""
    levels: list[tuple[str, float | None]] = [
        ("concurrency", int(c)) for c in args.concurrency.split(",") if c.strip()
    ]
    levels += [("request_rate", r) for r in _rates(args.request_rates)]
    per_count: dict[int, list[dict[str, float]]] = {}
    first: list[dict[str, float]] | None = None
    for count, start in servers:
        prefix = "" if count is None else f"w{count}_"
        http_reports: list[dict[str, float]] | int = []
        with start() as url:
            reports = run_levels(binary, args, url, input_data, levels, prefix)
            http_url = getattr(args, "http_address", {}).get("http")
            if count is None and http_url is not None and not isinstance(reports, int):
                http_reports = run_levels(
                    binary, args, http_url, input_data, levels, "http_", protocol="http"
                )
        if isinstance(reports, int):
            return reports
        if isinstance(http_reports, int):
            return http_reports
        if http_reports:
            print("textserve over HTTP (KServe v2 REST, the same server):")
            print(format_table(http_reports))
            for line in protocol_comparison(reports, http_reports):
                print(line)
        first = reports if first is None else first
        name = "textserve" if count is None else f"textserve --workers {count}"
        if count is not None:
            per_count[count] = reports
            print(f"{name}:")
        print(format_table(reports))
        print_ratio(name, tail_ratio(reports))
    assert first is not None
    result: dict[str, object] = {"textserve": first}
    if http_reports:
        result["http"] = http_reports
    if per_count:
        result["workers"] = {str(n): reports for n, reports in per_count.items()}
        for line in workers_comparison(per_count):
            print(line)
    if args.floor:
        from textserve.bench.process import echo_command, start_process

        rates = [("request_rate", r["request_rate"]) for r in first if "request_rate" in r]
        echo_levels: list[tuple[str, float | None]] = [("concurrency", 1), *rates]
        with start_process(echo_command()) as echo:
            floor = run_levels(binary, args, echo.address, input_data, echo_levels, "echo_")
        if isinstance(floor, int):
            return floor
        result["echo"] = floor
        print("model-less echo server (the transport's floor), same load generator and rates:")
        print(format_table(floor))
        print_ratio("echo", tail_ratio(floor))
    summary = args.output / "perf_analyzer.json"
    summary.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {summary}")
    return 0


def protocol_comparison(
    grpc: Sequence[dict[str, float]], http: Sequence[dict[str, float]]
) -> list[str]:
    """For each closed-loop level: HTTP's throughput against gRPC's, and both p50/p99."""
    lines = []
    for one, other in zip(grpc, http, strict=False):
        if "concurrency" not in one or one["throughput"] <= 0:
            continue
        lines.append(
            f"c={one['concurrency']:.0f}: http / grpc = {other['throughput']:,.0f} / "
            f"{one['throughput']:,.0f} texts/s = {other['throughput'] / one['throughput']:.2f}x; "
            f"p50 {other['p50_ms']:.2f} vs {one['p50_ms']:.2f} ms, "
            f"p99 {other['p99_ms']:.2f} vs {one['p99_ms']:.2f} ms"
            + (
                f", server CPU {other['server_cpu_us_per_text']:.0f} vs "
                f"{one['server_cpu_us_per_text']:.0f} µs per text"
                if "server_cpu_us_per_text" in one and "server_cpu_us_per_text" in other
                else ""
            )
        )
    return lines


def workers_comparison(per_count: dict[int, list[dict[str, float]]]) -> list[str]:
    """For each closed-loop level every count measured: each count's throughput and p99
    against the first count's (the ratio the scale-up target is about)."""
    counts = list(per_count)
    base = counts[0]
    lines = []
    for level in (r["concurrency"] for r in per_count[base] if "concurrency" in r):
        rows = {
            n: next((r for r in per_count[n] if r.get("concurrency") == level), None)
            for n in counts
        }
        one = rows[base]
        if one is None or one["throughput"] <= 0:
            continue
        for n in counts[1:]:
            other = rows[n]
            if other is None:
                continue
            lines.append(
                f"c={level:.0f}: --workers {n} / --workers {base} = "
                f"{other['throughput']:,.0f} / {one['throughput']:,.0f} texts/s = "
                f"{other['throughput'] / one['throughput']:.2f}x; "
                f"p99 {other['p99_ms']:.1f} vs {one['p99_ms']:.1f} ms"
            )
    return lines


def print_ratio(server: str, ratio: dict[str, float] | None) -> None:
    if ratio is not None:
        print(
            f"{server}: p99 at {ratio['request_rate']:.0f} requests/s (Poisson) / p50 at "
            f"concurrency 1: {ratio['p99_ms']:.2f} / {ratio['p50_ms']:.2f} ms = "
            f"{ratio['ratio']:.1f}x"
        )


def run_levels(
    binary: Path,
    args: argparse.Namespace,
    url: str,
    input_data: Path,
    levels: Sequence[tuple[str, float | None]],
    prefix: str = "",
    protocol: str = "grpc",
) -> list[dict[str, float]] | int:
    """perf_analyzer at each (kind, value) level; the parsed reports, or an exit status."""
    reports: list[dict[str, float]] = []
    for kind, value in levels:
        if value is None:  # half-peak
            peak = max((r["throughput"] for r in reports), default=0.0)
            if peak <= 0:
                sys.stderr.write("--request-rates half-peak needs a concurrency sweep first\n")
                return 2
            value = round(peak / 2 / args.batch_size, 1)
        tag = f"c{value:g}" if kind == "concurrency" else f"r{value:g}"
        csv_path = args.output / f"perf_analyzer_{prefix}{tag}.csv"
        command = functools.partial(
            perf_analyzer_command,
            binary,
            url=url,
            model=args.model,
            concurrency=int(value) if kind == "concurrency" else None,
            request_rate=value if kind == "request_rate" else None,
            input_data=input_data,
            csv_path=csv_path,
            batch_size=args.batch_size,
            percentile=args.percentile,
            protocol=protocol,
            verbose=True,
        )
        metrics = getattr(args, "http_address", {}).get("http")  # --http: the server's /metrics
        before = _server_cpu(metrics)
        measured = measure_level(command, args, tag)
        if isinstance(measured, int):
            return measured
        report = parse_report(csv_path)
        if measured is not None:
            report["spread_pct"], report["windows"] = measured
        after = _server_cpu(metrics)
        if before is not None and after is not None and after[1] > before[1]:
            # every request of the level, warm-up windows included, over all its server CPU
            texts = (after[1] - before[1]) * args.batch_size
            report["server_cpu_us_per_text"] = (after[0] - before[0]) / texts * 1e6
        reports.append(report)
    return reports


def _server_cpu(address: str | None) -> tuple[float, float] | None:
    """(process CPU seconds, requests answered) from the server's /metrics; None without."""
    if address is None:
        return None
    import urllib.request

    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    cpu = requests = 0.0
    for line in text.splitlines():
        if line.startswith("process_cpu_seconds_total "):
            cpu = float(line.split()[1])
        elif line.startswith("textserve_requests_total{"):
            requests += float(line.rsplit(" ", 1)[1])
    return cpu, requests


def _rates(text: str) -> list[float | None]:
    """The --request-rates list; None stands for 'half-peak'."""
    rates: list[float | None] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if part == "half-peak":
            rates.append(None)
            continue
        try:
            rate = float(part)
        except ValueError:
            raise SystemExit(f"--request-rates: {part!r} is not a number or 'half-peak'") from None
        if rate <= 0:
            raise SystemExit(f"--request-rates: {part!r} must be positive")
        rates.append(rate)
    return rates


def tail_ratio(reports: Sequence[dict[str, float]]) -> dict[str, float] | None:
    """p99 at the first open-loop rate over p50 at concurrency 1, when both were measured."""
    one = next((r for r in reports if r.get("concurrency") == 1), None)
    rate = next((r for r in reports if "request_rate" in r), None)
    if one is None or rate is None or one["p50_ms"] <= 0:
        return None
    return {
        "request_rate": rate["request_rate"],
        "p99_ms": rate["p99_ms"],
        "p50_ms": one["p50_ms"],
        "ratio": rate["p99_ms"] / one["p50_ms"],
    }


if __name__ == "__main__":
    shutil.which("ldconfig") or sys.exit("ldconfig not found: perf_analyzer needs a Linux host")
    sys.exit(main())
