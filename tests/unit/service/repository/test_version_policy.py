"""Version policies: parsing, selection, per-model resolution and serving.json (pure, no model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from textserve import cli
from textserve.service.repository.core import ModelRecord, State, VersionRecord
from textserve.service.repository.policy import (
    LATEST,
    PolicyError,
    PolicySet,
    VersionPolicy,
    parse_policies,
    parse_policy,
    read_serving_file,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("latest", VersionPolicy("latest", 1)),
        ("latest:3", VersionPolicy("latest", 3)),
        (" LATEST:2 ", VersionPolicy("latest", 2)),
        ("all", VersionPolicy("all")),
        ("specific:4,1,4", VersionPolicy("specific", versions=(1, 4))),
        ("specific:7", VersionPolicy("specific", versions=(7,))),
    ],
)
def test_parse_policy(text: str, expected: VersionPolicy) -> None:
    assert parse_policy(text) == expected
    assert parse_policy(str(expected)) == expected  # str() writes what parse_policy reads


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("newest", "is not one of latest"),
        ("latest:0", "N of 1 or more"),
        ("latest:x", "invalid literal"),
        ("all:2", "is not one of"),
        ("specific", "one or more positive versions"),
        ("specific:0,2", "one or more positive versions"),
        ("specific:a", "invalid literal"),
    ],
)
def test_parse_policy_refuses_with_the_syntax(text: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        parse_policy(text)


@pytest.mark.parametrize(
    ("policy", "candidates", "expected"),
    [
        ("latest", [1, 2, 3], [3]),
        ("latest:2", [3, 1, 2], [3, 2]),
        ("latest:5", [2, 1], [2, 1]),
        ("latest", [], []),
        ("all", [2, 5, 1], [5, 2, 1]),
        ("specific:1,3", [1, 2, 3, 4], [3, 1]),
        ("specific:9", [1, 2], []),
    ],
)
def test_select(policy: str, candidates: list[int], expected: list[int]) -> None:
    assert parse_policy(policy).select(candidates) == expected


def test_policies_flag_default_and_per_model() -> None:
    policies = parse_policies("all tiny=specific:2,3 big=latest:2")
    assert policies.default == VersionPolicy("all")
    assert policies.for_model("tiny") == VersionPolicy("specific", versions=(2, 3))
    assert policies.for_model("other") == VersionPolicy("all")
    assert str(policies) == "all big=latest:2 tiny=specific:2,3"
    assert parse_policies("default=latest:2").default == VersionPolicy("latest", 2)
    assert parse_policies("") == PolicySet()
    hash(policies)  # part of the frozen ServerConfig


def test_policies_flag_entry_beats_file_beats_default() -> None:
    policies = parse_policies("latest:2 tiny=all")
    from_file = VersionPolicy("specific", versions=(1,))
    assert policies.for_model("tiny", from_file) == VersionPolicy("all")
    assert policies.for_model("other", from_file) == from_file
    assert policies.for_model("other", None) == VersionPolicy("latest", 2)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("all latest:2", "two default policies"),
        ("a=all a=latest", "names model 'a' twice"),
        ("a=oldest", "is not one of"),
    ],
)
def test_policies_flag_errors(text: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        parse_policies(text)


def test_serve_flag_reports_a_bad_policy(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", "--version-policy", "specific:"])
    assert exc.value.code == 2
    assert "--version-policy: specific needs one or more" in capsys.readouterr().err


def test_policy_file(tmp_path: Path) -> None:
    assert read_serving_file(tmp_path).version_policy is None
    (tmp_path / "serving.json").write_text('{"version_policy": "latest:2"}')
    assert read_serving_file(tmp_path).version_policy == VersionPolicy("latest", 2)
    (tmp_path / "serving.json").write_text("{}")
    assert read_serving_file(tmp_path).version_policy is None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "is unreadable"),
        ('["latest"]', "must be a JSON object"),
        ('{"version_policy": "latest", "extra": 1}', "must be a JSON object"),
        ('{"version_policy": 2}', "must be a string"),
        ('{"version_policy": "latest:0"}', r"serving.json: latest:N needs"),
    ],
)
def test_policy_file_errors(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "serving.json").write_text(content)
    with pytest.raises(PolicyError, match=message):
        read_serving_file(tmp_path)


def record(states: dict[int, State], policy: VersionPolicy = LATEST) -> ModelRecord:
    """A model record with fake versions (no files, no handles): what `wanted` decides from."""
    versions = {v: VersionRecord(v, Path(str(v)), state=s) for v, s in states.items()}
    return ModelRecord("m", versions, policy=policy)


def test_wanted_skips_refused_versions_so_the_serving_one_stays() -> None:
    model = record({1: State.READY, 2: State.FAILED})
    assert model.wanted() == [1]
    model.versions[3] = VersionRecord(3, Path("3"))
    assert model.wanted() == [3]


def test_wanted_adds_pinned_and_skips_excluded_and_removed() -> None:
    model = record({1: State.AVAILABLE, 2: State.READY, 3: State.READY})
    model.pinned.add(1)
    assert model.wanted() == [3, 1]
    model.excluded.add(3)  # UnloadModel(3): a rollback to 2
    assert model.wanted() == [2, 1]
    model.versions[2].on_disk = False  # deleted from the repository
    assert model.wanted() == [1]
    model.disabled = True  # UnloadModel(name): only pins
    assert model.wanted() == [1]
    model.pinned.clear()
    assert model.wanted() == []


def test_wanted_follows_the_policy() -> None:
    states = {v: State.AVAILABLE for v in (1, 2, 3, 4)}
    assert record(states, parse_policy("latest:2")).wanted() == [4, 3]
    assert record(states, parse_policy("all")).wanted() == [4, 3, 2, 1]
    assert record(states, parse_policy("specific:2,9")).wanted() == [2]


def test_serve_flags_build_the_reload_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from textserve.service.cli import build_config

    args = cli.build_parser().parse_args(["serve"])
    config = build_config(args)
    assert (config.poll_interval, config.enable_admin) == (5.0, False)
    assert config.version_policy == PolicySet()
    monkeypatch.setenv("TEXTSERVE_ENABLE_ADMIN", "1")
    monkeypatch.setenv("TEXTSERVE_VERSION_POLICY", "all tiny=latest:2")
    argv = ["serve", "--poll-interval", "0.5"]
    config = build_config(cli.build_parser().parse_args(argv))
    assert (config.poll_interval, config.enable_admin) == (0.5, True)
    assert config.version_policy.for_model("tiny") == VersionPolicy("latest", 2)
    with pytest.raises(cli.CliError, match="--poll-interval must be 0"):
        build_config(cli.build_parser().parse_args(["serve", "--poll-interval", "-1"]))


def test_serving_json_windows(tmp_path: Path) -> None:
    from textserve.service.engine.window_options import Windows

    serving = tmp_path / "serving.json"
    for text, expected in [
        ('{"windows": true}', Windows("mean", 0)),
        ('{"windows": {"aggregate": "max", "stride": 16}}', Windows("max", 16)),
        ('{"windows": false}', None),
        ("{}", None),
    ]:
        serving.write_text(text)
        assert read_serving_file(tmp_path).windows == expected, text
    for text, words in [
        ('{"windows": "yes"}', "must be true, false or an object"),
        ('{"windows": {"aggregate": "median"}}', "windows.aggregate must be one of"),
        ('{"windows": {"stride": -1}}', "windows.stride must be a non-negative integer"),
    ]:
        serving.write_text(text)
        with pytest.raises(PolicyError, match=words):
            read_serving_file(tmp_path)
