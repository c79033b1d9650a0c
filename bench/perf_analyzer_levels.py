"""One perf_analyzer level, run until it yields figures: a noisy machine marks a level
unstable (with its windows' spread), it never ends a `make bench` sweep."""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from collections.abc import Callable

from textserve.bench.perf_analyzer_setup import tool_env

# What perf_analyzer prints (and exits 2 with, writing no CSV) when its windows never agree.
UNSTABLE = "Failed to obtain stable measurement"
# One window's figure in its -v output: "Pass [3] throughput: 382.392 infer/sec. Avg ..."
PASS_LINE = re.compile(r"Pass \[\d+\] throughput: ([0-9.]+) infer/sec")
# A level that never stabilizes is measured again with windows this many times longer, and if
# it is still unstable, once more with the check off (any three windows agree): its figures are
# then kept, marked unstable with the spread its windows showed, and the sweep goes on.
LONGER_WINDOWS = 3
NO_STABILITY_CHECK = 100_000


def window_spread(output: str) -> tuple[float, int] | None:
    """How far perf_analyzer's windows disagreed: (max - min) / median of their throughput,
    in per cent, and how many windows there were; None without two windows to compare."""
    values = [float(v) for v in PASS_LINE.findall(output)]
    if len(values) < 2:
        return None
    middle = statistics.median(values)
    spread = (max(values) - min(values)) / middle * 100 if middle > 0 else float("inf")
    return spread, len(values)


def measure_level(
    command: Callable[..., list[str]], args: argparse.Namespace, tag: str
) -> tuple[float, float] | int | None:
    """Run one level until perf_analyzer writes its CSV: as asked, then (if its windows never
    agreed) with windows LONGER_WINDOWS times longer, then with the stability check off.

    None when the level was stable; (spread %, windows) of the last unstable attempt when its
    figures come from the unchecked one; an exit status when perf_analyzer failed otherwise.
    A noisy machine marks a level, it never ends the sweep."""
    attempts = [
        (args.request_count, args.stability),
        (args.request_count * LONGER_WINDOWS, args.stability),
        (args.request_count * LONGER_WINDOWS, NO_STABILITY_CHECK),
    ]
    unstable: tuple[float, float] | None = None
    for number, (count, stability) in enumerate(attempts):
        argv = command(request_count=count, stability=stability)
        print("+", " ".join(argv), flush=True)
        try:
            done = subprocess.run(
                argv,
                env=tool_env(args.tools),
                capture_output=True,
                text=True,
                timeout=args.level_timeout,
            )
        except subprocess.TimeoutExpired as exc:
            for partial in (exc.stdout, exc.stderr):  # bytes here even with text=True
                if partial:
                    sys.stderr.write(
                        partial.decode(errors="replace") if isinstance(partial, bytes) else partial
                    )
            sys.stderr.write(f"perf_analyzer did not finish in {args.level_timeout:g}s\n")
            return 124
        output = done.stdout + done.stderr
        if done.returncode == 0:
            return unstable
        if UNSTABLE not in output or number == len(attempts) - 1:
            sys.stderr.write(output)
            return done.returncode
        spread, windows = window_spread(output) or (float("nan"), 0)
        unstable = (spread, float(windows))
        then = (
            f"again with {LONGER_WINDOWS}x longer windows"
            if number == 0
            else "once more without the stability check; its figures are marked unstable"
        )
        print(
            f"UNSTABLE {tag}: throughput varied by {spread:.0f}% over {windows} windows "
            f"(--stability {args.stability}%, {count} requests a window); measuring {then}",
            flush=True,
        )
    return unstable
