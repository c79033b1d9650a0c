"""The real Prometheus scrapes a real textserve server; every dashboard query returns data.

Prometheus (Debian package, `make system-deps`) runs on a free loopback port with the scrape
config of deploy/prometheus/prometheus.yml, its textserve target rewritten to the test
server's metrics port and a 1 s scrape interval. Traffic flows for the whole test, so that
rates and quantiles over the dashboard's window have samples. Then every PromQL expression of
deploy/grafana/dashboards/textserve.json (and its template variables) must return a series
with a finite value: a panel whose query names a wrong metric or label fails here.

Twice: against one process, and against `textserve serve --workers 2` (the supervisor's one
/metrics over both workers, prometheus-client's multiprocess mode). The one process traces
every request (to an OTLP receiver in the test) and Prometheus stores exemplars: the latency
histogram's exemplars carry the trace ids the receiver got.
"""

from __future__ import annotations

import json
import math
import random
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.otlp import Receiver, otlp_receiver
from tests.serving import poll, running_server, serve_subprocess
from textserve.client import Client, ClientError
from textserve.service.engine.cache_size import CacheSize

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "textserve.json"
JOB = "textserve"
# Grafana's $__rate_interval for a 1 s scrape interval is 4 s; a little more keeps a few
# samples in every window even when a scrape lands late on a busy machine.
RATE_INTERVAL = "10s"
DEADLINE = 90.0  # seconds to wait for each condition; normally met in about 10


def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        pytest.fail("the prometheus server is not installed: run `make system-deps`")
    return path


def free_port() -> int:
    # Prometheus cannot listen on port 0 and report the port back, so take one the kernel
    # just handed out; the small race is handled by retrying in `prometheus` below.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape_config(metrics_port: int) -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml with its textserve job pointed at the test server."""
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    jobs = [job for job in config["scrape_configs"] if job["job_name"] == JOB]
    assert jobs, f"{PROMETHEUS_CONFIG} has no {JOB!r} scrape job"
    job = jobs[0]
    job["static_configs"] = [{"targets": [f"127.0.0.1:{metrics_port}"]}]
    config["scrape_configs"] = [job]
    config["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
    return config


class Prometheus:
    def __init__(self, url: str, process: subprocess.Popen[bytes]) -> None:
        self.url = url
        self.process = process

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", (expr, data["resultType"])
        return list(data["result"])

    def started(self) -> bool:
        """Ready to answer, or exited (the caller then reads why from its log)."""
        return self.process.poll() is not None or self.ready()

    def ready(self) -> bool:
        if self.process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError):
            return False


@dataclass
class Served:
    address: str
    metrics_port: int
    model: str
    connections: int = 1  # what the traffic's client opens (one per worker and more)
    traced: bool = False  # every request traced to the module's OTLP receiver


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with otlp_receiver() as running:
        yield running


@pytest.fixture(scope="module", params=["one process", "2 workers"])
def server(
    request: pytest.FixtureRequest, tiny_repository: Path, receiver: Receiver
) -> Iterator[Served]:
    if request.param == "one process":
        with running_server(
            tiny_repository,
            metrics_port=0,
            metrics_host="127.0.0.1",
            otlp_endpoint=receiver.endpoint,
            trace_sample_ratio=1.0,
            # the cache's panels need a cache (off by default)
            cache_size=CacheSize.parse("1MiB"),
        ) as running:
            assert running.server.metrics_port
            model = running.server.repository.default_model
            assert model
            yield Served(running.address, running.server.metrics_port, model, traced=True)
        return
    with serve_subprocess(tiny_repository, "--workers", "2", "--cache-size", "1MiB") as process:
        assert process.metrics_url is not None
        port = int(process.metrics_url.rsplit(":", 1)[1].split("/")[0])
        yield Served(process.address, port, "tiny", connections=8)


def served_model(server: Served) -> str:
    return server.model


@pytest.fixture(scope="module")
def traffic(server: Served) -> Iterator[None]:
    """Requests for the whole module: good ones, and now and then one that fails."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def send() -> None:
        texts = ["a gripping, beautifully acted film", "dull", "the plot is a mess and so on"]
        words = " ".join(texts).replace(",", "").split()
        try:
            with Client(server.address, timeout=10, connections=server.connections) as client:
                for i in range(1_000_000):
                    if stop.is_set():
                        return
                    if i % 10 == 9:
                        with pytest.raises(ClientError, match="INVALID_ARGUMENT"):
                            client.classify([])
                    else:
                        # repeated texts (cache hits) and a new word order each time (a miss:
                        # batches keep their panels filled with the cache on)
                        fresh = " ".join(random.Random(i).sample(words, k=6))
                        client.classify([*texts[: 1 + i % 3], fresh])
                    stop.wait(0.02)  # pace: ~40 requests/s is plenty and spares the CPUs
        except BaseException as exc:  # reported by the fixture, not lost in the thread
            errors.append(exc)

    thread = threading.Thread(target=send, name="traffic", daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join(timeout=30)
    assert not errors, errors


@pytest.fixture(scope="module")
def prometheus(server: Served, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    binary = prometheus_binary()
    root = tmp_path_factory.mktemp("prometheus")
    config = root / "prometheus.yml"
    config.write_text(yaml.safe_dump(scrape_config(server.metrics_port)))
    output = ""
    for _attempt in range(3):
        port = free_port()
        log_path = root / f"prometheus-{port}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={root / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                    "--enable-feature=exemplar-storage",  # as docker-compose.yml runs it
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        instance = Prometheus(f"http://127.0.0.1:{port}", process)
        try:
            poll(instance.started, "Prometheus to start")
            if process.poll() is None:
                yield instance
                return
        finally:
            stop(process)
        output = log_path.read_text()
        if "address already in use" not in output:
            break  # not a lost race for the port: report it
    pytest.fail(f"Prometheus did not start:\n{output[-2000:]}")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target of the dashboard, template variables filled."""
    dashboard = json.loads(DASHBOARD.read_text())
    found = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            found.append((f"panel {panel['title']!r} {target['refId']}", target["expr"]))
    for variable in dashboard["templating"]["list"]:
        query = variable["query"]
        query = query["query"] if isinstance(query, dict) else query
        match = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", query)
        assert match, f"variable {variable['name']}: unsupported query {query!r}"
        metric, label = match.groups()
        found.append((f"variable ${variable['name']}", f"count by ({label}) ({metric})"))
    return found


def fill(expr: str, model: str) -> str:
    filled = expr.replace("$__rate_interval", RATE_INTERVAL).replace("$model", re.escape(model))
    assert "$" not in filled, f"unknown template variable in {expr!r}"
    return filled


def finite(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(series["value"][1])) for series in result)


def test_prometheus_scrapes_the_server(
    server: Served, traffic: None, prometheus: Prometheus
) -> None:
    def target_up() -> bool:
        targets = prometheus.api("targets")["activeTargets"]
        return any(t["labels"]["job"] == JOB and t["health"] == "up" for t in targets)

    poll(target_up, "the textserve target to be up")
    up = poll(lambda: prometheus.query(f'up{{job="{JOB}"}}'), "the up series")
    assert float(up[0]["value"][1]) == 1
    info = poll(lambda: prometheus.query("textserve_model_info"), "textserve_model_info")
    assert {series["metric"]["model"] for series in info} == {served_model(server)}
    assert all(series["metric"]["provider"] for series in info)


def test_every_dashboard_query_returns_data(
    server: Served, traffic: None, prometheus: Prometheus
) -> None:
    queries = dashboard_queries()
    assert len(queries) >= 20  # every panel is covered, not just the first
    # A token classifier's panels have data only for one (this server serves a sequence
    # classifier); tests/unit/bench/test_dashboard.py checks their metric names.
    queries = [(where, expr) for where, expr in queries if "(token classifiers)" not in where]
    pending = {where: fill(expr, served_model(server)) for where, expr in queries}

    def all_answered() -> bool:
        for where, expr in list(pending.items()):
            if finite(prometheus.query(expr)):
                del pending[where]
        return not pending

    try:
        poll(all_answered, "every dashboard query to return data", timeout=DEADLINE)
    except TimeoutError:  # tests.serving.poll's: say which panels stayed empty
        lines = "\n".join(f"  {where}: {expr}" for where, expr in pending.items())
        pytest.fail(f"dashboard queries without data after {DEADLINE:.0f}s:\n{lines}")


def test_errors_by_reason_show_the_failed_requests(
    server: Served, traffic: None, prometheus: Prometheus
) -> None:
    expr = fill(
        next(e for w, e in dashboard_queries() if "Errors by reason" in w), served_model(server)
    )

    def invalid_argument_seen() -> bool:
        return any(
            s["metric"]["reason"] == "invalid_argument" and float(s["value"][1]) > 0
            for s in prometheus.query(expr)
        )

    poll(invalid_argument_seen, "failed requests to show under reason invalid_argument")


def test_prometheus_stores_trace_ids_as_exemplars(
    server: Served, traffic: None, prometheus: Prometheus, receiver: Receiver
) -> None:
    """The p99 panel's exemplars: Prometheus scrapes the OpenMetrics exposition and keeps the
    trace ids of sampled requests, traces the collector received. Under --workers there are
    none: prometheus-client's multiprocess mode keeps no exemplars (a documented limit)."""
    query = f'textserve_request_duration_seconds_bucket{{job="{JOB}", code="OK"}}'

    def trace_ids() -> set[str]:
        now = time.time()
        data = prometheus.api(
            "query_exemplars", query=query, start=str(now - 600), end=str(now + 60)
        )
        return {
            e["labels"]["trace_id"]
            for series in data
            for e in series["exemplars"]
            if "trace_id" in e["labels"]
        }

    if not server.traced:  # --workers: scraped requests, but no exemplar among them
        poll(lambda: prometheus.query(query), "the latency histogram")
        assert trace_ids() == set()
        return
    found = poll(trace_ids, "exemplars with trace ids")
    assert all(re.fullmatch("[0-9a-f]{32}", t) for t in found), found
    poll(
        lambda: found & {s.trace_id for s in receiver.received()},
        "the exemplars' traces at the OTLP receiver",
    )


def test_a_wrong_query_would_fail(prometheus: Prometheus, server: Served) -> None:
    """The check above can fail: a misspelt metric or label gives no data."""
    good = fill('sum by (method) (textserve_requests_total{model=~"$model"})', served_model(server))
    poll(lambda: prometheus.query(good), "the requests counter")
    assert prometheus.query(good.replace("requests_total", "request_total")) == []
    assert prometheus.query(good.replace("model=~", "models=~")) == []


def promtool_check(config: Path) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: run `make system-deps` (Debian package prometheus)")
    return subprocess.run(
        [promtool, "check", "config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_promtool_accepts_the_deployed_config_and_rejects_a_broken_one(tmp_path: Path) -> None:
    done = promtool_check(PROMETHEUS_CONFIG)
    assert done.returncode == 0, done.stdout + done.stderr
    text = PROMETHEUS_CONFIG.read_text()
    assert "scrape_interval: 5s" in text, "the breakage no longer applies; update it"
    broken = tmp_path / "prometheus.yml"
    broken.write_text(text.replace("scrape_interval: 5s", "scrape_interval: 5"))
    assert promtool_check(broken).returncode != 0
