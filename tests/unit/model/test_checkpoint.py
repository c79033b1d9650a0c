"""The run directory: what tiny_run holds, and a clear CheckpointError for each way it can break."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from textserve.model.checkpoint import REQUIRED_FILES, CheckpointError, load_run  # noqa: E402
from textserve.tokenization import encode_batch  # noqa: E402


@pytest.fixture
def run_copy(tiny_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_run, tmp_path / "run"))


def edit_json(path: Path, change) -> None:  # type: ignore[no-untyped-def]
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_tiny_run_is_complete_and_loads(tiny_run: Path) -> None:
    names = {p.name for p in tiny_run.iterdir()}
    assert set(REQUIRED_FILES) | {"training_curves.png"} <= names
    assert (tiny_run / "training_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    run = load_run(tiny_run)
    assert not run.model.training
    assert run.labels == ["negative", "neutral", "positive"]
    assert json.loads((tiny_run / "labels.json").read_text()) == run.labels
    assert run.config.max_length == 64 and run.pad_token_id == 0
    assert len(run.test_texts) == len(run.test_labels) > 0
    assert set(run.test_labels) <= {0, 1, 2}
    config = json.loads((tiny_run / "config.json").read_text())
    assert set(config) == {"model", "labels", "data", "train"}
    metrics = run.metrics
    for key in ("accuracy", "macro_f1", "per_class", "confusion_matrix"):
        assert key in metrics["test"] and key in metrics["validation"]
    assert set(metrics["test"]["per_class"]["positive"]) == {"precision", "recall", "f1", "support"}


def test_tiny_run_model_has_learned_the_task(tiny_run: Path) -> None:
    run = load_run(tiny_run)
    ids, mask = encode_batch(run.tokenizer, run.test_texts, run.max_length)
    with torch.no_grad():
        pred = run.model(torch.from_numpy(ids), torch.from_numpy(mask)).argmax(dim=1)
    accuracy = (pred == torch.tensor(run.test_labels)).float().mean().item()
    assert accuracy >= 0.9
    assert accuracy == pytest.approx(run.metrics["test_accuracy"], abs=1e-6)


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"run directory .*nowhere does not exist"):
        load_run(tmp_path / "nowhere")


def test_incomplete_directory_names_what_is_missing(run_copy: Path) -> None:
    (run_copy / "model.safetensors").unlink()
    (run_copy / "test.jsonl").unlink()
    with pytest.raises(
        CheckpointError, match=r"incomplete: missing model\.safetensors, test\.jsonl"
    ):
        load_run(run_copy)


def test_weights_that_do_not_match_the_config(run_copy: Path) -> None:
    edit_json(run_copy / "config.json", lambda c: c["model"].update(d_ff=128))
    with pytest.raises(
        CheckpointError,
        match=r"does not match config\.json: blocks\.0\.ff\.linear1\.weight has shape",
    ):
        load_run(run_copy)


def test_weights_with_missing_layers(run_copy: Path) -> None:
    edit_json(run_copy / "config.json", lambda c: c["model"].update(n_layers=3))
    with pytest.raises(CheckpointError, match=r"does not match config\.json: missing blocks\.2\."):
        load_run(run_copy)


def test_labels_mismatch(run_copy: Path) -> None:
    (run_copy / "labels.json").write_text('["negative", "positive"]')
    with pytest.raises(CheckpointError, match=r"has 2 labels but config\.json says num_labels=3"):
        load_run(run_copy)


def test_corrupt_weights(run_copy: Path) -> None:
    (run_copy / "model.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(CheckpointError, match=r"not a readable safetensors file"):
        load_run(run_copy)


def test_unreadable_config(run_copy: Path) -> None:
    (run_copy / "config.json").write_text("{")
    with pytest.raises(CheckpointError, match=r"config\.json is unreadable"):
        load_run(run_copy)


def test_tokenizer_bigger_than_the_embedding(run_copy: Path) -> None:
    edit_json(run_copy / "config.json", lambda c: c["model"].update(vocab_size=10))
    with pytest.raises(CheckpointError, match=r"tokens but the model embeds only vocab_size=10"):
        load_run(run_copy)


def test_unknown_test_label(run_copy: Path) -> None:
    with open(run_copy / "test.jsonl", "a", encoding="utf-8") as fh:
        fh.write('{"text": "x", "label": "sideways"}\n')
    with pytest.raises(CheckpointError, match=r"unknown label 'sideways'"):
        load_run(run_copy)
