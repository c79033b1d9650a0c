"""Fitting the linear bag of token n-grams that the default model adds to its encoder's logits.

The bag (TransformerClassifier.bag_logits) reads token ids only, so it lives in the ONNX graph
and serving needs nothing new. Two feature blocks, both computed from the BPE ids:

- binary token unigrams and hashed bigrams (`bag_features`), each scaled by its naive-Bayes
  log-count ratio (NB-SVM, Wang & Manning 2012, with logistic regression);
- each token's character 2-5-grams within its boundaries, tf-idf weighted, summed over the
  text and divided by sqrt(sum of the tokens' squared norms).

One L2-regularised logistic regression (scikit-learn, lbfgs: deterministic) is fitted on both
blocks of the training split, once per label (one-vs-rest; once in all for two labels), and
folded into the model's tables: a bigram's weight is its NB ratio times its coefficient, a
token's character weight the sum of its n-grams' idf times their coefficients.

    >>> fit_bag(model, train_ids, train_targets, vocab)  # doctest: +SKIP
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from textserve.model.classifier import TransformerClassifier, bag_features
from textserve.tokenization import pad

BAG_C = 4.0  # the regularisation of the baseline's logistic regression (model/baseline.py)
CHAR_NGRAMS = (2, 5)  # the baseline's character n-gram orders
NB_ALPHA = 1.0  # naive-Bayes smoothing of the log-count ratios


def bag_matrix(model: TransformerClassifier, rows: Sequence[Sequence[int]]) -> Any:
    """The binary unigram + bigram matrix (N, vocab + buckets) the graph's bag computes."""
    import scipy.sparse as sp

    cfg = model.config
    width = cfg.vocab_size + cfg.bag_buckets
    indices: list[np.ndarray] = [np.zeros(0, dtype=np.int64)]  # never empty for concatenate
    indptr = [0]
    for start in range(0, len(rows), 512):
        ids, mask = pad([list(r) for r in rows[start : start + 512]], cfg.pad_token_id)
        feats, weights = bag_features(
            torch.from_numpy(ids), torch.from_numpy(mask), cfg.vocab_size, cfg.bag_buckets
        )
        for f, w in zip(feats.numpy(), weights.numpy(), strict=True):
            distinct = np.unique(f[w > 0])
            indices.append(distinct)
            indptr.append(indptr[-1] + len(distinct))
    flat = np.concatenate(indices)
    return sp.csr_matrix((np.ones(len(flat)), flat, indptr), shape=(len(rows), width))


def _token_counts(rows: Sequence[Sequence[int]], vocab_size: int) -> Any:
    import scipy.sparse as sp

    lengths = [len(r) for r in rows]
    cols = np.concatenate([np.zeros(0, dtype=np.int64), *(np.asarray(r, np.int64) for r in rows)])
    rows_of = np.repeat(np.arange(len(rows)), lengths)
    return sp.csr_matrix((np.ones(len(cols)), (rows_of, cols)), shape=(len(rows), vocab_size))


def char_tables(vocab: Sequence[str], counts: Any) -> tuple[Any, np.ndarray]:
    """(each token's tf-idf character n-gram vectors (V, F), their squared norms (V,)).

    n-grams seen in fewer than two training texts are dropped, as in the baseline; idf is
    scikit-learn's smoothed ln((1 + n) / (1 + df)) + 1 over the training texts.
    """
    import scipy.sparse as sp
    from sklearn.feature_extraction.text import CountVectorizer

    grams = CountVectorizer(analyzer="char_wb", ngram_range=CHAR_NGRAMS, lowercase=False)
    per_token = grams.fit_transform(list(vocab))  # (V, F) counts
    df = np.asarray(((counts @ per_token) > 0).sum(axis=0)).ravel()
    keep = np.flatnonzero(df >= 2)
    idf = np.log((1 + counts.shape[0]) / (1 + df[keep])) + 1
    weighted = (per_token[:, keep] @ sp.diags(idf)).tocsr()
    return weighted, np.asarray(weighted.multiply(weighted).sum(axis=1)).ravel()


class Design(NamedTuple):
    """The bag's features of some texts, as scipy sparse matrices."""

    binary: Any  # (N, vocab + buckets) binary unigrams and hashed bigrams
    char: Any  # (N, F) the texts' character block, normalised as bag_logits does
    char_vectors: Any  # (V, F) each token's tf-idf character n-gram vector
    char_norms: np.ndarray  # (V,) their squared norms

    def features(self, ratio: np.ndarray) -> Any:
        """[binary scaled by the NB ratios | character block]: what the regression reads."""
        import scipy.sparse as sp

        return sp.hstack([self.binary @ sp.diags(ratio), self.char]).tocsr()


def design(
    model: TransformerClassifier, rows: Sequence[Sequence[int]], vocab: Sequence[str]
) -> Design:
    """The bag's features of the training rows (the character tables are fitted on them)."""
    import scipy.sparse as sp

    counts = _token_counts(rows, model.config.vocab_size)
    char_vectors, char_norms = char_tables(vocab, counts)
    norm = np.sqrt(counts @ char_norms) + 1e-12
    char = sp.diags(1 / norm) @ (counts @ char_vectors)
    return Design(bag_matrix(model, rows), char, char_vectors, char_norms)


def nb_ratio(binary: Any, positive: np.ndarray) -> np.ndarray:
    """Each feature's naive-Bayes log-count ratio, log((p / |p|) / (q / |q|)), smoothed."""
    p = NB_ALPHA + np.asarray(binary[positive].sum(axis=0)).ravel()
    q = NB_ALPHA + np.asarray(binary[~positive].sum(axis=0)).ravel()
    return np.asarray(np.log((p / p.sum()) / (q / q.sum())))


def fit_bag(
    model: TransformerClassifier,
    train_rows: Sequence[Sequence[int]],
    train_targets: Sequence[int],
    vocab: Sequence[str],
) -> dict[str, Any]:
    """Fit the bag on the training split and write its tables into `model`; a summary dict.

    `vocab[i]` is token i's string. Deterministic: no random draw anywhere.
    """
    from sklearn.linear_model import LogisticRegression

    t0 = time.perf_counter()
    cfg = model.config
    y = np.asarray(train_targets)
    d = design(model, train_rows, vocab)
    width = d.binary.shape[1]
    ngram_table = np.zeros((width, cfg.num_labels))
    char_table = np.zeros((cfg.vocab_size, cfg.num_labels))
    bias = np.zeros(cfg.num_labels)
    # Two labels: one fit for label 1 (label 0's logit stays 0; softmax sees the difference).
    for label in [1] if cfg.num_labels == 2 else range(cfg.num_labels):
        positive = y == label
        ratio = nb_ratio(d.binary, positive)
        lr = LogisticRegression(C=BAG_C, max_iter=3000)
        lr.fit(d.features(ratio), positive.astype(int))
        coef = lr.coef_[0]
        ngram_table[:, label] = ratio * coef[:width]
        char_table[:, label] = d.char_vectors @ coef[width:]
        bias[label] = lr.intercept_[0]
    with torch.no_grad():
        model.bag_ngram.copy_(torch.from_numpy(ngram_table))
        model.bag_char.copy_(torch.from_numpy(char_table))
        model.bag_char_norm.copy_(torch.from_numpy(d.char_norms))
        model.bag_bias.copy_(torch.from_numpy(bias))
    return {
        "model": (
            f"bag: NB-weighted binary token 1-2-grams ({cfg.bag_buckets} bigram buckets) + "
            f"token char {CHAR_NGRAMS[0]}-{CHAR_NGRAMS[1]}-grams, logistic regression (C={BAG_C})"
        ),
        "encoder_weight": cfg.encoder_weight,
        "seconds": time.perf_counter() - t0,
    }
