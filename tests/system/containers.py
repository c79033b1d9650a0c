"""Podman for the container tests: a Debian base bootstrapped without a registry, the images.

What this kind of machine needs, found by trying (issue 21): the `runc` runtime (crun refuses
the cgroup hybrid mode), ulimits within the hard limits, host networking for builds (pip and apt
inside the build), the host's CA bundle mounted into builds and into containers that use pip,
and `--format docker` (OCI images drop HEALTHCHECK). Runtime, ulimits and network go into a
containers.conf of the session (CONTAINERS_CONF), so podman-compose's own podman calls get
them too. No registry: the base image is `mmdebstrap --variant=minbase` bookworm with python3,
imported with `podman import`, and the Dockerfile's PYTHON_IMAGE build argument selects it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
PROMETHEUS_DOCKERFILE = ROOT / "tests" / "system" / "compose" / "prometheus.Dockerfile"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# The CPU torch wheel on this machine's disk (PyPI's torch for Linux is a multi-GB CUDA build).
TORCH_WHEELS = Path(os.environ.get("TEXTSERVE_TORCH_WHEELS", "/opt/wheels"))
PREFIX = "textserve-test"  # every image, container and volume these tests create
# Set to keep the images after the session, under fixed names, so that a rerun reuses the base
# and the build cache (while working on the Dockerfile). Otherwise the names are the session's
# own (sessions on one machine never share or remove each other's) and removed at its end.
KEEP_IMAGES = os.environ.get("TEXTSERVE_KEEP_IMAGES", "") not in ("", "0")
SESSION = "kept" if KEEP_IMAGES else str(os.getpid())
BASE_IMAGE = f"localhost/{PREFIX}-base:{SESSION}"
IMAGES = {
    target: f"localhost/{PREFIX}-{target}:{SESSION}" for target in ("serve", "train", "prometheus")
}

# What was built and how long it took, printed at the end of the session (conftest.py).
REPORT: list[str] = []

CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]
[engine]
runtime = "runc"
"""


def unavailable() -> str | None:
    """Why podman cannot build and run images here, or None."""
    for tool in ("podman", "runc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (`make system-deps` installs podman, runc, mmdebstrap)"
    done = subprocess.run(
        ["podman", "--runtime", "runc", "info"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        return f"podman cannot run here: {(done.stderr.strip().splitlines() or ['?'])[-1]}"
    return None


@dataclass
class Podman:
    """podman with the session's containers.conf; remembers the images its builds made."""

    conf: Path
    built: list[str] = field(default_factory=list)  # stage images (IDs), then tags

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "CONTAINERS_CONF": str(self.conf)}

    def __call__(
        self, *args: str, timeout: float = 120, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["podman", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=self.env,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"podman {' '.join(args)} exited {done.returncode}:\n"
                f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )
        return done

    def exists(self, image: str) -> bool:
        return self("image", "exists", image, check=False).returncode == 0

    def size_mb(self, image: str) -> float:
        return int(self("image", "inspect", "--format", "{{.Size}}", image).stdout) / 1e6

    def bootstrap_base(self, workdir: Path) -> None:
        """BASE_IMAGE from Debian's archive: mmdebstrap minbase + python3 (about a minute)."""
        if self.exists(BASE_IMAGE):
            return
        if shutil.which("mmdebstrap") is None:
            raise AssertionError("mmdebstrap is not installed: run `make system-deps`")
        rootfs = workdir / "rootfs.tar"
        started = time.monotonic()
        # python-is-python3: the official image's `python` command, which the Dockerfile uses.
        subprocess.run(
            ["mmdebstrap", "--variant=minbase", "--quiet",
             "--include=python3,python3-venv,python-is-python3,ca-certificates",
             "bookworm", str(rootfs)],
            check=True, timeout=900, capture_output=True,
        )  # fmt: skip
        self("import", str(rootfs), BASE_IMAGE, timeout=300)
        rootfs.unlink()
        REPORT.append(f"base image bootstrapped in {time.monotonic() - started:.0f} s")

    def build(self, target: str, *, dockerfile: Path = DOCKERFILE, args: Sequence[str] = ()) -> str:
        """Build `target` of the Dockerfile on BASE_IMAGE as IMAGES[target]; once a session."""
        image = IMAGES[target]
        if dockerfile == DOCKERFILE:
            # Every target gets the same arguments, so the stages' layers are shared: the CPU
            # torch wheel from the host's disk, mounted into the build (train uses it); where
            # there is none, the Dockerfile's default, PyTorch's CPU-only index.
            args = ["--build-arg", f"PYTHON_IMAGE={BASE_IMAGE}", *args]
            if list(TORCH_WHEELS.glob("torch-*.whl")):
                args += [
                    "--volume", f"{TORCH_WHEELS}:/torch-wheels:ro",
                    "--build-arg", "TORCH_WHEELS=/torch-wheels",
                ]  # fmt: skip
        else:
            args = ["--build-arg", f"BASE={BASE_IMAGE}", *args]
        started = time.monotonic()
        done = self(
            "build", "--format", "docker", "--network", "host",
            "--volume", f"{CA_BUNDLE}:{CA_BUNDLE}:ro", *args,
            "--target", target, "--tag", image, "--file", str(dockerfile), str(ROOT),
            timeout=1800,
        )  # fmt: skip
        # "--> ID" after each stage: its image, kept as the build cache of the session.
        self.built += [
            line[4:].strip() for line in done.stdout.splitlines() if line.startswith("--> ")
        ]
        self.built.append(image)
        REPORT.append(
            f"{image}: built in {time.monotonic() - started:.0f} s, {self.size_mb(image):.0f} MB"
        )
        return image

    def remove_images(self) -> None:
        """What this session built, newest first, then the base. Without --force: an image that
        something else still uses (a container, another image built on it) stays."""
        for image in [*reversed(self.built), BASE_IMAGE]:
            self("rmi", image, check=False, timeout=300)

    def inspect(self, container: str) -> dict[str, object]:
        found = json.loads(self("container", "inspect", container).stdout)
        assert isinstance(found, list) and isinstance(found[0], dict)
        return found[0]

    def remove(self, *, containers: Sequence[str] = (), volumes: Sequence[str] = ()) -> None:
        for name in containers:
            self("rm", "--force", "--volumes", "--time", "5", name, check=False, timeout=60)
        for name in volumes:
            self("volume", "rm", "--force", name, check=False)

    @contextmanager
    def volume(self, name: str) -> Iterator[str]:
        self("volume", "create", name)
        try:
            yield name
        finally:
            self.remove(volumes=[name])


def wait_until(what: str, check: object, timeout: float, interval: float = 1.0) -> None:
    """Poll `check()` (a callable returning bool) until true; fail naming `what`."""
    assert callable(check)
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(interval)
