"""Unit test of the serving process's GC and thread settings (service/tuning.py)."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator

import pytest

from textserve.service.tuning import (
    GC_THRESHOLD_0,
    GC_THRESHOLD_1,
    GC_THRESHOLD_2,
    tune_for_serving,
)


@pytest.fixture
def restored_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()  # the test process keeps collecting everything
        gc.set_threshold(*thresholds)


def test_freezes_startup_objects_and_raises_the_thresholds(
    restored_gc: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "")  # records the value to restore
    monkeypatch.delenv("TOKENIZERS_PARALLELISM")
    tune_for_serving()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (GC_THRESHOLD_0, GC_THRESHOLD_1, GC_THRESHOLD_2)
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"


def test_keeps_a_tokenizers_setting_from_the_environment(
    restored_gc: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    tune_for_serving()
    assert os.environ["TOKENIZERS_PARALLELISM"] == "true"
