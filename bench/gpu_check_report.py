"""The prepared GPU check's figures side by side (textserve.bench.gpu_check): the acceptance
ratios of issue 37 and one Markdown table, ready for the README. Pure: results dict in.

    results["ratios"] = ratios(results)
    print(format_table(results))
"""

from __future__ import annotations

from typing import Any

# Issue 37's targets: the server at 64 texts per request against what all the cores tokenize;
# the texts/s one text per request reaches; the CPU provider's --workers 8 against 1.
TARGET_MULTI_OVER_TOKENIZER = 0.7
TARGET_SINGLE_TEXTS_PER_S = 15_000.0
TARGET_CPU_WORKERS_GAIN = 5.0


def _ratio(value: float | None, target: float | None, what: str) -> dict[str, Any]:
    met = None if value is None or target is None else value >= target
    return {"value": value, "target": target, "met": met, "what": what}


def _label(server: dict[str, Any]) -> str:
    return f"--workers {server['workers']} --engine {server['engine']}"


def ratios(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each ratio's value (None where a step it needs did not run), target and whether it is
    met: the best server configuration at 64 (1) texts per request for the first two."""
    servers = [s for s in results.get("servers", {}).values() if s.get("texts_per_s")]
    single = max((s for s in servers if s["texts_per_request"] == 1),
                 key=lambda s: s["texts_per_s"], default=None)  # fmt: skip
    multi = max((s for s in servers if s["texts_per_request"] > 1),
                key=lambda s: s["texts_per_s"], default=None)  # fmt: skip
    ceiling = max(
        (row["texts_per_second"] for row in results.get("tokenizer", {}).get("all_cores", [])),
        default=None,
    )
    found: dict[str, dict[str, Any]] = {}
    what = "server at many texts per request / the tokenizer on all cores"
    value = multi["texts_per_s"] / ceiling if multi is not None and ceiling else None
    if multi is not None:
        what = (
            f"{multi['texts_per_request']} texts/request ({_label(multi)}) / tokenizer, all cores"
        )
    found["multi_over_tokenizer"] = _ratio(value, TARGET_MULTI_OVER_TOKENIZER, what)
    found["single_texts_per_s"] = _ratio(
        single["texts_per_s"] if single is not None else None,
        TARGET_SINGLE_TEXTS_PER_S,
        "texts/s at 1 text/request" + (f" ({_label(single)})" if single is not None else ""),
    )
    cpu = {int(n): r for n, r in results.get("cpu_workers", {}).items() if r.get("texts_per_s")}
    if len(cpu) >= 2:
        low, high = min(cpu), max(cpu)
        found["cpu_workers_gain"] = _ratio(
            cpu[high]["texts_per_s"] / cpu[low]["texts_per_s"],
            TARGET_CPU_WORKERS_GAIN,
            f"CPU provider --workers {high} / --workers {low}",
        )
    else:
        found["cpu_workers_gain"] = _ratio(None, TARGET_CPU_WORKERS_GAIN, "CPU provider workers")
    for shared in (s for s in servers if s["engine"] == "shared"):
        thread = next(
            (s for s in servers if s["engine"] == "thread" and s["workers"] == shared["workers"]
             and s["texts_per_request"] == shared["texts_per_request"]),
            None,
        )  # fmt: skip
        if thread is not None:
            found[f"shared_over_thread_{shared['texts_per_request']}"] = _ratio(
                shared["texts_per_s"] / thread["texts_per_s"],
                None,  # a comparison: above 1, one engine fed by every worker wins
                f"--workers {shared['workers']}, {_count(shared['texts_per_request'], 'text')}"
                "/request: "
                "--engine shared / --engine thread",
            )
    return found


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _figure(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _gpu(record: dict[str, Any] | None) -> str:
    figures = (record or {}).get("gpu") or {}
    return _figure(figures.get("util_busy_mean"))


def _ceiling_rows(results: dict[str, Any]) -> list[str]:
    lines = []
    for precision, rows in results.get("ceilings", {}).items():
        record = results["steps"].get(f"ceiling_{precision}")
        for row in rows:
            setting = f"batch {row['batch_size']}"
            if "error" in row:
                lines.append(
                    f"| ceiling {precision} | {setting} | – | – | – | – | {row['error']} |"
                )
                continue
            note = (f"{row['provider']}; with tokenizing {row['texts_per_s']:,.0f} texts/s, "
                    f"tokenizing {row['tokenize_share']:.0%} of the time")  # fmt: skip
            lines.append(
                f"| ceiling {precision}, graph only | {setting} | "
                f"{_figure(row['graph_texts_per_s'])} | – | – | {_gpu(record)} | {note} |"
            )
    return lines


def _tokenizer_rows(results: dict[str, Any]) -> list[str]:
    lines = []
    for key, rows in results.get("tokenizer", {}).items():
        for row in rows:
            what = "1 text at a time" if key == "one_at_a_time" else f"batch {row['batch_size']}"
            lines.append(
                f"| tokenizer | {_count(row['threads'], 'thread')}, {what} | "
                f"{_figure(row['texts_per_second'])} | – | – | – | "
                f"{row['tokens_per_text']:.0f} tokens/text |"
            )
    return lines


def _server_row(kind: str, setting: str, server: dict[str, Any], record: Any) -> str:
    note = f"queue {_figure(server.get('server_queue_ms'), 2)} ms, "
    note += f"infer {_figure(server.get('server_infer_ms'), 2)} ms"
    if server.get("spread_pct") is not None:
        note += f"; **unstable** (windows ±{server['spread_pct'] / 2:.0f}%)"
    return (
        f"| {kind} | {setting} | {_figure(server.get('texts_per_s'))} | "
        f"{_figure(server.get('p50_ms'), 1)} | {_figure(server.get('p99_ms'), 1)} | "
        f"{_gpu(record)} | {note} |"
    )


def _server_rows(results: dict[str, Any]) -> list[str]:
    lines = []
    for name, server in results.get("servers", {}).items():
        kind = f"server {server['precision']} {server['device']}"
        setting = (f"{_label(server)}, {_count(server['texts_per_request'], 'text')}/request, "
                   f"{server['callers']} callers")  # fmt: skip
        lines.append(_server_row(kind, setting, server, results["steps"].get(name)))
    for count, server in results.get("cpu_workers", {}).items():
        kind = f"server {server['precision']} cpu"
        setting = f"--workers {count}, 1 text/request, {server['callers']} callers"
        lines.append(_server_row(kind, setting, server, None))
    return lines


def format_table(results: dict[str, Any]) -> str:
    """Markdown: every measurement side by side, the acceptance ratios, every step's status."""
    lines = [
        "| measured | setting | texts/s | p50 ms | p99 ms | GPU busy % | note |",
        "|---|---|---:|---:|---:|---:|---|",
        *_ceiling_rows(results),
        *_tokenizer_rows(results),
        *_server_rows(results),
        "",
        "| ratio | value | target | met |",
        "|---|---:|---:|---|",
    ]
    for ratio in results.get("ratios", {}).values():
        value, target = ratio["value"], ratio["target"]
        digits = 0 if target is not None and target > 100 else 2
        met = {True: "yes", False: "**no**", None: "–"}[ratio["met"]]
        lines.append(
            f"| {ratio['what']} | {_figure(value, digits)} | "
            f"{'–' if target is None else f'≥ {target:,.{digits}f}'} | {met} |"
        )
    notes = []
    texts = results.get("texts")
    if texts is not None:
        notes.append(f"- texts: {texts['count']} of {texts['tokens_mean']:.0f} tokens on average "
                     f"(max_length {texts['max_length']})")  # fmt: skip
    for precision, model in results.get("models", {}).items():
        notes.append(f"- {precision}: test accuracy {model.get('test_accuracy')}, {model['path']}")
    lines += ["", *notes] if notes else []
    lines += ["", "| step | status | seconds |", "|---|---|---:|"]
    for name, step in results["steps"].items():
        status = step.get("reason") or " ".join(
            str(part) for part in (step["status"], step.get("error")) if part is not None
        )
        lines.append(f"| {name} | {status} | {step.get('seconds', '–')} |")
    return "\n".join(lines)
