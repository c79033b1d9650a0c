"""The Grafana dashboard and provisioning files: consistent with each other and with metrics.py.

Whether each query returns data from a real server is tests/system/test_prometheus.py; this
checks the structure in milliseconds.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from textserve.service.metrics import Metrics

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "textserve.json"
DATASOURCES = ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "prometheus.yml"


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded = json.loads(DASHBOARD.read_text())
    assert isinstance(loaded, dict)
    return loaded


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in panels(dashboard) for t in p["targets"]]


def test_every_panel_uses_the_provisioned_data_source(dashboard: dict[str, Any]) -> None:
    provisioned = yaml.safe_load(DATASOURCES.read_text())["datasources"][0]
    expected = {"type": provisioned["type"], "uid": provisioned["uid"]}
    for panel in panels(dashboard):
        assert panel["datasource"] == expected, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == expected, panel["title"]
    for variable in dashboard["templating"]["list"]:
        assert variable["datasource"] == expected


def test_panels_have_unique_ids_and_do_not_overlap(dashboard: dict[str, Any]) -> None:
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    taken: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24, panel["title"]
        cells = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells


def exported_samples() -> list[Any]:
    """Every sample a server with one model exports (its version, predictions, cache, batches)."""
    metrics = Metrics(CollectorRegistry())
    metrics.init_model("m")
    metrics.set_model_info("m", 1, "CPUExecutionProvider")
    metrics.for_predictions("m", 1, ["negative", "positive"])  # a version's prediction series
    metrics.for_cache("m")  # a cached model's series
    metrics.for_entities("m", 1, ["O", "B-PER", "I-PER"])  # a token classifier's entity series
    metrics.for_model("m")  # a model's batch and queue series
    return [s for family in metrics.registry.collect() for s in family.samples]


def test_every_metric_queried_is_one_the_server_exports(dashboard: dict[str, Any]) -> None:
    exported = {s.name for s in exported_samples()}
    for expr in exprs(dashboard):
        for name in re.findall(r"\b(textserve_\w+|process_\w+)", expr):
            assert name in exported or name.startswith("process_"), f"{name} in {expr}"


def test_the_panels_the_issue_asks_for(dashboard: dict[str, Any]) -> None:
    everything = "\n".join(exprs(dashboard))
    assert "rate(textserve_requests_total" in everything  # request rate
    for stage in ("request", "queue", "tokenize", "inference"):
        for q in ("0.5", "0.95", "0.99"):
            quantile = rf"histogram_quantile\({q}, sum by \(le[^)]*\) \(rate\("
            bucket = rf"textserve_{stage}_duration_seconds_bucket"
            assert re.search(quantile + bucket, everything), (stage, q)
    assert "textserve_batch_size_bucket" in everything
    assert "textserve_batch_padding_ratio" in everything
    assert "textserve_queue_depth" in everything
    assert "sum by (reason) (rate(textserve_request_failures_total" in everything
    assert "max by (model, version, provider, precision) (textserve_model_info" in everything


def test_queries_filter_on_the_model_variable(dashboard: dict[str, Any]) -> None:
    names = {v["name"] for v in dashboard["templating"]["list"]}
    assert names == {"model"}
    # a few series have no model: drain refusals (no model is reached), per-request limits
    modelled = {s.name for s in exported_samples() if "model" in s.labels}
    for expr in exprs(dashboard):
        if any(name in modelled for name in re.findall(r"\btextserve_\w+", expr)):
            assert 'model=~"$model"' in expr, expr


def test_the_observability_panels(dashboard: dict[str, Any]) -> None:
    """Issue 17: label shares and confidence over time, and the latency panel with exemplars
    (trace ids of sampled requests)."""
    everything = "\n".join(exprs(dashboard))
    assert "rate(textserve_predictions_total" in everything
    assert "textserve_prediction_confidence_bucket" in everything
    with_exemplars = [
        target["expr"]
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        if target.get("exemplar")
    ]
    assert any("textserve_request_duration_seconds_bucket" in e for e in with_exemplars)
