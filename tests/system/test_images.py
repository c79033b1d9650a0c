"""The images of docker/Dockerfile, built and run for real with podman (see containers.py).

The lean `serve` image has no torch; its container runs as uid 10001 on a read-only root file
system, turns healthy through the image's own HEALTHCHECK against a model volume, answers
`textserve classify` from the host, and drains and exits 0 on SIGTERM. A volume that is empty or
holds only a broken version: the container never turns healthy and exits non-zero with a log
line saying why. The `train` image has the CPU torch and the training commands.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.system.containers import PREFIX, Podman, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # includes the session's builds

UID = "10001"


def fill_volume(podman: Podman, volume: str, repository: Path) -> None:
    """Copy a model repository into a named volume (as root-owned, world-readable files)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(repository.rglob("*")):
            info = tar.gettarinfo(str(path), path.relative_to(repository).as_posix())
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mode = 0o755 if path.is_dir() else 0o644
            if path.is_file():
                with open(path, "rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    archive = repository.parent / f"{repository.name}.tar"
    archive.write_bytes(buffer.getvalue())
    podman("volume", "import", volume, str(archive))
    archive.unlink()


@pytest.fixture(scope="module")
def default_repository(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's tiny model exported as `default/1`: what the image's CMD serves."""
    from textserve.export.pipeline import export_run

    repository = tmp_path_factory.mktemp("container-models")
    export_run(tiny_run, repository, "default", threads=1)
    return repository


def start(podman: Podman, image: str, name: str, volume: str) -> None:
    """The image's own ENTRYPOINT, CMD and HEALTHCHECK; the root file system read-only; gRPC
    and metrics published on ports the system picks, on 127.0.0.1 only."""
    podman(
        "run", "--detach", "--name", name, "--read-only", "--volume", f"{volume}:/models:ro",
        "--publish", "127.0.0.1::50051", "--publish", "127.0.0.1::8000", image,
    )  # fmt: skip


def healthcheck(podman: Podman, name: str) -> subprocess.CompletedProcess[str]:
    """The image's HEALTHCHECK command, run now inside the container (exit 0: healthy)."""
    return podman("healthcheck", "run", name, check=False, timeout=60)


def exited(podman: Podman, name: str) -> bool:
    state = podman.inspect(name)["State"]
    assert isinstance(state, dict)
    return state["Status"] in ("exited", "stopped")


@pytest.fixture(scope="module")
def served(podman: Podman, serve_image: str, default_repository: Path) -> Iterator[tuple[str, str]]:
    """(container name, host gRPC address) of a healthy serve container."""
    name = f"{PREFIX}-serve-{os.getpid()}"
    with podman.volume(f"{PREFIX}-models-{os.getpid()}") as volume:
        fill_volume(podman, volume, default_repository)
        start(podman, serve_image, name, volume)
        try:
            try:
                wait_until(
                    "the container turns healthy through its HEALTHCHECK",
                    lambda: exited(podman, name) or healthcheck(podman, name).returncode == 0,
                    timeout=240,
                    interval=2,
                )
            except AssertionError as exc:
                last = healthcheck(podman, name)
                raise AssertionError(
                    f"{exc}\nhealthcheck: {last.stdout}{last.stderr}\n"
                    + podman("logs", name).stderr[-3000:]
                ) from None
            assert not exited(podman, name), podman("logs", name).stderr[-3000:]
            port = podman("port", name, "50051/tcp").stdout.strip().rsplit(":", 1)[1]
            yield name, f"127.0.0.1:{port}"
        finally:
            podman.remove(containers=[name])


def test_the_serve_image_has_no_torch(podman: Podman, serve_image: str) -> None:
    done = podman(
        "run", "--rm", "--entrypoint", "python", serve_image, "-c", "import torch", check=False
    )
    assert done.returncode != 0 and "No module named 'torch'" in done.stderr, done.stderr
    size = podman.size_mb(serve_image)
    print(f"serve image {serve_image}: {size:.0f} MB")


def test_the_train_image_has_the_cpu_torch_and_the_training_commands(
    podman: Podman, train_image: str
) -> None:
    done = podman(
        "run", "--rm", "--entrypoint", "python", train_image, "-c",
        "import os, torch, onnx; print(torch.__version__, os.getuid())",
    )  # fmt: skip
    version, uid = done.stdout.split()
    assert version.endswith("+cpu") and uid == UID
    assert "--preset" in podman("run", "--rm", train_image, "setup-default", "--help").stdout


def test_it_runs_as_uid_10001_on_a_read_only_root(podman: Podman, served: tuple[str, str]) -> None:
    name, _ = served
    # Every process of the container (the server; with --workers auto on more than 1 CPU the
    # supervisor and its workers): `user` is read by podman from /proc, the name as the image's
    # /etc/passwd has it (uid 10001: textserve).
    users = podman("top", name, "pid", "user").stdout.split()[2:]
    assert len(users) >= 2 and set(users[1::2]) == {"textserve"}, users
    assert podman("exec", name, "id", "-u").stdout.strip() == UID
    config = podman.inspect(name)
    assert config["HostConfig"]["ReadonlyRootfs"] is True  # type: ignore[index]
    done = podman("exec", name, "touch", "/opt/textserve/written", check=False)
    assert done.returncode != 0 and "Read-only file system" in done.stderr, done.stderr


def test_it_is_healthy_through_its_own_healthcheck(podman: Podman, served: tuple[str, str]) -> None:
    name, _ = served
    check = podman.inspect(name)["Config"]["Healthcheck"]["Test"]  # type: ignore[index]
    assert "textserve.commands.probe" in check
    assert healthcheck(podman, name).returncode == 0
    health = podman.inspect(name)["State"]["Health"]  # type: ignore[index]
    assert health["Status"] == "healthy", health


def test_classify_from_the_host(served: tuple[str, str]) -> None:
    _, address = served
    done = subprocess.run(
        [sys.executable, "-m", "textserve.cli", "classify", "--server", address,
         "a gripping, beautifully acted film", "a dull mess"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = done.stdout.strip().splitlines()[1:]  # under the LABEL SCORE TEXT header
    assert [row.split()[-1] for row in rows] == ["film", "mess"], done.stdout
    assert "(default version 1, 2 texts)" in done.stderr, done.stderr


def test_sigterm_drains_and_exits_0(podman: Podman, served: tuple[str, str]) -> None:
    name, _ = served  # the module's last use of the container
    podman("kill", "--signal", "TERM", name)
    status = podman("wait", name, timeout=120).stdout.strip()
    logs = podman("logs", name).stderr
    assert status == "0", logs[-3000:]
    assert "SIGTERM received: draining" in logs, logs[-3000:]


def broken_copy(repository: Path, tmp_path: Path) -> Path:
    """A copy whose only version's model.onnx no longer matches its manifest."""
    copy = tmp_path / "broken"
    shutil.copytree(repository, copy)
    onnx = copy / "default" / "1" / "model.onnx"
    onnx.write_bytes(onnx.read_bytes()[:1000])
    return copy


@pytest.mark.parametrize(
    ("volume_holds", "message"),
    [
        ("nothing", "no model versions in /models"),
        ("a broken version", "model default version 1 refused (checksum_mismatch)"),
    ],
)
def test_a_bad_model_volume_is_unhealthy_and_says_why(
    podman: Podman,
    serve_image: str,
    default_repository: Path,
    tmp_path: Path,
    volume_holds: str,
    message: str,
) -> None:
    name = f"{PREFIX}-bad-{os.getpid()}"
    with podman.volume(f"{PREFIX}-bad-models-{os.getpid()}") as volume:
        if volume_holds != "nothing":
            fill_volume(podman, volume, broken_copy(default_repository, tmp_path))
        try:
            start(podman, serve_image, name, volume)
            wait_until("the server gives up", lambda: exited(podman, name), timeout=180)
            assert healthcheck(podman, name).returncode != 0
            state = podman.inspect(name)["State"]
            logs = podman("logs", name).stderr
            assert state["ExitCode"] != 0, logs  # type: ignore[index]
            assert message in logs, logs[-3000:]
            assert "textserve serve: error:" in logs.strip().splitlines()[-1], logs[-3000:]
        finally:
            podman.remove(containers=[name])
