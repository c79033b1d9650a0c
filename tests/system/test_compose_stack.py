"""The compose stack for real: docker-compose.yml run by podman-compose (see containers.py).

`setup` trains and exports the default model into the `models` volume on the first `up` and
finds it there on the second, `textserve` serves it, and Prometheus scrapes it under its
compose service name with the published deploy/prometheus/prometheus.yml: the test reads a
textserve series back from Prometheus. What differs from the published file, and why, is in
compose/compose.test.yml (the images built here, Prometheus from Debian, ports, a short
training); Grafana is not started (its JSON and every PromQL query are checked elsewhere).
"""

from __future__ import annotations

import os
import shutil
import socket
import string
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from tests.system.containers import PREFIX, ROOT, Podman, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # includes the session's builds

OVERRIDE = Path(__file__).parent / "compose" / "compose.test.yml"
SERVICES = ("setup", "textserve", "prometheus")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def podman_compose() -> list[str]:
    exe = shutil.which("podman-compose", path=str(Path(sys.executable).parent)) or shutil.which(
        "podman-compose"
    )
    if exe is None:
        pytest.fail("podman-compose is not installed: pip install -e '.[test]'")
    return [exe]


@dataclass
class Stack:
    podman: Podman
    project: str
    files: list[str]
    ports: dict[str, int]

    def compose(self, *args: str, timeout: float = 900) -> str:
        done = subprocess.run(
            [*podman_compose(), "--project-name", self.project, *self.files, *args],
            capture_output=True, text=True, timeout=timeout, check=False,
            env=self.podman.env, cwd=ROOT,
        )  # fmt: skip
        assert done.returncode == 0, f"podman-compose {' '.join(args)}:\n{done.stderr[-4000:]}"
        return done.stdout + done.stderr

    def up(self) -> None:
        """`up --detach` of the three services; returns once setup has finished (textserve
        waits for service_completed_successfully) and the others are started."""
        self.compose("up", "--detach", *SERVICES)

    def container(self, service: str) -> str:
        names = self.podman(
            "ps", "--all", "--format", "{{.Names}}",
            "--filter", f"label=io.podman.compose.project={self.project}",
            "--filter", f"label=io.podman.compose.service={service}",
        ).stdout.split()  # fmt: skip
        assert len(names) == 1, (service, names)
        return names[0]

    def logs(self, service: str) -> str:
        done = self.podman("logs", self.container(service))
        return done.stdout + done.stderr

    def wait_healthy(self) -> None:
        name = self.container("textserve")
        wait_until(
            "textserve turns healthy through its HEALTHCHECK",
            lambda: self.podman("healthcheck", "run", name, check=False).returncode == 0,
            timeout=240,
            interval=2,
        )

    def versions(self) -> list[str]:
        """What the models volume holds under default/, read through a container."""
        done = self.podman(
            "run", "--rm", "--entrypoint", "ls", "--volume", f"{self.project}_models:/models:ro",
            os.environ["TEXTSERVE_TEST_SERVE_IMAGE"], "/models/default",
        )  # fmt: skip
        return done.stdout.split()


@pytest.fixture(scope="module")
def stack(
    podman: Podman,
    serve_image: str,
    train_image: str,
    prometheus_image: str,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch_module: pytest.MonkeyPatch,
) -> Iterator[Stack]:
    """The stack after its first `up`, torn down with its volumes at the end."""
    ports = {
        name: free_port()
        for name in ("TEXTSERVE_TEST_GRPC_PORT", "TEXTSERVE_TEST_METRICS_PORT",
                     "TEXTSERVE_TEST_PROMETHEUS_PORT")
    }  # fmt: skip
    images = {
        "TEXTSERVE_TEST_SERVE_IMAGE": serve_image,
        "TEXTSERVE_TEST_TRAIN_IMAGE": train_image,
        "TEXTSERVE_TEST_PROMETHEUS_IMAGE": prometheus_image,
    }
    for name, value in images.items():
        monkeypatch_module.setenv(name, value)
    override = tmp_path_factory.mktemp("compose") / "compose.test.yml"
    override.write_text(string.Template(OVERRIDE.read_text()).substitute(ports, **images))
    files = ["--file", str(ROOT / "docker-compose.yml"), "--file", str(override)]
    found = Stack(podman, f"{PREFIX}-{os.getpid()}", files, ports)
    try:
        found.up()
        yield found
    finally:
        subprocess.run(
            [*podman_compose(), "--project-name", found.project, *files, "down", "--volumes"],
            capture_output=True, timeout=300, check=False, env=podman.env, cwd=ROOT,
        )  # fmt: skip
        label = f"label=io.podman.compose.project={found.project}"
        for kind in ("container", "volume"):
            left = podman(kind, "ls", "--all" if kind == "container" else "--quiet",
                          "--quiet", "--filter", label, check=False).stdout.split()  # fmt: skip
            for name in left:
                podman(kind, "rm", "--force", name, check=False)
        podman("network", "rm", "--force", f"{found.project}_default", check=False)


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_setup_trains_and_exports_into_the_volume(stack: Stack) -> None:
    logs = stack.logs("setup")
    assert "training the default model (tiny preset)" in logs, logs[-3000:]
    assert "published /models/default/1" in logs, logs[-3000:]
    state = stack.podman.inspect(stack.container("setup"))["State"]
    assert state["ExitCode"] == 0  # type: ignore[index]
    assert stack.versions() == ["1"]


def test_textserve_serves_the_model(stack: Stack) -> None:
    stack.wait_healthy()
    address = f"127.0.0.1:{stack.ports['TEXTSERVE_TEST_GRPC_PORT']}"
    done = subprocess.run(
        [sys.executable, "-m", "textserve.cli", "classify", "--server", address,
         "a gripping, beautifully acted film"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "(default version 1, 1 texts)" in done.stderr, done.stderr
    assert done.stdout.split()[3] in ("fresh", "rotten"), done.stdout  # the default data's labels


def test_prometheus_scrapes_textserve_by_its_service_name(stack: Stack) -> None:
    url = f"http://127.0.0.1:{stack.ports['TEXTSERVE_TEST_PROMETHEUS_PORT']}/api/v1/query"
    found: list[dict[str, dict[str, str]]] = []

    def scraped() -> bool:
        try:
            answer = requests.get(url, params={"query": 'textserve_model_info{job="textserve"}'},
                                  timeout=10)  # fmt: skip
        except requests.ConnectionError:
            return False  # Prometheus still starting
        found[:] = answer.json()["data"]["result"]
        return bool(found)

    wait_until("a textserve series in Prometheus", scraped, timeout=180, interval=2)
    labels = found[0]["metric"]
    assert labels["instance"] == "textserve:8000"  # the published scrape config, unchanged
    assert (labels["model"], labels["version"]) == ("default", "1")


def test_a_second_up_skips_setup(stack: Stack) -> None:
    """Last: takes the stack down (volumes kept) and up again."""
    stack.compose("down")
    stack.up()
    logs = stack.logs("setup")
    assert "model 'default' already has version(s) [1] in /models" in logs, logs[-3000:]
    assert "training" not in logs and "exporting" not in logs, logs[-3000:]
    assert stack.versions() == ["1"]
    stack.wait_healthy()
