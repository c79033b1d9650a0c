"""Token classification's answer: per-token probabilities grouped into entities, as transformers'
`pipeline("token-classification", aggregation_strategy=...)` groups them, without torch.

    tagger = Tagger(tokenizer, ["O", "B-PER", "I-PER"], unk_token_id=100)
    windows = [Window.of(encoding)]                      # a tokenizers Encoding, with offsets
    tagger.entities(text, windows, [probabilities], TagOptions("simple"))
    # [Entity(label='PER', score=0.998, word='Ada Lovelace', start=17, end=29)]

The rules are the pipeline's, one for one (transformers' pipelines/token_classification.py),
so that a served entity equals the pipeline's within float error:
- special tokens (the encoding's special_tokens_mask: [CLS], </s>, padding) are never reported;
- a token is a word's continuation when the tokenizer's model has a continuing-subword prefix
  (WordPiece's "##") and the token is longer than its characters in the text; else by the
  pipeline's fallback: it starts inside the text and neither it nor the character before it is
  a space. An unknown token is always a word start, reported by its characters in the text;
- `none`: every token with its best label; `simple`: tokens grouped by label; `first`, `max`,
  `average`: each word takes its first token's label, its most confident token's, or the best
  of its tokens' averaged probabilities, then words are grouped;
- grouping: a unit joins the group before it when its label's tag (the label less a `B-`/`I-`
  prefix) is the same and it is not a `B-`; the group is named by its first label less anything
  up to the first `-`, scored by the mean of its units' scores; its word is the tokenizer's
  decoder applied to its units' words; start and end are character offsets into the original
  text;
- `ignore_labels` (default `O`) are dropped per window; windows of a long text are merged as
  the pipeline merges the chunks of its `stride` (of entities that overlap, the longer, then
  the more confident, stays).
The work per batch is numpy over the tokens (argmax, word segments, groups); Python runs once
per reported entity (its word), not once per token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from tokenizers import Encoding, Tokenizer

STRATEGIES = ("none", "simple", "first", "average", "max")


class Entity(NamedTuple):
    """One entity (or, with aggregation `none`, one token) of a text."""

    label: str  # the group's name (PER), or with `none` the token's label (B-PER)
    score: float
    word: str  # as the tokenizer decodes it; the text's own characters are text[start:end]
    start: int  # character offsets into the original text
    end: int
    token: int = -1  # `none`: the token's position in its window; -1 otherwise

    def as_dict(self) -> dict[str, object]:
        """The pipeline's dictionary of this entity (`entity` and `index` for `none`)."""
        if self.token >= 0:
            return {
                "entity": self.label, "score": self.score, "index": self.token,
                "word": self.word, "start": self.start, "end": self.end,
            }  # fmt: skip
        return {
            "entity_group": self.label, "score": self.score, "word": self.word,
            "start": self.start, "end": self.end,
        }  # fmt: skip


class TagOptions(NamedTuple):
    aggregation: str = "simple"  # one of STRATEGIES
    ignore_labels: frozenset[str] = frozenset({"O"})
    threshold: float = 0.0  # entities scored below it are left out


class Window(NamedTuple):
    """One encoding of a text (a window of it when it is longer than the model takes)."""

    ids: np.ndarray  # int64 (T,)
    offsets: np.ndarray  # int64 (T, 2), characters of the original text
    special: np.ndarray  # bool (T,): special tokens and padding

    @classmethod
    def of(cls, encoding: Encoding) -> Window:
        return cls(
            np.asarray(encoding.ids, np.int64),
            np.asarray(encoding.offsets, np.int64).reshape(-1, 2),
            np.asarray(encoding.special_tokens_mask, np.bool_),
        )


class Tagger:
    """Entities from a token classifier's probabilities, for one tokenizer and label list."""

    def __init__(self, tokenizer: Tokenizer, labels: Sequence[str], unk_token_id: int | None):
        self.labels = tuple(labels)
        self.unk_token_id = -1 if unk_token_id is None else unk_token_id
        self._decoder = tokenizer.decoder
        self._id_to_token = tokenizer.id_to_token
        prefix = getattr(tokenizer.model, "continuing_subword_prefix", None)
        self.word_aware = bool(prefix)
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        size = max(tokenizer.get_vocab_size(with_added_tokens=True), max(vocab.values()) + 1)
        self._token_lengths = np.zeros(size, np.int64)
        for token, index in vocab.items():
            self._token_lengths[index] = len(token)
        # the pipeline's get_tag: "B-X" -> (B, X), "I-X" -> (I, X), anything else -> (I, itself)
        tags: dict[str, int] = {}
        self._begins = np.array([label.startswith("B-") for label in self.labels], np.bool_)
        self._tags = np.array(
            [
                tags.setdefault(label[2:] if label[:2] in ("B-", "I-") else label, len(tags))
                for label in self.labels
            ],
            np.int64,
        )
        self._groups = [label.split("-", 1)[-1] for label in self.labels]

    def decode(self, tokens: list[str]) -> str:
        """transformers' convert_tokens_to_string: the tokenizer's decoder, else spaces."""
        if self._decoder is None:
            return " ".join(tokens)
        return str(self._decoder.decode(tokens))

    def entities(
        self,
        text: str,
        windows: Sequence[Window],
        probabilities: Sequence[np.ndarray],
        options: TagOptions,
    ) -> list[Entity]:
        """The entities of `text` from its windows and each window's (T, labels)
        probabilities; windows' entities merged where they overlap."""
        space = np.frombuffer(text.encode("utf-32-le"), np.uint32) == 32  # " " per character
        found: list[Entity] = []
        for window, scores in zip(windows, probabilities, strict=True):
            found.extend(self._window(text, space, window, scores, options))
        if len(windows) > 1:
            found = merge_overlapping(found)
        if options.threshold > 0:
            found = [entity for entity in found if entity.score >= options.threshold]
        return found

    def _window(
        self,
        text: str,
        space: np.ndarray,
        window: Window,
        scores: np.ndarray,
        options: TagOptions,
    ) -> list[Entity]:
        positions = np.flatnonzero(~window.special)
        n = len(positions)
        if not n:
            return []
        ids = window.ids[positions]
        starts = window.offsets[positions, 0]
        ends = window.offsets[positions, 1]
        probs = scores[positions]
        unknown = ids == self.unk_token_id
        strategy = options.aggregation

        def token_word(i: int) -> str:  # the pipeline's pre-entity word
            if unknown[i]:
                return text[starts[i] : ends[i]]
            return self._id_to_token(int(ids[i])) or ""

        unit_words: Callable[[int], str]
        if strategy in ("none", "simple"):
            label = probs.argmax(axis=1)
            score = probs[np.arange(n), label]
            if strategy == "none":
                ignore = options.ignore_labels
                kept = [i for i, k in enumerate(label.tolist()) if self.labels[k] not in ignore]
                return [
                    Entity(
                        self.labels[label[i]],
                        float(score[i]),
                        token_word(i),
                        int(starts[i]),
                        int(ends[i]),
                        int(positions[i]),
                    )
                    for i in kept
                ]
            unit_words = token_word  # one token per unit
            unit_starts, unit_ends = starts, ends
        else:
            first = ~(self._continues(space, ids, starts, ends) & ~unknown)
            first[0] = True
            heads = np.flatnonzero(first)
            tails = np.append(heads[1:], n)
            if strategy == "first":
                rows = probs[heads]
            elif strategy == "max":
                best = probs.max(axis=1)
                segment = np.cumsum(first) - 1
                tops = np.flatnonzero(best == np.maximum.reduceat(best, heads)[segment])
                rows = probs[tops[np.append(True, np.diff(segment[tops]) != 0)]]
            elif strategy == "average":
                rows = np.add.reduceat(probs, heads, axis=0) / (tails - heads)[:, None]
            else:
                raise ValueError(f"aggregation {strategy!r} is not one of {', '.join(STRATEGIES)}")
            label = rows.argmax(axis=1)
            score = rows[np.arange(len(heads)), label]

            def word_of(u: int) -> str:  # the pipeline's aggregate_word
                return self.decode([token_word(i) for i in range(heads[u], tails[u])])

            unit_words = word_of
            unit_starts, unit_ends = starts[heads], ends[tails - 1]
        return self._grouped(label, score, unit_words, unit_starts, unit_ends, options)

    def _continues(
        self, space: np.ndarray, ids: np.ndarray, starts: np.ndarray, ends: np.ndarray
    ) -> np.ndarray:
        """Whether each token continues the word before it (the pipeline's is_subword)."""
        if self.word_aware:
            return self._token_lengths[ids] != ends - starts
        size = len(space)

        def space_at(index: np.ndarray) -> np.ndarray:
            inside = (index >= 0) & (index < size)
            if not size:
                return inside
            return inside & space[np.clip(index, 0, size - 1)]

        return (starts > 0) & ~space_at(starts - 1) & ~space_at(starts)

    def _grouped(
        self,
        label: np.ndarray,
        score: np.ndarray,
        unit_words: Callable[[int], str],
        unit_starts: np.ndarray,
        unit_ends: np.ndarray,
        options: TagOptions,
    ) -> list[Entity]:
        """Adjacent units of one tag grouped (the pipeline's group_entities), ignored labels
        left out before any word is decoded."""
        k = len(label)
        tags = self._tags[label]
        new = np.ones(k, np.bool_)
        new[1:] = (tags[1:] != tags[:-1]) | self._begins[label[1:]]
        heads = np.flatnonzero(new)
        tails = np.append(heads[1:], k)
        means = np.add.reduceat(score.astype(np.float64), heads) / (tails - heads)
        found = []
        for g, (head, tail) in enumerate(zip(heads.tolist(), tails.tolist(), strict=True)):
            name = self._groups[label[head]]
            if name in options.ignore_labels:
                continue
            found.append(
                Entity(
                    name,
                    float(means[g]),
                    self.decode([unit_words(u) for u in range(head, tail)]),
                    int(unit_starts[head]),
                    int(unit_ends[tail - 1]),
                )
            )
        return found


def merge_overlapping(entities: list[Entity]) -> list[Entity]:
    """The pipeline's aggregate_overlapping_entities: sorted by start, of entities that overlap
    the longer stays, on a tie the more confident."""
    if not entities:
        return entities
    ordered = sorted(entities, key=lambda entity: entity.start)
    merged: list[Entity] = []
    previous = ordered[0]
    for entity in ordered:
        if previous.start <= entity.start < previous.end:
            length, previous_length = entity.end - entity.start, previous.end - previous.start
            if length > previous_length or (
                length == previous_length and entity.score > previous.score
            ):
                previous = entity
        else:
            merged.append(previous)
            previous = entity
    merged.append(previous)
    return merged


def softmax(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis in float32 (the pipeline's, shifted by the max)."""
    shifted = logits.astype(np.float32) - logits.max(axis=-1, keepdims=True)
    np.exp(shifted, out=shifted)
    shifted /= shifted.sum(axis=-1, keepdims=True)
    return shifted
