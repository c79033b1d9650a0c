"""SecurityConfig and the message-size limit (service/config.py): the TLS files go in pairs,
a client CA needs TLS itself, --max-message-bytes has its default and refuses zero."""

from __future__ import annotations

from pathlib import Path

import pytest

from textserve.service.config import ConfigError, SecurityConfig, ServerConfig


def test_security_config_pairs_its_files() -> None:
    with pytest.raises(ConfigError, match="go together"):
        SecurityConfig(tls_cert=Path("c.pem"))
    with pytest.raises(ConfigError, match="needs TLS itself"):
        SecurityConfig(tls_client_ca=Path("ca.pem"))
    assert SecurityConfig(tls_cert=Path("c"), tls_key=Path("k")).tls
    assert ServerConfig().max_message_bytes == 4 * 1024 * 1024
    with pytest.raises(ConfigError, match="--max-message-bytes"):
        ServerConfig(max_message_bytes=0)
