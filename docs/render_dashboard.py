"""Draw the Grafana dashboard's panels from a real Prometheus, as a picture for the docs.

    .venv/bin/python docs/render_dashboard.py --prometheus http://127.0.0.1:9090 \\
        --minutes 3 --output docs/images/dashboard.png

Reads deploy/grafana/dashboards/textserve.json, runs every panel's own PromQL query (the
dashboard's `$model` variable as "all", `$__rate_interval` as --rate-interval) against the
Prometheus given, over the last --minutes, and lays the panels out on the dashboard's own
grid with matplotlib: timeseries as lines, stat panels as their last value, the table as its
rows. It is not Grafana (which needs a server of its own) but the same queries over the same
data, so the picture shows what the dashboard shows. docs/dashboard.md says how the committed
picture was made.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "textserve.json"
BACKGROUND, PANEL, TEXT, GRID = "#111217", "#181b1f", "#d8d9da", "#2c3235"


def _query(base: str, path: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=30) as response:
        body = json.load(response)
    if body.get("status") != "success":
        raise RuntimeError(f"{url}: {body}")
    return body["data"]["result"]


def _expr(expr: str, rate_interval: str) -> str:
    return expr.replace('=~"$model"', '=~".+"').replace("$__rate_interval", rate_interval)


def _legend(template: str, labels: dict[str, str]) -> str:
    out = template or ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "value"
    for key, value in labels.items():
        out = out.replace("{{" + key + "}}", value)
    return out


def _unit(panel: dict[str, Any]) -> str:
    return str(panel.get("fieldConfig", {}).get("defaults", {}).get("unit", ""))


def _scale(unit: str, value: float) -> tuple[float, str]:
    if unit == "s":  # every stage here is well under a second
        return value * 1e3, "ms"
    if unit == "bytes":
        return value / 2**20, "MiB"
    if unit == "percentunit":
        return value * 100, "%"
    return value, {"reqps": "req/s", "ops": "/s"}.get(unit, "")


def draw(base: str, minutes: float, end: float, rate_interval: str, output: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    start = end - 60 * minutes
    panels = dashboard["panels"]
    height = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    top = 0.97  # the title above the grid
    fig = plt.figure(figsize=(24, height * 0.42), facecolor=BACKGROUND)

    def box(x: float, y: float, w: float, h: float) -> list[float]:
        """Figure coordinates of a cell of the dashboard's 24-column grid, with room for the
        panel's title (above) and tick labels (left, below)."""
        unit_w, unit_h = 0.985 / 24, top / height
        left, bottom = 0.01 + x * unit_w, top - (y + h) * unit_h
        return [left + 0.028, bottom + 0.45 * unit_h, w * unit_w - 0.036, (h - 1.15) * unit_h]

    for panel in panels:
        pos = panel["gridPos"]
        if panel.get("type") == "row":
            y = top - (pos["y"] + 0.75) * top / height
            fig.text(0.01, y, panel.get("title", ""), color=TEXT, fontsize=15, weight="bold")
            continue
        ax = fig.add_axes(box(pos["x"], pos["y"], pos["w"], pos["h"]))
        ax.set_facecolor(PANEL)
        for spine in ax.spines.values():
            spine.set_color(GRID)
        ax.set_title(panel.get("title", ""), color=TEXT, fontsize=12, loc="left", pad=6)
        targets = [t for t in panel.get("targets", []) if t.get("expr")]
        kind, unit = panel.get("type"), _unit(panel)
        if kind in ("stat", "table"):
            ax.set_xticks([])
            ax.set_yticks([])
            lines = []
            for target in targets:
                for series in _query(base, "query", {"query": _expr(target["expr"], rate_interval),
                                                      "time": end}):  # fmt: skip
                    value, shown = _scale(unit, float(series["value"][1]))
                    if kind == "table":
                        labels = series["metric"]
                        lines.append("  ".join(f"{k} {labels[k]}" for k in sorted(labels)))
                    else:
                        lines.append(f"{value:,.3g} {shown}".strip())
            text = "\n".join(lines) or "no data"
            size = 26 if kind == "stat" else 12
            ax.text(0.5, 0.45, text, color="#73bf69", fontsize=size, ha="center", va="center",
                    transform=ax.transAxes)  # fmt: skip
            continue
        shown_unit = ""
        for target in targets:
            params = {
                "query": _expr(target["expr"], rate_interval),
                "start": start,
                "end": end,
                "step": max(1, int(60 * minutes / 200)),
            }
            for series in _query(base, "query_range", params):
                xs = [float(t) - start for t, _ in series["values"]]
                ys = []
                for _, v in series["values"]:
                    value, shown_unit = _scale(unit, float(v))
                    ys.append(value)
                label = _legend(target.get("legendFormat", ""), series["metric"])
                ax.plot(xs, ys, linewidth=1.4, label=label)
        ax.tick_params(colors=TEXT, labelsize=8)
        ax.grid(color=GRID, linewidth=0.6)
        ax.set_xlabel("seconds", color=TEXT, fontsize=8)
        if shown_unit:
            ax.set_ylabel(shown_unit, color=TEXT, fontsize=8)
        if ax.lines:
            ax.legend(
                fontsize=7, facecolor=PANEL, labelcolor=TEXT, edgecolor=GRID, loc="upper left"
            )
        else:
            ax.text(0.5, 0.5, "no data", color=TEXT, ha="center", transform=ax.transAxes)
    fig.text(
        0.01,
        0.985,
        f"{dashboard.get('title', 'textserve')}: the dashboard's queries against Prometheus, "
        f"{minutes:g} min (drawn with matplotlib)",
        color=TEXT,
        fontsize=16,
        va="center",
    )
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=64, facecolor=BACKGROUND)
    print(f"wrote {output}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus", default="http://127.0.0.1:9090")
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--end", type=float, default=None, help="unix time (default: now)")
    parser.add_argument("--rate-interval", default="15s", help="what $__rate_interval stands for")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "images" / "dashboard.png")
    args = parser.parse_args(argv)
    end = time.time() if args.end is None else args.end
    draw(args.prometheus.rstrip("/"), args.minutes, end, args.rate_interval, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
