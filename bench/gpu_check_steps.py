"""The steps of the prepared GPU check (textserve.bench.gpu_check): each a child process run on
a share of one time budget, its failure recorded and never fatal to the others; GPU utilization
sampled through NVML while it runs; the texts of about 128 tokens every step measures; and the
in-process onnxruntime ceiling as a child of its own (a crash on the device ends that step only):

    python -m textserve.bench.gpu_check_steps --model VERSION --texts FILE \\
        --batch-sizes 64,256,1024 --json OUT

The ceiling tokenizes inside its timed loop (bench/ceilings.py); its graph-only figure is the
same texts over the time left once the tokenizing is taken out: texts / (wall - tokenize wall).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from textserve.artifact import TOKENIZER_FILE, Manifest
from textserve.tokenization import Tokenization, load_tokenizer

MIN_STEP_SECONDS = 10.0  # a step with less of the budget left is skipped, never started
INTERRUPT_GRACE = 20.0  # s between SIGINT (servers drain, perf_analyzer stops) and SIGKILL
NVML_INTERVAL = 0.1  # s between two utilization samples
TARGET_TOKENS = 128  # the texts' length, cut to the model's max_length


def run_command(command: Sequence[str], log: Path, timeout: float) -> dict[str, Any]:
    """Run one step's command (its output into `log`) in a process group of its own; past
    `timeout` the whole group (a server and perf_analyzer with it) gets SIGINT, then SIGKILL,
    and the status is 124."""
    started = time.perf_counter()
    with open(log, "w") as out:
        child = subprocess.Popen(
            list(command), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            status = child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _signal_group(child.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=INTERRUPT_GRACE)
            _signal_group(child.pid, signal.SIGKILL)
            child.wait()
            status = 124
    return {
        "command": shlex.join(command),
        "status": status,
        "seconds": round(time.perf_counter() - started, 1),
        "log": str(log),
    }


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


class GpuSampler:
    """GPU 0's utilization and memory, sampled on a thread through NVML while a step runs.
    pynvml (the nvidia-ml-py package) is imported here, lazily: without it, or without a
    driver, `reason` says why and every step's figures say the same."""

    def __init__(self, interval: float = NVML_INTERVAL) -> None:
        self.interval = interval
        self.reason: str | None = None
        self._nvml: Any = None
        self._handle: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self._nvml = pynvml
        except ImportError:
            self.reason = "pynvml is not installed (the nvidia-ml-py package)"
        except Exception as exc:  # no driver, no device: recorded, never a failure
            self.reason = f"NVML: {type(exc).__name__}: {exc}"

    @contextlib.contextmanager
    def sample(self) -> Iterator[dict[str, Any]]:
        """Sample while the block runs; the yielded dict holds the figures once it ends."""
        figures: dict[str, Any] = {}
        if self._handle is None:
            figures["unavailable"] = self.reason
            yield figures
            return
        samples: list[tuple[float, float]] = []
        stop = threading.Event()
        thread = threading.Thread(target=self._poll, args=(samples, stop, figures), daemon=True)
        thread.start()
        try:
            yield figures
        finally:
            stop.set()
            thread.join(timeout=5)
            figures.update(summarize_samples(samples))

    def _poll(
        self, samples: list[tuple[float, float]], stop: threading.Event, figures: dict[str, Any]
    ) -> None:
        while True:
            try:
                rates = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
                memory = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
            except Exception as exc:
                figures["error"] = f"{type(exc).__name__}: {exc}"
                return
            samples.append((float(rates.gpu), memory.used / 2**20))
            if stop.wait(self.interval):
                return


def summarize_samples(samples: Sequence[tuple[float, float]]) -> dict[str, Any]:
    """Mean and max utilization (%) over the step, the mean over its busy stretch (first to
    last sample with a kernel running: a server's start and drain left out), the most memory."""
    if not samples:
        return {"samples": 0}
    util = [u for u, _ in samples]
    busy = [i for i, u in enumerate(util) if u > 0]
    stretch = util[busy[0] : busy[-1] + 1] if busy else [0.0]
    return {
        "samples": len(samples),
        "util_mean": round(statistics.fmean(util), 1),
        "util_busy_mean": round(statistics.fmean(stretch), 1),
        "util_max": max(util),
        "memory_max_mib": round(max(m for _, m in samples)),
    }


class Steps:
    """Every step's record (status, seconds, command, log; `gpu` where sampled) under one
    deadline: a step starts only with MIN_STEP_SECONDS of the budget left, and gets at most
    what is left."""

    def __init__(self, out: Path, budget: float, sampler: GpuSampler | None = None) -> None:
        self.out = out
        self.deadline = time.monotonic() + budget
        self.sampler = sampler
        self.records: dict[str, dict[str, Any]] = {}

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def skip(self, name: str, reason: str) -> None:
        self.records[name] = {"status": "skipped", "reason": f"skipped: {reason}"}
        self._said(name)

    def run(
        self,
        name: str,
        command: Sequence[str],
        cap: float,
        *,
        gpu: bool = False,
        blocked: str | None = None,
    ) -> bool:
        """Run `command` as step `name` for at most `cap` s (less when the budget says so;
        skipped with the reason `blocked` when given); whether it exited 0."""
        left = self.left()
        if blocked is not None:
            self.skip(name, blocked)
            return False
        if left < MIN_STEP_SECONDS:
            self.skip(name, f"out of the time budget ({max(left, 0):.0f} s left)")
            return False
        sampling = self.sampler.sample() if gpu and self.sampler is not None else None
        with sampling or contextlib.nullcontext({}) as figures:
            record = run_command(command, self.out / f"{name}.log", min(cap, left))
        if sampling is not None:
            record["gpu"] = figures
        self.records[name] = record
        self._said(name)
        return record["status"] == 0

    def call(self, name: str, function: Callable[[], Any]) -> Any:
        """An in-process step: its value, or None with the error recorded."""
        started = time.perf_counter()
        try:
            value = function()
        except Exception as exc:
            value = None
            self.records[name] = {"status": 1, "error": f"{type(exc).__name__}: {exc}"}
        else:
            self.records[name] = {"status": 0}
        self.records[name]["seconds"] = round(time.perf_counter() - started, 1)
        self._said(name)
        return value

    def _said(self, name: str) -> None:
        """One line per step as it ends (a run cut short still shows how far it got)."""
        record = self.records[name]
        status = record.get("reason") or f"exit {record['status']} in {record['seconds']} s"
        print(f"gpu_check: {name}: {status} ({max(self.left(), 0):.0f} s left)", flush=True)


def long_texts(version: Path, count: int, path: Path, seed: int = 1) -> dict[str, Any]:
    """`count` texts of about TARGET_TOKENS tokens (at most the model's max_length, special
    tokens included): synthetic sentences run together, written to `path` as JSONL ({"text"});
    their token counts."""
    from textserve.model.synthetic import synthetic_rows

    manifest = Manifest.read(version)
    tokenizer = load_tokenizer(version / TOKENIZER_FILE)
    target = min(TARGET_TOKENS, manifest.max_length) - tokenizer.num_special_tokens_to_add(False)
    pieces = [row["text"] for row in synthetic_rows(1999, seed=seed)]  # a prime: texts differ
    lengths = [len(e.ids) for e in tokenizer.encode_batch(pieces, add_special_tokens=False)]
    texts: list[str] = []
    at = 0
    while len(texts) < count:  # sentences while the next one fits: never cut when served
        words, tokens = [pieces[at % len(pieces)]], lengths[at % len(pieces)]
        at += 1
        while tokens + lengths[at % len(pieces)] <= target:
            words.append(pieces[at % len(pieces)])
            tokens += lengths[at % len(pieces)]
            at += 1
        texts.append(" ".join(words))
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    counted = [len(ids) for ids in Tokenization.for_manifest(tokenizer, manifest).encode(texts)]
    return {
        "path": str(path),
        "count": count,
        "max_length": manifest.max_length,
        "tokens_mean": round(statistics.fmean(counted), 1),
        "tokens_min": min(counted),
    }


def ceilings(
    version: Path, texts: Sequence[str], sizes: Sequence[int], min_seconds: float
) -> list[dict[str, Any]]:
    """onnxruntime_ceiling at each batch size (the server's session settings, its device
    choice: CUDA where onnxruntime has it), with the graph-only rate; a batch size that fails
    (the device's memory) is recorded and the others still run."""
    from textserve.bench.ceilings import onnxruntime_ceiling

    rows: list[dict[str, Any]] = []
    for size in sizes:
        try:
            row = onnxruntime_ceiling(version, texts, size, min_seconds=min_seconds)
        except Exception as exc:
            rows.append({"batch_size": size, "error": f"{type(exc).__name__}: {exc}"})
            continue
        share = row["tokenize_share"]
        row["graph_texts_per_s"] = row["texts_per_s"] / (1 - share) if share < 1 else None
        rows.append(row)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    from textserve.bench.tokenize_rate import read_texts

    parser = argparse.ArgumentParser(prog="python -m textserve.bench.gpu_check_steps")
    parser.add_argument("--model", type=Path, required=True, help="a version folder")
    parser.add_argument("--texts", type=Path, required=True, help="JSONL ({'text'})")
    parser.add_argument("--batch-sizes", default="64,256,1024")
    parser.add_argument("--min-seconds", type=float, default=1.5, help="per batch size")
    parser.add_argument("--json", type=Path, required=True, help="write the rows here")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.batch_sizes.split(",") if size.strip()]
    texts = read_texts(args.texts, 4 * max(sizes))  # full batches, several of them
    rows = ceilings(args.model, texts, sizes, args.min_seconds)
    args.json.write_text(json.dumps(rows, indent=2) + "\n")
    for row in rows:
        print(json.dumps(row))
    return 0 if all("error" not in row for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
