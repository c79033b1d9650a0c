"""The client's targets: one address or URI as is, several as one ipv4:/ipv6: URI, and the
service config (round_robin, retries of UNAVAILABLE) on every channel."""

from __future__ import annotations

import json

import pytest

from textserve.cli import ConfigError
from textserve.connect import (
    BALANCING_OPTIONS,
    HEALTH_CHECKED_SERVICE_CONFIG,
    SERVICE_CONFIG,
    channel_target,
)


def test_one_address_or_uri_is_kept() -> None:
    assert channel_target("127.0.0.1:50051") == ("127.0.0.1:50051", [])
    assert channel_target("dns:///textserve-grpc.textserve.svc:50051") == (
        "dns:///textserve-grpc.textserve.svc:50051",
        [],
    )


def test_several_addresses_become_one_uri() -> None:
    assert channel_target(["127.0.0.1:1", "127.0.0.2:2"]) == ("ipv4:127.0.0.1:1,127.0.0.2:2", [])
    assert channel_target("127.0.0.1:1, 127.0.0.2:2") == ("ipv4:127.0.0.1:1,127.0.0.2:2", [])
    assert channel_target("[::1]:1,[::1]:2") == ("ipv6:[::1]:1,[::1]:2", [])


def test_host_names_are_resolved_and_keep_their_authority() -> None:
    uri, options = channel_target("localhost:7001,127.0.0.1:7002")
    assert uri.startswith(("ipv4:", "ipv6:")) and uri.endswith(":7002")
    assert ("grpc.default_authority", "localhost:7001") in options


@pytest.mark.parametrize(
    "target",
    ["", "127.0.0.1:1,dns:///x:2", "127.0.0.1,127.0.0.2:2", "127.0.0.1:1,[::1]:2", "a:1,b:²"],
)
def test_unusable_targets_are_refused(target: str) -> None:
    with pytest.raises(ConfigError):
        channel_target(target)


def test_the_service_config_balances_and_retries_unavailable() -> None:
    options = dict(BALANCING_OPTIONS)
    config = json.loads(options["grpc.service_config"])
    assert config == SERVICE_CONFIG
    assert config["loadBalancingConfig"] == [{"round_robin": {}}]
    (method,) = config["methodConfig"]
    assert {"service": "textserve.v1.Classifier", "method": "Classify"} in method["name"]
    assert method["retryPolicy"]["retryableStatusCodes"] == [
        "UNAVAILABLE",
        "CANCELLED",
        "RESOURCE_EXHAUSTED",
    ]
    assert "retryThrottling" not in config  # a worker's death must not spend the retries
    assert "healthCheckConfig" not in config  # only where a target balances over replicas
    checked = HEALTH_CHECKED_SERVICE_CONFIG
    assert checked["healthCheckConfig"] == {"serviceName": ""}  # round_robin skips NOT_SERVING
    assert {k: v for k, v in checked.items() if k != "healthCheckConfig"} == SERVICE_CONFIG
    assert options["grpc.enable_retries"] == 1
