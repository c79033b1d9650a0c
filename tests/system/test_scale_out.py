"""Scaling out as deploy/k8s does it, on loopback: three `textserve serve` replicas, a client
balancing per request with round_robin (what it does over a headless Service's DNS), and the
real Prometheus evaluating the exact autoscaling queries of the KEDA ScaledObject and the
Prometheus Adapter rule against them."""

from __future__ import annotations

import contextlib
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.handmade import make_version
from tests.serving import ServerProcess, serve_subprocess
from tests.system.test_prometheus import Prometheus, free_port, poll, prometheus_binary, stop
from textserve.client import Client

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
NAMESPACE = "textserve"  # what the base deploys to, and what the queries select
TEXTS = ["a gripping, beautifully acted film", "dull", "the plot is a mess"]


def reserved_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Replica:
    """One `textserve serve` on fixed loopback ports, so it can come back where it was."""

    def __init__(self, repository: Path, index: int) -> None:
        self.repository = repository
        self.pod = f"textserve-{index}"
        self.port = reserved_port()
        self.metrics_port = reserved_port()
        self._stack = contextlib.ExitStack()
        self.process: ServerProcess | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.process = self._stack.enter_context(
            serve_subprocess(
                self.repository,
                "--listen",
                self.address,
                "--metrics-port",
                str(self.metrics_port),
                "--grace-period",
                "20",
            )
        )

    def sigterm(self) -> int:
        """SIGTERM, as the kubelet sends after preStop; returns the exit status."""
        assert self.process is not None
        self.process.process.send_signal(signal.SIGTERM)
        status = self.process.process.wait(timeout=60)
        self._stack.close()
        return status

    def served(self) -> float:
        """Classify requests this process answered (its own textserve_requests_total)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        values = re.findall(
            r'^textserve_requests_total\{method="Classify",[^}]*\} (\S+)', text, re.M
        )
        return sum(float(v) for v in values)

    def close(self) -> None:
        self._stack.close()


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Replica]]:
    repository = tmp_path_factory.mktemp("scale-out") / "models"
    make_version(repository, "default", 1)
    started = [Replica(repository, i) for i in range(3)]
    try:
        for replica in started:
            replica.start()
        yield started
    finally:
        for replica in started:
            replica.close()


class Load:
    """Callers sending Classify through one balanced client until stopped; every failure kept."""

    def __init__(self, target: list[str], callers: int) -> None:
        self.client = Client(target, timeout=30)
        self.stop = threading.Event()
        self.failures: list[BaseException] = []
        self.answered = 0
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(callers)]

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self.client.classify(TEXTS)
            except BaseException as exc:  # reported by the test
                self.failures.append(exc)
                return
            with self._lock:
                self.answered += 1

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)
        self.client.close()


def test_round_robin_spreads_requests_and_survives_a_replica_restart(
    replicas: list[Replica],
) -> None:
    before = [r.served() for r in replicas]
    with Load([r.address for r in replicas], callers=3) as load:
        # every replica serves a share
        poll(lambda: all(r.served() > b for r, b in zip(replicas, before, strict=True)),
             "every replica to serve requests")  # fmt: skip
        shares = [r.served() - b for r, b in zip(replicas, before, strict=True)]
        assert min(shares) > 0, shares
        # one replica is stopped mid-run (SIGTERM: drain), then comes back on its port
        victim = replicas[1]
        answered = load.answered
        assert victim.sigterm() == 0
        poll(lambda: load.answered > answered + 20, "requests served by the two others")
        victim.start()  # a fresh process: its counters start at 0
        poll(lambda: victim.served() > 0, "the client's traffic to return to the replica")
        poll(lambda: load.answered > answered + 40, "more requests after the return")
    assert not load.failures, load.failures[:3]
    # the command line balances too: several addresses in --server
    result = subprocess.run(
        [sys.executable, "-m", "textserve.cli", "classify", "--server",
         ",".join(r.address for r in replicas), *TEXTS],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


# -- the autoscaling signal, through the real Prometheus --------------------------------------


def keda_query() -> tuple[str, float]:
    scaled = yaml.safe_load((K8S / "components" / "keda" / "scaledobject.yaml").read_text())
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    return trigger["metadata"]["query"], float(trigger["metadata"]["threshold"])


def adapter_query(pods: list[str]) -> str:
    """The adapter rule's metricsQuery as the adapter expands it for this namespace's pods."""
    config = yaml.safe_load((K8S / "prometheus-adapter" / "rules.yaml").read_text())
    (rule,) = yaml.safe_load(config["data"]["config.yaml"])["rules"]
    series = re.match(r"(\w+)", rule["seriesQuery"])
    assert series
    matchers = f'namespace="{NAMESPACE}",pod=~"{"|".join(pods)}"'
    return (
        rule["metricsQuery"]
        .replace("<<.Series>>", series.group(1))
        .replace("<<.LabelMatchers>>", matchers)
        .replace("<<.GroupBy>>", "pod")
    )


@pytest.fixture(scope="module")
def prometheus(
    replicas: list[Replica], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Prometheus]:
    """Prometheus scraping the replicas each second, each target labelled with the namespace
    and pod that Kubernetes service discovery gives it in a cluster."""
    root = tmp_path_factory.mktemp("prometheus-scale")
    config = root / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "textserve",
                        "static_configs": [
                            {
                                "targets": [f"127.0.0.1:{r.metrics_port}"],
                                "labels": {"namespace": NAMESPACE, "pod": r.pod},
                            }
                            for r in replicas
                        ],
                    }
                ],
            }
        )
    )
    port = free_port()
    log = (root / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            prometheus_binary(),
            f"--config.file={config}",
            f"--storage.tsdb.path={root / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    instance = Prometheus(f"http://127.0.0.1:{port}", process)
    try:
        poll(instance.started, "Prometheus to start")
        if process.poll() is not None:
            pytest.fail(f"Prometheus did not start:\n{(root / 'prometheus.log').read_text()}")
        yield instance
    finally:
        stop(process)
        log.close()


def value(prometheus: Prometheus, expr: str) -> float:
    result = prometheus.query(expr)
    return sum(float(series["value"][1]) for series in result)


def test_the_autoscaling_query_is_zero_idle_and_rises_with_load(
    replicas: list[Replica], prometheus: Prometheus
) -> None:
    query, threshold = keda_query()
    per_pod = adapter_query([r.pod for r in replicas])

    def scraped() -> bool:
        return len(prometheus.query('count_over_time(up{job="textserve"}[1m]) >= 5')) == 3

    poll(scraped, "five scrapes of each replica")
    idle = value(prometheus, query)
    assert idle < 0.5, idle  # nothing in flight: no replica is asked for
    assert len(prometheus.query(per_pod)) == 3  # the adapter gives one value per pod
    with Load([r.address for r in replicas], callers=12) as load:

        def risen() -> dict[str, float] | None:
            pods = {s["metric"]["pod"]: float(s["value"][1]) for s in prometheus.query(per_pod)}
            if value(prometheus, query) > max(1.0, 10 * idle) and all(pods.values()):
                return pods
            return None

        # the total rises, and so does every pod's own value (round_robin spreads the load)
        pods = poll(risen, "the signal to rise on every replica")
        loaded = value(prometheus, query)
    assert not load.failures, load.failures[:3]
    assert loaded > idle
    assert set(pods) == {r.pod for r in replicas}
    assert sum(pods.values()) > idle  # the adapter's per-pod values carry the same load
    print(f"autoscaling query: idle {idle:.2f}, loaded {loaded:.2f} texts in flight "
          f"(threshold {threshold:g} per replica); per pod {pods}")  # fmt: skip
