"""Classification metrics (accuracy, macro-F1, per-class P/R/F1, confusion matrix), PNGs.

numpy only (matplotlib is imported lazily, with the Agg backend, when a plot is drawn).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def classification_metrics(
    y_true: Sequence[int] | np.ndarray, y_pred: Sequence[int] | np.ndarray, labels: Sequence[str]
) -> dict[str, Any]:
    """Metrics as plain JSON-able values; rows of the confusion matrix are the true labels.

    >>> m = classification_metrics([0, 1, 1], [0, 1, 0], ["neg", "pos"])
    >>> round(m["accuracy"], 3), m["confusion_matrix"]
    (0.667, [[1, 0], [1, 1]])
    """
    t = np.asarray(y_true, dtype=np.int64)
    p = np.asarray(y_pred, dtype=np.int64)
    k = len(labels)
    confusion = np.zeros((k, k), dtype=np.int64)
    np.add.at(confusion, (t, p), 1)
    tp = np.diag(confusion).astype(np.float64)
    predicted = confusion.sum(axis=0).astype(np.float64)
    actual = confusion.sum(axis=1).astype(np.float64)
    # A class never predicted (or absent) has precision (recall) 0 rather than NaN, as sklearn's
    # zero_division=0: the macro average must stay a number.
    precision = np.divide(tp, predicted, out=np.zeros(k), where=predicted > 0)
    recall = np.divide(tp, actual, out=np.zeros(k), where=actual > 0)
    denom = precision + recall
    f1 = np.divide(2 * precision * recall, denom, out=np.zeros(k), where=denom > 0)
    return {
        "n": int(t.size),
        "accuracy": float(tp.sum() / max(1, t.size)),
        "macro_f1": float(f1.mean()),
        "per_class": {
            name: {
                "precision": float(precision[i]),
                "recall": float(recall[i]),
                "f1": float(f1[i]),
                "support": int(actual[i]),
            }
            for i, name in enumerate(labels)
        },
        "confusion_matrix": confusion.tolist(),
    }


def plot_curves(history: Sequence[dict[str, float]], path: Path, title: str = "") -> None:
    """Loss (train/validation) and validation accuracy/macro-F1 per epoch, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and in CI
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    epochs = [h["epoch"] for h in history]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    ax_loss.plot(epochs, [h["train_loss"] for h in history], marker="o", label="train")
    ax_loss.plot(epochs, [h["val_loss"] for h in history], marker="o", label="validation")
    ax_loss.set_xlabel("epoch")
    ax_loss.set_ylabel("cross-entropy (with label smoothing)")
    ax_loss.legend()
    ax_acc.plot(epochs, [h["val_accuracy"] for h in history], marker="o", label="val accuracy")
    ax_acc.plot(epochs, [h["val_macro_f1"] for h in history], marker="o", label="val macro-F1")
    ax_acc.set_xlabel("epoch")
    ax_acc.legend()
    for ax in (ax_loss, ax_acc):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_reliability(summary: dict[str, Any], path: Path, title: str = "") -> None:
    """The test split's reliability diagram before / after temperature scaling, as a PNG.

    `summary` is metrics.json's "calibration" (model/calibration.py's `summary`).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5))
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="calibrated")
    for when, marker in (("before", "o"), ("after", "s")):
        bins = summary["test_reliability"][when]
        figures = summary["test"][when]
        ax.plot(
            [b["mean_confidence"] for b in bins], [b["accuracy"] for b in bins], marker=marker,
            label=f"{when} (ECE {figures['ece']:.3f}, NLL {figures['nll']:.3f})",
        )  # fmt: skip
    low = min(b["from"] for when in ("before", "after") for b in summary["test_reliability"][when])
    ax.set_xlim(low, 1)
    ax.set_ylim(low, 1)
    ax.set_xlabel("confidence (top label's score)")
    ax.set_ylabel("accuracy on the test split")
    ax.set_title(title or f"temperature {summary['temperature']:.3f}, fitted on validation")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
