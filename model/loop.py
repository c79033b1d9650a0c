"""The steps a training run is made of, shared by runs from scratch (train.py) and fine-tuned
ones (finetune.py): the device, the splits, batches, the optimizer and its schedule, the fit
loop with early stopping, prediction, evaluation and the run's summary.

Kept apart from train.py so that finetune.py uses them without importing train.py, which
dispatches to it (the import graph has no circle).
"""

from __future__ import annotations

import copy
import logging
import math
import random
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from tqdm import tqdm

from textserve.model import data as data_mod
from textserve.model.report import classification_metrics
from textserve.model.train_config import TrainConfig, TrainConfigError
from textserve.tokenization import PAD_TOKEN_ID, pad

logger = logging.getLogger("textserve.model.train")  # the run's log: one logger for a run

# A split as the model takes it: each text's token ids, and the label indices.
Encoded = tuple[list[list[int]], torch.Tensor]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise TrainConfigError("--device cuda was asked for but no CUDA device is available")
    if name not in ("cpu", "cuda"):
        raise TrainConfigError(f"unknown device {name!r}; use auto, cpu or cuda")
    return torch.device(name)


def load_splits(cfg: TrainConfig) -> tuple[data_mod.Splits, list[str]]:
    """The train/validation/test splits and the label names (logit order)."""
    if cfg.data is None:
        full = data_mod.load_default(cfg.cache_dir)
    else:
        full = data_mod.load_labelled(cfg.data, cfg.text_column, cfg.label_column)
    labels = data_mod.require_labels(full)

    def given(path: Path | None) -> data_mod.LabelledData | None:
        return (
            None
            if path is None
            else data_mod.load_labelled(path, cfg.text_column, cfg.label_column)
        )

    val, test = given(cfg.validation_data), given(cfg.test_data)
    if val is not None and test is not None:
        splits = data_mod.Splits(full, val, test)
    else:
        # Split off only the parts that were not given as files.
        part = data_mod.stratified_split(
            full,
            cfg.validation_fraction if val is None else 0.0,
            cfg.test_fraction if test is None else 0.0,
            cfg.seed,
        )
        splits = data_mod.Splits(
            part.train,
            val if val is not None else part.validation,
            test if test is not None else part.test,
        )
    for split in (splits.validation, splits.test):
        unknown = sorted(set(split.labels) - set(labels))
        if unknown:
            raise data_mod.DataError(
                f"{split.source} has label(s) not in the training data: {unknown}"
            )
    return splits, labels


def make_batches(lengths: list[int], batch_size: int, rng: random.Random | None) -> list[list[int]]:
    """Index batches of similar length (less padding); shuffled when `rng` is given."""
    order = list(range(len(lengths)))
    if rng is None:
        order.sort(key=lambda i: lengths[i])
        return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    rng.shuffle(order)
    # Sort within windows of 50 batches: padding drops a lot, batches stay random.
    window = batch_size * 50
    batches: list[list[int]] = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start : start + window], key=lambda i: lengths[i])
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches


def collate(
    rows: list[list[int]], device: torch.device, pad_token_id: int = PAD_TOKEN_ID
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of encoded rows padded by the contract (textserve.tokenization.pad)."""
    ids, mask = pad(rows, pad_token_id)
    return torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device)


def predict(
    model: nn.Module,
    ids: list[list[int]],
    device: torch.device,
    batch_size: int = 256,
    pad_token_id: int = PAD_TOKEN_ID,
) -> torch.Tensor:
    """Logits (N, num_labels) on CPU, in the order of `ids`."""
    model.eval()
    out = torch.empty(len(ids), 0)
    with torch.inference_mode(), _autocast(device):
        for batch in make_batches([len(r) for r in ids], batch_size, None):
            rows = [ids[i] for i in batch]
            logits = model(*collate(rows, device, pad_token_id)).float().cpu()
            if out.shape[1] == 0:
                out = torch.empty(len(ids), logits.shape[1])
            out[batch] = logits  # back in input order: batches are sorted by length
    return out


def _autocast(device: torch.device) -> torch.autocast:
    # bf16 on CUDA: no loss scaling needed (fp32's exponent range); CPU stays fp32.
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    # Decay only matrices: decaying LayerNorm gains and biases pulls them to 0 for no benefit.
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=(0.9, 0.98), eps=1e-9)


def warmup_cosine(step: int, warmup: int, total: int) -> float:
    """LR multiplier: linear 0→1 over `warmup` steps, then cosine 1→0 at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def metrics_of(logits: torch.Tensor, split: Encoded, labels: list[str]) -> dict[str, Any]:
    """classification_metrics of the logits' argmax against the split's targets."""
    return classification_metrics(split[1].numpy(), logits.argmax(dim=1).numpy(), labels)


def run_settings(cfg: TrainConfig) -> dict[str, Any]:
    """The TrainConfig as JSON (config.json's "train"), with the learning rate actually used."""
    info = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}
    info["lr"] = cfg.learning_rate
    return info


def log_summary(metrics: dict[str, Any], out_dir: Path, t_start: float) -> None:
    """The run's last lines: its test figures beside the baseline's, then any warning."""
    baseline = metrics.get("baseline")
    versus = (
        ""
        if not baseline or baseline["accuracy"] is None
        else f" — linear baseline {baseline['accuracy']:.4f}, macro-F1 {baseline['macro_f1']:.4f}"
    )
    logger.info(
        "test accuracy %.4f, macro-F1 %.4f%s (majority class %.4f); %.1fs in all; run: %s",
        metrics["test_accuracy"], metrics["test_macro_f1"], versus,
        metrics["test_majority_baseline"], time.perf_counter() - t_start, out_dir,
    )  # fmt: skip
    for warning in metrics.get("warnings", []):
        logger.warning("%s", warning)


def evaluate(
    model: nn.Module,
    split: Encoded,
    labels: list[str],
    device: torch.device,
    pad_token_id: int = PAD_TOKEN_ID,
) -> dict[str, Any]:
    return metrics_of(predict(model, split[0], device, pad_token_id=pad_token_id), split, labels)


def fit(
    model: nn.Module,
    cfg: TrainConfig,
    encoded: dict[str, Encoded],
    device: torch.device,
    optimizer: torch.optim.Optimizer,
    num_labels: int,
    pad_token_id: int = PAD_TOKEN_ID,
) -> tuple[list[dict[str, float]], int]:
    """The training loop; leaves the best (validation accuracy) weights in `model`.

    `model(input_ids, attention_mask) -> logits`; the learning rates are the optimizer's groups'
    (warm-up and cosine decay scale each of them).
    """
    train_ids, train_y = encoded["train"]
    val_ids, val_y = encoded["validation"]
    lengths = [len(r) for r in train_ids]
    rng = random.Random(cfg.seed)
    steps_per_epoch = math.ceil(len(train_ids) / cfg.batch_size)
    total = steps_per_epoch * cfg.epochs
    warmup = max(1, int(cfg.warmup_fraction * total))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine(step, warmup, total)
    )
    history: list[dict[str, float]] = []
    best_acc, best_epoch, best_state = -1.0, 0, copy.deepcopy(model.state_dict())
    for epoch in range(1, cfg.epochs + 1):
        t0 = time.perf_counter()
        model.train()
        total_loss, seen = 0.0, 0
        bar = tqdm(
            make_batches(lengths, cfg.batch_size, rng),
            desc=f"epoch {epoch}/{cfg.epochs}", unit="batch", leave=False,
            disable=not cfg.progress, mininterval=0.5,
        )  # fmt: skip
        for batch in bar:
            ids, mask = collate([train_ids[i] for i in batch], device, pad_token_id)
            target = train_y[batch].to(device)
            with _autocast(device):
                logits = model(ids, mask)
            loss = F.cross_entropy(logits.float(), target, label_smoothing=cfg.label_smoothing)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip > 0:
                nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            scheduler.step()
            total_loss += loss.item() * len(batch)
            seen += len(batch)
            bar.set_postfix(loss=f"{total_loss / seen:.4f}", refresh=False)
        bar.close()
        val_logits = predict(model, val_ids, device, pad_token_id=pad_token_id)
        val_loss = F.cross_entropy(val_logits, val_y, label_smoothing=cfg.label_smoothing).item()
        val_labels = [str(i) for i in range(num_labels)]
        val = classification_metrics(val_y.numpy(), val_logits.argmax(dim=1).numpy(), val_labels)
        record = {
            "epoch": epoch,
            "train_loss": total_loss / max(1, seen),
            "val_loss": val_loss,
            "val_accuracy": val["accuracy"],
            "val_macro_f1": val["macro_f1"],
            "lr": optimizer.param_groups[0]["lr"],
            "seconds": time.perf_counter() - t0,
        }
        history.append(record)
        improved = val["accuracy"] > best_acc
        if improved:
            best_acc, best_epoch = val["accuracy"], epoch
            best_state = copy.deepcopy(model.state_dict())
        logger.info(
            "epoch %d/%d: train loss %.4f, val loss %.4f, val acc %.4f, val macro-F1 %.4f, "
            "lr %.2e, %.1fs%s",
            epoch, cfg.epochs, record["train_loss"], val_loss, val["accuracy"], val["macro_f1"],
            record["lr"], record["seconds"], " *" if improved else "",
        )  # fmt: skip
        if epoch - best_epoch >= cfg.patience:
            logger.info("early stop: no better validation accuracy for %d epochs", cfg.patience)
            break
    model.load_state_dict(best_state)
    return history, best_epoch
