"""--http-port and --http-host, and the deprecated --metrics-port / --metrics-host they replace
(service/cli.py): the flags and their TEXTSERVE_* fallbacks build the same ServerConfig."""

from __future__ import annotations

import pytest

from textserve.cli import build_parser
from textserve.service.cli import build_config


def config(monkeypatch: pytest.MonkeyPatch, *flags: str, **env: str):  # type: ignore[no-untyped-def]
    for name in ("TEXTSERVE_HTTP_PORT", "TEXTSERVE_HTTP_HOST", "TEXTSERVE_METRICS_PORT",
                 "TEXTSERVE_METRICS_HOST"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return build_config(build_parser().parse_args(["serve", *flags]))


def test_http_port_and_host(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    default = config(monkeypatch)
    assert (default.metrics_port, default.metrics_host, default.http.inference) == (
        8000, "127.0.0.1", True,
    )  # fmt: skip
    given = config(monkeypatch, "--http-port", "9100", "--http-host", "0.0.0.0")
    assert (given.metrics_port, given.metrics_host) == (9100, "0.0.0.0")
    from_env = config(monkeypatch, TEXTSERVE_HTTP_PORT="9200")
    assert from_env.metrics_port == 9200
    off = config(monkeypatch, "--http-port", "off")
    assert off.metrics_port == 8000 and off.http.inference is False  # probes and /metrics stay
    assert capsys.readouterr().err == ""


def test_the_deprecated_aliases(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    alias = config(monkeypatch, "--metrics-port", "9300", "--metrics-host", "0.0.0.0")
    assert (alias.metrics_port, alias.metrics_host) == (9300, "0.0.0.0")
    err = capsys.readouterr().err
    assert "--metrics-port is deprecated; use --http-port" in err
    assert "--metrics-host is deprecated; use --http-host" in err
    # 'off' is no deprecation: it is the one way to have no HTTP port at all
    assert config(monkeypatch, "--metrics-port", "off").metrics_port is None
    assert config(monkeypatch, TEXTSERVE_METRICS_PORT="off").metrics_port is None
    assert capsys.readouterr().err == ""
