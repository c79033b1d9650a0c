"""`textserve train --init-from DIR`: fine-tune a pretrained Hugging Face encoder on labelled text.

DIR is a `save_pretrained` folder (config.json, weights, tokenizer.json) or, on a machine whose
`transformers` can fetch it, a model id. The model is AutoModelForSequenceClassification with a
new head for the data's labels; training is train.py's loop (same splits, early stopping,
metrics, curves, baseline) with layer-wise learning-rate decay. The run directory is itself a
save_pretrained folder, so transformers and `textserve export` read it as any other
(docs/training.md, "Fine-tuning a pretrained model"):

    config.json (id2label/label2id), model.safetensors, tokenizer.json, tokenizer_config.json
    (model_max_length: the max_length trained with), special_tokens_map.json   — transformers'
    metrics.json, test.jsonl, training_curves.png, textserve_run.json  — textserve's
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from textserve.model import calibration
from textserve.model import loop as train_mod
from textserve.model.baseline import add_baseline, run_baseline
from textserve.model.checkpoint import CURVES_FILE, METRICS_FILE, RELIABILITY_FILE, TEST_FILE
from textserve.model.report import plot_curves, plot_reliability
from textserve.model.train_config import TrainConfig, TrainConfigError
from textserve.tokenization import Tokenization

logger = logging.getLogger(__name__)

RUN_INFO_FILE = "textserve_run.json"  # the data and training settings (our config.json's part)
DEFAULT_MAX_LENGTH = 128  # tokens, when --max-length is not given (capped by the model's limit)
# Position tables of these models start after the padding index: 2 rows fewer are usable.
_OFFSET_POSITIONS = ("roberta", "xlm-roberta", "camembert", "data2vec-text", "xmod", "longformer")
_LAYER_NUMBER = re.compile(r"\.(?:layer|layers|block|blocks)\.(\d+)\.")


class Pretrained(nn.Module):
    """The Hugging Face model as train.py's loop sees it: (input_ids, attention_mask) -> logits."""

    def __init__(self, hf_model: nn.Module) -> None:
        super().__init__()
        self.hf = hf_model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.hf(input_ids=input_ids, attention_mask=attention_mask).logits  # (B, L)


def load_source(init_from: str) -> tuple[Any, Any]:
    """(config, fast tokenizer) of the model to fine-tune; TrainConfigError if it is not one."""
    from transformers import AutoConfig, AutoTokenizer
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
    )

    path = Path(init_from)
    local = path.exists() or init_from.startswith((".", "/", "~")) or init_from.count("/") > 1
    if local and not path.is_dir():
        raise TrainConfigError(f"--init-from {init_from}: no such model folder")
    if local and not (path / "config.json").is_file():
        raise TrainConfigError(
            f"--init-from {init_from} is not a Hugging Face model folder (no config.json); "
            "give a folder written by save_pretrained"
        )
    try:
        config = AutoConfig.from_pretrained(init_from)
    except (OSError, ValueError, KeyError) as exc:
        raise TrainConfigError(
            f"--init-from {init_from} is not a usable model: {_first_line(exc)}"
        ) from None
    model_type = getattr(config, "model_type", None)
    if model_type not in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES:
        raise TrainConfigError(
            f"--init-from {init_from}: a {type(config).__name__} (model_type {model_type!r}) has "
            "no sequence-classification head in transformers; use a text encoder such as BERT, "
            "RoBERTa, DistilBERT, ELECTRA or DeBERTa"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(init_from)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TrainConfigError(
            f"--init-from {init_from}: cannot load its tokenizer: {_first_line(exc)}"
        ) from None
    if not getattr(tokenizer, "is_fast", False):
        raise TrainConfigError(
            f"--init-from {init_from}: its tokenizer has no tokenizer.json (a fast tokenizer); "
            "textserve serves the tokenizers file"
        )
    return config, tokenizer


def _first_line(exc: BaseException) -> str:
    """An exception as one line (transformers' messages run over several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def max_length_for(cfg: TrainConfig, config: Any, tokenizer: Any) -> int:
    """--max-length, else DEFAULT_MAX_LENGTH, never more than the model's positions allow."""
    limit = getattr(config, "max_position_embeddings", None) or 10**9
    if getattr(config, "model_type", None) in _OFFSET_POSITIONS:
        limit -= 2
    tokenizer_limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(tokenizer_limit, int) and 0 < tokenizer_limit < 10**6:
        limit = min(limit, tokenizer_limit)
    wanted = int(cfg.model_overrides.get("max_length", DEFAULT_MAX_LENGTH))
    if wanted > limit:
        raise TrainConfigError(f"--max-length {wanted} is more than this model's {limit} positions")
    return min(wanted, limit)


def encode(tokenizer: Any, texts: list[str], max_length: int) -> list[list[int]]:
    """Token ids as serving makes them: THE tokenization (textserve.tokenization) on the model's
    tokenizer.json, special tokens kept on truncation, as transformers' truncation=True does."""
    from tokenizers import Tokenizer

    # A copy: Tokenization clears the file's padding and truncation settings in place.
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    unk = tokenizer.unk_token_id
    return Tokenization(backend, max_length, tokenizer.pad_token_id, unk_token_id=unk).encode(texts)


def layerwise_groups(
    model: nn.Module, lr: float, decay: float, weight_decay: float
) -> list[dict[str, Any]]:
    """AdamW groups with layer-wise learning-rate decay (ELECTRA, BEiT): the head and pooler get
    `lr`, encoder layer i of n gets lr·decay^(n-i), the embeddings lr·decay^(n+1); biases and
    norms are not decayed."""
    depth_of: dict[str, int] = {}
    for name, _ in model.named_parameters():
        match = _LAYER_NUMBER.search(name)
        depth_of[name] = int(match.group(1)) + 1 if match else (0 if "embed" in name else -1)
    n = max([d for d in depth_of.values()] + [0])
    groups: dict[tuple[int, bool], dict[str, Any]] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        depth = depth_of[name]
        scale = 1.0 if depth < 0 else decay ** (n + 1 - depth)
        decays = param.ndim >= 2 and "norm" not in name.lower()
        group = groups.setdefault(
            (depth, decays),
            {"params": [], "lr": lr * scale, "weight_decay": weight_decay if decays else 0.0},
        )
        group["params"].append(param)
    return list(groups.values())


def finetune(cfg: TrainConfig, device: torch.device, out_dir: Path, t_start: float) -> Path:
    """train()'s fine-tuning branch: seeds are set and out_dir checked by the caller."""
    from transformers import AutoModelForSequenceClassification

    assert cfg.init_from is not None
    if not 0.0 < cfg.layer_decay <= 1.0:
        raise TrainConfigError(f"layer_decay must be in (0, 1], got {cfg.layer_decay}")
    source, tokenizer = load_source(cfg.init_from)
    splits, labels = train_mod.load_splits(cfg)
    index = {name: i for i, name in enumerate(labels)}
    max_length = max_length_for(cfg, source, tokenizer)
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        raise TrainConfigError(f"--init-from {cfg.init_from}: its tokenizer has no padding token")
    t_data = time.perf_counter()
    encoded = _encode_splits(tokenizer, splits, index, max_length)
    t_tok = time.perf_counter()
    # A new head for these labels (the seed set by train() makes its initialisation repeatable);
    # ignore_mismatched_sizes: a folder that already had a head for other labels.
    hf_model = AutoModelForSequenceClassification.from_pretrained(
        cfg.init_from,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id=index,
        ignore_mismatched_sizes=True,
    )
    model = Pretrained(hf_model).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    logger.info(
        "model: %s from %s, %s parameters, max_length %d, device %s",
        type(hf_model).__name__, cfg.init_from, f"{n_params:,}", max_length, device,
    )  # fmt: skip
    groups = layerwise_groups(model, cfg.learning_rate, cfg.layer_decay, cfg.weight_decay)
    optimizer = torch.optim.AdamW(groups, lr=cfg.learning_rate)
    history, best = train_mod.fit(
        model, cfg, encoded, device, optimizer, len(labels), pad_token_id=pad_id
    )
    val_logits = train_mod.predict(model, encoded["validation"][0], device, pad_token_id=pad_id)
    val = train_mod.metrics_of(val_logits, encoded["validation"], labels)
    temperature = _calibrate(model, cfg, val_logits, encoded["validation"], device, pad_id)
    t_fit = time.perf_counter()
    test_logits = train_mod.predict(model, encoded["test"][0], device, pad_token_id=pad_id)
    test = train_mod.metrics_of(test_logits, encoded["test"], labels)
    metrics = {
        "test_accuracy": test["accuracy"],
        "test_macro_f1": test["macro_f1"],
        "validation_accuracy": val["accuracy"],
        "validation_macro_f1": val["macro_f1"],
        "test_majority_baseline": max(splits.test.label_counts().values()) / len(splits.test),
        "validation": val,
        "test": test,
        "best_epoch": best,
        "epochs_run": len(history),
        "history": history,
        "num_parameters": n_params,
        "init_from": cfg.init_from,
        "architecture": type(hf_model).__name__,
        "max_length": max_length,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "timings": {
            "data_seconds": t_data - t_start,
            "tokenizer_seconds": t_tok - t_data,
            "train_seconds": t_fit - t_tok,
            "total_seconds": time.perf_counter() - t_start,
        },
    }
    if temperature is not None:
        metrics["calibration"] = calibration.summary(
            temperature, (val_logits, encoded["validation"][1]), test_logits, encoded["test"][1]
        )
    add_baseline(metrics, run_baseline(cfg, splits, encoded, labels))
    run_info = _run_info(cfg, labels, max_length, splits)
    _save(out_dir, hf_model, tokenizer, max_length, metrics, run_info, splits.test)
    train_mod.log_summary(metrics, out_dir, t_start)
    return out_dir


def _encode_splits(
    tokenizer: Any, splits: Any, index: dict[str, int], max_length: int
) -> dict[str, train_mod.Encoded]:
    """Each split's token ids (the model's own tokenizer) and label indices."""
    return {
        name: (
            encode(tokenizer, split.texts, max_length),
            torch.tensor([index[y] for y in split.labels], dtype=torch.long),
        )
        for name, split in (
            ("train", splits.train), ("validation", splits.validation), ("test", splits.test),
        )
    }  # fmt: skip


def _calibrate(
    model: Pretrained,
    cfg: TrainConfig,
    val_logits: torch.Tensor,
    validation: train_mod.Encoded,
    device: torch.device,
    pad_id: int,
) -> float | None:
    """Temperature scaling folded into the classifier's output layer, checked on validation."""
    temperature = (
        calibration.choose_temperature(val_logits, validation[1]) if cfg.calibrate else None
    )
    if temperature is None:
        return None
    head = calibration.output_layer(model.hf, val_logits.shape[1])
    if head is not None:
        saved = copy.deepcopy(head.state_dict())
        calibration.scale_layer(head, 1.0 / temperature)
        # The layer found must be the last operation: the logits are now exactly divided by T.
        check = train_mod.predict(model, validation[0][:64], device, pad_token_id=pad_id)
        if torch.allclose(check, val_logits[:64] / temperature, rtol=1e-2, atol=1e-3):
            return temperature
        head.load_state_dict(saved)  # not the last operation: leave the model as it was
    logger.warning(
        "scores not calibrated: no output layer of %s divides its logits by the temperature",
        type(model.hf).__name__,
    )
    return None


def _run_info(cfg: TrainConfig, labels: list[str], max_length: int, splits: Any) -> dict[str, Any]:
    """The run's config.json: where the model came from, its labels, data and settings."""
    return {
        "kind": "huggingface",
        "init_from": cfg.init_from,
        "labels": labels,
        "max_length": max_length,
        "data": {"source": splits.train.source if cfg.data is None else str(cfg.data),
                 "sizes": {"train": len(splits.train), "validation": len(splits.validation),
                           "test": len(splits.test)}},
        "train": train_mod.run_settings(cfg),
    }  # fmt: skip


def _save(
    out_dir: Path,
    hf_model: Any,
    tokenizer: Any,
    max_length: int,
    metrics: dict[str, Any],
    run_info: dict[str, Any],
    test: Any,
) -> None:
    """Write the run as a save_pretrained folder plus textserve's files, atomically (rename)."""
    tmp = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        hf_model.to("cpu").save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.model_max_length = max_length  # the exporter and the server's max_length
        tokenizer.save_pretrained(str(tmp))
        # No labels.json: `textserve export` takes a folder with one for a from-scratch run; the
        # labels are config.json's id2label (and textserve_run.json's "labels").
        for name, data in ((METRICS_FILE, metrics), (RUN_INFO_FILE, run_info)):
            (tmp / name).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        with open(tmp / TEST_FILE, "w", encoding="utf-8") as fh:
            for text, label in zip(test.texts, test.labels, strict=True):
                fh.write(json.dumps({"text": text, "label": label}, ensure_ascii=False) + "\n")
        plot_curves(metrics["history"], tmp / CURVES_FILE, title=f"textserve fine-tune: {out_dir}")
        if "calibration" in metrics:
            plot_reliability(metrics["calibration"], tmp / RELIABILITY_FILE)
        if out_dir.exists():
            out_dir.rmdir()  # checked empty by train()
        tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
