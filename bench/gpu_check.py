"""The prepared GPU check: one run on a machine with an NVIDIA GPU, one JSON, one table.

    bench/gpu_check.sh                              # on the GPU machine (stages onnxruntime-gpu)
    python -m textserve.bench.gpu_check --dry-run   # on CPU: every step but the CUDA/NVML ones

Side by side, on texts of about 128 tokens (synthetic sentences run together): a `base` run
trained on synthetic data (or --run, or none with --models: a repository holding the exports
already) exported in fp16 and fp32; the graph-only ceiling (in-process onnxruntime, CUDA, the
server's session settings) of each at 64, 256 and 1024 texts per batch; the tokenizer's
ceiling on all cores and one text at a time (bench/tokenize_rate.py); `textserve serve --device
cuda` (fp16) under NVIDIA's perf_analyzer at 1 text per request (256 callers) and 64 (32
callers), with `--workers 1`, `--workers 8` (N sessions, `--engine thread`) and `--workers 8
--engine shared` (one engine fed by every worker), GPU utilization sampled through NVML during
each; the CPU provider's `--workers 1,2,4,8` at 128 callers; the GPU-marked tests if time is
left. Each step is timed, a failure is recorded and the others still run, and one budget
(7 minutes) bounds them all. Writes OUTPUT/gpu_check.json and OUTPUT/gpu_check.md (the table
printed, with issue 37's ratios: see gpu_check_report). --dry-run runs the same steps on CPU,
small (tiny preset, short steps, --device cpu, no NVML, no GPU tests): the script is tested
where there is no GPU. perf_analyzer comes from --tools (set up by
textserve.bench.perf_analyzer); on the GPU machine only when carried there, never downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from textserve.artifact import Manifest, newest_version
from textserve.bench.gpu_check_report import format_table, ratios
from textserve.bench.gpu_check_steps import GpuSampler, Steps, long_texts
from textserve.bench.perf_analyzer_setup import DEFAULT_TOOLS


@dataclass(frozen=True)
class Load:
    """One perf_analyzer level: texts per request, callers, requests per window."""

    texts_per_request: int
    callers: int
    window: int


@dataclass(frozen=True)
class Plan:
    """What one check runs: the GPU machine's sizes, or the dry run's."""

    device: str  # the served steps' textserve serve --device
    preset: str  # textserve train --preset
    rows: int  # synthetic training rows
    epochs: int  # the run only has to be good enough to compare fp16 with fp32
    train_device: str  # textserve train --device
    budget: float  # seconds for every step together
    texts: int  # texts of ~128 tokens every step measures
    ceiling_batches: tuple[int, ...]
    ceiling_seconds: float  # per batch size
    tokenize_count: int  # texts per tokenize_rate pass
    workers: int  # --workers N of the thread/shared comparison
    loads: tuple[Load, ...]
    cpu_workers: str  # the CPU provider's --workers counts
    cpu_load: Load
    stability: int  # perf_analyzer --stability (%)
    gpu: bool  # NVML sampling and the GPU-marked tests; perf_analyzer only when carried


# Each field's value on the GPU machine and in the dry run, side by side. The GPU machine's
# are sized for < 8 minutes of device time on the H200's 16 cores, install.sh included: the
# budget is 7 minutes; training the base preset takes about a minute (less on torch's CUDA).
SIZES: dict[str, tuple[Any, Any]] = {
    "device": ("cuda", "cpu"),
    "preset": ("base", "tiny"),
    "rows": (3000, 300),
    "epochs": (1, 2),
    "train_device": ("auto", "cpu"),
    "budget": (420.0, 240.0),
    "texts": (4096, 256),
    "ceiling_batches": ((64, 256, 1024), (8, 32, 64)),
    "ceiling_seconds": (1.5, 0.3),
    "tokenize_count": (16384, 1024),
    "workers": (8, 2),
    "loads": ((Load(1, 256, 6000), Load(64, 32, 500)), (Load(1, 8, 100), Load(8, 4, 30))),
    "cpu_workers": ("1,2,4,8", "1,2"),
    "cpu_load": (Load(1, 128, 1500), Load(1, 8, 100)),
    "stability": (30, 100),
    "gpu": (True, False),
}
GPU = Plan(**{field: values[0] for field, values in SIZES.items()})
DRY = Plan(**{field: values[1] for field, values in SIZES.items()})
# fp16 first: the served steps need it
PRECISIONS: tuple[tuple[str, list[str]], ...] = (("fp16", ["--fp16"]), ("fp32", []))


def _machine(sampler: GpuSampler | None) -> dict[str, Any]:
    import onnxruntime

    gpu = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    ) if shutil.which("nvidia-smi") else None  # fmt: skip
    return {
        "cpus": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "onnxruntime": onnxruntime.__version__,
        "providers": onnxruntime.get_available_providers(),
        "gpu": gpu.stdout.strip() if gpu is not None and gpu.returncode == 0 else None,
        "nvml": "not sampled" if sampler is None else sampler.reason or "sampled",
    }


def _models(plan: Plan, out: Path, run: Path | None, python: str, steps: Steps) -> Path:
    """A repository with the plan's run exported as PRESET_fp16 and PRESET_fp32."""
    from textserve.model.synthetic import synthetic_rows, write_jsonl

    if run is None:
        data = write_jsonl(synthetic_rows(plan.rows, seed=0), out / "synthetic.jsonl")
        run = out / "run"
        shutil.rmtree(run, ignore_errors=True)  # an earlier check's, into the same --output
        command = [python, "-m", "textserve.cli", "train", str(data), "--preset", plan.preset]
        command += ["--epochs", str(plan.epochs), "--device", plan.train_device]
        steps.run("train", [*command, "--no-progress", "--output-dir", str(run)], 240)
    repository = out / "models"
    for precision, flags in PRECISIONS:
        export = [python, "-m", "textserve.cli", "export", str(run), *flags]
        export += ["--name", f"{plan.preset}_{precision}", "--repository", str(repository)]
        steps.run(f"export_{precision}", export, 150)
    return repository


def _versions(plan: Plan, repository: Path) -> dict[str, Path]:
    found = {}
    for precision, _ in PRECISIONS:
        folder = repository / f"{plan.preset}_{precision}"
        newest = newest_version(folder, complete=True) if folder.is_dir() else None
        if newest is not None:
            found[precision] = newest[1]
    return found


def _ceilings(plan: Plan, versions: dict[str, Path], texts: Path, python: str, steps: Steps,
              results: dict[str, Any]) -> None:  # fmt: skip
    for precision, version in versions.items():
        rows = steps.out / f"ceiling_{precision}.json"
        command = [python, "-m", "textserve.bench.gpu_check_steps", "--model", str(version),
                   "--texts", str(texts), "--json", str(rows), "--batch-sizes",
                   ",".join(map(str, plan.ceiling_batches)),
                   "--min-seconds", str(plan.ceiling_seconds)]  # fmt: skip
        steps.run(f"ceiling_{precision}", command, 90, gpu=True)
        if rows.is_file():
            results["ceilings"][precision] = json.loads(rows.read_text())


def _tokenizer(plan: Plan, version: Path, texts: Path, python: str, steps: Steps,
               results: dict[str, Any]) -> None:  # fmt: skip
    cores = str(os.cpu_count() or 1)
    for key, threads, batches in (("all_cores", cores, "64,512"), ("one_at_a_time", "1", "1")):
        figures = steps.out / f"tokenize_{key}.json"
        command = [python, "-m", "textserve.bench.tokenize_rate", "--model", str(version),
                   "--texts", str(texts), "--count", str(plan.tokenize_count), "--threads",
                   threads, "--batch-size", batches, "--json", str(figures)]  # fmt: skip
        steps.run(f"tokenize_{key}", command, 60)
        if figures.is_file():
            results["tokenizer"][key] = json.loads(figures.read_text())["rows"]


def _perf_analyzer(plan: Plan, tools: Path, python: str, steps: Steps) -> bool:
    """perf_analyzer ready under `tools`: set up (downloaded if need be) in the dry run; on the
    GPU machine only checked, when carried there (no package index, no apt)."""
    from textserve.bench.perf_analyzer_setup import LIBB64, _has_libb64

    if plan.gpu:
        missing = [n for n in ("perf_analyzer", "libcudart.so.12") if not (tools / n).is_file()]
        if missing or not _has_libb64(tools):
            steps.skip("perf_analyzer_setup", f"{tools} lacks {', '.join(missing) or LIBB64}: "
                       "carry .tools/perf_analyzer (see bench/gpu_check.sh)")  # fmt: skip
            return False
    command = [python, "-m", "textserve.bench.perf_analyzer", "--setup-only", "--tools", str(tools)]
    return steps.run("perf_analyzer_setup", command, 120)


def _perf_command(plan: Plan, tools: Path, python: str, texts: Path, load: Load) -> list[str]:
    return [python, "-m", "textserve.bench.perf_analyzer", "--texts", str(texts),
            "--num-texts", str(min(plan.texts, 1000)), "--batch-size", str(load.texts_per_request),
            "--concurrency", str(load.callers), "--request-count", str(load.window),
            "--stability", str(plan.stability), "--level-timeout", "60",
            "--tools", str(tools)]  # fmt: skip


def _report(folder: Path, workers: int) -> dict[str, Any] | None:
    """perf_analyzer.json's figures for `workers` in perf_analyzer's key names, or None."""
    path = folder / "perf_analyzer.json"
    if not path.is_file():
        return None
    reports: list[dict[str, Any]] = json.loads(path.read_text())["workers"][str(workers)]
    r = reports[0]
    return {"texts_per_s": r["throughput"], "p50_ms": r["p50_ms"], "p99_ms": r["p99_ms"],
            "server_queue_ms": r.get("server_queue_ms"),
            "server_infer_ms": r.get("server_compute_infer_ms"),
            "spread_pct": r.get("spread_pct")}  # fmt: skip


def _servers(plan: Plan, repository: Path, tools: Path, texts: Path, python: str, steps: Steps,
             results: dict[str, Any], blocked: str | None) -> None:  # fmt: skip
    """The fp16 version served on plan.device: --workers 1 and N with --engine thread, N with
    --engine shared, at each load; GPU utilization sampled during each."""
    for load in plan.loads:
        for workers, engine in ((1, "thread"), (plan.workers, "thread"), (plan.workers, "shared")):
            name = f"server_w{workers}_{engine}_{load.texts_per_request}x{load.callers}"
            folder = steps.out / name
            command = _perf_command(plan, tools, python, texts, load)
            command += ["--repository", str(repository), "--model", f"{plan.preset}_fp16",
                        "--server-args", f"--device {plan.device} --engine {engine}",
                        "--workers", str(workers), "--output", str(folder)]  # fmt: skip
            steps.run(name, command, 120, gpu=True, blocked=blocked)
            report = _report(folder, workers)
            if report is not None:
                results["servers"][name] = {
                    "device": plan.device, "precision": "fp16", "workers": workers,
                    "engine": engine, "texts_per_request": load.texts_per_request,
                    "callers": load.callers, **report,
                }  # fmt: skip


def _cpu_workers(plan: Plan, repository: Path, tools: Path, texts: Path, python: str,
                 steps: Steps, results: dict[str, Any], blocked: str | None) -> None:  # fmt: skip
    """The CPU provider's scaling: a server per --workers count in turn, one text per request,
    fp32 (fp16 where there is no fp32: slower on CPU, but there)."""
    precision = "fp32" if "fp32" in _versions(plan, repository) else "fp16"
    folder = steps.out / "cpu_workers"
    command = _perf_command(plan, tools, python, texts, plan.cpu_load)
    command += ["--repository", str(repository), "--model", f"{plan.preset}_{precision}",
                "--server-args", "--device cpu", "--workers", plan.cpu_workers,
                "--output", str(folder)]  # fmt: skip
    steps.run("cpu_workers", command, 150, blocked=blocked)
    for count in plan.cpu_workers.split(","):
        report = _report(folder, int(count))
        if report is not None:
            results["cpu_workers"][count] = {
                "precision": precision,
                "callers": plan.cpu_load.callers,
                **report,
            }


def _measure(plan: Plan, repository: Path, tools: Path, python: str, steps: Steps,
             results: dict[str, Any]) -> None:  # fmt: skip
    """Every measuring step on the versions `repository` holds."""
    versions = _versions(plan, repository)
    results["models"] = {
        p: {"path": str(v), "test_accuracy": Manifest.read(v).test_accuracy}
        for p, v in versions.items()
    }
    if not versions:
        steps.skip("measure", f"no {plan.preset}_fp16 or _fp32 version in {repository}")
        return
    texts = steps.out / "texts.jsonl"
    first = next(iter(versions.values()))
    results["texts"] = steps.call("texts", lambda: long_texts(first, plan.texts, texts))
    if results["texts"] is None:
        return
    _ceilings(plan, versions, texts, python, steps, results)
    _tokenizer(plan, first, texts, python, steps, results)
    blocked = None
    if not _perf_analyzer(plan, tools, python, steps):
        blocked = "perf_analyzer is not set up (see the perf_analyzer_setup step)"
    if "fp16" in versions:
        _servers(plan, repository, tools, texts, python, steps, results, blocked)
    _cpu_workers(plan, repository, tools, texts, python, steps, results, blocked)


def check(plan: Plan, out: Path, *, run: Path | None = None, models: Path | None = None,
          tools: Path = DEFAULT_TOOLS, python: str = sys.executable) -> dict[str, Any]:  # fmt: skip
    """Run every step of `plan` into `out`; the results (also in gpu_check.json and .md)."""
    out.mkdir(parents=True, exist_ok=True)
    sampler = GpuSampler() if plan.gpu else None
    steps = Steps(out, plan.budget, sampler)
    results: dict[str, Any] = {"plan": asdict(plan), "machine": _machine(sampler),
                               "steps": steps.records, "ceilings": {}, "tokenizer": {},
                               "servers": {}, "cpu_workers": {}}  # fmt: skip
    repository = models or _models(plan, out, run, python, steps)
    _measure(plan, repository, tools.resolve(), python, steps, results)
    if plan.gpu and steps.left() >= 60:  # the GPU-marked tests: with what time is left
        command = [python, "-m", "pytest", "-q", "-m", "gpu", "tests", "-p", "no:cacheprovider"]
        steps.run("gpu_tests", command, steps.left() - 5)
    elif plan.gpu:
        steps.skip("gpu_tests", "under 60 s of the time budget left")
    results["ratios"] = ratios(results)
    table = format_table(results)
    (out / "gpu_check.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    (out / "gpu_check.md").write_text(table + "\n")
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m textserve.bench.gpu_check")
    parser.add_argument("--dry-run", action="store_true", help="on CPU, small: no CUDA steps")
    parser.add_argument("--output", type=Path, default=Path("bench/results/gpu_check"))
    parser.add_argument("--run", type=Path, help="a training run to export (default: train one)")
    parser.add_argument(
        "--models", type=Path, help="a repository with PRESET_fp16 (and _fp32): no training"
    )
    parser.add_argument("--tools", type=Path, default=DEFAULT_TOOLS, help="perf_analyzer's folder")
    args = parser.parse_args(argv)
    plan = DRY if args.dry_run else GPU
    if not args.dry_run:
        import onnxruntime

        if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            print("gpu_check: error: this onnxruntime offers no CUDA execution provider "
                  "(stage .gpu/a and .gpu/b first, see bench/gpu_check.sh), or use --dry-run",
                  file=sys.stderr)  # fmt: skip
            return 2
    if args.run is not None and not (args.run / "config.json").is_file():
        print(f"gpu_check: error: --run {args.run} is not a training run", file=sys.stderr)
        return 2
    if args.models is not None and not _versions(plan, args.models):
        print(f"gpu_check: error: --models {args.models} holds no complete {plan.preset}_fp16 "
              f"or {plan.preset}_fp32 version", file=sys.stderr)  # fmt: skip
        return 2
    started = time.perf_counter()
    results = check(plan, args.output, run=args.run, models=args.models, tools=args.tools)
    print(format_table(results))
    print(f"total {time.perf_counter() - started:.0f} s; wrote {args.output / 'gpu_check.json'}")
    return 0 if all(step["status"] == 0 for step in results["steps"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
