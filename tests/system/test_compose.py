"""docker-compose.yml, validated by a real Compose implementation (Debian's docker-compose).

`docker-compose config` needs no engine: it loads the file, checks it against the Compose
schema (unknown keys, wrong types, bad depends_on conditions) and resolves references
(services named in depends_on, named volumes). `make system-deps` installs it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "docker" / "Dockerfile"


def docker_compose() -> str:
    path = shutil.which("docker-compose")
    if path is None:
        pytest.fail("docker-compose is not installed: run `make system-deps` (Debian package)")
    return path


def compose_config(compose_file: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [docker_compose(), "--file", str(compose_file), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=compose_file.parent,
    )


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """target -> source of a service's volumes, short ("src:dst:mode") or long syntax."""
    found = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, target = volume.split(":")[:2]
        else:
            source, target = volume["source"], volume["target"]
        found[target] = source
    return found


@pytest.fixture(scope="module")
def resolved() -> dict[str, Any]:
    """The compose file as docker-compose resolved it (anchors expanded, paths absolute)."""
    done = compose_config(COMPOSE_FILE)
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load(done.stdout)
    assert isinstance(config, dict)
    return config


def test_the_compose_file_is_valid(resolved: dict[str, Any]) -> None:
    assert set(resolved["services"]) == {
        "setup",
        "textserve",
        "textserve-gpu",
        "prometheus",
        "grafana",
    }


def test_setup_runs_first_and_fills_the_models_volume(resolved: dict[str, Any]) -> None:
    services = resolved["services"]
    setup = services["setup"]
    assert setup["command"] == ["setup-default", "--repository", "/models", "--name", "default"]
    assert setup["build"]["target"] == "train"
    assert setup["restart"] == "no"
    for name in ("textserve", "textserve-gpu"):
        server = services[name]
        assert server["depends_on"]["setup"]["condition"] == "service_completed_successfully"
        assert mounts(server)["/models"] == "models"
    assert mounts(setup)["/models"] == "models"
    assert "models" in resolved["volumes"]


def test_the_server_serves_grpc_and_metrics_on_all_interfaces(resolved: dict[str, Any]) -> None:
    server = resolved["services"]["textserve"]
    assert server["build"]["target"] == "serve"
    command = server["command"]
    assert command[0] == "serve"
    assert command[command.index("--listen") + 1] == "0.0.0.0:50051"
    assert command[command.index("--http-host") + 1] == "0.0.0.0"
    assert command[command.index("--http-port") + 1] == "8000"
    published = {(p["target"], p["published"]) for p in server["ports"]}
    assert {(50051, 50051), (8000, 8000)} <= {(int(t), int(p)) for t, p in published}


def test_the_gpu_profile_reserves_an_nvidia_gpu(resolved: dict[str, Any]) -> None:
    gpu = resolved["services"]["textserve-gpu"]
    assert gpu["profiles"] == ["gpu"]
    assert gpu["build"]["target"] == "serve-gpu"
    command = gpu["command"]
    assert command[command.index("--device") + 1] == "cuda"
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]


def test_prometheus_and_grafana_mount_the_files_of_deploy(resolved: dict[str, Any]) -> None:
    services = resolved["services"]
    binds = {
        Path(source).relative_to(ROOT).as_posix(): target
        for name in ("prometheus", "grafana")
        for target, source in mounts(services[name]).items()
        if source.startswith("/")
    }
    assert binds["deploy/prometheus/prometheus.yml"] == "/etc/prometheus/prometheus.yml"
    assert binds["deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    # The dashboard provider reads the directory compose mounts the dashboards into.
    provider = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/dashboards/textserve.yml").read_text()
    )
    assert provider["providers"][0]["options"]["path"] == binds["deploy/grafana/dashboards"]
    datasource = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text()
    )
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
    # Prometheus scrapes the server under its compose service name and metrics port.
    scrape = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    targets = {
        job["job_name"]: job["static_configs"][0]["targets"] for job in scrape["scrape_configs"]
    }
    assert targets["textserve"] == ["textserve:8000"]
    assert targets["textserve-gpu"] == ["textserve-gpu:8000"]


def test_every_build_target_is_a_stage_of_the_dockerfile(resolved: dict[str, Any]) -> None:
    stages = {
        line.split()[-1]
        for line in DOCKERFILE.read_text().splitlines()
        if line.upper().startswith("FROM ") and " AS " in line.upper()
    }
    for name, service in resolved["services"].items():
        if "build" in service:
            assert Path(service["build"]["context"]) == ROOT, name
            assert (ROOT / service["build"]["dockerfile"]).resolve() == DOCKERFILE, name
            assert service["build"]["target"] in stages, name


BREAKAGES = {
    "misspelt key": ("    image: textserve:latest\n", "    imgae: textserve:latest\n"),
    "bad condition": ("condition: service_completed_successfully", "condition: service_done"),
    "undefined dependency": ("      setup:\n        condition", "      set-up:\n        condition"),
    "undeclared volume": ("      - models:/models:ro\n", "      - modelz:/models:ro\n"),
    "wrong type": ("    stop_grace_period: 35s\n", "    stop_grace_period: [35s]\n"),
    "not yaml": ("  prometheus:\n", "  prometheus: [\n"),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_a_broken_copy_is_rejected(breakage: str, tmp_path: Path) -> None:
    old, new = BREAKAGES[breakage]
    text = COMPOSE_FILE.read_text()
    assert old in text, "the breakage no longer applies to docker-compose.yml; update it"
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(text.replace(old, new, 1))
    done = compose_config(broken)
    assert done.returncode != 0, f"{breakage}: docker-compose accepted it:\n{done.stdout[:500]}"
