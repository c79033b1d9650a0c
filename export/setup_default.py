"""Set up the default model on a fresh machine: fetch data, train, export — each only if missing.

`make serve` and the compose `setup` service run this before serving. It is idempotent: a
repository that already holds a complete version of the model is left alone, and a finished
training run is reused rather than retrained.
"""

from __future__ import annotations

import argparse
import logging
import shutil
from pathlib import Path

from textserve.artifact import Manifest, ManifestError, parse_version
from textserve.cli import CliError

logger = logging.getLogger(__name__)

# Files whose presence marks a training run as finished (metrics.json is written last).
_RUN_COMPLETE = ("model.safetensors", "config.json", "tokenizer.json", "metrics.json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repository", type=Path, default=Path("models"), help="model repository")
    parser.add_argument("--name", default="default", help="model name in the repository")
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="training run to (re)use; default runs/<name>",
    )
    parser.add_argument("--preset", default="small", help="model preset for training")
    parser.add_argument("--cache-dir", type=Path, default=None, help="where the data set is kept")
    parser.add_argument("--threads", type=int, default=None, help="torch threads for training")
    parser.add_argument(
        "--epochs", type=int, default=None, help="training epochs at most (default: train's)"
    )


def existing_versions(repository: Path, name: str) -> list[int]:
    """Complete versions of `name` (a directory with a valid manifest), ascending."""
    model_dir = repository / name
    if not model_dir.is_dir():
        return []
    versions = []
    for child in model_dir.iterdir():
        version = parse_version(child.name)
        if version and child.is_dir():
            try:
                Manifest.read(child)
            except ManifestError:
                continue
            versions.append(version)
    return sorted(versions)


def run_is_complete(run_dir: Path) -> bool:
    return all((run_dir / f).is_file() for f in _RUN_COMPLETE)


def setup_default(
    repository: Path,
    name: str = "default",
    *,
    run_dir: Path | None = None,
    preset: str = "small",
    cache_dir: Path | None = None,
    threads: int | None = None,
    epochs: int | None = None,
) -> Path:
    """Make sure `repository/name` has a version; returns the newest version's directory."""
    versions = existing_versions(repository, name)
    if versions:
        logger.info("model %r already has version(s) %s in %s", name, versions, repository)
        return repository / name / str(versions[-1])

    run_dir = run_dir or Path("runs") / name
    if run_is_complete(run_dir):
        logger.info("reusing the finished training run %s", run_dir)
    else:
        from textserve.model.train import TrainConfig, train  # torch: only when training is needed

        if run_dir.exists():
            logger.warning("removing the unfinished training run %s", run_dir)
            shutil.rmtree(run_dir)
        kwargs: dict[str, object] = {"preset": preset, "output_dir": run_dir, "threads": threads}
        if cache_dir is not None:
            kwargs["cache_dir"] = cache_dir
        if epochs is not None:
            kwargs["epochs"] = epochs
        logger.info("training the default model (%s preset) into %s", preset, run_dir)
        train(TrainConfig(**kwargs))  # type: ignore[arg-type]

    from textserve.export.onnx_export import export_run

    logger.info("exporting %s as model %r into %s", run_dir, name, repository)
    return export_run(run_dir, repository, name)


def run(args: argparse.Namespace) -> int:
    try:
        version_dir = setup_default(
            args.repository,
            args.name,
            run_dir=args.run_dir,
            preset=args.preset,
            cache_dir=args.cache_dir,
            threads=args.threads,
            epochs=args.epochs,
        )
    except ModuleNotFoundError as exc:
        raise CliError(
            f"{exc.name} is not installed: training and export need `pip install textserve[train]`"
        ) from None
    except (ValueError, OSError) as exc:
        raise CliError(str(exc)) from None
    except Exception as exc:
        if type(exc).__module__.startswith("export."):  # ExportError and its checks
            raise CliError(str(exc)) from None
        raise
    print(f"model ready: {version_dir}")
    return 0
