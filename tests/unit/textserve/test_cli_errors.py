"""Every command's argparse errors are one line and exit 2 (textserve.cli.OneLineParser): a
bad choice, a bad type, an unknown flag, a missing command; `--help` still prints the usage."""

from __future__ import annotations

import pytest

from textserve.cli import main


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["serve", "--device", "foo"], "textserve serve: error: argument --device: invalid choice"),
        (["serve", "--max-batch-size", "many"], "argument --max-batch-size: expected an integer"),
        (["export", "x", "--activation", "relu"], "argument --activation: invalid choice: 'relu'"),
        (["classify", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["bogus"], "textserve: error: argument COMMAND: invalid choice: 'bogus'"),
        ([], "textserve: error: the following arguments are required: COMMAND"),
    ],
)
def test_argparse_errors_are_one_line_and_exit_2(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err and "usage:" not in err, err
    assert err.rstrip().endswith("--help)")


def test_help_still_shows_the_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--help"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("usage: textserve serve")


@pytest.mark.parametrize(
    ("argv", "env", "said"),
    [
        (["--worker-timeout", "0"], {}, "--worker-timeout must be more than 0 and at most 3600"),
        (["--max-queue-wait-ms", "-5"], {}, "--max-queue-wait-ms must be between 1 and 600000"),
        ([], {"TEXTSERVE_MAX_CONCURRENT_RPCS": "-2"}, "--max-concurrent-rpcs must be at least 1"),
        ([], {"TEXTSERVE_WORKER_TIMEOUT": "-1"}, "--worker-timeout must be more than 0"),
        ([], {"TEXTSERVE_WORKER_TIMEOUT": "soon"}, "TEXTSERVE_WORKER_TIMEOUT='soon'"),
    ],
)
def test_a_bad_serve_flag_is_one_line_and_exit_2(
    argv: list[str],
    env: dict[str, str],
    said: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """#28's liveness deadline, the admission bounds: refused before anything starts."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["serve", "--workers", "2", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err, err
