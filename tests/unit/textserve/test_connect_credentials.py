"""Credentials in textserve/connect.py, shared by the server and the clients: token files
(comments, blank lines, which line is wrong), the client's bearer metadata, PEM file checks,
and the client flags that read a token from a file or TEXTSERVE_TOKEN and pair the TLS files."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from textserve import connect
from textserve.cli import CliError
from textserve.connect import (
    bearer_metadata,
    channel_credentials,
    parse_tokens,
    read_pem,
    read_tokens,
)
from textserve.service.config import ConfigError

TOKEN = "s3cret-0123456789abcdef"


def test_token_files_skip_blanks_and_comments() -> None:
    text = f"# who: ci\n\n  {TOKEN}  \n# rotated: old\nother-token-0123456789\n"
    assert parse_tokens(text) == [TOKEN, "other-token-0123456789"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "holds no token"),
        ("# only a comment\n\n", "holds no token"),
        ("two words\n", "line 1: a token must be printable ASCII without spaces"),
        ("ok-token\ntöken\n", "line 2: a token must be printable ASCII"),
        ("tab\there\n", "line 1"),
    ],
)
def test_bad_token_files_say_which_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_tokens(text)


def test_unreadable_token_file_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--auth-token-file .*missing: cannot read"):
        read_tokens(tmp_path / "missing")


def test_client_token_metadata_is_checked() -> None:
    assert bearer_metadata(None) == ()
    assert bearer_metadata(f" {TOKEN}\n") == (("authorization", f"Bearer {TOKEN}"),)
    for bad in ("", "two words", "tök"):
        with pytest.raises(ValueError):
            bearer_metadata(bad)


def test_pem_files_are_checked_at_startup(tmp_path: Path) -> None:
    key = tmp_path / "key.pem"
    key.write_text("-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n")
    with pytest.raises(ConfigError, match=r"--tls-cert .*not a PEM file holding a certificate"):
        read_pem(key, "--tls-cert", "CERTIFICATE")
    assert read_pem(key, "--tls-key", "PRIVATE KEY").startswith(b"-----BEGIN")
    with pytest.raises(ConfigError, match="cannot read"):
        read_pem(tmp_path / "nope.pem", "--tls-ca", "CERTIFICATE")
    with pytest.raises(ValueError, match="give both cert and key"):
        channel_credentials(cert=key)


def _args(**values: Any) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    connect.add_arguments(parser)
    args = parser.parse_args([])
    for name, value in values.items():
        setattr(args, name, value)
    return args


def test_client_flags_read_the_token_from_a_file_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TEXTSERVE_TOKEN", raising=False)
    assert connect.client_options(_args())["token"] is None
    monkeypatch.setenv("TEXTSERVE_TOKEN", TOKEN)
    assert connect.client_options(_args())["token"] == TOKEN
    path = tmp_path / "token"
    path.write_text(f"# mine\n{TOKEN}x\n")
    assert connect.client_options(_args(token_file=str(path)))["token"] == TOKEN + "x"
    path.write_text("one-0123456789abcdef\ntwo-0123456789abcdef\n")
    with pytest.raises(CliError, match="holds 2 tokens; a client sends one"):
        connect.client_options(_args(token_file=str(path)))
    with pytest.raises(CliError, match="go together"):
        connect.client_options(_args(tls_cert="c.pem"))
    with pytest.raises(CliError, match="needs TLS"):
        connect.client_options(_args(tls_server_name="example.com"))
    options = connect.client_options(_args(tls_ca="ca.pem"))
    assert options["tls"] and options["ca"] == "ca.pem"
