"""What one refused call costs a grpc.aio server, by where it is refused.

    python -m textserve.bench.refusal --calls 40000 --rounds 3 --output bench/results/refusal

Under overload most calls a server sees are refused (at 1.5x the peak, a third of them or
more), and each refusal takes the event loop's CPU from the calls it serves. Each mode is a
fresh server process (grpc.aio, one registered unary method, a 100-byte message) that answers
every call the same way:

- served: a unary handler that answers (a call's floor: what grpc.aio does for any call);
- limiter: grpc.aio's own maximum_concurrent_rpcs with its one slot held: refused in Cython
  before any handler runs or any message is read (the cheapest refusal grpc.aio has);
- abort: a unary handler that refuses with context.abort (an exception through grpc.aio);
- set_code: a unary handler that sets RESOURCE_EXHAUSTED and returns;
- door: textserve's own guard of an inference method with its door shut
  (service/servicers/interceptors.py `_guard_door`), what a worker under overload does.

The client, one process of 32 callers, is pinned to the last CPU when there are two or more;
the server runs where the scheduler puts it, like a one-worker `textserve serve` (with
`--server-cpus 0` pinned apart: on one core the thread switches between grpc's poller and the
event loop weigh as much as the work, and the modes come out within the machine's noise of
each other - bench/results/refusal/pinned). The figure is the server process's CPU (user +
system, /proc) per call over `--calls` calls after a warm-up of as many; the rounds run the
modes in turn, again, and each mode's median is given with its ratio to the limiter's,
measured in the same run.
Exit status 2 on a bad flag.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import grpc

from textserve.bench.describe import describe_machine
from textserve.bench.overload import cpu_list
from textserve.bench.process import spawn
from textserve.procfs import tree_cpu_seconds

SERVICE, METHOD = "textserve.v1.Classifier", "Classify"  # a door's method (metric_labels.METHODS)
MODES = ("served", "limiter", "abort", "set_code", "door")
REFUSED = "no room (refusal bench)"
CALLERS = 32
MESSAGE = b"a" * 100


def _raw(data: bytes) -> bytes:
    return data


def _handler(mode: str) -> grpc.RpcMethodHandler:
    async def served(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return b"ok"

    async def held(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await asyncio.sleep(3600)  # the limiter's one slot, held by the first call
        return b""

    async def abort(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, REFUSED)
        return b""  # pragma: no cover - abort raises

    async def set_code(request: bytes, context: grpc.aio.ServicerContext) -> None:
        context.set_code(grpc.StatusCode.RESOURCE_EXHAUSTED)
        context.set_details(REFUSED)

    behavior = {"served": served, "limiter": held, "abort": abort, "set_code": set_code}
    if mode == "door":
        from textserve.service.door import Door
        from textserve.service.servicers.interceptors import guard

        door = Door(ceiling=0, wait=None)  # shut: every call is past its bound
        handler = grpc.unary_unary_rpc_method_handler(served, _raw, _raw)
        return guard(f"/{SERVICE}/{METHOD}", handler, door=door)
    return grpc.unary_unary_rpc_method_handler(behavior[mode], _raw, _raw)


async def serve(mode: str, ready_file: Path) -> None:
    """One mode's server on 127.0.0.1 (its address in `ready_file`), until killed."""
    from textserve.service.cli import write_ready_file

    server = grpc.aio.server(maximum_concurrent_rpcs=1 if mode == "limiter" else None)
    server.add_registered_method_handlers(SERVICE, {METHOD: _handler(mode)})
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    write_ready_file(ready_file, f"127.0.0.1:{port}", None, 1)
    await server.wait_for_termination()


async def _drive(address: str, pid: int, mode: str, calls: int) -> dict[str, Any]:
    """Warm up, then `calls` calls from CALLERS callers: server CPU per call and the codes."""
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_unary(f"/{SERVICE}/{METHOD}")
        holder = None
        if mode == "limiter":
            holder = asyncio.ensure_future(call(MESSAGE))
            await asyncio.sleep(0.3)  # the slot is taken before the warm-up
        codes: collections.Counter[str] = collections.Counter()
        details: set[str] = set()

        async def caller(n: int) -> None:
            for _ in range(n):
                try:
                    await call(MESSAGE)
                    codes["OK"] += 1
                except grpc.aio.AioRpcError as error:
                    codes[error.code().name] += 1
                    details.add(error.details() or "")

        per_caller = max(1, calls // CALLERS)
        await asyncio.gather(*(caller(per_caller) for _ in range(CALLERS)))  # warm-up
        codes.clear()
        cpu0, start = tree_cpu_seconds(pid) or 0.0, time.perf_counter()
        await asyncio.gather(*(caller(per_caller) for _ in range(CALLERS)))
        seconds, cpu = time.perf_counter() - start, (tree_cpu_seconds(pid) or 0.0) - cpu0
        if holder is not None:
            holder.cancel()
        total = per_caller * CALLERS
        return {
            "mode": mode,
            "calls": total,
            "calls_per_s": total / seconds,
            "server_cpu_us": cpu / total * 1e6,
            "codes": dict(codes),
            "details": sorted(details),
        }


def measure(
    modes: tuple[str, ...], calls: int, rounds: int, server_cpus: frozenset[int] | None = None
) -> list[dict[str, Any]]:
    """Every mode `rounds` times, in turn; one dict per run."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 2:
        os.sched_setaffinity(0, set(cpus[-1:]))  # the client
    runs = []
    for round_ in range(rounds):
        for mode in modes:
            command = [sys.executable, "-m", "textserve.bench.refusal", "--serve", mode]
            with spawn(command, cpus=server_cpus, stop_timeout=5) as server:
                assert server.pid is not None
                run = asyncio.run(_drive(server.address, server.pid, mode, calls))
            run["round"] = round_ + 1
            print(
                f"round {round_ + 1}/{rounds} {mode:9s} {run['server_cpu_us']:7.1f} us/call "
                f"{run['calls_per_s']:8.0f} calls/s  {run['codes']}",
                flush=True,
            )
            runs.append(run)
    return runs


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each mode's median server CPU per call and its ratio to the limiter's."""
    by_mode: dict[str, list[float]] = collections.defaultdict(list)
    for run in runs:
        by_mode[run["mode"]].append(run["server_cpu_us"])
    medians = {mode: statistics.median(values) for mode, values in by_mode.items()}
    base = medians.get("limiter")
    return [
        {
            "mode": mode,
            "server_cpu_us": round(medians[mode], 1),
            "runs": [round(v, 1) for v in by_mode[mode]],
            "vs_limiter": round(medians[mode] / base, 2) if base else None,
        }
        for mode in by_mode
    ]


def format_table(
    rows: list[dict[str, Any]], machine: dict[str, Any], server_cpus: frozenset[int] | None = None
) -> str:
    where = "any" if server_cpus is None else ",".join(map(str, sorted(server_cpus)))
    lines = [
        f"server CPU per call by where it is refused ({machine.get('cpu_model')}, "
        f"{machine.get('logical_cpus')} CPUs; the client on the last, the server on {where})",
        "| mode | server CPU µs/call (median) | ÷ limiter | runs |",
        "|---|---|---|---|",
    ]
    for row in rows:
        ratio = "" if row["vs_limiter"] is None else f"{row['vs_limiter']:.2f}×"
        runs = ", ".join(f"{v:.0f}" for v in row["runs"])
        lines.append(f"| {row['mode']} | {row['server_cpu_us']:.0f} | {ratio} | {runs} |")
    return "\n".join(lines)


def _modes(text: str) -> tuple[str, ...]:
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise argparse.ArgumentTypeError(f"modes are {', '.join(MODES)}; got {text!r}")
    return modes


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m textserve.bench.refusal", description=__doc__)
    parser.add_argument("--modes", type=_modes, default=MODES, help=",".join(MODES))
    parser.add_argument("--calls", type=_positive, default=40000, help="measured calls per run")
    parser.add_argument("--rounds", type=_positive, default=3)
    parser.add_argument("--output", type=Path, default=None, help="writes refusal.json and .txt")
    parser.add_argument(
        "--server-cpus", type=cpu_list, default=None, help="pin each server here (e.g. 0)"
    )
    parser.add_argument("--serve", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--ready-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        if args.ready_file is None:
            parser.error("--serve needs --ready-file")
        asyncio.run(serve(args.serve, args.ready_file))
        return 0
    machine = describe_machine()
    runs = measure(args.modes, args.calls, args.rounds, args.server_cpus)
    rows = summarize(runs)
    table = format_table(rows, machine, args.server_cpus)
    print(table)
    if args.output is not None:
        args.output.mkdir(parents=True, exist_ok=True)
        data = {"machine": machine, "calls": args.calls, "rounds": args.rounds,
                "server_cpus": sorted(args.server_cpus or ())}  # fmt: skip
        (args.output / "refusal.json").write_text(
            json.dumps({**data, "summary": rows, "runs": runs}, indent=1) + "\n"
        )
        (args.output / "refusal.txt").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
