"""Server CPU per request side by side, with flame graphs: where the serving path spends its time.

    python -m textserve.bench.profile --repository models --model default \
        --concurrency 256 --texts-per-request 1 --duration 10 --flamegraphs docs/images/profile
    python -m textserve.bench.profile ... --baseline /tmp/textserve-7a118c1   # another checkout

Each target is started in turn on 127.0.0.1:0 and driven by the closed-loop load generator for
`--duration` seconds after a warm-up: the model-less gRPC echo server (gRPC's own cost, the
floor), textserve on the trivial model (everything but the model), textserve on the real model,
and the same two from a `--baseline` checkout (its `textserve` package on PYTHONPATH). Reported
per target: texts/s, p50/p99, the server process's CPU per request and per text (from /proc, the
same clock for every target) and that CPU as a multiple of the echo server's. With
`--flamegraphs DIR` each textserve target is sampled by py-spy (`--idle` off, native frames
off) and written as DIR/<target>-c<callers>-t<texts>.svg; the sampling itself costs a few per
cent of CPU, the same for every target. With `--threads`, the same CPU by thread (/proc/PID/task
at the window's ends; the threads' Python names from `py-spy dump` after it): the event loop,
the inference thread, grpc's poller and event-engine threads, the backlog sampler — which one a
change moved, and which one is the wall. The run is repeated `--rounds` times, alternating
targets, so a noisy machine shows as spread between rounds rather than as a wrong ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from textserve import procfs
from textserve.bench.loadgen import closed_loop
from textserve.bench.process import ServerProcess, echo_command, serve_command, spawn
from textserve.bench.requests import build_requests, load_texts
from textserve.bench.stats import summarize


@dataclass(frozen=True)
class Row:
    target: str
    round: int
    concurrency: int
    texts_per_request: int
    texts_per_s: float
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    cpu_ms_per_request: float
    cpu_ms_per_text: float
    # --threads: the server's CPU per request by thread role (thread_role), ms
    threads: dict[str, float] = field(default_factory=dict)


# A thread's role by its name (py-spy's Python name, else the kernel's): the first match wins.
ROLES = (
    ("MainThread", "event loop"),
    ("infer-", "inference"),
    ("engine-", "inference"),
    ("_poll_wrapper", "grpc poller"),
    ("event_engine", "grpc event engine"),
    ("grpc-backlog", "backlog sampler"),
    ("asyncio_", "executor"),
)


def thread_role(name: str) -> str:
    """The role of a thread named `name` (ROLES), else its name without trailing digits."""
    for part, role in ROLES:
        if part in name:
            return role
    return name.rstrip("0123456789_-:") or name


def per_thread(
    before: dict[int, tuple[str, float]],
    after: dict[int, tuple[str, float]],
    names: dict[int, str],
    requests: int,
) -> dict[str, float]:
    """CPU ms per request by thread role between two procfs.thread_cpu_seconds snapshots
    (`names`: Python's thread names by tid, from py-spy; the kernel's where missing). Roles under
    a microsecond a request are left out."""
    roles: dict[str, float] = {}
    for tid, (comm, cpu) in after.items():
        spent = cpu - before.get(tid, (comm, 0.0))[1]
        role = thread_role(names.get(tid, comm))
        roles[role] = roles.get(role, 0.0) + spent / max(1, requests) * 1e3
    return {role: ms for role, ms in sorted(roles.items(), key=lambda r: -r[1]) if ms >= 1e-3}


def _python_thread_names(pid: int) -> dict[int, str]:
    """{tid: Python thread name} from `py-spy dump` (empty without py-spy)."""
    spy = _py_spy()
    if spy is None:
        return {}
    dump = subprocess.run(
        [spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30, check=False
    ).stdout
    names = {}
    for line in dump.splitlines():  # Thread 19410 (idle): "MainThread"
        if line.startswith("Thread ") and '"' in line:
            tid = line.split()[1]
            with contextlib.suppress(ValueError):
                names[int(tid, 16) if tid.startswith("0x") else int(tid)] = line.split('"')[1]
    return names


def _py_spy() -> str | None:
    """py-spy on PATH or beside this interpreter (the venv's dev extras), else None."""
    return shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))


@contextlib.contextmanager
def _sampled(pid: int, svg: Path | None, seconds: float) -> Iterator[None]:
    """py-spy record the process for `seconds` into `svg` (nothing when svg is None)."""
    spy = _py_spy()
    if svg is None or spy is None:
        yield
        return
    svg.parent.mkdir(parents=True, exist_ok=True)
    command = [spy, "record", "--pid", str(pid), "--output", str(svg), "--format"]
    command += ["flamegraph", "--duration", str(max(1, round(seconds))), "--rate", "200"]
    recorder = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield
    finally:
        try:
            recorder.wait(timeout=seconds + 30)
        except subprocess.TimeoutExpired:
            recorder.kill()


def _measure(
    server: ServerProcess,
    label: str,
    model: str,
    texts: list[str],
    args: argparse.Namespace,
    round_: int,
    svg: Path | None,
) -> Row:
    pool = build_requests(texts, "v1", args.texts_per_request, model, seed=round_)
    assert server.pid is not None
    cpu: list[float] = []
    threads: list[dict[int, tuple[str, float]]] = []

    async def probe() -> None:
        cpu.append(procfs.tree_cpu_seconds(server.pid) or 0.0)  # type: ignore[arg-type]
        if args.threads:
            threads.append(procfs.thread_cpu_seconds(server.pid))  # type: ignore[arg-type]

    with _sampled(server.pid, svg, args.duration):
        raw, _ = asyncio.run(
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
    requests = max(1, raw.requests_done)
    seconds = cpu[-1] - cpu[0] if len(cpu) >= 2 else float("nan")
    by_thread = {}
    if len(threads) >= 2:  # named after the window: py-spy's dump stops the process a moment
        names = _python_thread_names(server.pid)
        by_thread = per_thread(threads[0], threads[-1], names, requests)
    step = summarize(raw, os.cpu_count() or 1)
    return Row(
        target=label,
        round=round_,
        concurrency=args.concurrency,
        texts_per_request=args.texts_per_request,
        texts_per_s=step["throughput_texts_per_s"],
        requests_per_s=step["throughput_requests_per_s"],
        p50_ms=step["latency_ms"]["p50"],
        p99_ms=step["latency_ms"]["p99"],
        errors=sum(raw.errors.values()),
        cpu_ms_per_request=seconds / requests * 1e3,
        cpu_ms_per_text=seconds / max(1, raw.texts) * 1e3,
        threads=by_thread,
    )


def _targets(
    args: argparse.Namespace, scratch: Path
) -> list[tuple[str, list[str], dict[str, str], str]]:
    """(label, command, extra environment, model name) of each server to compare."""
    from textserve.artifact import newest_version
    from textserve.bench.trivial import TRIVIAL_NAME, write_trivial_version

    newest = newest_version(args.repository / args.model, complete=True)
    if newest is None:
        raise SystemExit(f"no version of {args.model!r} in {args.repository}")
    version_dir = newest[1]
    write_trivial_version(version_dir, scratch)
    shutil.copytree(version_dir, scratch / args.model / version_dir.name)
    extra = [*args.server_args.split()]
    targets: list[tuple[str, list[str], dict[str, str], str]] = [
        ("echo", echo_command(), {}, "echo")
    ]
    checkouts = [("", None, [])] + ([("base-", args.baseline, [])] if args.baseline else [])
    for variant in args.variant or ():  # LABEL:FLAGS, this checkout with more flags
        label, _, flags = variant.partition(":")
        checkouts.append((label + "-", None, flags.split()))
    for prefix, checkout, flags in checkouts:
        env = {} if checkout is None else {"PYTHONPATH": str(checkout)}
        for model in (TRIVIAL_NAME, args.model):
            if args.only and model not in args.only:
                continue
            label = prefix + ("trivial" if model == TRIVIAL_NAME else "model")
            command = serve_command(scratch, model, [*extra, *flags])
            targets.append((label, command, env, model))
    return targets


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m textserve.bench.profile", description=__doc__)
    parser.add_argument("--repository", type=Path, default=Path("models"))
    parser.add_argument("--model", default="default")
    parser.add_argument("--texts", type=Path, help="JSONL with 'text' (default: runs/<model>)")
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--texts-per-request", type=int, default=1)
    parser.add_argument(
        "--connections", type=int, default=1, help="gRPC connections (several with --workers N)"
    )
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--baseline", type=Path, help="another checkout's root, run side by side")
    parser.add_argument("--only", nargs="*", help="model names to run (trivial, default)")
    parser.add_argument(
        "--server-args", default="--workers 1", help="`textserve serve` flags (--workers 1)"
    )
    parser.add_argument(
        "--variant",
        action="append",
        help="LABEL:FLAGS, this checkout again with more `serve` flags (e.g. 'proc:--engine "
        "process'), beside the others",
    )
    parser.add_argument("--flamegraphs", type=Path, help="write py-spy SVGs here")
    parser.add_argument(
        "--threads",
        action="store_true",
        help="also the server's CPU per request by thread (event loop, inference, grpc's "
        "threads...; names from py-spy)",
    )
    parser.add_argument("--output", type=Path, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    texts = load_texts(args.texts or Path("runs") / args.model)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="textserve-profile-") as folder:
        targets = _targets(args, Path(folder))
        for round_ in range(args.rounds):
            for label, command, env, model in targets:
                svg = None
                if args.flamegraphs is not None and label != "echo" and round_ == 0:
                    name = f"{label}-c{args.concurrency}-t{args.texts_per_request}.svg"
                    svg = args.flamegraphs / name
                with spawn(command, env=env, cwd=Path.cwd()) as server:
                    row = _measure(server, label, model, texts, args, round_, svg)
                rows.append(row)
                print(
                    f"round {round_} {label:<12} {row.texts_per_s:8.0f} texts/s  "
                    f"p50 {row.p50_ms:7.1f} p99 {row.p99_ms:7.1f} ms  errors {row.errors}  "
                    f"cpu {row.cpu_ms_per_request:.3f} ms/request",
                    flush=True,
                )
                if row.threads:
                    shares = ", ".join(f"{role} {ms:.3f}" for role, ms in row.threads.items())
                    print(f"    by thread, ms/request: {shares}", flush=True)
    _report(rows)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        machine = {"cpus": os.cpu_count(), "cpu": _cpu_name(), "at": time.strftime("%F %T")}
        args.output.write_text(
            json.dumps({"machine": machine, "rows": [asdict(r) for r in rows]}, indent=1) + "\n"
        )
    return 0


def _report(rows: list[Row]) -> None:
    """Per target: medians over rounds, and CPU per request as a multiple of the echo's."""
    labels = list(dict.fromkeys(r.target for r in rows))
    echo = [r.cpu_ms_per_request for r in rows if r.target == "echo"]
    floor = statistics.median(echo) if echo else float("nan")
    print(f"\nmedians over rounds ({_cpu_name()}, {os.cpu_count()} CPUs)")
    print(
        f"{'target':<12} {'texts/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'cpu ms/req':>11} "
        f"{'x echo':>7}"
    )
    for label in labels:
        mine = [r for r in rows if r.target == label]
        cpu = statistics.median(r.cpu_ms_per_request for r in mine)
        print(
            f"{label:<12} {statistics.median(r.texts_per_s for r in mine):9.0f} "
            f"{statistics.median(r.p50_ms for r in mine):8.1f} "
            f"{statistics.median(r.p99_ms for r in mine):8.1f} {cpu:11.3f} {cpu / floor:7.2f}"
        )
    for label in labels:  # --threads: medians by role
        mine = [r for r in rows if r.target == label and r.threads]
        roles = list(dict.fromkeys(role for r in mine for role in r.threads))
        if roles:
            medians = [statistics.median(r.threads.get(role, 0.0) for r in mine) for role in roles]
            shares = ", ".join(f"{role} {ms:.3f}" for role, ms in zip(roles, medians, strict=True))
            print(f"{label:<12} by thread, ms/request: {shares}")


def _cpu_name() -> str:
    return procfs.cpu_model() or "unknown CPU"


if __name__ == "__main__":
    sys.exit(main())
