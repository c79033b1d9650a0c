"""The `textserve` console script: one thin subcommand per library function.

Each subcommand lives in its own module exposing `add_arguments(parser)` and `run(args) -> int`.
Those modules must import nothing heavy at import time (torch, onnxruntime, grpc) so that
`textserve --help` is instant and serving never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

# name -> (module, one-line help). Modules are imported only to build their parser.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "train": ("model.cli", "train a transformer classifier on labelled text"),
    "export": ("export.cli", "export a training run to ONNX as a new model version"),
    "models": ("service.models_cli", "list (and, with admin, load/unload) model versions"),
    "serve": ("service.serve_cli", "serve a model repository over gRPC"),
    "classify": ("service.classify_cli", "classify texts against a running server"),
    "bench": ("service.bench_cli", "benchmark a server: throughput and latency percentiles"),
    "setup-default": (
        "service.setup_default",
        "fetch the default data set, train and export the default model if none exists",
    ),
}


class CliError(Exception):
    """An error for the user: printed as one line, exit status 2, no traceback."""


def env_flag(
    parser: argparse.ArgumentParser,
    prefix: str,
    name: str,
    default: str | None,
    help: str,
    **kwargs: Any,
) -> None:
    """--NAME, falling back to the environment variable PREFIX + NAME (upper case, - as _),
    which --help names: flags read at the edge, for containers configured by environment."""
    env = prefix + name.upper().replace("-", "_")
    value = os.environ.get(env, default)
    parser.add_argument(f"--{name}", default=value, help=f"{help} [{env}]", **kwargs)


def env_switch(env: str) -> bool:
    """Whether the environment variable `env` turns a switch on (1, true, yes, on)."""
    return os.environ.get(env, "").strip().lower() in ("1", "true", "yes", "on")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="textserve", description=__doc__)
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue  # subcommand not built yet / not installed
            raise
        sp = sub.add_parser(name, help=help_text, description=module.__doc__)
        module.add_arguments(sp)
        sp.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args._module.run(args) or 0)
    except CliError as exc:
        print(f"textserve {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    # Run main() from the imported module, not from __main__: with `python -m service.cli` this
    # file is loaded twice, and subcommands raise the importable `service.cli.CliError`.
    from service.cli import main as _main

    sys.exit(_main())
