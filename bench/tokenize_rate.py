"""Tokenization throughput on CPU: can the CPU side keep a GPU busy? Texts per second of the
serving path's tokenization (textserve.tokenization.Tokenization.full_ids: the tokenizers
library's encode_batch, parallel over its rayon thread pool) at 1..N threads, per core.

    python -m textserve.bench.tokenize_rate --model models/default/1 --texts runs/default \\
        --threads 1,2 --batch-size 64,512 --json bench/results/tokenize_rate.json

The pool's size is fixed at its first use, so each thread count runs in a process of its own
(RAYON_NUM_THREADS=n; 1 is run with TOKENIZERS_PARALLELISM=false, the sequential path). Each
figure is the best of --repeats passes over the texts, batch by batch: texts/s of wall clock
(and per thread), and texts per CPU-second of all the process's threads (what one core does,
whatever else the machine runs). Exit status 2
on bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from textserve.artifact import TOKENIZER_FILE, Manifest
from textserve.cli import CliError
from textserve.tokenization import Tokenization, load_tokenizer


def read_texts(source: Path, limit: int) -> list[str]:
    """Up to `limit` texts of a JSONL file (a 'text' field) or of a run folder's test.jsonl,
    repeated to `limit` when there are fewer."""
    path = source / "test.jsonl" if source.is_dir() else source
    if not path.is_file():
        raise CliError(f"--texts: {path} is not a JSONL file (or a run folder with test.jsonl)")
    texts = [json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip()]
    if not texts:
        raise CliError(f"--texts: {path} has no texts")
    return (texts * (limit // len(texts) + 1))[:limit]


def measure(version: Path, texts: list[str], batch_size: int, repeats: int) -> dict[str, Any]:
    """In this process: texts/s of the serving tokenization, batch by batch (best pass)."""
    manifest = Manifest.read(version)
    tokenization = Tokenization(
        load_tokenizer(version / TOKENIZER_FILE), manifest.max_length, manifest.pad_token_id
    )
    batches = [texts[i : i + batch_size] for i in range(0, len(texts), batch_size)]
    tokenization.full_ids(batches[0])  # the pool starts here, not in the first timed pass
    best, cpu, tokens = float("inf"), float("inf"), 0
    for _ in range(repeats):
        started, cpu_started = time.perf_counter(), time.process_time()
        tokens = sum(len(ids) for batch in batches for ids in tokenization.full_ids(batch))
        best = min(best, time.perf_counter() - started)
        cpu = min(cpu, time.process_time() - cpu_started)
    return {
        "batch_size": batch_size,
        "texts": len(texts),
        "texts_per_second": len(texts) / best,
        # every thread's CPU time: what one core tokenizes, whatever else the machine runs
        "texts_per_cpu_second": len(texts) / cpu if cpu > 0 else None,
        "tokens_per_text": tokens / len(texts),
    }


def _child(args: argparse.Namespace, threads: int) -> list[dict[str, Any]]:
    env = dict(os.environ)
    env["RAYON_NUM_THREADS"] = str(threads)
    env["TOKENIZERS_PARALLELISM"] = "false" if threads == 1 else "true"
    command = [sys.executable, "-m", "textserve.bench.tokenize_rate", "--child",
               "--model", str(args.model), "--texts", str(args.texts), "--count", str(args.count),
               "--batch-size", args.batch_size, "--repeats", str(args.repeats)]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise CliError(f"tokenizing with {threads} threads failed: {done.stderr.strip()[-500:]}")
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    for row in rows:
        row["threads"] = threads
        row["texts_per_second_per_core"] = row["texts_per_second"] / threads
    return rows


def _counts(value: str, flag: str) -> list[int]:
    try:
        counts = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise CliError(f"{flag} must be positive integers separated by commas, got {value!r}")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m textserve.bench.tokenize_rate")
    parser.add_argument("--model", type=Path, required=True, help="a version folder")
    parser.add_argument("--texts", type=Path, required=True, help="JSONL or a run folder")
    parser.add_argument("--count", type=int, default=4096, help="texts per pass (4096)")
    parser.add_argument("--threads", default=f"1,{os.cpu_count() or 1}", help="e.g. 1,2,4,16")
    parser.add_argument("--batch-size", default="64,512", help="texts per encode_batch call")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        sizes = _counts(args.batch_size, "--batch-size")
        if not (args.model / TOKENIZER_FILE).is_file():
            raise CliError(f"--model: {args.model} is not a version folder (no {TOKENIZER_FILE})")
        if args.child:
            texts = read_texts(args.texts, args.count)
            print(json.dumps([measure(args.model, texts, s, args.repeats) for s in sizes]))
            return 0
        rows = [row for n in _counts(args.threads, "--threads") for row in _child(args, n)]
    except CliError as exc:
        print(f"tokenize_rate: error: {exc}", file=sys.stderr)
        return 2
    header = ("threads", 7), ("batch", 5), ("texts/s", 9), ("per core", 9), ("per CPU-s", 9)
    print(" ".join(f"{name:>{width}}" for name, width in header), f"{'tok/text':>8}")
    for row in rows:
        rate, per_core = row["texts_per_second"], row["texts_per_second_per_core"]
        print(
            f"{row['threads']:>7} {row['batch_size']:>5} {rate:>9.0f} {per_core:>9.0f} "
            f"{row['texts_per_cpu_second'] or 0:>9.0f} {row['tokens_per_text']:>8.1f}"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"model": str(args.model), "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
