"""export_run's input checks and its repository bookkeeping (versions, stale temp dirs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pipeline = pytest.importorskip("textserve.export.pipeline")
from textserve.artifact import Manifest  # noqa: E402
from textserve.export import publish  # noqa: E402
from textserve.export.errors import ExportError  # noqa: E402


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "../escape"}, "model name '../escape' must be"),
        ({"name": ".hidden"}, "model name '.hidden' must be"),
        ({"quantize": "int4"}, "quantize must be one of int8, got 'int4'"),
        ({"quantize": "int8", "fp16": True}, "choose one of --quantize int8 and --fp16"),
        ({"max_accuracy_drop": -1.0}, "max accuracy drop must be >= 0 points"),
        ({"opset": 16}, "opset must be >= 17, got 16"),
        ({"exporter": "jit"}, "exporter must be one of torchscript, dynamo"),
        ({"atol": -1.0}, "tolerances must be >= 0"),
    ],
)
def test_bad_options_are_refused_before_any_work(
    tmp_path: Path, kwargs: dict[str, object], message: str
) -> None:
    args = {"name": "ok", **kwargs}
    name = args.pop("name")
    with pytest.raises(ExportError, match=message.replace("(", r"\(").replace(")", r"\)")):
        pipeline.export_run(tmp_path / "no-run", tmp_path / "models", name, **args)
    assert not (tmp_path / "models").exists()  # nothing was created


def test_missing_run_dir_is_named(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=f"run directory {tmp_path / 'nope'} does not exist"):
        pipeline.export_run(tmp_path / "nope", tmp_path / "models", "m")
    assert not (tmp_path / "models").exists()


def test_next_version_counts_version_directories_only(tmp_path: Path) -> None:
    assert publish.next_version(tmp_path) == 1
    # not versions (textserve.artifact.parse_version): the server skips them, so they take no
    # number; "²" and a number past int64 used to make the export fail or publish past int64
    for name in ("1", "3", ".tmp-1-abc", "latest", "0007", "²", "9" * 23):
        (tmp_path / name).mkdir()
    (tmp_path / "9").write_text("a file, not a version")
    assert publish.next_version(tmp_path) == 4


def test_stale_temp_dirs_of_dead_exports_are_removed(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    stale = tmp_path / f".tmp-{int(dead.stdout)}-x1"
    live = tmp_path / f".tmp-{os.getpid()}-x2"  # an export running right now (us)
    other = tmp_path / ".tmp-notapid"
    for path in (stale, live, other):
        path.mkdir()
        (path / "model.onnx").write_bytes(b"partial")
    publish.remove_stale_temp_dirs(tmp_path)
    assert not stale.exists()
    assert live.exists() and other.exists()


def _manifest() -> Manifest:
    return Manifest(
        name="m", version=1, labels=["a", "b"], max_length=8, pad_token_id=0, opset=18,
        precision="fp32", sha256={"model.onnx": "0" * 64, "tokenizer.json": "0" * 64},
        source_checkpoint_sha256="0" * 64, parity={}, test_accuracy=1.0, created_at="now",
    )  # fmt: skip


def test_publish_takes_the_next_number_when_another_export_wins_the_race(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_dir = tmp_path / "m"
    tmp = publish.make_temp_dir(model_dir)
    (tmp / "model.onnx").write_bytes(b"graph")
    (model_dir / "1").mkdir()
    (model_dir / "1" / "manifest.json").write_text("{}")  # another export published 1 first
    stale_view = iter([1])  # our first look at the directory predates theirs
    real = publish.next_version
    monkeypatch.setattr(publish, "next_version", lambda d: next(stale_view, None) or real(d))
    target = publish.publish(tmp, model_dir, _manifest())
    assert target == model_dir / "2" and not tmp.exists()
    assert Manifest.read(target).version == 2
    assert (model_dir / "1" / "manifest.json").read_text() == "{}"  # theirs is untouched
    assert target.stat().st_mode & 0o777 == 0o755
