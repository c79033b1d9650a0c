"""`textserve bench` as a library: load generation, server ceilings, metrics reading, reports.

    from textserve.bench.runner import BenchConfig, run_benchmark
    results = run_benchmark(BenchConfig(repository=Path("models"), model="default"))
    results["steps"][0]["throughput_texts_per_s"]

Modules: stats (percentiles, step summaries; pure), loadgen (closed and open loop over grpc.aio),
requests (texts and pre-serialized requests), scrape (the server's /metrics), process (server
child processes), echo (a model-less gRPC server) and trivial (a do-nothing model) for the load
generator check, ceilings (in-process onnxruntime and PyTorch), describe (machine and model),
report (targets, table, JSON, plot), runner (the standard sweep).
"""

# One copy of each module: this folder is textserve.bench (the wheel's package-dir, the
# checkout's textserve/bench symlink). Imported as top-level `bench` (the repository root on
# sys.path) it would be a second copy whose classes are not textserve.bench's.
if __name__ != "textserve.bench":
    raise ImportError(
        f"import textserve.bench, not {__name__}: the bench/ folder is the package "
        "textserve.bench (see docs/architecture.md)"
    )
