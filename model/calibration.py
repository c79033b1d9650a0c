"""Temperature scaling: the scores a from-scratch model serves, calibrated on validation.

A classifier trained with cross-entropy (and a bag fitted by logistic regression beside it) is
over-confident on texts it has not seen: on the default split the model said 0.91 on average
where it is right 0.80 of the time. One scalar T, fitted on the validation split's logits by
minimising their negative log-likelihood (Guo et al., 2017, "On Calibration of Modern Neural
Networks"), divides the logits: argmax, hence accuracy, is unchanged; the probabilities are
closer to the accuracy they claim. T is folded into the weights (the head and the bag's tables
scaled by 1/T; for a fine-tuned Hugging Face model, its classifier's output layer), so the
exported graph and serving change nothing.

    >>> t = fit_temperature(validation_logits, validation_targets)  # doctest: +SKIP
    >>> fold_temperature(model, t)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from textserve.model.classifier import TransformerClassifier

logger = logging.getLogger("textserve.model.train")  # the run's log: one logger for a run

MIN_TEXTS = 100  # below this many validation texts, T would be fitted to noise: not calibrated
T_RANGE = (0.05, 20.0)  # a fitted T outside this is clamped (separable or degenerate logits)
ECE_BINS = 15


def choose_temperature(logits: torch.Tensor, targets: torch.Tensor) -> float | None:
    """T fitted on the validation split's logits, logged; None (and a warning) if too few."""
    if len(targets) < MIN_TEXTS:
        logger.warning(
            "scores not calibrated: %d validation texts, fewer than %d", len(targets), MIN_TEXTS
        )
        return None
    temperature = fit_temperature(logits, targets)
    if not np.isfinite(temperature):  # logits with NaN or inf in them: nothing to fit
        logger.warning("scores not calibrated: the validation logits are not all finite")
        return None
    before = calibration_figures(logits, targets)
    after = calibration_figures(logits / temperature, targets)
    logger.info(
        "calibration: temperature %.3f fitted on validation (NLL %.4f -> %.4f, ECE %.4f -> %.4f)",
        temperature, before["nll"], after["nll"], before["ece"], after["ece"],
    )  # fmt: skip
    return temperature


def fit_temperature(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """The T > 0 that minimises mean cross-entropy(logits / T, targets); deterministic."""
    log_t = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    z, y = logits.detach().to(torch.float64), targets.long()
    optimizer = torch.optim.LBFGS([log_t], lr=0.5, max_iter=100, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(z / log_t.exp(), y)
        loss.backward()
        return loss

    optimizer.step(closure)
    low, high = T_RANGE
    return float(np.clip(log_t.exp().item(), low, high))


def reliability(logits: torch.Tensor, targets: torch.Tensor) -> list[dict[str, float]]:
    """The reliability diagram's bins: 15 equal confidence ranges, each with its texts' count,
    mean confidence (the top label's probability) and accuracy; empty bins are left out."""
    z = logits.detach().to(torch.float64)
    confidence, predicted = F.softmax(z, dim=1).max(dim=1)
    right = (predicted == targets).to(torch.float64)
    bins = torch.clamp((confidence * ECE_BINS).ceil().long() - 1, 0, ECE_BINS - 1)
    out = []
    for b in range(ECE_BINS):
        in_bin = bins == b
        if in_bin.any():
            out.append({
                "from": b / ECE_BINS,
                "to": (b + 1) / ECE_BINS,
                "n": int(in_bin.sum().item()),
                "mean_confidence": confidence[in_bin].mean().item(),
                "accuracy": right[in_bin].mean().item(),
            })  # fmt: skip
    return out


def calibration_figures(logits: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """Negative log-likelihood, expected calibration error (15 equal bins), mean confidence."""
    z = logits.detach().to(torch.float64)
    bins = reliability(z, targets)
    total = sum(b["n"] for b in bins)
    return {
        "nll": F.cross_entropy(z, targets.long()).item(),
        "ece": sum(b["n"] / total * abs(b["accuracy"] - b["mean_confidence"]) for b in bins),
        "mean_confidence": sum(b["n"] * b["mean_confidence"] for b in bins) / total,
    }


def fold_temperature(model: TransformerClassifier, temperature: float) -> None:
    """Scale the model's output by 1/T in its weights: the head and (if any) the bag's tables."""
    scale = 1.0 / temperature
    scale_layer(model.head, scale)
    with torch.no_grad():
        if model.config.bag_buckets:
            for table in (model.bag_ngram, model.bag_char, model.bag_bias):
                table.mul_(scale)


def output_layer(module: nn.Module, num_labels: int) -> nn.Linear | None:
    """A Hugging Face classifier's output layer: the last nn.Linear with `num_labels` outputs
    (BERT's `classifier`, RoBERTa's `classifier.out_proj`, ...), or None.

    The caller checks the model's logits after scaling it: a layer found this way may not be
    the last operation of every architecture.
    """
    linear = [m for m in module.modules() if isinstance(m, nn.Linear)]
    heads = [m for m in linear if m.out_features == num_labels]
    return heads[-1] if heads else None


def scale_layer(layer: nn.Linear, factor: float) -> None:
    """Multiply a linear layer's weight and bias by `factor` (its output scales by it)."""
    with torch.no_grad():
        layer.weight.mul_(factor)
        if layer.bias is not None:
            layer.bias.mul_(factor)


def summary(
    temperature: float, validation: tuple[torch.Tensor, torch.Tensor], test_logits: torch.Tensor,
    test_targets: torch.Tensor,
) -> dict[str, Any]:  # fmt: skip
    """metrics.json's "calibration": T and the figures before / after on validation and test.

    `test_logits` are the calibrated model's (after the fold); `validation` its logits before.
    """
    val_logits, val_targets = validation
    return {
        "method": "temperature scaling, fitted on the validation split (NLL)",
        "temperature": temperature,
        "validation": {
            "before": calibration_figures(val_logits, val_targets),
            "after": calibration_figures(val_logits / temperature, val_targets),
        },
        "test": {
            "before": calibration_figures(test_logits * temperature, test_targets),
            "after": calibration_figures(test_logits, test_targets),
        },
        "test_reliability": {
            "before": reliability(test_logits * temperature, test_targets),
            "after": reliability(test_logits, test_targets),
        },
    }
