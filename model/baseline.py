"""The linear baseline of every run: TF-IDF word 1-2 + char 2-5 n-grams, logistic regression.

`textserve train` fits it on the run's training split and scores it on the same validation and
test split as the transformer (`run_baseline`; refitted on training + validation for its test
figures when the model's bag was), so a run says whether the transformer beats the obvious
model (`add_baseline`: metrics.json's "baseline" and the warning):

    >>> result = fit_baseline(train_texts, train_y, {"test": (texts, y)}, labels)  # doctest: +SKIP
    >>> result["test"]["accuracy"]  # doctest: +SKIP
    0.7883

scikit-learn (the `train` extra) is imported here only; a run with `--no-baseline` never needs it.
The recipe is the textbook one, not tuned on any test split: sublinear term frequencies, words
and bigrams, character 2-5-grams within word boundaries (seen at least twice), C = 4.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from textserve.model.report import classification_metrics

if TYPE_CHECKING:  # types only: train imports this module
    from textserve.model.data import Splits
    from textserve.model.loop import Encoded
    from textserve.model.train_config import TrainConfig

logger = logging.getLogger("textserve.model.train")  # the run's log: one logger for a run

BASELINE_NAME = "tfidf word 1-2 + char_wb 2-5, logistic regression (C=4)"
BASELINE_C = 4.0


def fit_baseline(
    train_texts: Sequence[str],
    train_targets: Sequence[int],
    eval_sets: Mapping[str, tuple[Sequence[str], Sequence[int]]],
    labels: Sequence[str],
) -> dict[str, Any]:
    """Fit on the training texts; metrics (accuracy, macro-F1, ...) of each evaluation set.

    Returns {"model": BASELINE_NAME, "seconds": fit + scoring time, <set name>: metrics, ...}.
    Deterministic: the lbfgs solver has no randomness.
    """
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline, make_union

    t0 = time.perf_counter()
    # min_df=2 on the characters only: n-grams seen once are mostly typos and names, and the
    # character vocabulary is the large one. The word vocabulary keeps everything.
    features = make_union(
        TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True),
        TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), sublinear_tf=True, min_df=2),
    )
    model = make_pipeline(features, LogisticRegression(C=BASELINE_C, max_iter=2000))
    model.fit(list(train_texts), list(train_targets))
    result: dict[str, Any] = {"model": BASELINE_NAME}
    for name, (texts, targets) in eval_sets.items():
        predicted = model.predict(list(texts)) if len(texts) else []
        result[name] = classification_metrics(list(targets), list(predicted), labels)
    result["seconds"] = time.perf_counter() - t0
    return result


def add_baseline(metrics: dict[str, Any], baseline: dict[str, Any] | None) -> None:
    """metrics["baseline"] and metrics["warnings"] (the model losing to it), if it ran."""
    if baseline is not None:
        metrics["baseline"] = baseline
        metrics["warnings"] = _baseline_warnings(metrics["test"], baseline)


def run_baseline(
    cfg: TrainConfig,
    splits: Splits,
    encoded: dict[str, Encoded],
    labels: list[str],
    refit: bool = False,
) -> dict[str, Any] | None:
    """The linear baseline's figures on the run's own splits (None with --no-baseline).

    Fitted on the training split; with `refit` (the model's bag was refitted on training +
    validation) its test figures are those of a second fit on training + validation, so the
    comparison is like for like. The first fit's test figures stay as `train_only_test`.
    """
    if not cfg.baseline:
        return None
    targets = {name: encoded[name][1].tolist() for name in ("train", "validation", "test")}
    sets = {
        name: (split.texts, targets[name])
        for name, split in (("validation", splits.validation), ("test", splits.test))
    }
    try:
        result = fit_baseline(splits.train.texts, targets["train"], sets, labels)
        if refit:
            both = [*splits.train.texts, *splits.validation.texts]
            again = fit_baseline(
                both, targets["train"] + targets["validation"], {"test": sets["test"]}, labels
            )
    except ValueError as exc:  # e.g. a vocabulary left empty by min_df on a handful of texts
        logger.warning("linear baseline skipped: %s", exc)
        return {"model": "skipped", "error": str(exc), "accuracy": None, "macro_f1": None}
    test, val, seconds = result["test"], result["validation"], result["seconds"]
    extra: dict[str, Any] = {"fitted_on": "train"}
    if refit:
        extra = {"fitted_on": "train + validation", "train_only_test": test}
        test, seconds = again["test"], seconds + again["seconds"]
    logger.info(
        "linear baseline (%s, fitted on %s): test accuracy %.4f, macro-F1 %.4f; %.1fs",
        result["model"], extra["fitted_on"], test["accuracy"], test["macro_f1"], seconds,
    )  # fmt: skip
    return {
        "model": result["model"],
        "accuracy": test["accuracy"],
        "macro_f1": test["macro_f1"],
        "validation_accuracy": val["accuracy"],
        "validation_macro_f1": val["macro_f1"],
        "test": test,
        "validation": val,
        "seconds": seconds,
        **extra,
    }


def _baseline_warnings(test_metrics: dict[str, Any], baseline: dict[str, Any]) -> list[str]:
    if baseline["accuracy"] is None or test_metrics["accuracy"] >= baseline["accuracy"]:
        return []
    return [
        f"the model does not beat the linear baseline: test accuracy "
        f"{test_metrics['accuracy']:.4f} < {baseline['accuracy']:.4f} ({baseline['model']}); "
        "a bigger or pretrained model (--init-from) or more data may help"
    ]
