"""The wheel installs ONE import package, `textserve`, and a user's own `model.py` or `service/`
neither shadows ours nor is shadowed: built for real (pip wheel), installed for real (pip
install --target), used from a script in a user's folder against a real server. And the lean
install: the wheel without extras in a fresh virtual environment, offline from a wheelhouse,
serves and classifies with no torch there."""

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
from textserve.bench.process import spawn

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
    for module in ("service/server.py", "model/train.py", "export/pipeline.py",
                   "bench/runner.py", "oip/grpc_service_pb2.py", "v1/classifier_pb2.py",
                   "client.py", "tokenization.py"):  # fmt: skip
        assert f"textserve/{module}" in names
    # one-off experiments stay in the checkout (experiments/), not in what users install
    assert not [
        name for name in names if "http_server_choice" in name or "observability_cost" in name
    ]
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


def _run(*argv: str | Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{argv}:\n{done.stdout}\n{done.stderr}"
    return done  # type: ignore[no-any-return]


@pytest.mark.slow
def test_the_lean_install_serves_without_torch(wheel: Path, tmp_path: Path) -> None:
    """`pip install textserve` (no extras) in a fresh venv: serve, classify, no torch.

    The wheelhouse is `pip download` of the wheel's own dependencies (through pip's configured
    indexes, a local mirror here, PyPI elsewhere): this proves the declared dependencies are
    enough to serve. The install itself is offline (--no-index). ~15 s here, most of it pip."""
    wheelhouse = tmp_path / "wheelhouse"
    _run(sys.executable, "-m", "pip", "download", "-q", "--only-binary", ":all:",
         "--dest", wheelhouse, wheel, timeout=600)  # fmt: skip
    downloaded = {p.name.split("-")[0].lower() for p in wheelhouse.glob("*.whl")}
    assert "torch" not in downloaded and "onnxruntime" in downloaded, downloaded
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv, timeout=300)
    bin_dir = venv / "bin"
    _run(bin_dir / "python", "-m", "pip", "install", "-q", "--no-index", "--find-links",
         wheelhouse, wheel, timeout=600)  # fmt: skip

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    no_torch = subprocess.run([bin_dir / "python", "-c", "import torch"], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert no_torch.returncode == 1
    assert "ModuleNotFoundError: No module named 'torch'" in no_torch.stderr

    repository = tmp_path / "models"
    make_version(repository, "handmade", 1)
    serve = [str(bin_dir / "textserve"), "serve", "--repository", str(repository),
             "--listen", "127.0.0.1:0", "--metrics-port", "off"]  # fmt: skip
    # the installed console script, in the environment without this checkout (inherit_env)
    with spawn(serve, env=env, inherit_env=False, cwd=tmp_path) as server:
        done = _run(bin_dir / "textserve", "classify", "--server", server.address, "--json",
                    "a good film", "a bad plot", cwd=tmp_path, env=env, timeout=60)  # fmt: skip
        # and the server process itself never imported torch
        modules = Path(f"/proc/{server.pid}/maps").read_text()
        assert "libtorch" not in modules
    assert done.stdout.count('"label"') == 2, done.stdout
    assert textserve_of(bin_dir, env).startswith(str(venv))


def textserve_of(bin_dir: Path, env: dict[str, str]) -> str:
    """Where the venv's python imports textserve from (the install, not this checkout), in
    `env` (without this checkout's PYTHONPATH, which would win over any install)."""
    code = "import textserve; print(textserve.__file__)"
    return _run(bin_dir / "python", "-c", code, cwd=bin_dir, env=env).stdout.strip()
