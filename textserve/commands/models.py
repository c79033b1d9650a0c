"""`textserve models`: list the model repository — names, versions, precision, accuracy, size,
task (sequence or token classification).

Listing (the default, or `textserve models list`) reads the manifests only: no server needed,
and fast on a large repository (--verify also checks every file's checksum). A directory named as
a version (textserve.artifact.iter_versions) but without a valid manifest is listed as broken;
other names (temporary directories of exports in progress, .tmp-*) are not versions and are not
listed.

`textserve models load NAME [VERSION]`, `unload NAME [VERSION]` and `reload` ask a running
server (--server, started with --enable-admin) through its Admin service: load serves VERSION
beside what the version policy picks (no VERSION: the policy's choice again), unload retires
VERSION (a rollback when it was the newest; no VERSION: the whole model), reload scans the
repository now. Exit status 1 when a version was refused.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from textserve import connect
from textserve.artifact import Manifest, ManifestError, iter_versions
from textserve.cli import env_flag


@dataclass(frozen=True)
class VersionInfo:
    name: str
    version: int
    path: Path
    size_bytes: int  # every file of the version directory
    manifest: Manifest | None  # None: broken (see error)
    error: str | None = None

    @property
    def status(self) -> str:
        return "ok" if self.error is None else f"broken: {self.error}"

    def to_dict(self) -> dict[str, Any]:
        m = self.manifest
        return {
            "name": self.name,
            "version": self.version,
            "path": str(self.path),
            "size_bytes": self.size_bytes,
            "precision": m.precision if m else None,
            "test_accuracy": m.test_accuracy if m else None,
            "opset": m.opset if m else None,
            "labels": m.labels if m else None,
            "max_length": m.max_length if m else None,
            "created_at": m.created_at if m else None,
            "format_version": m.format_version if m else None,
            "source": asdict(m.source) if m else None,
            "activation": m.activation if m else None,
            "threshold": m.decision_threshold if m and m.activation == "sigmoid" else None,
            "inputs": m.inputs if m else None,
            "truncation_side": m.truncation_side if m else None,
            "task": m.task if m else None,
            "tagging": m.tagging if m else None,
            "zero_shot": m.zero_shot if m else None,
            "status": self.status,
        }


def list_versions(repository: Path, *, verify: bool = False) -> list[VersionInfo]:
    """Every version directory under repository/<name>/<N>/, sorted by name then version.

    >>> [v.version for v in list_versions(Path("models"))]  # doctest: +SKIP
    [1, 2]
    """
    found: list[VersionInfo] = []
    for model_dir in sorted(p for p in repository.iterdir() if p.is_dir()):
        if model_dir.name.startswith("."):
            continue
        for version, version_dir in iter_versions(model_dir):
            found.append(_describe(model_dir.name, version, version_dir, verify))
    return sorted(found, key=lambda v: (v.name, v.version))


def _describe(name: str, version: int, version_dir: Path, verify: bool) -> VersionInfo:
    # lstat: a link's own size; what it points at is not the version's (and is refused)
    try:
        size = sum(f.lstat().st_size for f in version_dir.iterdir() if f.is_file())
    except OSError:  # a link to a file, or unreadable: listed as broken below, size unknown
        size = 0
    try:
        manifest = Manifest.read(version_dir)
        if manifest.name != name or manifest.version != version:
            raise ManifestError(
                f"manifest says {manifest.name}/{manifest.version}, directory is {name}/{version}"
            )
        if verify:
            manifest.verify_files(version_dir)
    except ManifestError as exc:
        return VersionInfo(name, version, version_dir, size, None, str(exc))
    return VersionInfo(name, version, version_dir, size, manifest)


def format_table(versions: list[VersionInfo]) -> str:
    header = (
        "NAME", "VERSION", "PRECISION", "ACCURACY", "SIZE", "OPSET", "SOURCE", "TASK",
        "ACTIVATION", "INPUTS", "CREATED", "STATUS",
    )  # fmt: skip
    rows = [header]
    for v in versions:
        m = v.manifest
        rows.append(
            (
                v.name,
                str(v.version),
                m.precision if m else "-",
                f"{m.test_accuracy:.2%}" if m and m.test_accuracy is not None else "-",
                _human(v.size_bytes),
                str(m.opset) if m else "-",
                f"{m.source.kind}:{m.source.architecture}" if m else "-",
                m.task.removesuffix("-classification") if m else "-",  # sequence | token
                _activation(m) if m else "-",
                ",".join(INPUT_ABBREVIATIONS.get(i, i) for i in m.inputs) if m else "-",
                m.created_at if m else "-",
                v.status,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1]
        for row in rows
    )


# The table's short names of the graph inputs (--json has the full ones).
INPUT_ABBREVIATIONS = {"input_ids": "ids", "attention_mask": "mask", "token_type_ids": "types"}


def _activation(manifest: Manifest) -> str:
    if manifest.activation == "sigmoid":
        return f"sigmoid@{manifest.decision_threshold:g}"
    return manifest.activation


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} GB"


ACTIONS = ("list", "load", "unload", "reload")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action", nargs="?", default="list", choices=ACTIONS, help="default: list the repository"
    )
    parser.add_argument("name", nargs="?", help="load/unload: the model")
    parser.add_argument(
        "version", nargs="?", type=int, help="load/unload: the version (default: see above)"
    )
    env_flag(parser, "TEXTSERVE_", "server", "127.0.0.1:50051",
             "load/unload/reload: the server's address HOST:PORT")  # fmt: skip
    parser.add_argument(
        "--timeout", type=float, default=120.0, help="load/unload/reload: seconds to wait"
    )
    connect.add_arguments(parser)
    env_flag(parser, "TEXTSERVE_", "repository", "models", "the model repository (default: models)",
             type=Path)  # fmt: skip
    parser.add_argument(
        "--verify", action="store_true", help="also check every file's sha256 against its manifest"
    )
    parser.add_argument("--json", action="store_true", help="print a JSON list")


def run(args: argparse.Namespace) -> int:
    from textserve.cli import CliError

    if args.action != "list":
        from textserve.commands.models_admin import run_admin

        return run_admin(args)
    if args.name is not None:
        raise CliError(
            f"unexpected argument {args.name!r}: did you mean `models load {args.name}`?"
        )
    repository: Path = args.repository
    if not repository.is_dir():
        raise CliError(f"model repository {repository} does not exist (export a run first)")
    try:
        versions = list_versions(repository, verify=args.verify)
    except OSError as exc:
        raise CliError(f"cannot read the model repository {repository}: {exc}") from None
    if args.json:
        print(json.dumps([v.to_dict() for v in versions], indent=2))
    elif not versions:
        print(f"no model versions in {repository}")
    else:
        print(format_table(versions))
    # A broken version is worth a non-zero status for scripts (and `--verify` in CI).
    return 1 if any(v.error for v in versions) else 0
