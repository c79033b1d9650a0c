"""The wheel installs ONE import package, `textserve`, and a user's own `model.py` or `service/`
neither shadows ours nor is shadowed: built for real (pip wheel), installed for real (pip
install --target), used from a script in a user's folder against a real server."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from tests.handmade import make_version
from tests.serving import running_server

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # A copy of the checkout (symlinks kept): setuptools builds in-tree, and a stale build/
    # of this checkout must not leak into the wheel under test.
    source = tmp_path_factory.mktemp("source") / "textserve"
    skip = shutil.ignore_patterns(
        ".git", ".venv", "build", "models", "runs", ".*cache*", "*.egg-info"
    )
    shutil.copytree(ROOT, source, symlinks=True, ignore=skip)
    # no build isolation: the venv's setuptools (a test dependency) builds it, offline
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(source)],
        check=True, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    (built,) = out.glob("textserve-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
         str(wheel)],
        check=True, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    return target


@pytest.mark.slow
def test_the_wheel_holds_one_top_level_package(wheel: Path, installed: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert top == {"textserve"}
    # the role folders are inside it, and the generated code and the manifest schema with them
    for module in ("service/server.py", "model/train.py", "export/onnx_export.py",
                   "bench/runner.py", "oip/grpc_service_pb2.py", "v1/classifier_pb2.py",
                   "client.py", "tokenization.py"):  # fmt: skip
        assert f"textserve/{module}" in names
    # what `pip install` put on the import path: textserve, its metadata (and bin/textserve)
    placed = {p.name for p in installed.iterdir() if not p.name.endswith(".dist-info")}
    assert placed - {"bin"} == {"textserve"}


@pytest.mark.slow
def test_a_users_own_model_and_service_modules_do_not_collide(
    installed: Path, tmp_path: Path
) -> None:
    project = tmp_path / "project"  # a user's project with names ours once took
    (project / "service").mkdir(parents=True)
    (project / "service" / "__init__.py").write_text("WHOSE = 'user'\n")
    (project / "model.py").write_text("WHOSE = 'user'\n")
    (project / "export.py").write_text("WHOSE = 'user'\n")
    script = project / "app.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            import export, model, service
            import textserve
            from textserve import Client

            assert (model.WHOSE, service.WHOSE, export.WHOSE) == ("user",) * 3
            assert textserve.__file__.startswith(sys.argv[2]), textserve.__file__
            with Client(sys.argv[1]) as client:
                result = client.classify(["a good film", "a bad plot"])
            print(" ".join(p.label for p in result.predictions))
            """
        )
    )
    repository = tmp_path / "models"
    make_version(repository, "handmade", 1)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(installed)  # the installed wheel, not this checkout
    with running_server(repository) as srv:
        done = subprocess.run(
            [sys.executable, str(script), srv.address, str(installed)],
            cwd=project, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.split()) == 2
