"""`textserve bench`: throughput and latency percentiles of a textserve server, next to its
ceilings (in-process onnxruntime and PyTorch, the server with batching off) measured in the
same run. By default it starts its own servers (127.0.0.1, free ports) on the model in
--repository; --server measures one already running instead.

Writes textserve_bench.json (every figure and the machine), .txt (the table) and .png
(latency percentiles against throughput) into --output. Exit status 0 whether or not the
targets are met (a benchmark measures); 2 on bad input.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from textserve.cli import CliError


def _ints(value: str) -> tuple[int, ...]:
    try:
        items = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {value!r}"
        ) from None
    if not items or min(items) < 1:
        raise argparse.ArgumentTypeError(f"expected integers of at least 1, got {value!r}")
    return items


def _floats(value: str) -> tuple[float, ...]:
    try:
        items = tuple(float(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {value!r}"
        ) from None
    if any(v <= 0 for v in items):
        raise argparse.ArgumentTypeError(f"expected positive numbers, got {value!r}")
    return items


def _add_target_arguments(target: argparse._ArgumentGroup) -> None:
    """What to measure: the server (started here or running), its model and API."""
    target.add_argument(
        "--repository", type=Path, default=Path("models"), help="model repository (default: models)"
    )
    target.add_argument("--model", default="default", help="model name (default: default)")
    target.add_argument("--server", help="HOST:PORT of a running server (default: start one)")
    target.add_argument("--metrics-url", help="that server's /metrics URL (for CPU and batches)")
    target.add_argument(
        "--api",
        choices=("v1", "oip", "stream"),
        default="v1",
        help="textserve.v1 Classify, KServe v2 ModelInfer, or textserve.v1 ClassifyStream "
        "(closed steps of --streams streams; unary rows beside them) (default: v1)",
    )
    target.add_argument(
        "--server-args",
        default="",
        help="more `textserve serve` flags, quoted, e.g. '--max-queue-delay-ms 5'",
    )
    target.add_argument(
        "--intra-op-threads",
        type=int,
        default=0,
        help="onnxruntime threads, server and in-process (0: the usable CPUs)",
    )


def _add_load_arguments(load: argparse._ArgumentGroup) -> None:
    """The load of the sweeps: texts, closed-loop callers, open-loop rates, step lengths."""
    load.add_argument(
        "--texts",
        type=Path,
        help="run dir (its test.jsonl) or JSONL with a 'text' field "
        "(default: the model's training run)",
    )
    load.add_argument(
        "--concurrency",
        type=_ints,
        default=(1, 4, 16, 64, 128, 256),
        help="closed-loop callers per step (default: 1,4,16,64,128,256)",
    )
    load.add_argument("--texts-per-request", type=int, default=1, help="(default: 1)")
    load.add_argument(
        "--multi-texts-per-request",
        type=int,
        default=16,
        help="a second sweep with this many texts per request; 0: off (16)",
    )
    load.add_argument(
        "--multi-concurrency",
        type=_ints,
        default=(4, 16),
        help="callers of that sweep (default: 4,16)",
    )
    load.add_argument(
        "--open-loop",
        type=_floats,
        default=(0.5, 0.9, 1.5),
        help="Poisson rates as fractions of the closed-loop peak (0.5,0.9,1.5)",
    )
    load.add_argument(
        "--rates",
        type=_floats,
        default=(),
        help="Poisson rates in requests/s instead of --open-loop",
    )
    load.add_argument("--warmup", type=float, default=1.0, help="seconds per step (1)")
    load.add_argument("--duration", type=float, default=5.0, help="measured seconds per step (5)")
    load.add_argument("--timeout", type=float, default=10.0, help="per request, seconds (10)")


def _add_comparison_arguments(load: argparse._ArgumentGroup) -> None:
    """The load of the side-by-side comparisons: --workers counts, streams against unary."""
    load.add_argument(
        "--workers",
        default="auto",
        help="`serve --workers` counts compared side by side, e.g. 1,2; auto: 1 and the "
        "server's auto count (skipped on one CPU); off: none (auto)",
    )
    load.add_argument(
        "--workers-concurrency",
        type=_ints,
        default=(64, 128),
        help="closed-loop callers of that comparison (default: 64,128)",
    )
    load.add_argument(
        "--connections",
        type=int,
        default=0,
        help="connections of the comparison, the same for every count (0: 2 per worker)",
    )
    load.add_argument(
        "--streams",
        type=int,
        default=4,
        help="--api stream: a step of concurrency C is min(streams, C) streams with C // streams "
        "messages in flight each (4)",
    )
    load.add_argument(
        "--unary-concurrency",
        type=_ints,
        default=(128,),
        help="--api stream: unary Classify steps on the same server, for comparison (128)",
    )


def _add_check_arguments(extra: argparse._ArgumentGroup) -> None:
    """The ceilings (in-process onnxruntime, PyTorch) and the extra checks, each skippable."""
    extra.add_argument(
        "--batching-off-concurrency",
        type=int,
        default=64,
        help="callers against --max-batch-size 1; 0: skip (64)",
    )
    extra.add_argument(
        "--no-loadgen-check",
        dest="loadgen_check",
        action="store_false",
        help="skip the trivial-model server run",
    )
    extra.add_argument(
        "--no-ceilings",
        dest="ceilings",
        action="store_false",
        help="skip in-process onnxruntime and PyTorch",
    )
    extra.add_argument(
        "--no-torch", dest="torch", action="store_false", help="skip the PyTorch eager ceiling"
    )
    extra.add_argument(
        "--run-dir", type=Path, help="training run for the PyTorch ceiling (default: the model's)"
    )
    extra.add_argument(
        "--tracing-concurrency",
        type=int,
        default=128,
        help="callers of the tracing off vs on steps, side by side (0: skip them; 128)",
    )
    extra.add_argument(
        "--trace-sample-ratio",
        type=float,
        default=0.1,
        help="sampling ratio of the tracing-on step (0.1)",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every `textserve bench` flag, in --help's groups and order."""
    _add_target_arguments(parser.add_argument_group("what to measure"))
    load = parser.add_argument_group("load")
    _add_load_arguments(load)
    _add_comparison_arguments(load)
    _add_check_arguments(parser.add_argument_group("ceilings and checks"))
    parser.add_argument(
        "--output",
        type=Path,
        default=Path("bench/results"),
        help="directory for textserve_bench.{json,txt,png} (bench/results)",
    )
    parser.add_argument("--seed", type=int, default=0)


def _workers(value: str) -> tuple[int, ...]:
    if value.strip().lower() == "off":
        return ()
    if value.strip().lower() == "auto":
        from textserve.service.workers.sizing import AUTO_MAX_WORKERS, cpu_limit

        auto = min(cpu_limit(), AUTO_MAX_WORKERS)
        return (1, auto) if auto > 1 else ()
    try:
        return _ints(value)
    except argparse.ArgumentTypeError as exc:
        raise CliError(f"--workers: {exc}; or auto, off") from None


def build_config(args: argparse.Namespace) -> object:
    from textserve.bench.runner import BenchConfig

    if args.texts_per_request < 1:
        raise CliError(f"--texts-per-request must be at least 1, got {args.texts_per_request}")
    if args.multi_texts_per_request < 0:
        raise CliError("--multi-texts-per-request must be 0 (off) or more")
    if args.duration <= 0 or args.warmup < 0 or args.timeout <= 0:
        raise CliError("--duration and --timeout must be positive, --warmup 0 or more")
    if args.tracing_concurrency < 0 or not 0 <= args.trace_sample_ratio <= 1:
        raise CliError("--tracing-concurrency must be 0 or more, --trace-sample-ratio 0 to 1")
    if args.intra_op_threads < 0 or args.batching_off_concurrency < 0:
        raise CliError("--intra-op-threads and --batching-off-concurrency must be 0 or more")
    if args.connections < 0:
        raise CliError("--connections must be 0 (2 per worker) or more")
    if args.streams < 1:
        raise CliError(f"--streams must be at least 1, got {args.streams}")
    return BenchConfig(
        repository=args.repository,
        model=args.model,
        server=args.server,
        metrics_url=args.metrics_url,
        api=args.api,
        texts=args.texts,
        run_dir=args.run_dir,
        concurrency=args.concurrency,
        texts_per_request=args.texts_per_request,
        multi_texts_per_request=args.multi_texts_per_request,
        multi_concurrency=args.multi_concurrency,
        open_loop=args.open_loop,
        rates=args.rates,
        warmup=args.warmup,
        duration=args.duration,
        timeout=args.timeout,
        batching_off_concurrency=args.batching_off_concurrency,
        tracing_concurrency=args.tracing_concurrency,
        trace_sample_ratio=args.trace_sample_ratio,
        loadgen_check=args.loadgen_check,
        ceilings=args.ceilings,
        torch=args.torch,
        intra_op_threads=args.intra_op_threads,
        server_args=tuple(shlex.split(args.server_args)),
        seed=args.seed,
        workers=_workers(args.workers),
        workers_concurrency=args.workers_concurrency,
        connections=args.connections,
        streams=args.streams,
        unary_concurrency=args.unary_concurrency,
    )


def run(args: argparse.Namespace) -> int:
    from textserve.bench.process import ServerStartError
    from textserve.bench.report import format_table, write_results
    from textserve.bench.requests import BenchInputError
    from textserve.bench.runner import run_benchmark

    config = build_config(args)
    try:
        results = run_benchmark(config, log=lambda line: print(line, flush=True))  # type: ignore[arg-type]
    except (BenchInputError, FileNotFoundError, ServerStartError) as exc:
        raise CliError(str(exc)) from None
    results["command"] = "textserve " + shlex.join(sys.argv[1:])
    print()
    print(format_table(results))
    written = write_results(results, args.output)
    print("\nwrote " + ", ".join(str(p) for p in written.values()))
    if "plot" not in written:
        print("(no plot: matplotlib is not installed; pip install 'textserve[bench]')")
    return 0
