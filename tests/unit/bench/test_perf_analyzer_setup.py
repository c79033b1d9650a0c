"""perf_analyzer's setup (bench/perf_analyzer_setup.py) on a machine without a network: a tools
folder staged whole (the binary, libcudart, libb64 beside them) is used as it is, and apt is
never called (the device machine is offline: an apt call there failed the check)."""

from __future__ import annotations

from pathlib import Path

import pytest

from textserve.bench import perf_analyzer_setup as setup


def staged(tools: Path, *, libb64: bool) -> Path:
    tools.mkdir()
    binary = tools / "perf_analyzer"
    binary.write_text("#!/bin/sh\necho 'perf_analyzer 2.51.0'\n")
    binary.chmod(0o755)
    (tools / "libcudart.so.12").write_bytes(b"")
    if libb64:
        (tools / setup.LIBB64).write_bytes(b"")
    return tools


def no_network(*args: object, **kwargs: object) -> None:
    raise AssertionError("no download and no apt on a staged machine")


def test_a_staged_tools_folder_needs_neither_pip_nor_apt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools = staged(tmp_path / "tools", libb64=True)
    monkeypatch.setattr(setup, "_download_member", no_network)
    monkeypatch.setattr(setup, "_install_libb64", no_network)
    assert setup.ensure_perf_analyzer(tools) == tools / "perf_analyzer"


def test_without_libb64_anywhere_apt_is_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools = staged(tmp_path / "tools", libb64=False)
    asked: list[bool] = []
    monkeypatch.setattr(setup, "_download_member", no_network)
    monkeypatch.setattr(setup, "_install_libb64", lambda: asked.append(True))
    monkeypatch.setattr(setup.subprocess, "run", _ldconfig_without_libb64(setup.subprocess.run))
    setup.ensure_perf_analyzer(tools)
    assert asked == [True]


def _ldconfig_without_libb64(run):  # type: ignore[no-untyped-def]
    def fake(command, *args, **kwargs):  # type: ignore[no-untyped-def]
        if command[:2] == ["ldconfig", "-p"]:
            return setup.subprocess.CompletedProcess(command, 0, "libc.so.6\n", "")
        return run(command, *args, **kwargs)

    return fake
