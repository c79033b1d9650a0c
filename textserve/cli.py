"""textserve: serve transformer text classifiers over gRPC, with dynamic batching and metrics.

Train a classifier on your labelled text, export it as a model version, serve the model
repository, and classify against the server:

  textserve train reviews.csv --output-dir runs/reviews
  textserve export runs/reviews --repository models --name reviews
  textserve serve --repository models --model reviews
  textserve classify --server 127.0.0.1:50051 "a gripping, beautifully acted film"

`textserve COMMAND --help` shows each command's options; every `serve` option can also be set
through a TEXTSERVE_* environment variable (named in its help).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn


@dataclass(frozen=True)
class Command:
    module: str  # exposes add_arguments(parser) and run(args) -> int; imported to build its parser
    summary: str  # one line, in `textserve --help`
    example: str  # shown under the command's own --help


# Each command's module imports nothing heavy (torch, onnxruntime, grpc) until it runs, so
# `textserve --help` is instant and serving never imports torch.
COMMANDS: dict[str, Command] = {
    "train": Command(
        "textserve.model.cli",
        "train a transformer classifier on labelled text (needs textserve[train])",
        "textserve train reviews.csv --text-column text --label-column label "
        "--output-dir runs/reviews",
    ),
    "export": Command(
        "textserve.export.cli",
        "export a run or a Hugging Face folder to ONNX, checked, as a model's next version",
        "textserve export runs/reviews --repository models --name reviews --quantize int8\n"
        "  textserve export my-finetuned-bert --repository models --name bert",
    ),
    "serve": Command(
        "textserve.service.cli",
        "serve a model repository over gRPC (textserve.v1 and KServe v2), with /metrics",
        "textserve serve --repository models --model reviews --listen 0.0.0.0:50051",
    ),
    "classify": Command(
        "textserve.commands.classify",
        "classify texts against a running server",
        'textserve classify --server 127.0.0.1:50051 --top-k 2 "dull, but the cast shines"',
    ),
    "models": Command(
        "textserve.commands.models",
        "list the model versions of a repository; load, unload or reload them on a server",
        "textserve models --repository models --verify\n"
        "  textserve models load reviews 3 --server 127.0.0.1:50051",
    ),
    "bench": Command(
        "textserve.bench.cli",
        "benchmark a server: throughput and latency percentiles beside in-process ceilings",
        "textserve bench --repository models --model reviews --output bench/results",
    ),
    "setup-default": Command(
        "textserve.export.setup_default",
        "fetch the default data set, then train and export the default model unless it exists",
        "textserve setup-default --repository models --name default",
    ),
}


class CliError(Exception):
    """An error for the user: printed as one line, exit status 2, no traceback."""


class ConfigError(ValueError):
    """A bad flag, environment value or file named by one; the message names the flag and says
    what to do. Raised by the server's configuration (service.config re-exports it) and by the
    connection helpers (token and PEM files); commands turn it into one line and exit 2."""


def env_flag(
    parser: Any,
    prefix: str,
    name: str,
    default: str | None,
    help: str,
    *,
    env: str | None = None,
    **kwargs: Any,
) -> None:
    """--NAME on `parser` (or an argument group), falling back to the environment variable
    PREFIX + NAME (upper case, - as _; or `env`), which --help names: flags read at the edge,
    for containers and shells configured by environment. A string default goes through the
    flag's `type` as argparse does for command-line values."""
    env = env or prefix + name.upper().replace("-", "_")
    value = os.environ.get(env)
    if value is not None:
        kwargs["type"] = _from_env(env, kwargs.get("type"), kwargs.get("choices"))
        parser.add_argument(f"--{name}", default=_EnvValue(value), help=f"{help} [{env}]", **kwargs)
        return
    parser.add_argument(f"--{name}", default=default, help=f"{help} [{env}]", **kwargs)


class _EnvValue(str):
    """A flag's default read from the environment: a bad one is reported by its variable."""


def _from_env(env: str, convert: Any, choices: Any) -> Any:
    """`convert` (the flag's type), except that a bad value from the environment raises
    CliError naming the variable: one line for a pod log, not argparse's usage and a flag
    the manifest never named. Values given on the command line are converted as before."""

    def typed(value: str) -> Any:
        if not isinstance(value, _EnvValue):
            return value if convert is None else convert(value)
        try:
            result = str(value) if convert is None else convert(str(value))
        except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
            kind = {int: "an integer", float: "a number"}.get(convert)
            raise CliError(f"{env}={str(value)!r}: {f'expected {kind}' if kind else exc}") from None
        if choices is not None and result not in choices:
            raise CliError(f"{env}={str(value)!r}: expected one of {', '.join(map(str, choices))}")
        return result

    typed.__name__ = getattr(convert, "__name__", "str")  # argparse names it in its errors
    return typed


def env_switch(env: str) -> bool:
    """Whether the environment variable `env` turns a switch on (1, true, yes, on)."""
    return os.environ.get(env, "").strip().lower() in ("1", "true", "yes", "on")


class OneLineParser(argparse.ArgumentParser):
    """argparse with its errors on one line (`textserve export: error: argument --activation:
    invalid choice: 'relu' (...)`), exit 2: what a pod log or a CI step shows, without the
    dozen lines of usage before it; `--help` still shows the usage. Subcommands inherit it."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    raw = argparse.RawDescriptionHelpFormatter
    parser = OneLineParser(prog="textserve", description=__doc__, formatter_class=raw)
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        module = importlib.import_module(command.module)
        sp = sub.add_parser(
            name,
            help=command.summary,
            description=module.__doc__,
            epilog=f"example:\n  {command.example}",
            formatter_class=raw,
        )
        module.add_arguments(sp)
        sp.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except CliError as exc:  # a bad TEXTSERVE_* value (env_flag): one line
        print(f"textserve: error: {exc}", file=sys.stderr)
        return 2
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
    # Run main() from the imported module, not from __main__: with `python -m textserve.cli` this
    # file is loaded twice, and subcommands raise the importable `textserve.cli.CliError`.
    from textserve.cli import main as _main

    sys.exit(_main())
