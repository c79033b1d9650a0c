"""An open loop second by second: what arrived, what was answered and refused, and how long
each took, by the second the request arrived in (bench.overload's timeline and its plot).

    rows = per_second(raw.outcomes, duration=40, refusals=("RESOURCE_EXHAUSTED", "HTTP_429"))
    plot(rows_by_title, Path("overload.png"), bounds={"accepted p99": 750.0, "refusal": 50.0})

A row's figures for the whole window say whether a promise held; the timeline says when it did
not: the first seconds of an overload before the server judges it, an episode in the middle,
a door that flaps.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from textserve.bench.stats import percentiles


def per_second(
    outcomes: Iterable[tuple[float, float, str | None]], duration: float, refusals: Sequence[str]
) -> list[dict[str, Any]]:
    """One dict per second of the window: t (its start, s), arrivals, ok, refused, other (any
    other error), accepted_p50_ms / accepted_p99_ms, refused_p99_ms (None when there were none)."""
    seconds = max(1, math.ceil(duration))
    accepted: list[list[float]] = [[] for _ in range(seconds)]
    refused: list[list[float]] = [[] for _ in range(seconds)]
    other = [0] * seconds
    for at, took, code in outcomes:
        i = min(seconds - 1, max(0, int(at)))
        if code is None:
            accepted[i].append(took)
        elif code in refusals:
            refused[i].append(took)
        else:
            other[i] += 1
    rows = []
    for i in range(seconds):
        ok = percentiles(accepted[i], (50, 99)) if accepted[i] else None
        no = percentiles(refused[i], (99,)) if refused[i] else None
        rows.append(
            {
                "t": i,
                "arrivals": len(accepted[i]) + len(refused[i]) + other[i],
                "ok": len(accepted[i]),
                "refused": len(refused[i]),
                "other": other[i],
                "accepted_p50_ms": None if ok is None else round(ok["p50"] * 1e3, 2),
                "accepted_p99_ms": None if ok is None else round(ok["p99"] * 1e3, 2),
                "refused_p99_ms": None if no is None else round(no["p99"] * 1e3, 2),
            }
        )
    return rows


def plot(timelines: dict[str, tuple[list[dict[str, Any]], dict[str, float]]], path: Path) -> None:
    """One column per timeline (title -> (per_second rows, bounds: label -> ms, drawn as dashed
    lines)): requests per second above, latencies (log scale) below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = max(1, len(timelines))
    fig, axes = plt.subplots(2, columns, figsize=(4.2 * columns, 6), sharex="col", squeeze=False)
    for column, (title, (rows, bounds)) in enumerate(timelines.items()):
        top, bottom = axes[0][column], axes[1][column]
        t = [r["t"] for r in rows]
        for key, colour in (("arrivals", "grey"), ("ok", "green"), ("refused", "orange")):
            top.plot(t, [r[key] for r in rows], label=key, color=colour, lw=1.2)
        if any(r["other"] for r in rows):
            top.plot(t, [r["other"] for r in rows], label="other errors", color="red", lw=1.2)
        top.set_title(title, fontsize=9)
        top.set_ylabel("requests / s")
        top.legend(fontsize=7)
        for key, colour in (
            ("accepted_p50_ms", "green"), ("accepted_p99_ms", "darkgreen"),
            ("refused_p99_ms", "orange"),
        ):  # fmt: skip
            points = [(r["t"], r[key]) for r in rows if r[key]]
            bottom.plot(
                [p[0] for p in points], [p[1] for p in points], color=colour, lw=1.2,
                label=key.replace("_ms", "").replace("_", " "),
            )  # fmt: skip
        for label, ms in bounds.items():
            bottom.axhline(ms, color="black", lw=0.7, ls="--")
            bottom.text(0, ms, f" {label}", fontsize=7, va="bottom")
        bottom.set_yscale("log")
        bottom.set_ylabel("ms (by the second it arrived)")
        bottom.set_xlabel("seconds of the open loop")
        bottom.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
