"""The prepared GPU check: one run on a machine with an NVIDIA GPU, one JSON, one table.

    bench/gpu_check.sh                              # on the GPU machine (stages onnxruntime-gpu)
    python -m textserve.bench.gpu_check --dry-run   # on CPU: every step but the CUDA ones

Steps, each timed and recorded: the machine and onnxruntime's providers; the GPU-marked tests
(pytest -m gpu); a `base` run trained on synthetic data (or --run); its export in fp32 and fp16
(`textserve export`, every check of the export, the fp16 accuracy on the test split); then per
precision `textserve bench` against `textserve serve --device cuda` at 1 and 64 texts per
request up to 512 callers, with 1, 2 and 4 workers side by side, and the in-process
onnxruntime ceiling (CUDA, the server's session settings) on the same texts. Writes
OUTPUT/gpu_check.json and prints the table; sized to finish in under 8 minutes on the H200
(16 cores). --dry-run runs the same steps on CPU, small (tiny preset, short steps, --device cpu,
no GPU tests), so that the script itself is tested where there is no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from textserve.artifact import Manifest, newest_version


@dataclass(frozen=True)
class Plan:
    """What one check runs: the GPU run's sizes, or the dry run's."""

    device: str  # textserve serve --device
    preset: str  # textserve train --preset
    rows: int  # synthetic training rows
    epochs: int  # of training: the run only has to be good enough to compare fp16 with fp32
    concurrency: str  # callers at 1 text per request
    multi_concurrency: str  # callers at `multi_texts` texts per request
    multi_texts: int
    workers: str  # serve --workers counts compared side by side
    workers_concurrency: str
    duration: float  # measured seconds per step
    gpu_tests: bool


# Sized for < 8 minutes on the H200's 16 cores: training the base preset on CPU (torch has no
# CUDA there) is the longest step, ~128x the tiny preset's compute per token.
GPU = Plan("cuda", "base", 3000, 1, "1,64,512", "8,64", 64, "1,2,4", "256,512", 3, True)
DRY = Plan("cpu", "tiny", 300, 2, "1,4", "2", 8, "off", "4", 0.5, False)


def _run(command: Sequence[str], log: Path, timeout: float) -> dict[str, Any]:
    """Run one step's command (its output into `log`); its status, time and command line."""
    started = time.perf_counter()
    with open(log, "w") as out:
        try:
            status = subprocess.run(
                list(command), stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False
            ).returncode
        except subprocess.TimeoutExpired:
            status = 124
    return {
        "command": shlex.join(command),
        "status": status,
        "seconds": round(time.perf_counter() - started, 1),
        "log": str(log),
    }


def _machine() -> dict[str, Any]:
    import onnxruntime

    gpu = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    ) if _has("nvidia-smi") else None  # fmt: skip
    return {
        "cpus": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "onnxruntime": onnxruntime.__version__,
        "providers": onnxruntime.get_available_providers(),
        "gpu": gpu.stdout.strip() if gpu is not None and gpu.returncode == 0 else None,
    }


def _has(program: str) -> bool:
    from shutil import which

    return which(program) is not None


def _train(plan: Plan, out: Path, python: str, steps: dict[str, Any]) -> Path:
    """A run of the plan's preset on synthetic data (learnable, 3 labels)."""
    from textserve.model.synthetic import synthetic_rows, write_jsonl

    data = write_jsonl(synthetic_rows(plan.rows, seed=0), out / "synthetic.jsonl")
    run = out / "run"
    command = [python, "-m", "textserve.cli", "train", str(data), "--preset", plan.preset]
    command += ["--epochs", str(plan.epochs), "--device", "cpu", "--no-progress"]
    command += ["--output-dir", str(run)]
    steps["train"] = _run(command, out / "train.log", 900)
    return run


def _bench_command(plan: Plan, python: str, repository: Path, model: str, out: Path) -> list[str]:
    return [python, "-m", "textserve.cli", "bench", "--repository", str(repository),
            "--model", model, "--server-args", f"--device {plan.device}",
            "--concurrency", plan.concurrency, "--multi-texts-per-request", str(plan.multi_texts),
            "--multi-concurrency", plan.multi_concurrency, "--open-loop", "",
            "--workers", plan.workers, "--workers-concurrency", plan.workers_concurrency,
            "--batching-off-concurrency", "0", "--tracing-concurrency", "0",
            "--no-loadgen-check", "--no-torch", "--warmup", "1",
            "--duration", str(plan.duration), "--output", str(out)]  # fmt: skip


def summarize(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per measured step of each precision's bench: throughput and p50/p99."""
    rows: list[dict[str, Any]] = []
    for precision, bench in results.get("bench", {}).items():
        # the in-process onnxruntime runs (the server's session settings, the same texts, at
        # the batch sizes the bench chose): the best of them is the ceiling
        ceiling = max(
            (
                run.get("texts_per_s") or 0.0
                for name, runs in bench.get("ceilings", {}).items()
                if name.startswith("onnxruntime")
                for run in runs.values()
            ),
            default=0.0,
        )
        for step in bench.get("steps", []):
            rate = step.get("throughput_texts_per_s") or 0.0
            rows.append(
                {
                    "precision": precision,
                    "server": step.get("server"),
                    "callers": step.get("concurrency"),
                    "texts_per_request": step.get("texts_per_request"),
                    "texts_per_s": rate,
                    "p50_ms": step.get("latency_ms", {}).get("p50"),
                    "p99_ms": step.get("latency_ms", {}).get("p99"),
                    "of_ceiling": rate / ceiling if ceiling else None,
                }
            )
    return rows


def format_table(results: dict[str, Any]) -> str:
    lines = [f"{'precision':9} {'server':12} {'callers':>7} {'texts/rq':>8} {'texts/s':>9} "
             f"{'p50 ms':>8} {'p99 ms':>8} {'/ceiling':>8}"]  # fmt: skip
    for row in summarize(results):
        share = "-" if row["of_ceiling"] is None else f"{row['of_ceiling']:.2f}"
        lines.append(
            f"{row['precision']:9} {str(row['server'])[:12]:12} {row['callers']!s:>7} "
            f"{row['texts_per_request']!s:>8} {row['texts_per_s']:>9.0f} "
            f"{row['p50_ms'] or 0:>8.1f} {row['p99_ms'] or 0:>8.1f} {share:>8}"
        )
    for precision, model in results.get("models", {}).items():
        lines.append(f"{precision}: test accuracy {model.get('test_accuracy')}, {model['path']}")
    for name, step in results["steps"].items():
        lines.append(f"step {name}: exit {step['status']} in {step['seconds']} s")
    return "\n".join(lines)


def check(plan: Plan, out: Path, run: Path | None, python: str) -> dict[str, Any]:
    """Run every step of `plan` into `out`; the results (also written to gpu_check.json)."""
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"plan": plan.__dict__, "machine": _machine(), "steps": {}}
    steps = results["steps"]
    if plan.gpu_tests:
        steps["gpu_tests"] = _run(
            [python, "-m", "pytest", "-q", "-m", "gpu", "tests", "-p", "no:cacheprovider"],
            out / "gpu_tests.log",
            300,
        )
    run = run or _train(plan, out, python, steps)
    repository = out / "models"
    results["models"], results["bench"] = {}, {}
    for precision, flags in (("fp32", []), ("fp16", ["--fp16"])):
        name = f"{plan.preset}_{precision}"
        export = [python, "-m", "textserve.cli", "export", str(run), "--name", name, *flags]
        export += ["--repository", str(repository)]
        steps[f"export_{precision}"] = _run(export, out / f"export_{precision}.log", 600)
        found = newest_version(repository / name, complete=True)
        if found is None:
            continue
        manifest = Manifest.read(found[1])
        results["models"][precision] = {
            "path": str(found[1]),
            "test_accuracy": manifest.test_accuracy,
        }
        bench_out = out / f"bench_{precision}"
        steps[f"bench_{precision}"] = _run(
            _bench_command(plan, python, repository, name, bench_out),
            out / f"bench_{precision}.log",
            600,
        )
        report = bench_out / "textserve_bench.json"
        if report.is_file():
            results["bench"][precision] = json.loads(report.read_text())
    results["rows"] = summarize(results)
    (out / "gpu_check.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m textserve.bench.gpu_check")
    parser.add_argument("--dry-run", action="store_true", help="on CPU, small: no CUDA steps")
    parser.add_argument("--output", type=Path, default=Path("bench/results/gpu_check"))
    parser.add_argument("--run", type=Path, help="a training run to export (default: train one)")
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
    started = time.perf_counter()
    results = check(plan, args.output, args.run, sys.executable)
    print(format_table(results))
    print(f"total {time.perf_counter() - started:.0f} s; wrote {args.output / 'gpu_check.json'}")
    return 0 if all(step["status"] == 0 for step in results["steps"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
