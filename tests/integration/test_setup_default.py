"""`make serve`'s setup step (`textserve setup-default`) is idempotent: a model with a version is
left alone, a finished training run is reused, only a missing or unfinished one is trained.

Training is counted through a stand-in for `train` that writes tiny_run's files (the real
export runs on them); the export is counted through a wrapper around the real one."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
from textserve.cli import main as cli_main
from textserve.export import pipeline
from textserve.model import train as train_module


@pytest.fixture
def calls(tiny_run: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    counted = {"train": 0, "export": 0}
    export_run = pipeline.export_run

    def train(cfg: Any) -> Path:
        counted["train"] += 1
        shutil.copytree(tiny_run, cfg.output_dir)
        return Path(cfg.output_dir)

    def export(*args: Any, **kwargs: Any) -> Path:
        counted["export"] += 1
        return export_run(*args, **kwargs)

    monkeypatch.setattr(train_module, "train", train)
    monkeypatch.setattr(pipeline, "export_run", export)
    return counted


def setup(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    argv = ["setup-default", "--repository", str(tmp_path / "models"), "--name", "default",
            "--run-dir", str(tmp_path / "runs" / "default"), "--threads", "1"]  # fmt: skip
    assert cli_main(argv) == 0
    return capsys.readouterr().out


def test_a_second_setup_trains_and_exports_nothing(
    tmp_path: Path, calls: dict[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    first = setup(tmp_path, capsys)
    assert calls == {"train": 1, "export": 1}
    assert first == f"model ready: {tmp_path / 'models' / 'default' / '1'}\n"
    second = setup(tmp_path, capsys)
    assert calls == {"train": 1, "export": 1}  # nothing trained or exported again
    assert second == first
    assert sorted(p.name for p in (tmp_path / "models" / "default").iterdir()) == ["1"]


def test_a_finished_run_is_reused_not_retrained(
    tiny_run: Path, tmp_path: Path, calls: dict[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copytree(tiny_run, tmp_path / "runs" / "default")
    setup(tmp_path, capsys)
    assert calls == {"train": 0, "export": 1}
    # the repository lost its model (a fresh volume): exported again from the same run
    shutil.rmtree(tmp_path / "models")
    setup(tmp_path, capsys)
    assert calls == {"train": 0, "export": 2}


def test_an_unfinished_run_or_a_broken_version_is_redone(
    tiny_run: Path, tmp_path: Path, calls: dict[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = shutil.copytree(tiny_run, tmp_path / "runs" / "default")
    (run_dir / "metrics.json").unlink()  # training was killed before its last file
    broken = tmp_path / "models" / "default" / "1"
    broken.mkdir(parents=True)
    (broken / "manifest.json").write_text("{")  # not a version: it does not count
    out = setup(tmp_path, capsys)
    assert calls == {"train": 1, "export": 1}
    assert out == f"model ready: {tmp_path / 'models' / 'default' / '2'}\n"
    setup(tmp_path, capsys)
    assert calls == {"train": 1, "export": 1}


def test_an_export_that_fails_a_check_is_one_line_and_exit_1(
    tiny_run: Path,
    tmp_path: Path,
    calls: dict[str, int],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # export's options and their environment fallbacks reach setup-default's export: int8 from
    # TEXTSERVE_EXPORT_QUANTIZE, graded against a bound the stand-in graph cannot meet
    from textserve.export import transforms
    from textserve.model.checkpoint import load_run

    run = load_run(tiny_run)

    def untrained(src: Path, dst: Path) -> dict[str, object]:
        import torch

        torch.manual_seed(1)
        transforms.export_onnx(type(run.model)(run.config).eval(), dst, max_length=run.max_length)
        return {}

    monkeypatch.setattr(transforms, "quantize_int8", untrained)
    monkeypatch.setenv("TEXTSERVE_EXPORT_QUANTIZE", "int8")
    monkeypatch.setenv("TEXTSERVE_EXPORT_MAX_ACCURACY_DROP", "0.5")
    shutil.copytree(tiny_run, tmp_path / "runs" / "default")
    argv = ["setup-default", "--repository", str(tmp_path / "models"),
            "--run-dir", str(tmp_path / "runs" / "default"), "--threads", "1"]  # fmt: skip
    assert cli_main(argv) == 1
    captured = capsys.readouterr()
    assert calls == {"train": 0, "export": 1}
    assert captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith("textserve setup-default: int8 accuracy check failed: ")
    assert "Traceback" not in captured.err and captured.out == ""
    assert list((tmp_path / "models" / "default").iterdir()) == []


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TEXTSERVE_EXPORT_OPSET": "x"}, "TEXTSERVE_EXPORT_OPSET='x': expected an integer"),
        ({"TEXTSERVE_EXPORT_FP16": "maybe"}, "TEXTSERVE_EXPORT_FP16='maybe': expected one of"),
        ({"TEXTSERVE_EXPORT_FP16": "1", "TEXTSERVE_EXPORT_QUANTIZE": "int8"}, "choose one of"),
    ],
)
def test_a_bad_export_setting_is_one_line_and_exit_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    message: str,
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert cli_main(["setup-default", "--repository", str(tmp_path / "models")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "models").exists()
