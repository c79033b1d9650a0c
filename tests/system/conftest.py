"""Session fixtures of the container tests: podman, the base image and the images, built once.

The images are built at most once a session and shared by test_images.py and
test_compose_stack.py; everything they create is named `textserve-test…` (the images with the
session's id) and removed at the end (TEXTSERVE_KEEP_IMAGES=1 keeps the images, under fixed
names, for faster reruns). Where podman cannot run the tests are skipped with the reason, unless
TEXTSERVE_REQUIRE_CONTAINERS=1 (`make test` sets it): then that is a failure, so CI never skips
them quietly.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.system.containers import (
    CONTAINERS_CONF,
    KEEP_IMAGES,
    PROMETHEUS_DOCKERFILE,
    REPORT,
    Podman,
    unavailable,
)


@pytest.fixture(scope="session")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Podman]:
    reason = unavailable()
    if reason is not None:
        if os.environ.get("TEXTSERVE_REQUIRE_CONTAINERS", "") not in ("", "0"):
            pytest.fail(f"TEXTSERVE_REQUIRE_CONTAINERS is set but {reason}")
        pytest.skip(reason)
    workdir = tmp_path_factory.mktemp("podman")
    conf = workdir / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    runner = Podman(conf)
    runner.bootstrap_base(workdir)
    yield runner
    if not KEEP_IMAGES:
        runner.remove_images()


@pytest.fixture(scope="session")
def serve_image(podman: Podman) -> str:
    return podman.build("serve")


@pytest.fixture(scope="session")
def train_image(podman: Podman) -> str:
    return podman.build("train")


@pytest.fixture(scope="session")
def prometheus_image(podman: Podman) -> str:
    return podman.build("prometheus", dockerfile=PROMETHEUS_DOCKERFILE)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if REPORT:
        terminalreporter.section("container images")
        for line in REPORT:
            terminalreporter.write_line(line)
