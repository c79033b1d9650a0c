"""The linear baseline of every run: in metrics.json, on the run's own split, and the warning."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")

from textserve.model.baseline import fit_baseline
from textserve.model.synthetic import synthetic_rows, write_jsonl
from textserve.model.train import TrainConfig, load_splits, train


def test_every_run_has_the_baseline_of_its_own_split(tiny_run: Path) -> None:
    metrics = json.loads((tiny_run / "metrics.json").read_text())
    baseline = metrics["baseline"]
    assert {"model", "accuracy", "macro_f1", "validation_accuracy", "seconds"} <= set(baseline)
    # Refit on the split the run's settings give: the same figures, so it was fitted on the
    # run's training split and scored on its test split (not on some other data).
    settings = json.loads((tiny_run / "config.json").read_text())["train"]
    cfg = TrainConfig(data=Path(settings["data"]), seed=settings["seed"])
    splits, labels = load_splits(cfg)
    index = {name: i for i, name in enumerate(labels)}
    again = fit_baseline(
        splits.train.texts,
        [index[y] for y in splits.train.labels],
        {"test": (splits.test.texts, [index[y] for y in splits.test.labels])},
        labels,
    )
    assert baseline["accuracy"] == again["test"]["accuracy"]
    assert baseline["macro_f1"] == again["test"]["macro_f1"]
    assert baseline["test"]["n"] == len(splits.test) == metrics["test"]["n"]
    # tiny_run learns its data set: it is not below the baseline, so no warning
    assert metrics["test_accuracy"] >= baseline["accuracy"]
    assert metrics["warnings"] == []


def _tiny(tmp_path: Path, name: str, **changes: object) -> TrainConfig:
    data = tmp_path / "syn.jsonl"
    if not data.exists():
        write_jsonl(synthetic_rows(150, seed=5), data)
    settings: dict[str, object] = {
        "data": data, "preset": "tiny", "epochs": 1, "batch_size": 16, "seed": 0,
        "device": "cpu", "threads": 1, "output_dir": tmp_path / name, "progress": False,
    }  # fmt: skip
    settings.update(changes)
    return TrainConfig(**settings)  # type: ignore[arg-type]


def test_a_tiny_model_that_loses_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # One epoch at a learning rate of ~0: the tiny model guesses, the baseline learns the cues.
    with caplog.at_level(logging.INFO, logger="textserve.model.train"):
        run = train(_tiny(tmp_path, "loses", lr=1e-9))
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["test_accuracy"] < metrics["baseline"]["accuracy"]
    assert len(metrics["warnings"]) == 1
    assert "does not beat the linear baseline" in metrics["warnings"][0]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert metrics["warnings"][0] in warned
    summary = [r.getMessage() for r in caplog.records if r.getMessage().startswith("test accuracy")]
    assert f"linear baseline {metrics['baseline']['accuracy']:.4f}" in summary[0]


def test_no_baseline(tmp_path: Path) -> None:
    run = train(_tiny(tmp_path, "none", baseline=False))
    metrics = json.loads((run / "metrics.json").read_text())
    assert "baseline" not in metrics and "warnings" not in metrics
