"""The linear baseline of every run: TF-IDF word 1-2 + char 2-5 n-grams, logistic regression.

`textserve train` fits it on the run's training split and scores it on the same validation and
test split as the transformer, so a run says whether the transformer beats the obvious model:

    >>> result = fit_baseline(train_texts, train_y, {"test": (texts, y)}, labels)  # doctest: +SKIP
    >>> result["test"]["accuracy"]  # doctest: +SKIP
    0.7883

scikit-learn (the `train` extra) is imported here only; a run with `--no-baseline` never needs it.
The recipe is the textbook one, not tuned on any test split: sublinear term frequencies, words
and bigrams, character 2-5-grams within word boundaries (seen at least twice), C = 4.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from textserve.model.report import classification_metrics

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
