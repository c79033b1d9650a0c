"""Benchmark output: the acceptance targets, a terminal table, the JSON file and the PNG plot.

    results["targets"] = evaluate_targets(results)
    print(format_table(results))
    write_results(results, Path("bench/results"))   # textserve_bench.{json,txt,png}

evaluate_targets and format_table are pure (results dict in, figures out); the plot needs
matplotlib (textserve[bench]) and is skipped with a note without it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

STEM = "textserve_bench"
# The project's targets on the reference 2-core machine (issue #8); see evaluate_targets.
TARGET_TEXTS_PER_S_AT_128 = 1000.0
TARGET_P99_MS_AT_128 = 150.0
TARGET_BATCHING_GAIN_AT_64 = 3.0
TARGET_HALF_LOAD_P99_OVER_P50 = 3.0
TARGET_EFFICIENCY = {"1": 0.8, "16": 0.9}
TARGET_WORKERS_GAIN = 1.25  # issue 15: --workers 2 on 2 cores at 128 callers
# the single-step servers in the plot: marker, colour
MARKERS = {"batching-off": ("x", "black"), "trivial": ("^", "grey"), "echo": ("s", "purple")}


def _closed(results: dict[str, Any], server: str, concurrency: int, per_request: int = 1) -> Any:
    for step in results.get("steps", []):
        if (
            step["server"] == server
            and step["mode"] == "closed"
            and step["concurrency"] == concurrency
            and step["texts_per_request"] == per_request
        ):
            return step
    return None


def _target(name: str, value: float | None, op: str, limit: float, unit: str = "") -> dict:
    ok = None
    if value is not None and not math.isnan(value):
        ok = value >= limit if op == ">=" else value <= limit
    return {"name": name, "value": value, "target": f"{op} {limit:g}{unit}", "ok": ok}


def evaluate_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each acceptance target with the measured value and ok (None: not measured this run)."""
    return [*_peak_targets(results), *_batching_targets(results), *_scaling_targets(results)]


def _peak_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Throughput and p99 at 128 callers."""
    targets = []
    at128 = _closed(results, "batching", 128)
    targets.append(
        _target(
            "texts/s at 128 callers (1 text/request)",
            at128["throughput_texts_per_s"] if at128 else None,
            ">=",
            TARGET_TEXTS_PER_S_AT_128,
        )
    )
    targets.append(
        _target(
            "p99 latency at 128 callers",
            at128["latency_ms"]["p99"] if at128 else None,
            "<=",
            TARGET_P99_MS_AT_128,
            " ms",
        )
    )
    return targets


def _batching_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Batching on against off, and the latency at half the peak against one caller."""
    targets = []
    on = _closed(results, "batching", 64)
    off = _closed(results, "batching-off", 64)
    gain = None
    if on and off and off["throughput_texts_per_s"] > 0:
        gain = on["throughput_texts_per_s"] / off["throughput_texts_per_s"]
    targets.append(
        _target("batching on / off at 64 callers", gain, ">=", TARGET_BATCHING_GAIN_AT_64, "x")
    )
    one = _closed(results, "batching", 1)
    opens = [
        s for s in results.get("steps", []) if s["mode"] == "open" and s["server"] == "batching"
    ]
    peak = max(
        (s["throughput_texts_per_s"] for s in results.get("steps", [])
         if s["server"] == "batching" and s["mode"] == "closed" and s["texts_per_request"] == 1),
        default=None,
    )  # fmt: skip
    ratio = None
    if one and opens and peak:
        # the open-loop step nearest half of the peak rate
        half = min(opens, key=lambda s: abs(s["rate_requests_per_s"] - peak / 2))
        ratio = half["latency_ms"]["p99"] / one["latency_ms"]["p50"]
    targets.append(
        _target(
            "p99 at half the peak rate / p50 at 1 caller",
            ratio,
            "<=",
            TARGET_HALF_LOAD_P99_OVER_P50,
            "x",
        )
    )
    return targets


def _scaling_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """CPU efficiency against in-process, --workers scaling, the load generator's headroom."""
    targets = []
    efficiency = results.get("efficiency", {})
    for per_request, limit in TARGET_EFFICIENCY.items():
        entry = efficiency.get(per_request)
        targets.append(
            _target(
                f"CPU efficiency in-process / server, {per_request} text(s)/request",
                entry["ratio"] if entry else None,
                ">=",
                limit,
            )
        )
    workers = results.get("workers") or {}
    counts = workers.get("counts", [])
    if len(counts) > 1:  # issue 15: the most workers against the first count (1)
        w = workers.get(str(counts[-1])) or {}
        name = (
            f"--workers {counts[-1]} / {counts[0]} throughput at {workers['concurrency']} callers"
        )
        targets.append(_target(name, w.get("throughput_ratio"), ">=", TARGET_WORKERS_GAIN, "x"))
        p99 = w.get("p99_ms")
        targets.append(
            _target(
                f"--workers {counts[-1]} p99 / --workers {counts[0]} p99",
                p99[1] / p99[0] if p99 and p99[0] else None,
                "<=",
                1.0,
                "x",
            )
        )
    check = results.get("loadgen_check") or {}
    targets.append(
        _target(
            "load generator headroom: echo server / real peak",
            check.get("headroom"),
            ">=",
            1.0,
            "x",
        )
    )
    return targets


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _efficiency_line(name: str, per_request: str, e: dict[str, Any]) -> str:
    sorted_part = (
        f" (length-sorted in-process: {e['ratio_sorted']:.2f})" if "ratio_sorted" in e else ""
    )
    return (
        f"efficiency{' of ' + name if name else ''} at {per_request} text(s)/request "
        f"(c={e['concurrency']}, batch {e['batch_size']}): in-process "
        f"{e['inprocess_cpu_per_text_ms']:.3f} / server {e['server_cpu_per_text_ms']:.3f} ms "
        f"CPU/text = {e['ratio']:.2f}{sorted_part}"
    )


def format_table(results: dict[str, Any]) -> str:
    """The figures as fixed-width text: one row per step, then ceilings and targets."""
    return "\n".join(
        [
            *_step_lines(results),
            *_comparison_lines(results),
            *_check_lines(results),
            *_target_lines(results),
        ]
    )


def _step_lines(results: dict[str, Any]) -> list[str]:
    """The header and one row per step."""
    header = (
        f"{'server':<13}{'load':<15}{'texts/req':>9}{'texts/s':>9}{'req/s':>8}"
        f"{'p50':>8}{'p90':>8}{'p95':>8}{'p99':>8}{'max':>8}{'errors':>8}"
        f"{'batch':>7}{'pad':>6}{'srv cpu':>8}{'ms/text':>8}{'lg cpu':>7}{'other':>6}{'busy':>6}"
    )
    lines = [
        "latency in ms; cpu = share of all cores (srv: the server, lg: the load generator, "
        "other: every other process, busy: the whole machine); ms/text = server CPU time per "
        "text; workers-N: `serve --workers N` over the same connections",
        header,
    ]
    for s in results.get("steps", []):
        load = (
            f"closed c={s['concurrency']}"
            if s["mode"] == "closed"
            else f"open {s['rate_requests_per_s']:.0f}/s"
        )
        if s.get("streams"):
            load = f"stream {s['streams']}x{s['inflight_per_stream']}"
        lat = s["latency_ms"]
        srv = s.get("server_metrics") or {}
        errors = sum(s["errors"].values()) + s.get("not_sent", 0)
        lines.append(
            f"{s['server']:<13}{load:<15}{s['texts_per_request']:>9}"
            f"{s['throughput_texts_per_s']:>9.0f}{s['throughput_requests_per_s']:>8.0f}"
            + "".join(f"{_fmt(lat[k]):>8}" for k in ("p50", "p90", "p95", "p99", "max"))
            + f"{errors:>8}{_fmt(srv.get('mean_batch_size')):>7}"
            f"{_fmt(srv.get('padding_ratio'), 2):>6}{_fmt(srv.get('cpu_share'), 2):>8}"
            f"{_fmt(srv.get('cpu_per_text_ms'), 3):>8}{_fmt(s['loadgen']['cpu_share'], 2):>7}"
            f"{_fmt(s.get('others_cpu_share'), 2):>6}{_fmt(s.get('machine_cpu_share'), 2):>6}"
        )
    return lines


def _comparison_lines(results: dict[str, Any]) -> list[str]:
    """--workers against one, the in-process ceilings, the CPU efficiencies."""
    lines = []
    workers = results.get("workers") or {}
    for count in workers.get("counts", [])[1:]:
        w = workers.get(str(count))
        if w is None:
            continue
        first = workers["counts"][0]
        lines.append(
            f"--workers {count} vs {first} (c={workers['concurrency']}, "
            f"{workers['connections']} connections): {w['throughput_ratio']:.2f}x the "
            f"throughput, p99 {_fmt(w['p99_ms'][0])} -> {_fmt(w['p99_ms'][1])} ms, server CPU "
            f"{_fmt(w['server_cpu_share'][0], 2)} -> {_fmt(w['server_cpu_share'][1], 2)}, "
            f"machine busy {_fmt(w['machine_cpu_share'][0], 2)} -> "
            f"{_fmt(w['machine_cpu_share'][1], 2)}"
        )
    ceilings = results.get("ceilings") or {}
    if ceilings.get("skipped"):
        lines.append(f"ceilings: skipped ({ceilings['skipped']})")
    for kind in ("onnxruntime", "onnxruntime_sorted", "torch"):
        for size, c in sorted((ceilings.get(kind) or {}).items(), key=lambda kv: int(kv[0])):
            if "skipped" in c:
                lines.append(f"in-process {kind} (batch {size}): skipped ({c['skipped']})")
            else:
                lines.append(
                    f"in-process {kind} (batch {size}, {c['threads']} threads): "
                    f"{c['texts_per_s']:.0f} texts/s, {c['cpu_per_text_ms']:.3f} ms CPU/text, "
                    f"padding {c['padding_ratio']:.2f}"
                )
    stream = (results.get("config") or {}).get("api") == "stream"
    for name, key in (("stream" if stream else "", "efficiency"), ("unary", "efficiency_unary")):
        for per_request, e in sorted((results.get(key) or {}).items()):
            lines.append(_efficiency_line(name, per_request, e))
    return lines


def _check_lines(results: dict[str, Any]) -> list[str]:
    """The load generator check: the echo and trivial servers beside the real one."""
    lines = []
    check = results.get("loadgen_check") or {}
    if check:
        trivial = check.get("trivial_texts_per_s")
        lines.append(
            f"load generator check (c={check['concurrency']}): model-less echo server "
            f"{check['echo_texts_per_s']:.0f} texts/s = {check['headroom']:.2f}x the real peak "
            f"{check['real_peak_texts_per_s']:.0f}; textserve on a trivial model: "
            + (f"{trivial:.0f} texts/s" if trivial else check.get("trivial_skipped", "-"))
        )
        lines.append(
            "server CPU per text at that load: gRPC transport alone (echo) "
            f"{_fmt(check.get('echo_cpu_per_text_ms'), 3)} ms, textserve without the model "
            f"(trivial) {_fmt(check.get('trivial_cpu_per_text_ms'), 3)} ms, with the model "
            f"{_fmt(check.get('real_cpu_per_text_ms'), 3)} ms"
            + (
                f"; echo over unary calls {_fmt(check['echo_unary_cpu_per_text_ms'], 3)} ms"
                if check.get("echo_unary_cpu_per_text_ms") is not None
                else ""
            )
        )
    return lines


def _target_lines(results: dict[str, Any]) -> list[str]:
    """Each target with its mark, then the machine the figures were measured on."""
    lines = ["targets:"]
    for t in results.get("targets", []):
        mark = {True: "PASS", False: "MISS", None: "n/a "}[t["ok"]]
        lines.append(f"  [{mark}] {t['name']}: {_fmt(t['value'], 2)} (target {t['target']})")
    machine = results.get("machine") or {}
    if machine:
        versions = ", ".join(f"{k} {v}" for k, v in machine.get("versions", {}).items())
        lines.append(
            f"machine: {machine.get('usable_cpus')} usable CPUs ({machine.get('cpu_model')}), "
            f"load average {_fmt_load(machine.get('load_average'))} -> "
            f"{_fmt_load(machine.get('load_average_end'))}; providers "
            f"{machine.get('providers') or '-'}; {versions}"
        )
    return lines


def _fmt_load(load: Any) -> str:
    return "/".join(f"{x:.2f}" for x in load) if load else "-"


def plot(results: dict[str, Any], path: Path) -> Path | None:
    """Latency percentiles against throughput; None (nothing written) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(12, 6))
    steps = results.get("steps", [])
    # (mode, texts per request, label, line style, percentiles drawn)
    series = [
        ("closed", 1, "closed loop, 1 text/req", "-", ("p50", "p90", "p99")),
        ("open", 1, "open loop (Poisson), 1 text/req", ":", ("p50", "p99")),
        ("closed", 16, "closed loop, 16 texts/req", "--", ("p50", "p99")),
    ]
    colors = {"p50": "tab:blue", "p90": "tab:orange", "p99": "tab:red"}
    for mode, per_request, label, style, qs in series:
        chosen = sorted(
            (s for s in steps if s["server"] == "batching" and s["mode"] == mode
             and s["texts_per_request"] == per_request),
            key=lambda s: s["rate_requests_per_s"] if mode == "open" else s["concurrency"],
        )  # fmt: skip
        if not chosen:
            continue
        x = [s["throughput_texts_per_s"] for s in chosen]
        for q in qs:
            ax.plot(x, [s["latency_ms"][q] for s in chosen], style, marker="o", color=colors[q],
                    label=f"{q}, {label}")  # fmt: skip
        for s in chosen:
            tag = (
                f"c={s['concurrency']}" if mode == "closed" else f"{s['rate_requests_per_s']:.0f}/s"
            )
            ax.annotate(tag, (s["throughput_texts_per_s"], s["latency_ms"]["p99"]), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")  # fmt: skip
    for s in steps:
        if s["server"] in MARKERS and s["server"] != "echo":  # echo: the load generator's
            marker, color = MARKERS[s["server"]]
            ax.scatter([s["throughput_texts_per_s"]], [s["latency_ms"]["p99"]], zorder=3,
                       marker=marker, color=color,
                       label=f"p99, {s['server']} c={s['concurrency']}")  # fmt: skip
    ceilings = results.get("ceilings") or {}
    ceiling_lines: list[tuple[str, Any, str]] = [
        ("onnxruntime", "-.", "arrival order"),
        ("onnxruntime_sorted", (0, (1, 3)), "length-sorted"),
    ]
    for key, style, what in ceiling_lines:
        for size, c in sorted((ceilings.get(key) or {}).items(), key=lambda kv: int(kv[0])):
            ax.axvline(c["texts_per_s"], color="green", alpha=0.6, linestyle=style,
                       label=f"in-process onnxruntime, batch {size}, {what}")  # fmt: skip
    ax.set_yscale("log")
    ax.set_xlabel("throughput (texts/s)")
    ax.set_ylabel("latency (ms, log scale)")
    machine = results.get("machine") or {}
    model = results.get("model") or {}
    ax.set_title(
        f"textserve {model.get('name', '')}:{model.get('version', '')} on "
        f"{machine.get('usable_cpus', '?')} CPUs ({machine.get('cpu_model', '')}): "
        "latency percentiles vs throughput",
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _jsonable(value: Any) -> Any:
    """NaN is not JSON: write null instead."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def write_results(results: dict[str, Any], output: Path) -> dict[str, Path]:
    """textserve_bench.json (every figure), .txt (the table), .png (the plot, if matplotlib)."""
    output.mkdir(parents=True, exist_ok=True)
    written = {}
    json_path = output / f"{STEM}.json"
    tmp = json_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(_jsonable(results), indent=2, sort_keys=False) + "\n")
    tmp.replace(json_path)
    written["json"] = json_path
    table = output / f"{STEM}.txt"
    table.write_text(format_table(results) + "\n")
    written["table"] = table
    png = plot(results, output / f"{STEM}.png")
    if png is not None:
        written["plot"] = png
    return written
