"""Unit tests of the serving edges: the error table, configuration checks, the CLIs' parsing."""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import pytest

from textserve.cli import CliError, build_parser
from textserve.client import ClientError, Prediction, to_result
from textserve.commands import classify as classify_cli
from textserve.service import cli as serve_cli
from textserve.service.config import BatcherConfig, ConfigError, RuntimeConfig, ServerConfig
from textserve.v1 import classifier_pb2 as pb


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: BatcherConfig(max_batch_size=0), "--max-batch-size must be at least 1"),
        (lambda: BatcherConfig(max_queue_delay=20), "--max-queue-delay-ms must be between"),
        (lambda: BatcherConfig(max_queue_size=0), "--max-queue-size"),
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


def test_classify_reads_arguments_file_or_stdin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert classify_cli.read_texts(parse(["classify", "a", "b"])) == ["a", "b"]
    path = tmp_path / "texts.txt"
    path.write_text("one\n\n two \n")
    assert classify_cli.read_texts(parse(["classify", "--file", str(path)])) == ["one", " two "]
    monkeypatch.setattr("sys.stdin", io.StringIO("x\ny\n"))
    assert classify_cli.read_texts(parse(["classify"])) == ["x", "y"]
    with pytest.raises(CliError, match="cannot read"):
        classify_cli.read_texts(parse(["classify", "--file", str(tmp_path / "nope")]))
    monkeypatch.setattr("sys.stdin", io.StringIO("\n \n"))
    with pytest.raises(CliError, match="only blank lines"):
        classify_cli.read_texts(parse(["classify"]))


def test_classify_table_is_readable() -> None:
    predictions = [
        Prediction("positive", 0.9876, scores={"negative": 0.0124, "positive": 0.9876}),
        Prediction("negative", 0.5),
    ]
    table = classify_cli.format_table(["a fine film", "x" * 100], predictions, True, 0)
    lines = table.splitlines()
    assert lines[0].split() == ["LABEL", "SCORE", "TEXT"]
    assert lines[1].startswith("positive  0.9876  a fine film  negative=0.0124 positive=0.9876")
    assert lines[2].endswith("...") and len(lines[2]) < 90


def test_client_result_conversion() -> None:
    response = pb.ClassifyResponse(
        model="m",
        model_version=3,
        labels=["neg", "pos"],
        results=[pb.TextResult(label="pos", score=0.75, scores=[0.25, 0.75], num_tokens=4)],
    )
    result = to_result(response)
    assert (result.model, result.version) == ("m", 3)
    assert result.predictions[0].scores == {"neg": 0.25, "pos": 0.75}
    assert result.predictions[0].num_tokens == 4


def test_client_refuses_a_single_string() -> None:
    from textserve.client import _request

    with pytest.raises(TypeError, match="not one string"):
        _request("abc", None, None, None, 0, False, "")


def test_client_error_carries_the_code() -> None:
    err = ClientError("NOT_FOUND", "model 'x' not found")
    assert err.code == "NOT_FOUND" and str(err) == "NOT_FOUND: model 'x' not found"
