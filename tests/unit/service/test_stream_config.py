"""--stream-max-inflight (issue 20): its default, its TEXTSERVE_* fallback and its validation."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from textserve.cli import CliError, build_parser
from textserve.service import cli as serve_cli
from textserve.service.config import ConfigError, ServerConfig


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def test_the_default_is_32_requests_per_stream() -> None:
    assert serve_cli.build_config(parse(["serve"])).stream_max_inflight == 32
    assert ServerConfig().stream_max_inflight == 32


def test_the_flag_falls_back_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEXTSERVE_STREAM_MAX_INFLIGHT", "5")
    assert serve_cli.build_config(parse(["serve"])).stream_max_inflight == 5
    config = serve_cli.build_config(parse(["serve", "--stream-max-inflight", "7"]))
    assert config.stream_max_inflight == 7  # a flag beats the environment


@pytest.mark.parametrize("value", [0, -1])
def test_a_limit_below_one_names_the_flag(value: int, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--stream-max-inflight must be at least 1"):
        ServerConfig(repository=tmp_path, stream_max_inflight=value)
    with pytest.raises(CliError, match=f"--stream-max-inflight must be at least 1, got {value}"):
        serve_cli.build_config(parse(["serve", f"--stream-max-inflight={value}"]))
