"""MkDocs hooks: the pages' generated parts, built from the files they describe at build time.

A page asks for a part with a marker line, e.g. `<!-- generated: manifest-schema -->`; the
hook replaces it with Markdown made from the repository's own files, so the site cannot drift
from them: the manifest's JSON Schema (textserve/schemas/manifest.schema.json), the Grafana
dashboard (deploy/grafana/dashboards/textserve.json) and the benchmark results
(bench/results/). The benchmark plots are copied into the site under assets/bench/. An unknown
marker, or a file a marker needs that is missing, fails the build.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
MARKER = re.compile(r"^<!-- generated: ([a-z0-9-]+)(?: (\S+))? -->$", re.MULTILINE)


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _table(header: list[str], rows: list[list[str]], align: str | None = None) -> str:
    align = align or "|".join("---" for _ in header)
    lines = ["| " + " | ".join(header) + " |", f"|{align}|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# --- the manifest schema ---------------------------------------------------------------------


def _type(schema: dict[str, Any], defs: dict[str, Any]) -> str:
    """A short, readable rendering of a JSON Schema: type and constraints."""
    if "$ref" in schema:
        return _type(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
    if "const" in schema:
        return f"exactly `{json.dumps(schema['const'])}`"
    if "enum" in schema:
        return "one of " + ", ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(_type(s, defs) for s in schema[key])
    kind = schema.get("type", "any")
    kind = " or ".join(kind) if isinstance(kind, list) else kind
    limits = []
    if "minimum" in schema or "maximum" in schema:
        limits.append(f"{schema.get('minimum', '…')}–{schema.get('maximum', '…')}")
    if "exclusiveMinimum" in schema or "exclusiveMaximum" in schema:
        low, high = schema.get("exclusiveMinimum", "…"), schema.get("exclusiveMaximum", "…")
        limits.append(f"in ({low}, {high})")
    if "minLength" in schema or "maxLength" in schema:
        low, high = schema.get("minLength", 0), schema.get("maxLength", "…")
        limits.append(f"length {low}" if low == high else f"length {low}–{high}")
    if "pattern" in schema:
        limits.append(f"pattern `{schema['pattern']}`")
    if "maxProperties" in schema:
        limits.append(f"at most {schema['maxProperties']} keys")
    if kind == "array":
        items = schema.get("items")
        of = f" of {_type(items, defs)}" if isinstance(items, dict) else ""
        size = f"{schema.get('minItems', 0)}–{schema.get('maxItems', '…')} items"
        unique = ", unique" if schema.get("uniqueItems") else ""
        return f"array{of} ({size}{unique})"
    if kind == "object" and "properties" in schema:
        inner = ", ".join(f"`{k}`: {_type(v, defs)}" for k, v in schema["properties"].items())
        return f"object {{{inner}}}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        limits.append(f"values {_type(schema['additionalProperties'], defs)}")
    return kind + (f" ({'; '.join(limits)})" if limits else "")


def manifest_schema(_: str | None) -> str:
    path = ROOT / "textserve" / "schemas" / "manifest.schema.json"
    schema = _read_json(path)
    defs = schema.get("$defs", {})
    required = set(schema.get("required", []))
    rows = [
        [
            f"`{name}`",
            "yes" if name in required else "no",
            _type(prop, defs),
            prop.get("description", ""),
        ]
        for name, prop in schema["properties"].items()
    ]
    source = "from `textserve/schemas/manifest.schema.json`"
    if schema.get("additionalProperties") is False:
        source += "; unknown keys are refused"
    intro = f"*{_cell(schema.get('description', ''))}* ({source}.)"
    text = [intro, "", _table(["field", "required", "type", "meaning"], rows)]
    return "\n".join(text)


# --- the Grafana dashboard -------------------------------------------------------------------


def dashboard_panels(_: str | None) -> str:
    path = ROOT / "deploy" / "grafana" / "dashboards" / "textserve.json"
    dashboard = _read_json(path)
    out: list[str] = []
    rows: list[list[str]] = []

    def flush() -> None:
        if rows:
            out.append(_table(["panel", "kind", "query (PromQL)"], rows))
            out.append("")
            rows.clear()

    def visit(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            if panel.get("type") == "row":
                flush()
                out.extend([f"**Row: {panel.get('title', '')}**", ""])
                visit(panel.get("panels", []))  # a collapsed row holds its panels
                continue
            queries = [t["expr"] for t in panel.get("targets", []) if t.get("expr")]
            shown = "<br>".join(f"`{_cell(q)}`" for q in queries) or "—"
            rows.append([panel.get("title", ""), panel.get("type", ""), shown])

    visit(dashboard["panels"])
    flush()
    return "\n".join(out)


# --- the import contracts ------------------------------------------------------------------


def import_contracts(_: str | None) -> str:
    """The layering import-linter checks in `make test`, from .importlinter itself."""
    import configparser

    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter", encoding="utf-8")
    rows = []
    for section in config.sections():
        if not section.startswith("importlinter:contract:"):
            continue
        contract = config[section]

        def names(key: str, contract: Any = contract) -> str:
            return ", ".join(f"`{n}`" for n in contract.get(key, "").split()) or "—"

        if contract["type"] == "layers":
            rule = "layers, top to bottom: " + names("layers")
        else:
            rule = f"{names('source_modules')} never import {names('forbidden_modules')}"
        rows.append([contract["name"], rule])
    return _table(["contract", "rule"], rows)


# --- the metrics ------------------------------------------------------------------------------


def metrics(_: str | None) -> str:
    """Every metric the server and the --workers supervisor define, from the code itself."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from prometheus_client import CollectorRegistry

    from textserve.service.metrics import Metrics
    from textserve.service.workers.metrics import SupervisorMetrics

    rows = []
    for make in (Metrics, SupervisorMetrics):
        registry = CollectorRegistry()
        make(registry=registry)
        for collector in registry._collector_to_names:  # the metric objects, as registered
            kind = getattr(collector, "_type", "")
            name = collector._name + ("_total" if kind == "counter" else "")
            labels = ", ".join(f"`{label}`" for label in collector._labelnames) or "—"
            rows.append([f"`{name}`", kind, labels, collector._documentation])
    return _table(["metric", "type", "labels", "meaning"], rows)


# --- benchmark results -----------------------------------------------------------------------


def _text_block(path: Path) -> str:
    return "```text\n" + path.read_text(encoding="utf-8").rstrip() + "\n```"


def _machine(machine: dict[str, Any]) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in machine.get("versions", {}).items())
    return (
        f"Machine: {machine.get('cpu_model', '?')}, {machine.get('usable_cpus', '?')} usable CPUs"
        f" of {machine.get('logical_cpus', '?')}; {versions}."
    )


def _bench_run(folder: Path, image: str | None) -> str:
    result = _read_json(folder / "textserve_bench.json")
    parts = [f"`{result['command']}` wrote `{folder.relative_to(ROOT)}/textserve_bench.json`:"]
    parts += ["", _text_block(folder / "textserve_bench.txt"), "", _machine(result["machine"])]
    targets = result.get("targets") or []
    if targets:
        rows = [
            [
                t["name"],
                "—" if t["value"] is None else f"{t['value']:.2f}",
                t["target"],
                "met" if t["ok"] else "missed",
            ]
            for t in targets
        ]
        parts += ["", _table(["target", "measured", "goal", ""], rows, "---|---:|---|---")]
    if image:
        parts += ["", f"![{image}](assets/bench/{image})"]
    return "\n".join(parts)


def bench_textserve(_: str | None) -> str:
    return _bench_run(RESULTS, "textserve_bench.png")


def bench_stream(_: str | None) -> str:
    return _bench_run(RESULTS / "stream", None)


def _perf_analyzer_table(steps: list[dict[str, Any]]) -> str:
    rows = []
    for step in steps:
        if "concurrency" in step:
            load = f"c={step['concurrency']:g}"
        else:
            load = f"{step['request_rate']:g}/s Poisson"
        rows.append(
            [load, f"{step['throughput']:,.0f}"]
            + [f"{step[k]:.2f}" for k in ("p50_ms", "p90_ms", "p95_ms", "p99_ms")]
            + [f"{step[k]:.2f}" if k in step else "–" for k in _SERVER_COLUMNS]
        )
    header = ["load", "texts/s", "p50 ms", "p90 ms", "p95 ms", "p99 ms"]
    header += ["server queue ms", "server infer ms"]
    return _table(header, rows, "---:|" * (len(header) - 1) + "---:")


_SERVER_COLUMNS = ("server_queue_ms", "server_compute_infer_ms")


def bench_perf_analyzer(name: str | None) -> str:
    # A list of steps (older results), or {"textserve": [...], "echo": [...]} with `--floor`.
    path = RESULTS / (name or "perf_analyzer.json")
    result = _read_json(path)
    runs = result if isinstance(result, dict) else {"textserve": result}
    parts = [f"From `{path.relative_to(ROOT)}`:"]
    for server in ("textserve", "echo"):
        if isinstance(runs.get(server), list):
            title = "textserve" if server == "textserve" else "model-less echo server (`--floor`)"
            parts += ["", f"{title}:", "", _perf_analyzer_table(runs[server])]
    return "\n".join(parts)


def bench_export(_: str | None) -> str:
    path = RESULTS / "export_bench.json"
    result = _read_json(path)
    base: dict[int, float] = {}
    rows = []
    for m in result["measurements"]:
        if m["engine"] == "pytorch fp32":
            base[m["batch_size"]] = m["texts_per_second"]
    for m in result["measurements"]:
        ratio = m["texts_per_second"] / base[m["batch_size"]] if m["batch_size"] in base else 0
        rows.append(
            [
                str(m["batch_size"]),
                m["engine"],
                f"{m['texts_per_second']:,.0f}",
                f"{ratio:.2f}×",
                f"{100 * m['accuracy']:.2f} %",
            ]
        )
    header = ["batch", "engine", "texts/s", "vs PyTorch fp32", "test accuracy"]
    table = _table(header, rows, "---:|---|---:|---:|---:")
    threads, texts = result.get("threads"), result.get("n_texts")
    return f"From `{path.relative_to(ROOT)}` ({threads} thread, {texts} test texts):\n\n{table}"


PARTS: dict[str, Callable[[str | None], str]] = {
    "metrics": metrics,
    "import-contracts": import_contracts,
    "manifest-schema": manifest_schema,
    "dashboard-panels": dashboard_panels,
    "bench-textserve": bench_textserve,
    "bench-stream": bench_stream,
    "bench-perf-analyzer": bench_perf_analyzer,
    "bench-export": bench_export,
}


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    def replace(match: re.Match[str]) -> str:
        name, argument = match.group(1), match.group(2)
        if name not in PARTS:
            raise ValueError(f"{page.file.src_uri}: unknown generated part {name!r}")
        return PARTS[name](argument)

    return MARKER.sub(replace, markdown)


def on_files(files: Files, config: Any, **_: Any) -> Files:
    for png in sorted(RESULTS.glob("*.png")):
        files.append(File.generated(config, f"assets/bench/{png.name}", abs_src_path=str(png)))
    return files
