"""`textserve export` and `textserve models` as a user runs them: exit codes and messages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from textserve import cli
from textserve.export import transforms
from textserve.model.checkpoint import load_run


def test_export_then_list(
    tiny_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = str(tmp_path / "models")
    assert (
        cli.main(["export", str(tiny_run), "--repository", repo, "--name", "m", "--threads", "1"])
        == 0
    )
    out = capsys.readouterr().out
    assert out.startswith(f"published {repo}/m/1: fp32, opset 18")
    assert cli.main(["export", str(tiny_run), "--repository", repo, "--name", "m", "--quantize",
                     "int8", "--no-padding-free", "--threads", "1", "--json"]) == 0  # fmt: skip
    manifest = json.loads(capsys.readouterr().out)
    assert (manifest["version"], manifest["precision"]) == (2, "int8")
    assert manifest["extra"]["graph_form"] == "dense"
    assert cli.main(["models", "--repository", repo, "--verify"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [(r[0], r[1], r[2]) for r in rows] == [("m", "1", "fp32"), ("m", "2", "int8")]


def test_a_failed_check_exits_1_naming_check_and_figure(
    tiny_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = load_run(tiny_run)

    def untrained(src: Path, dst: Path) -> dict[str, object]:
        import torch

        torch.manual_seed(1)
        transforms.export_onnx(type(run.model)(run.config).eval(), dst, max_length=run.max_length)
        return {}

    monkeypatch.setattr(transforms, "quantize_int8", untrained)
    repo = tmp_path / "models"
    argv = ["--name", "m", "--quantize", "int8", "--max-accuracy-drop", "0.5", "--threads", "1"]
    code = cli.main(["export", str(tiny_run), "--repository", str(repo), *argv])
    err = capsys.readouterr().err
    assert code == 1
    assert "int8 accuracy check failed: test accuracy drops" in err
    assert "more than the allowed 0.5" in err and "nothing was published" in err
    assert [p.name for p in (repo / "m").iterdir()] == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--name", "m"], "{missing} does not exist: SOURCE is a textserve run folder"),
        (["--name", "a/b"], "model name 'a/b' must be"),
        (["--name", "m", "--fp16", "--quantize", "int8"], "choose one of --quantize int8"),
        (["--name", "m", "--threads", "0"], "--threads must be >= 1"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    missing = tmp_path / "no-such-run"
    code = cli.main(["export", str(missing), "--repository", str(tmp_path / "models"), *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("textserve export: error: ")
    assert message.format(missing=missing) in err


def test_console_script_end_to_end(tiny_run: Path, tmp_path: Path) -> None:
    # A real child process through `python -m textserve.cli`, as `make serve` runs it.
    repo = tmp_path / "models"
    done = subprocess.run(
        [sys.executable, "-m", "textserve.cli", "export", str(tiny_run), "--repository", str(repo),
         "--name", "cli", "--threads", "1"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"published {repo}/cli/1" in done.stdout
    assert (repo / "cli" / "1" / "manifest.json").is_file()
