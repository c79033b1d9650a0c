"""Set up the default model on a fresh machine: fetch data, train, export — each only if missing.

`make serve` and the compose `setup` service run this before serving. It is idempotent: a
repository that already holds a complete version of the model is left alone, and a finished
training run is reused rather than retrained.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
from pathlib import Path

from textserve.artifact import Manifest, ManifestError, iter_versions
from textserve.cli import CliError
from textserve.export import options
from textserve.export.errors import CheckFailed, ExportError
from textserve.export.options import ExportOptions

logger = logging.getLogger(__name__)

# Files whose presence marks a training run as finished (metrics.json is written last).
_RUN_COMPLETE = ("model.safetensors", "config.json", "tokenizer.json", "metrics.json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from textserve.export.cli import add_destination

    add_destination(parser)
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="training run to (re)use; default runs/<name>",
    )
    parser.add_argument("--preset", default="small", help="model preset for training")
    parser.add_argument("--cache-dir", type=Path, default=None, help="where the data set is kept")
    parser.add_argument(
        "--epochs", type=int, default=None, help="training epochs at most (default: train's)"
    )
    # export's own options and environment fallbacks; --threads also sets training's threads
    options.add_arguments(parser, all_sources=False)


def existing_versions(repository: Path, name: str) -> list[int]:
    """Complete versions of `name` (a directory with a valid manifest), ascending."""
    model_dir = repository / name
    if not model_dir.is_dir():
        return []
    versions = []
    for version, child in iter_versions(model_dir, complete=True):
        try:
            Manifest.read(child)
        except ManifestError:
            continue
        versions.append(version)
    return versions


def run_is_complete(run_dir: Path) -> bool:
    return all((run_dir / f).is_file() for f in _RUN_COMPLETE)


def setup_default(
    repository: Path,
    name: str = "default",
    *,
    run_dir: Path | None = None,
    preset: str = "small",
    cache_dir: Path | None = None,
    epochs: int | None = None,
    export_options: ExportOptions | None = None,
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
        threads = export_options.threads if export_options else None
        kwargs: dict[str, object] = {"preset": preset, "output_dir": run_dir, "threads": threads}
        if cache_dir is not None:
            kwargs["cache_dir"] = cache_dir
        if epochs is not None:
            kwargs["epochs"] = epochs
        logger.info("training the default model (%s preset) into %s", preset, run_dir)
        train(TrainConfig(**kwargs))  # type: ignore[arg-type]

    from textserve.export.pipeline import export_run

    logger.info("exporting %s as model %r into %s", run_dir, name, repository)
    return export_run(run_dir, repository, name, export_options)


def run(args: argparse.Namespace) -> int:
    export_options = options.from_args(args)
    try:
        version_dir = setup_default(
            args.repository,
            args.name,
            run_dir=args.run_dir,
            preset=args.preset,
            cache_dir=args.cache_dir,
            epochs=args.epochs,
            export_options=export_options,
        )
    except ModuleNotFoundError as exc:
        raise CliError(
            f"{exc.name} is not installed: training and export need `pip install textserve[train]`"
        ) from None
    except CheckFailed as exc:
        # As `textserve export`: a model that fails a check is a result (exit 1), in one line.
        print(f"textserve setup-default: {exc}; nothing was published", file=sys.stderr)
        return 1
    except (ExportError, ValueError, OSError) as exc:
        raise CliError(str(exc)) from None
    print(f"model ready: {version_dir}")
    return 0
