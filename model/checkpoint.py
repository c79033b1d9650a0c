"""The run directory (runs/<run-id>/): write it after training, read it back for export and checks.

Files (docs/architecture.md): model.safetensors, config.json, tokenizer.json, labels.json,
metrics.json, test.jsonl, training_curves.png. Weights are safetensors, never pickle.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from textserve.model.classifier import ModelConfig, TransformerClassifier
from textserve.tokenization import PAD_TOKEN

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
LABELS_FILE = "labels.json"
METRICS_FILE = "metrics.json"
TEST_FILE = "test.jsonl"
CURVES_FILE = "training_curves.png"
RELIABILITY_FILE = "calibration.png"  # the test split's reliability diagram, when calibrated
# What load_run needs; the PNG is for people and may be missing.
REQUIRED_FILES = (WEIGHTS_FILE, CONFIG_FILE, TOKENIZER_FILE, LABELS_FILE, METRICS_FILE, TEST_FILE)


class CheckpointError(ValueError):
    """A run directory that is missing, incomplete, unreadable or inconsistent."""


@dataclass
class Run:
    """A loaded run: the model in eval mode on CPU (or `device`) and everything around it."""

    run_dir: Path
    model: TransformerClassifier
    config: ModelConfig
    labels: list[str]
    tokenizer: Tokenizer
    tokenizer_path: Path
    weights_path: Path
    test_texts: list[str]
    test_labels: list[int]  # indices into `labels`
    metrics: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # config.json's "data" and "train"

    @property
    def max_length(self) -> int:
        return self.config.max_length

    @property
    def pad_token_id(self) -> int:
        return self.config.pad_token_id


def save_run(
    run_dir: str | Path,
    *,
    model: TransformerClassifier,
    labels: list[str],
    tokenizer: Tokenizer,
    metrics: dict[str, Any],
    test_texts: list[str],
    test_labels: list[str],
    data_info: dict[str, Any] | None = None,
    train_info: dict[str, Any] | None = None,
) -> Path:
    """Write every file of the contract except the PNG into `run_dir` (created if needed)."""
    run_dir = Path(run_dir)
    if len(labels) != model.config.num_labels:
        raise ValueError(f"{len(labels)} labels for a model with {model.config.num_labels} outputs")
    run_dir.mkdir(parents=True, exist_ok=True)
    # contiguous + cpu: safetensors refuses views, and the file must load without a GPU.
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(run_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    config = {
        "model": model.config.to_dict(),
        "labels": list(labels),
        "data": data_info or {},
        "train": train_info or {},
    }
    _write_json(run_dir / CONFIG_FILE, config)
    _write_json(run_dir / LABELS_FILE, list(labels))
    _write_json(run_dir / METRICS_FILE, metrics)
    tokenizer.save(str(run_dir / TOKENIZER_FILE))
    with open(run_dir / TEST_FILE, "w", encoding="utf-8") as fh:
        for text, label in zip(test_texts, test_labels, strict=True):
            fh.write(json.dumps({"text": text, "label": label}, ensure_ascii=False) + "\n")
    return run_dir


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is unreadable: {exc}") from None


def load_run(run_dir: str | Path, device: str | torch.device = "cpu") -> Run:
    """Read and cross-check a run directory; the model comes back in eval mode.

    >>> run = load_run("runs/20250101-120000-small")  # doctest: +SKIP
    >>> run.labels, run.max_length  # doctest: +SKIP
    (['fresh', 'rotten'], 64)
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"run directory {run_dir} does not exist")
    missing = [name for name in REQUIRED_FILES if not (run_dir / name).is_file()]
    if missing:
        raise CheckpointError(
            f"run directory {run_dir} is incomplete: missing {', '.join(missing)}"
        )
    raw = _read_json(run_dir / CONFIG_FILE)
    if not isinstance(raw, dict) or not isinstance(raw.get("model"), dict):
        raise CheckpointError(f'{run_dir / CONFIG_FILE} has no "model" object')
    try:
        config = ModelConfig.from_dict(raw["model"])
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{run_dir / CONFIG_FILE}: invalid model config: {exc}") from None
    labels = _check_labels(run_dir, raw, config)
    tokenizer_path = run_dir / TOKENIZER_FILE
    tokenizer = _load_tokenizer(tokenizer_path, config)
    weights_path = run_dir / WEIGHTS_FILE
    model = _load_model(weights_path, config, device)
    test_texts, test_labels = _load_test(run_dir / TEST_FILE, labels)
    metrics = _read_json(run_dir / METRICS_FILE)
    return Run(
        run_dir=run_dir,
        model=model,
        config=config,
        labels=labels,
        tokenizer=tokenizer,
        tokenizer_path=tokenizer_path,
        weights_path=weights_path,
        test_texts=test_texts,
        test_labels=test_labels,
        metrics=metrics if isinstance(metrics, dict) else {},
        extra={k: raw.get(k, {}) for k in ("data", "train")},
    )


def _check_labels(run_dir: Path, raw: dict[str, Any], config: ModelConfig) -> list[str]:
    labels = _read_json(run_dir / LABELS_FILE)
    if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
        raise CheckpointError(f"{run_dir / LABELS_FILE} is not a JSON list of label names")
    if len(set(labels)) != len(labels):
        raise CheckpointError(f"{run_dir / LABELS_FILE} repeats a label: {labels}")
    if len(labels) != config.num_labels:
        raise CheckpointError(
            f"{run_dir / LABELS_FILE} has {len(labels)} labels but config.json says "
            f"num_labels={config.num_labels}"
        )
    if "labels" in raw and raw["labels"] != labels:
        raise CheckpointError(
            f"{run_dir / LABELS_FILE} ({labels}) does not match config.json ({raw['labels']})"
        )
    return labels


def _load_tokenizer(path: Path, config: ModelConfig) -> Tokenizer:
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception on a malformed file
        raise CheckpointError(f"{path} is not a tokenizers file: {exc}") from None
    if tokenizer.get_vocab_size() > config.vocab_size:
        raise CheckpointError(
            f"{path} has {tokenizer.get_vocab_size()} tokens but the model embeds only "
            f"vocab_size={config.vocab_size}"
        )
    pad = tokenizer.token_to_id(PAD_TOKEN)
    if pad != config.pad_token_id:
        raise CheckpointError(
            f"{path}: {PAD_TOKEN} has id {pad} but config.json says pad_token_id="
            f"{config.pad_token_id}"
        )
    return tokenizer


def _load_model(
    path: Path, config: ModelConfig, device: str | torch.device
) -> TransformerClassifier:
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is not a readable safetensors file: {exc}") from None
    model = TransformerClassifier(config)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{path} does not match config.json: "
            + "; ".join(
                part
                for part in (
                    f"missing {', '.join(missing)}" if missing else "",
                    f"unexpected {', '.join(unexpected)}" if unexpected else "",
                )
                if part
            )
        )
    for name, tensor in expected.items():
        if state[name].shape != tensor.shape:
            raise CheckpointError(
                f"{path} does not match config.json: {name} has shape "
                f"{tuple(state[name].shape)}, the config needs {tuple(tensor.shape)}"
            )
    model.load_state_dict(state)
    return model.to(device).eval()


def _load_test(path: Path, labels: list[str]) -> tuple[list[str], list[int]]:
    index = {name: i for i, name in enumerate(labels)}
    texts: list[str] = []
    targets: list[int] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                text, label = row["text"], row["label"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise CheckpointError(
                    f'{path}, line {lineno}: expected {{"text": ..., "label": ...}}'
                ) from None
            if label not in index:
                raise CheckpointError(f"{path}, line {lineno}: unknown label {label!r}")
            texts.append(str(text))
            targets.append(index[label])
    if not texts:
        raise CheckpointError(f"{path} is empty")
    return texts, targets
