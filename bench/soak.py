"""`make soak`: minutes of steady load against `textserve serve --workers N`, to show that
memory, threads and file descriptors stay flat.

    python -m textserve.bench.soak --repository models --model default --minutes 8

What it does: copies the newest version of the model into a scratch repository, starts the
server on it (bench/process.py), measures a short closed-loop peak, then sends Poisson
arrivals at --load (0.7) of that peak through several connections, keeps one ClassifyStream
busy, publishes a new version (hot reload, the old one retired) every --reload-every seconds,
and SIGKILLs one worker halfway. Once a second it records every server process's RSS, threads
and open file descriptors, and the errors so far. At the end: the series as JSON, a PNG plot,
and the RSS slope per hour of each process after warm-up (the killed worker's replacement
included), printed and written to soak.json.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from textserve import procfs
from textserve.artifact import (
    MANIFEST_FILE,
    newest_version,
    next_version,
    read_version,
    version_dir,
)
from textserve.bench.process import start_server
from textserve.v1 import classifier_pb2 as pb
from textserve.v1 import classifier_pb2_grpc as pb_grpc

TEXTS = ["a gripping, beautifully acted film", "dull", "the plot is a mess and far too long"]
WARMUP = 60.0  # seconds left out of the slopes: allocators and caches fill first
KILL_GRACE = 5.0  # UNAVAILABLE this long after the worker kill: its calls (of_the_killed_worker)
MESSAGES = 50  # distinct failure messages counted apart
# The bound on memory growth: a process is flat when the median RSS of its last minute exceeds
# that of its first minute after warm-up by at most GROWTH_MB or GROWTH_FRACTION of it, the
# larger. Medians over a minute each, so that one reload's second session (the old version is
# retired a moment after the new one loads: ~+10 MiB for a second or two) or a burst of
# requests is not growth; an 8-minute run cannot show a leak slower than this, a longer one
# (SOAK_MINUTES=30) tightens it per hour.
GROWTH_MB = 8.0
GROWTH_FRACTION = 0.05


PROGRESS_EVERY = 60  # samples (seconds) between two progress lines


def _proc(pid: int) -> dict[str, float] | None:
    rss, threads, fds = (
        procfs.status_number(pid, "VmRSS"),
        procfs.status_number(pid, "Threads"),
        procfs.open_fds(pid),
    )
    if rss is None or threads is None or fds is None:
        return None
    return {"rss_mb": rss / 1024, "threads": threads, "fds": fds}


def progress(elapsed: float, minutes: float, load: Load, processes: dict[str, Any]) -> str:
    """One line a minute: time, calls so far, errors so far, each process's RSS."""
    rss = ", ".join(f"{pid} {info['rss_mb']:.1f}" for pid, info in processes.items())
    return (
        f"{elapsed / 60:4.1f} / {minutes:g} min: {load.codes['OK']:,} OK, "
        f"{len(load.failures)} errors; RSS MiB {rss}"
    )


def server_pids(supervisor: int) -> list[int]:
    """The supervisor and its worker processes (its children that run spawn_main)."""
    workers = [
        pid
        for pid in procfs.pids()
        if (stat := procfs.process_stat(pid)) is not None
        and stat.ppid == supervisor
        and any("spawn_main" in part for part in procfs.cmdline(pid))
    ]
    return [supervisor, *workers]


def publish_copy(model_dir: Path) -> int:
    """A new version of the model: the newest one's files under the next number."""
    newest = newest_version(model_dir, complete=True)
    assert newest is not None
    manifest, _ = read_version(newest[1])
    number = next_version(model_dir)
    tmp = Path(tempfile.mkdtemp(dir=model_dir, prefix=".soak-"))
    for file in newest[1].iterdir():
        if file.name != MANIFEST_FILE:
            shutil.copy2(file, tmp / file.name)
    dataclasses.replace(manifest, version=number).write(tmp)
    os.chmod(tmp, 0o755)
    tmp.rename(version_dir(model_dir, number))
    return number


def tally(messages: Counter[str], code: str, details: str) -> None:
    """Count a failure under "CODE: message" (its first 200 characters), up to MESSAGES
    distinct keys; the failures past them under "(other)"."""
    key = f"{code}: {details[:200]}"
    if key in messages or len(messages) < MESSAGES:
        messages[key] += 1
    else:
        messages["(other)"] += 1


class Load:
    """Open-loop unary calls over `connections` channels plus one busy ClassifyStream, on an
    event loop of its own thread; counts outcomes with the time of each failure."""

    def __init__(self, address: str, rate: float, connections: int, stream: bool = True) -> None:
        self.address, self.rate, self.connections = address, rate, connections
        self.with_stream = stream
        self.codes: Counter[str] = Counter()
        self.failures: list[tuple[float, str]] = []
        # every failure's status and message, counted ("RESOURCE_EXHAUSTED: ... 100 ms ...": which
        # bound refused), up to MESSAGES distinct ones (the rest under "(other)")
        self.messages: Counter[str] = Counter()
        self.streamed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def start(self) -> Load:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _fail(self, code: str) -> None:
        self.codes[code] += 1
        self.failures.append((time.monotonic(), code))

    async def _one(self, stub: Any) -> None:
        try:
            await stub.Classify(pb.ClassifyRequest(texts=TEXTS[:1]), timeout=10)
            self.codes["OK"] += 1
        except grpc.aio.AioRpcError as exc:
            self._fail(exc.code().name)
            tally(self.messages, exc.code().name, exc.details() or "")

    async def _stream(self, stub: Any) -> None:
        while not self._stop.is_set():
            call = stub.ClassifyStream()  # one long-lived stream, as streaming clients keep
            try:
                while not self._stop.is_set():
                    await call.write(pb.ClassifyRequest(id=str(self.streamed), texts=TEXTS))
                    await call.read()
                    self.streamed += 1
                await call.done_writing()
            except grpc.aio.AioRpcError as exc:
                self._fail(f"stream {exc.code().name}")
                await asyncio.sleep(0.1)

    async def _main(self) -> None:
        options = [[("grpc.use_local_subchannel_pool", 1), ("soak.connection", i)]
                   for i in range(self.connections)]  # fmt: skip
        channels = [grpc.aio.insecure_channel(self.address, options=o) for o in options]
        stubs = [pb_grpc.ClassifierStub(c) for c in channels]
        stream = asyncio.create_task(
            self._stream(stubs[0]) if self.with_stream else asyncio.sleep(0)
        )
        rng = np.random.default_rng(0)
        tasks: set[asyncio.Task[None]] = set()
        next_at, sent = time.monotonic(), 0
        while not self._stop.is_set():
            next_at += rng.exponential(1.0 / self.rate)
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            task = asyncio.create_task(self._one(stubs[sent % len(stubs)]))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            sent += 1
        await asyncio.gather(*tasks)
        stream.cancel()
        await asyncio.gather(stream, return_exceptions=True)
        for channel in channels:
            await channel.close()


def measure_peak(address: str, seconds: float = 10.0, callers: int = 16) -> float:
    """Requests a second of `callers` closed-loop callers (over as many connections)."""
    done = [0]
    end = time.monotonic() + seconds

    def caller(i: int) -> None:
        with grpc.insecure_channel(address, options=[("soak.peak", i)]) as channel:
            stub = pb_grpc.ClassifierStub(channel)
            while time.monotonic() < end:
                stub.Classify(pb.ClassifyRequest(texts=TEXTS[:1]), timeout=10)
                done[0] += 1

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done[0] / seconds


def slope_per_hour(times: list[float], values: list[float]) -> float | None:
    """Least-squares slope of `values` over `times` (seconds), per hour; None if too few."""
    if len(times) < 30:
        return None
    return float(np.polyfit(np.asarray(times), np.asarray(values), 1)[0] * 3600)


def rss_growth(points: list[tuple[float, float]]) -> dict[str, float] | None:
    """A process's (seconds since its first sample, RSS MiB) series judged against the bound:
    the median of the last minute minus that of the first minute after WARMUP; None when the
    process lived too short for two minutes after its warm-up."""
    if not points:
        return None
    first = points[0][0]
    later = [(t - first, v) for t, v in points if t - first >= WARMUP]
    if not later or later[-1][0] - later[0][0] < 120:
        return None
    start = [v for t, v in later if t - later[0][0] < 60]
    end = [v for t, v in later if later[-1][0] - t < 60]
    before, after = float(np.median(start)), float(np.median(end))
    bound = max(GROWTH_MB, GROWTH_FRACTION * before)
    return {"start_mb": round(before, 1), "end_mb": round(after, 1),
            "growth_mb": round(after - before, 1), "bound_mb": round(bound, 1),
            "flat": after - before <= bound}  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(prefix="textserve-soak-"))
    source = newest_version(args.repository / args.model, complete=True)
    if source is None:
        raise SystemExit(f"no version of {args.model} in {args.repository}")
    model_dir = scratch / args.model
    shutil.copytree(source[1], version_dir(model_dir, source[0]))
    extra = ["--workers", str(args.workers), "--poll-interval", "1", "--grace-period", "10"]
    samples: list[dict[str, Any]] = []
    events: list[tuple[float, str]] = []
    try:
        with start_server(scratch, args.model, extra) as server:
            assert server.pid is not None
            peak = measure_peak(server.address)
            rate = args.rate or max(1.0, args.load * peak)
            print(f"peak {peak:.0f} requests/s (16 callers); soak at {rate:.0f}/s", flush=True)
            load = Load(server.address, rate, connections=max(8, 16 * args.workers)).start()
            t0 = time.monotonic()
            end = t0 + args.minutes * 60
            next_reload, killed = t0 + args.reload_every, False
            while (now := time.monotonic()) < end:
                processes = {}
                for pid in server_pids(server.pid):
                    if (info := _proc(pid)) is not None:
                        processes[str(pid)] = info
                samples.append({"t": now - t0, "errors": len(load.failures),
                                "ok": load.codes["OK"], "streamed": load.streamed,
                                "processes": processes})  # fmt: skip
                if len(samples) % PROGRESS_EVERY == 1:  # long work shows progress
                    print(progress(now - t0, args.minutes, load, processes), flush=True)
                if now >= next_reload:
                    version = publish_copy(model_dir)
                    events.append((now - t0, f"version {version}"))
                    next_reload += args.reload_every
                if args.kill and not killed and now - t0 >= args.minutes * 30:
                    workers = [p for p in server_pids(server.pid) if p != server.pid]
                    if workers:
                        os.kill(workers[0], signal.SIGKILL)
                        events.append((now - t0, f"SIGKILL worker {workers[0]}"))
                    killed = True
                time.sleep(max(0.0, 1.0 - (time.monotonic() - now)))
            load.stop()
            kill_at = next((t for t, e in events if e.startswith("SIGKILL")), None)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return summarize(args, samples, events, load, t0, kill_at, peak, rate)


def of_the_killed_worker(
    failures: list[tuple[float, str]], t0: float, kill_at: float | None
) -> list[str]:
    """The failures that are the killed worker's: UNAVAILABLE (its calls in flight, streams
    removed, connections reset as it went) within KILL_GRACE of the kill. Any other status
    then (RESOURCE_EXHAUSTED from a survivor handed the load, say) is an error otherwise."""
    if kill_at is None:
        return []
    return [
        code for t, code in failures
        if 0 <= t - t0 - kill_at <= KILL_GRACE and code.rpartition(" ")[2] == "UNAVAILABLE"
    ]  # fmt: skip


def summarize(
    args: argparse.Namespace,
    samples: list[dict[str, Any]],
    events: list[tuple[float, str]],
    load: Load,
    t0: float,
    kill_at: float | None,
    peak: float,
    rate: float,
) -> dict[str, Any]:
    by_kill = of_the_killed_worker(load.failures, t0, kill_at)
    slopes, growth = {}, {}
    for pid in {p for s in samples for p in s["processes"]}:
        points = [(s["t"], s["processes"][pid]["rss_mb"]) for s in samples if pid in s["processes"]]
        first = points[0][0]
        later = [(t, v) for t, v in points if t - first >= WARMUP]
        slope = slope_per_hour([t for t, _ in later], [v for _, v in later])
        if slope is not None:
            slopes[pid] = round(slope, 1)
        if (judged := rss_growth(points)) is not None:
            growth[pid] = judged
    result = {
        "minutes": args.minutes,
        "workers": args.workers,
        "peak_rps": round(peak, 1),
        "rate_rps": round(rate, 1),
        "ok": load.codes["OK"],
        "streamed": load.streamed,
        "codes": dict(load.codes),
        "messages": dict(load.messages),  # each failure's status and message: who answered it
        "errors": len(load.failures),
        "errors_of_the_killed_worker": len(by_kill),
        "errors_otherwise": len(load.failures) - len(by_kill),
        "rss_slope_mb_per_hour": slopes,
        "rss_growth": growth,
        "rss_flat": all(g["flat"] for g in growth.values()) if growth else None,
        "events": events,
        "samples": samples,
    }
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "soak.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(samples, events, args.output / "soak.png")
    return result


def plot(samples: list[dict[str, Any]], events: list[tuple[float, str]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    pids = sorted({p for s in samples for p in s["processes"]}, key=int)
    for key, axis, unit in zip(("rss_mb", "threads", "fds"), axes, ("MiB", "", ""), strict=True):
        for pid in pids:
            points = [(s["t"], s["processes"][pid][key]) for s in samples if pid in s["processes"]]
            axis.plot([t for t, _ in points], [v for _, v in points], label=f"pid {pid}")
        axis.set_ylabel(f"{key} {unit}".strip())
        for t, what in events:
            axis.axvline(t, color="red" if "SIGKILL" in what else "grey", lw=0.6, ls="--")
    axes[0].legend(fontsize=7, ncol=3)
    axes[0].set_title("textserve soak: per process (grey: new version published; red: a kill)")
    axes[-1].set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m textserve.bench.soak", description=__doc__)
    parser.add_argument("--repository", type=Path, default=Path("models"))
    parser.add_argument("--model", default="default")
    parser.add_argument("--minutes", type=float, default=8.0, help="soak length (default 8)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--load", type=float, default=0.7, help="fraction of the peak")
    parser.add_argument("--reload-every", type=float, default=60.0, help="seconds")
    parser.add_argument(
        "--rate", type=float, default=0.0, help="requests/s (default: --load x the measured peak)"
    )
    parser.add_argument(
        "--no-kill", dest="kill", action="store_false", help="no worker SIGKILLed halfway"
    )
    parser.add_argument("--output", type=Path, default=Path("bench/results/soak"))
    args = parser.parse_args(argv)
    if not args.minutes > 0 or not 0 < args.load <= 1 or args.workers < 1 or args.rate < 0:
        parser.error(
            "--minutes must be positive, --load within (0, 1], --workers at least 1, "
            "--rate not negative"
        )
    result = run(args)
    print(
        f"soak {args.minutes:g} min, {args.workers} workers at {result['rate_rps']:.0f} req/s "
        f"(peak {result['peak_rps']:.0f}): {result['ok']} OK, {result['streamed']} streamed, "
        f"errors {result['errors']} ({result['errors_of_the_killed_worker']} within "
        f"{KILL_GRACE:g}s of the worker kill); RSS slope after warm-up, MiB/hour per process: "
        f"{result['rss_slope_mb_per_hour']}; wrote {args.output}/soak.json and soak.png"
    )
    for pid, g in sorted(result["rss_growth"].items()):
        print(
            f"  pid {pid}: RSS {g['start_mb']:.1f} -> {g['end_mb']:.1f} MiB (first and last minute "
            f"after warm-up), growth {g['growth_mb']:+.1f} MiB, bound {g['bound_mb']:.1f}: "
            + ("flat" if g["flat"] else "GROWING")
        )
    verdict = {True: "flat", False: "NOT flat", None: "not judged (too short)"}[result["rss_flat"]]
    print(f"memory: {verdict}; errors besides the killed worker's: {result['errors_otherwise']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
