"""Training: split → tokenizer → fit (AdamW, warm-up + cosine, early stopping) → evaluate → run dir.

`train(TrainConfig(...)) -> Path` is the library function under `textserve train`. TrainConfig lives
in model/train_config.py (no torch there, so the CLI can read its defaults) and is re-exported here.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from textserve.model import calibration
from textserve.model import data as data_mod
from textserve.model.baseline import add_baseline, run_baseline
from textserve.model.checkpoint import CURVES_FILE, RELIABILITY_FILE, save_run
from textserve.model.classifier import ModelConfig, TransformerClassifier
from textserve.model.loop import Encoded as Encoded
from textserve.model.loop import build_optimizer as build_optimizer
from textserve.model.loop import collate as collate
from textserve.model.loop import evaluate as evaluate
from textserve.model.loop import fit as fit
from textserve.model.loop import load_splits as load_splits
from textserve.model.loop import log_summary as log_summary
from textserve.model.loop import make_batches as make_batches
from textserve.model.loop import metrics_of as metrics_of
from textserve.model.loop import predict as predict
from textserve.model.loop import resolve_device as resolve_device
from textserve.model.loop import run_settings as run_settings
from textserve.model.loop import warmup_cosine as warmup_cosine
from textserve.model.report import plot_curves, plot_reliability
from textserve.model.tokenizer import train_tokenizer
from textserve.model.train_config import TrainConfig, TrainConfigError
from textserve.tokenization import PAD_TOKEN_ID, encode_ids

logger = logging.getLogger(__name__)

__all__ = ["TrainConfig", "TrainConfigError", "train"]


def _check(cfg: TrainConfig) -> None:
    positive = {"epochs": cfg.epochs, "batch_size": cfg.batch_size, "patience": cfg.patience}
    for name, value in positive.items():
        if value < 1:
            raise TrainConfigError(f"{name} must be >= 1, got {value}")
    if cfg.learning_rate <= 0:
        raise TrainConfigError(f"lr must be > 0, got {cfg.learning_rate}")
    if not 0.0 <= cfg.label_smoothing < 1.0:
        raise TrainConfigError(f"label_smoothing must be in [0, 1), got {cfg.label_smoothing}")
    if not 0.0 <= cfg.warmup_fraction < 1.0:
        raise TrainConfigError(f"warmup_fraction must be in [0, 1), got {cfg.warmup_fraction}")


def output_directory(cfg: TrainConfig) -> Path:
    if cfg.output_dir is not None:
        out = Path(cfg.output_dir)
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise TrainConfigError(f"output directory {out} already exists and is not empty")
        return out
    stem = f"{time.strftime('%Y%m%d-%H%M%S')}-{cfg.preset}"
    out, n = Path(cfg.runs_dir) / stem, 1
    while out.exists():  # two runs in the same second
        n += 1
        out = Path(cfg.runs_dir) / f"{stem}-{n}"
    return out


def train(cfg: TrainConfig) -> Path:
    """Train, evaluate, and write a complete run directory; returns its path.

    With `cfg.init_from` (a Hugging Face model folder) it fine-tunes that model instead
    (model/finetune.py) and the run directory is a save_pretrained folder.
    """
    t_start = time.perf_counter()
    _check(cfg)
    device = resolve_device(cfg.device)
    out_dir = output_directory(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    if cfg.init_from is not None:
        from textserve.model.finetune import finetune

        return finetune(cfg, device, out_dir, t_start)

    splits, labels = load_splits(cfg)
    label_index = {name: i for i, name in enumerate(labels)}
    t_data = time.perf_counter()
    logger.info(
        "data: %s — train %d, validation %d, test %d; labels %s",
        splits.train.source, len(splits.train), len(splits.validation), len(splits.test),
        splits.train.label_counts(),
    )  # fmt: skip

    tokenizer, model_cfg, encoded = _tokenize(cfg, splits, labels, label_index)
    t_tok = time.perf_counter()

    model = TransformerClassifier(model_cfg).to(device)
    logger.info(
        "model: %s preset, %s parameters, vocabulary %d, max_length %d, device %s",
        cfg.preset, f"{model.num_parameters():,}", model_cfg.vocab_size, model_cfg.max_length,
        device,
    )  # fmt: skip
    optimizer = build_optimizer(model, cfg)
    # The optimizer trains the encoder alone; the bag (if any) is fitted after it, in closed form.
    encoder = EncoderOnly(model)
    history, best = fit(encoder, cfg, encoded, device, optimizer, model_cfg.num_labels)
    bag, val_logits, refit = _fit_bag_and_validate(model, cfg, encoded, tokenizer, device)
    val_metrics = metrics_of(val_logits, encoded["validation"], labels)
    temperature = _calibrate(model, cfg, val_logits, encoded["validation"])
    t_fit = time.perf_counter()

    test_logits = predict(model, encoded["test"][0], device)
    test_metrics = metrics_of(test_logits, encoded["test"], labels)
    baseline = run_baseline(cfg, splits, encoded, labels, refit=refit)
    majority = max(splits.test.label_counts().values()) / len(splits.test)
    timings = {
        "data_seconds": t_data - t_start,
        "tokenizer_seconds": t_tok - t_data,
        "train_seconds": t_fit - t_tok,
        "total_seconds": time.perf_counter() - t_start,
    }
    metrics = {
        "test_accuracy": test_metrics["accuracy"],
        "test_macro_f1": test_metrics["macro_f1"],
        "validation_accuracy": val_metrics["accuracy"],
        "validation_macro_f1": val_metrics["macro_f1"],
        "test_majority_baseline": majority,
        "validation": val_metrics,
        "test": test_metrics,
        "best_epoch": best,
        "epochs_run": len(history),
        "history": history,
        "num_parameters": model.num_parameters(),
        "device": str(device),
        "threads": torch.get_num_threads(),
        "timings": timings,
    }
    metrics.update(_extras(bag, temperature, encoder, (val_logits, test_logits), encoded, labels))
    add_baseline(metrics, baseline)
    _write_run(cfg, out_dir, model, labels, tokenizer, metrics, splits, history)
    log_summary(metrics, out_dir, t_start)
    return out_dir


class EncoderOnly(nn.Module):
    """The model without its bag: `model.encoder_logits` as a module, for the training loop."""

    def __init__(self, model: TransformerClassifier) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model.encoder_logits(input_ids, attention_mask)


def _extras(
    bag: dict[str, Any] | None,
    temperature: float | None,
    encoder: nn.Module,
    logits: tuple[torch.Tensor, torch.Tensor],
    encoded: dict[str, Encoded],
    labels: list[str],
) -> dict[str, Any]:
    """metrics.json's "bag" (with the encoder's own test figures) and "calibration", if any."""
    out: dict[str, Any] = {}
    if bag is not None:
        device = next(encoder.parameters()).device
        alone = evaluate(encoder, encoded["test"], labels, device)
        out["bag"] = {
            **bag,
            "encoder_test_accuracy": alone["accuracy"],
            "encoder_test_macro_f1": alone["macro_f1"],
        }
    if temperature is not None:
        val_logits, test_logits = logits
        out["calibration"] = calibration.summary(
            temperature, (val_logits, encoded["validation"][1]), test_logits, encoded["test"][1]
        )
    return out


def _fit_bag_and_validate(
    model: TransformerClassifier,
    cfg: TrainConfig,
    encoded: dict[str, Encoded],
    tokenizer: Any,
    device: torch.device,
) -> tuple[dict[str, Any] | None, torch.Tensor, bool]:
    """(the bag's summary or None, the validation logits, whether the bag was refitted).

    The bag is fitted on the training split, the validation logits are taken with it, then
    (cfg.bag_refit) it is fitted again on training + validation: the shipped model's bag has
    seen more data, its validation figures stay those of a model that had not seen them.
    """
    if not model.config.bag_buckets:
        return None, predict(model, encoded["validation"][0], device), False
    bag = _fit_bag(model, encoded, tokenizer, ("train",))
    val_logits = predict(model, encoded["validation"][0], device)
    if "error" in bag or not cfg.bag_refit or not encoded["validation"][0]:
        return bag, val_logits, False
    again = _fit_bag(model, encoded, tokenizer, ("train", "validation"))
    if "error" in again:  # the first fit's tables are still in place
        return bag, val_logits, False
    return {**again, "seconds": bag["seconds"] + again["seconds"]}, val_logits, True


def _calibrate(
    model: TransformerClassifier, cfg: TrainConfig, val_logits: torch.Tensor, validation: Encoded
) -> float | None:
    """Fit the temperature on the validation logits and fold it into `model`; None if not."""
    temperature = (
        calibration.choose_temperature(val_logits, validation[1]) if cfg.calibrate else None
    )
    if temperature is not None:
        calibration.fold_temperature(model, temperature)
    return temperature


def _fit_bag(
    model: TransformerClassifier,
    encoded: dict[str, Encoded],
    tokenizer: Any,
    on: tuple[str, ...],
) -> dict[str, Any]:
    """Fit the bag on the splits `on` (their rows together) and write it into `model`."""
    from textserve.model.bag import fit_bag

    vocab = [tokenizer.id_to_token(i) or "" for i in range(model.config.vocab_size)]
    rows = [row for name in on for row in encoded[name][0]]
    targets = [t for name in on for t in encoded[name][1].tolist()]
    try:
        bag = fit_bag(model, rows, targets, vocab)
    except ValueError as exc:  # e.g. one label only in a tiny training split
        # The bag's tables stay 0: the model's predictions are the encoder's.
        logger.warning("bag of n-grams skipped: %s", exc)
        return {"model": "skipped", "error": str(exc)}
    bag["fitted_on"] = " + ".join(on)
    logger.info("%s: fitted on %s in %.1fs", bag["model"], bag["fitted_on"], bag["seconds"])
    return bag


def _tokenize(
    cfg: TrainConfig, splits: data_mod.Splits, labels: list[str], label_index: dict[str, int]
) -> tuple[Any, ModelConfig, dict[str, Encoded]]:
    """Train the tokenizer on the training texts, size the model to it, encode every split."""
    preset = ModelConfig.preset(cfg.preset)
    vocab_size = cfg.vocab_size or preset.vocab_size
    tokenizer = train_tokenizer(splits.train.texts, vocab_size, lowercase=cfg.lowercase)
    try:
        model_cfg = ModelConfig.preset(
            cfg.preset,
            **{
                "vocab_size": tokenizer.get_vocab_size(),
                "num_labels": len(labels),
                "pad_token_id": PAD_TOKEN_ID,
                **cfg.model_overrides,
            },
        )
    except (TypeError, ValueError) as exc:
        raise TrainConfigError(f"invalid model options: {exc}") from None
    encoded = {
        name: (
            encode_ids(tokenizer, split.texts, model_cfg.max_length),
            torch.tensor([label_index[y] for y in split.labels], dtype=torch.long),
        )
        for name, split in (
            ("train", splits.train), ("validation", splits.validation), ("test", splits.test),
        )
    }  # fmt: skip
    return tokenizer, model_cfg, encoded


def _write_run(
    cfg: TrainConfig,
    out_dir: Path,
    model: TransformerClassifier,
    labels: list[str],
    tokenizer: Any,
    metrics: dict[str, Any],
    splits: data_mod.Splits,
    history: Any,
) -> None:
    """Write the run directory: complete or absent."""
    data_info = {
        "source": splits.train.source if cfg.data is None else str(cfg.data),
        "text_column": cfg.text_column,
        "label_column": cfg.label_column,
        "sizes": {"train": len(splits.train), "validation": len(splits.validation),
                  "test": len(splits.test)},
    }  # fmt: skip
    train_info = run_settings(cfg)

    # Written to a hidden sibling and renamed: a run directory is either complete or absent.
    tmp = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        save_run(
            tmp, model=model, labels=labels, tokenizer=tokenizer, metrics=metrics,
            test_texts=splits.test.texts, test_labels=splits.test.labels,
            data_info=data_info, train_info=train_info,
        )  # fmt: skip
        plot_curves(history, tmp / CURVES_FILE, title=f"textserve {cfg.preset}: {out_dir.name}")
        if "calibration" in metrics:
            plot_reliability(metrics["calibration"], tmp / RELIABILITY_FILE)
        if out_dir.exists():
            out_dir.rmdir()  # checked empty above
        tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
