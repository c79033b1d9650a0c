"""How many workers `textserve serve --workers VALUE` starts, and each one's config: the CPUs
(affinity and a container's quota), the device, and the memory the models will take.

    workers = resolve_workers("auto", config)      # SupervisorError (one line) when it cannot
    worker = worker_config(config, port, workers)  # the reserved port, its share of the CPUs
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path

from textserve import procfs
from textserve.artifact import MODEL_FILE, newest_version
from textserve.service.config import ServerConfig, usable_cpus
from textserve.service.workers.errors import SupervisorError

# What a worker holds besides its models (measured: a worker serving the tiny test model has
# ~100 MiB resident at rest: the interpreter, grpc, onnxruntime, tokenizers, numpy; twice that
# leaves room for buffers under load) and, per model, a multiple of model.onnx (the weights in
# the session, the optimized graph, the arena).
WORKER_BASE_BYTES = 200 * 2**20
MODEL_BYTES_FACTOR = 3
AUTO_CPUS_PER_WORKER = 1  # auto on CPU: one worker per usable CPU (measured, see below)
AUTO_MAX_WORKERS = 8  # ... up to this many
AUTO_MAX_GPU_WORKERS = 4  # auto with CUDA: workers sharing one device


def cpu_limit() -> int:
    """CPUs this process may use: its affinity, and a cgroup v2 quota (a container's CPU
    limit, e.g. Kubernetes resources.limits.cpu) rounded up."""
    cpus = usable_cpus()
    with contextlib.suppress(OSError, ValueError):
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, -(-int(quota) // int(period))))
    return cpus


def available_memory() -> int | None:
    """Bytes of memory free for new processes: MemAvailable, within a cgroup v2 limit."""
    available = procfs.meminfo_bytes("MemAvailable")
    with contextlib.suppress(OSError, ValueError):
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            free = max(0, int(limit) - used)
            available = free if available is None else min(available, free)
    return available


def worker_memory(repository: Path) -> int:
    """An estimate of one worker's memory: a base and a multiple of the model files it will
    load (the newest version of each model: what the default policy serves)."""
    total = WORKER_BASE_BYTES
    with contextlib.suppress(OSError):
        for model in Path(repository).iterdir():
            # The scan's rule (textserve.artifact): a stray `²` folder is no version, no crash.
            newest = newest_version(model, complete=True) if model.is_dir() else None
            if newest is not None:
                onnx = newest[1] / MODEL_FILE
                if onnx.is_file():
                    total += MODEL_BYTES_FACTOR * onnx.stat().st_size
    return total


def uses_gpu(device: str) -> bool:
    if device == "cpu":
        return False
    if device == "cuda":
        return True
    from textserve.service.engine.runtime import available_providers

    return "CUDAExecutionProvider" in available_providers(device)


def resolve_workers(value: str, config: ServerConfig) -> int:
    """The number of workers for --workers VALUE ("auto" or a positive integer); SupervisorError
    (one line) for anything else or for more workers than the memory holds.

    auto: on CPU one worker per AUTO_CPUS_PER_WORKER usable CPUs (affinity and container
    quota), at least 1 and at most AUTO_MAX_WORKERS. One process is held to about 1.2 cores by
    its one event loop and GIL (gRPC, tokenizer hand-off, batching). Measured on 2 cores (AMD
    EPYC, the default model, 128 callers, NVIDIA's C++ perf_analyzer as the load generator on
    the same machine, 6 runs): two workers gave a median 1.33x the throughput of one
    (1.07-1.54x), with a p99 not higher in 4 of the 6. (With the Python load generator of
    `textserve bench` on the same two cores it was 0.99x: that generator takes most of a core
    itself, so the second worker has nothing left to run on; a server's clients are normally
    elsewhere.) So 2 CPUs get 2 workers, 16 get 8; each worker gets CPUs / N onnxruntime
    threads. With CUDA at most AUTO_MAX_GPU_WORKERS (each worker holds a CUDA context and a
    copy of the weights on the one device; a few keep it fed while others tokenize). Never
    more than the memory holds (worker_memory)."""
    text = value.strip().lower()
    per_worker = worker_memory(config.repository)
    memory = available_memory()
    if text == "auto":
        cpus = cpu_limit()
        gpu = uses_gpu(config.runtime.device)
        if gpu:
            wanted = min(cpus, AUTO_MAX_GPU_WORKERS)
        else:
            wanted = min(cpus // AUTO_CPUS_PER_WORKER, AUTO_MAX_WORKERS)
        if memory is not None:
            wanted = min(wanted, memory // per_worker)
        return max(1, wanted)
    try:
        workers = int(text)
    except ValueError:
        raise SupervisorError(
            f"--workers must be a whole number of processes or 'auto', got {value!r}"
        ) from None
    if workers < 1:
        raise SupervisorError(f"--workers must be at least 1 (or 'auto'), got {workers}")
    if workers > 1 and memory is not None and workers * per_worker > memory:
        raise SupervisorError(
            f"--workers {workers} needs about {workers * per_worker / 2**20:,.0f} MiB "
            f"({per_worker / 2**20:,.0f} MiB per worker with the models of "
            f"{config.repository}) but {memory / 2**20:,.0f} MiB are available: "
            f"use at most {max(1, memory // per_worker)}"
        )
    return workers


def worker_config(
    config: ServerConfig, port: int, workers: int, http: tuple[int, int] | None = None
) -> ServerConfig:
    """A worker's config: the reserved port, and its share of the CPUs as onnxruntime
    intra-op threads unless --intra-op-threads says otherwise. `http`: (the reserved HTTP
    port, which every worker serves too; the port of the supervisor's private endpoint, whose
    /metrics and /readyz the workers answer with); None: no HTTP port."""
    host = config.listen.rpartition(":")[0]
    runtime = config.runtime
    if runtime.intra_op_threads == 0:
        runtime = replace(runtime, intra_op_threads=max(1, cpu_limit() // workers))
    if http is None:
        return replace(config, listen=f"{host}:{port}", metrics_port=None, runtime=runtime)
    http_config = replace(config.http, upstream=f"127.0.0.1:{http[1]}")
    return replace(
        config, listen=f"{host}:{port}", metrics_port=http[0], http=http_config, runtime=runtime
    )
