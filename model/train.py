"""Training: split → tokenizer → fit (AdamW, warm-up + cosine, early stopping) → evaluate → run dir.

`train(TrainConfig(...)) -> Path` is the library function under `textserve train`. TrainConfig lives
in model/train_config.py (no torch there, so the CLI can read its defaults) and is re-exported here.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import random
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from tqdm import tqdm

from textserve.model import calibration
from textserve.model import data as data_mod
from textserve.model.baseline import add_baseline, run_baseline
from textserve.model.checkpoint import CURVES_FILE, RELIABILITY_FILE, save_run
from textserve.model.classifier import ModelConfig, TransformerClassifier
from textserve.model.report import classification_metrics, plot_curves, plot_reliability
from textserve.model.tokenizer import train_tokenizer
from textserve.model.train_config import TrainConfig, TrainConfigError
from textserve.tokenization import PAD_TOKEN_ID, encode_ids, pad

logger = logging.getLogger(__name__)

__all__ = ["TrainConfig", "TrainConfigError", "train"]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise TrainConfigError("--device cuda was asked for but no CUDA device is available")
    if name not in ("cpu", "cuda"):
        raise TrainConfigError(f"unknown device {name!r}; use auto, cpu or cuda")
    return torch.device(name)


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


def metrics_of(logits: torch.Tensor, split: Encoded, labels: list[str]) -> dict[str, Any]:
    """classification_metrics of the logits' argmax against the split's targets."""
    return classification_metrics(split[1].numpy(), logits.argmax(dim=1).numpy(), labels)


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


Encoded = tuple[list[list[int]], torch.Tensor]


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
