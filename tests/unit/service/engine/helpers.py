"""What the engine's tests of a real model share: a hand-made version loaded as a ModelHandle
(tests/handmade.py, real onnxruntime) and a session that fails the runs holding a chosen id."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from tests.handmade import make_version
from textserve.service.config import BatcherConfig, RuntimeConfig, ServerConfig
from textserve.service.engine.handle import ModelHandle
from textserve.service.metrics import Metrics
from textserve.service.repository.loader import load_version_dir


def load(tmp_path: Path, **batcher: Any) -> tuple[ModelHandle, Metrics]:
    path = make_version(tmp_path, "m", 1, max_length=6)
    config = ServerConfig(
        repository=tmp_path,
        metrics_port=None,
        runtime=RuntimeConfig(device="cpu", intra_op_threads=1),
        batcher=BatcherConfig(**batcher),
    )
    metrics = Metrics(CollectorRegistry())
    metrics.init_model("m")
    return load_version_dir(path, config, metrics=metrics), metrics


class FailsOn:
    """A session that fails any run holding token id `bad` (as onnxruntime fails on an id beyond
    the embedding), or every run once `broken`; counts its runs."""

    def __init__(self, real: Any, bad: int) -> None:
        self._real, self.bad, self.broken, self.runs = real, bad, False, 0

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        self.runs += 1
        if self.broken or (input_ids == self.bad).any():
            raise RuntimeError("Gather: indices element out of data bounds")
        return np.asarray(self._real.run(input_ids, attention_mask))
