"""The serving configuration's checks and `textserve serve`'s flags (service/config.py,
service/cli.py): each bad value names its flag; flags, TEXTSERVE_* fallbacks and the
dataclasses' defaults build one ServerConfig."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from textserve.cli import CliError, build_parser
from textserve.service import cli as serve_cli
from textserve.service.config import BatcherConfig, ConfigError, RuntimeConfig, ServerConfig


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: BatcherConfig(max_batch_size=0), "--max-batch-size must be at least 1"),
        (lambda: BatcherConfig(max_queue_delay=20), "--max-queue-delay-ms must be between"),
        (lambda: BatcherConfig(max_queue_size=0), "--max-queue-size"),
        (lambda: BatcherConfig(max_queue_wait=0), "--max-queue-wait-ms must be between 1"),
        (lambda: BatcherConfig(max_queue_wait=-0.1), "--max-queue-wait-ms must be between 1"),
        (lambda: ServerConfig(max_concurrent_rpcs=-1), "--max-concurrent-rpcs must be at least"),
        (lambda: RuntimeConfig(device="gpu"), "--device must be one of auto, cpu, cuda"),
        (lambda: ServerConfig(listen="50051"), "--listen must be HOST:PORT"),
        (lambda: ServerConfig(listen="127.0.0.1:²"), "--listen must be HOST:PORT"),  # isdigit()
        (lambda: ServerConfig(metrics_port=70000), "--metrics-port"),
        (lambda: ServerConfig(max_texts_per_request=0), "--max-texts-per-request"),
    ],
)
def test_config_errors_say_which_flag(build: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build()  # type: ignore[operator]


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def test_serve_flags_build_the_config() -> None:
    args = parse(
        ["serve", "--repository", "r", "--model", "m", "--max-queue-delay-ms", "5",
         "--metrics-port", "off", "--device", "cpu", "--max-batch-size", "8"]
    )  # fmt: skip
    config = serve_cli.build_config(args)
    assert config.repository == Path("r") and config.model == "m"
    assert config.batcher.max_queue_delay == pytest.approx(0.005)
    assert config.batcher.max_batch_size == 8
    assert config.metrics_port is None and config.runtime.device == "cpu"


def test_serve_flag_defaults_are_the_configs_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    # One source of defaults: `textserve serve` with no flag (and no TEXTSERVE_* variable)
    # builds exactly the config the dataclasses default to.
    import os

    for name in [n for n in os.environ if n.startswith("TEXTSERVE_")]:
        monkeypatch.delenv(name)
    assert serve_cli.build_config(parse(["serve"])) == ServerConfig()


def test_serve_flags_fall_back_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEXTSERVE_LISTEN", "0.0.0.0:6000")
    monkeypatch.setenv("TEXTSERVE_MAX_QUEUE_SIZE", "17")
    config = serve_cli.build_config(parse(["serve"]))
    assert config.listen == "0.0.0.0:6000" and config.batcher.max_queue_size == 17
    config = serve_cli.build_config(parse(["serve", "--listen", "127.0.0.1:1"]))
    assert config.listen == "127.0.0.1:1"  # a flag beats the environment


def test_serve_bad_values_are_cli_errors() -> None:
    with pytest.raises(CliError, match="--max-batch-tokens must be at least 1"):
        serve_cli.build_config(parse(["serve", "--max-batch-tokens", "0"]))
