"""The batch function of a token classifier: texts in, entities out (textserve.tagging).

`TokenRunner` is TextRunner's twin for a version whose manifest says `task:
token-classification` (its graph gives (batch, tokens, labels) logits). Per batch, on the
inference thread: each text is encoded with character offsets (a copy of the tokenizer with
truncation at max_length and, when windows are on, the request's stride: the library's own
overflowing windows, the very ones transformers' pipeline runs with `stride`), every window of
every text becomes one row, the rows run as TextRunner's sub-batches (sorted by length, bisected
on failure), one softmax over the whole batch, then each text's entities are grouped by the
request's aggregation (textserve.tagging). A text longer than max_length without windows is cut
(truncate) or refused, as a classified one; one that needs more windows than a request may carry
texts is refused, naming it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np

from textserve.service.engine.batches import BatchOutput, RunStats, Timings
from textserve.service.engine.inference import (
    WARMUP_TEXT,
    ModelCheckError,
    TextItem,
    TextRunner,
    TokenizeObserver,
)
from textserve.service.errors import ValidationError
from textserve.tagging import STRATEGIES, Entity, Tagger, TagOptions, Window, softmax

if TYPE_CHECKING:
    from tokenizers import Encoding, Tokenizer

    from textserve.artifact import Manifest
    from textserve.service.engine.runtime import Session
    from textserve.tokenization import Tokenization


class TagRequest(NamedTuple):
    """A request's options, carried by each of its TextItems (TextItem.options)."""

    options: TagOptions
    stride: int | None  # windows of a long text overlapping by this many tokens; None: no windows


@dataclass(frozen=True)
class TagResult:
    """A token classifier's answer (ModelHandle.tag): each text's entities."""

    entities: list[list[Entity]]
    num_tokens: np.ndarray  # int64 (n,), tokens the model saw per text (all its windows)
    truncated: np.ndarray  # bool (n,): cut (windows off and the text over max_length)
    windows: np.ndarray  # int64 (n,): windows per text (1: it fit)
    timings: Timings
    cached: np.ndarray | None = None  # never cached

    cached_count = 0


def tag_defaults(manifest: Manifest) -> TagRequest:
    """A token classifier's request defaults, from its manifest's `tagging`."""
    tagging = manifest.tagging or {}
    aggregation = tagging.get("aggregation", "simple")
    return TagRequest(
        TagOptions(
            aggregation if aggregation in STRATEGIES else "simple",
            frozenset(tagging.get("ignore_labels", ["O"])),
            0.0,
        ),
        tagging.get("stride"),
    )


class EntityObserver(Protocol):
    """Counts each batch's entities (textserve_entities_total by label, per text histogram)."""

    def observe(self, entities: Sequence[list[Entity]]) -> None: ...


def token_row_dtype() -> np.dtype:
    """One text's result: TokenRunner's row (the entities themselves in an object column)."""
    return np.dtype(
        [
            ("entities", object),  # list[Entity]
            ("num_tokens", np.int64),  # tokens the model saw, over all windows
            ("full_tokens", np.int64),  # tokens of the whole text (> num_tokens: cut)
            ("windows", np.int64),  # windows the text ran as (1: it fit)
            ("tokenize_seconds", np.float64),
            ("cached", np.bool_),  # never: token answers are not cached
            ("answered", np.bool_),
        ]
    )


class TokenRunner(TextRunner):
    """Runs batches of TextItems (options: TagRequest) through a token classifier."""

    def __init__(
        self,
        session: Session,
        tokenization: Tokenization,
        *,
        labels: Sequence[str],
        max_batch_tokens: int,
        defaults: TagRequest,
        max_windows: int,
        name: str = "model",
        version: int = 0,
        observer: TokenizeObserver | None = None,
    ) -> None:
        super().__init__(
            session,
            tokenization,
            labels=labels,
            max_batch_tokens=max_batch_tokens,
            activation="softmax",
            name=name,
            version=version,
            observer=observer,
        )
        self.rows = token_row_dtype()
        self.defaults = defaults
        self.max_windows = max_windows
        tokenizer = tokenization.tokenizer
        self.tagger = Tagger(tokenizer, labels, tokenization.unk_token_id)
        self._source = tokenizer.to_str()
        self._windowing: dict[int, Tokenizer] = {}  # stride -> a truncating copy
        self.specials = tokenizer.num_special_tokens_to_add(False)
        self.entity_observer: EntityObserver | None = None

    def max_stride(self) -> int:
        """The largest stride a window of max_length tokens leaves room for."""
        return max(0, self.max_length - self.specials - 1)

    def _windower(self, stride: int) -> Tokenizer:
        """The tokenizer truncating at max_length with `stride` (one copy per stride)."""
        tokenizer = self._windowing.get(stride)
        if tokenizer is None:
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_str(self._source)
            tokenizer.no_padding()
            tokenizer.enable_truncation(
                self.max_length,
                stride=stride,
                strategy="longest_first",
                direction=self.tokenization.truncation_side,
            )
            if len(self._windowing) < 64:
                self._windowing[stride] = tokenizer
        return tokenizer

    def estimate_lengths(
        self, texts: Sequence[str], pairs: Sequence[str | None] | None = None
    ) -> list[int]:
        """Tokens per text from characters; a long text's windows count, up to a batch."""
        per_token, cap = self.chars_per_token, self.max_batch_tokens
        return [min(cap, int(len(text) / per_token) + 1) for text in texts]

    # -- load-time checks ------------------------------------------------------------------------

    def _probe(self, ids: list[int], failure: str) -> None:
        row = np.asarray([ids], dtype=np.int64)
        try:
            logits = self.session.run(row, np.ones_like(row))
        except Exception as exc:
            raise ModelCheckError(f"{failure} (onnxruntime: {exc})") from None
        if logits.shape != (1, len(ids), len(self.labels)):
            raise ModelCheckError(
                f"model.onnx gives logits of shape {logits.shape} for {len(ids)} tokens but a "
                f"token classifier with {len(self.labels)} labels gives (1, {len(ids)}, "
                f"{len(self.labels)})"
            )
        if not np.isfinite(logits).all():
            raise ModelCheckError(f"{failure} (its logits are not finite)")

    def warmup(self, max_batch_size: int) -> None:
        self.session.warmup(self.max_length, max_batch_size, self.tokenization.unk_id)
        output = self([TextItem(WARMUP_TEXT, True, 0, None, None, self.defaults)])
        if output.errors or not output.outputs["answered"].all():
            raise ValueError(f"model.onnx fails on a sample text: {output.errors}")

    # -- the batch function ----------------------------------------------------------------------

    def __call__(self, payloads: list[TextItem]) -> BatchOutput:
        started = time.perf_counter()
        out = np.zeros(len(payloads), self.rows)
        requests = [
            p.options if isinstance(p.options, TagRequest) else self.defaults for p in payloads
        ]
        windows, errors = self._windows(payloads, requests, out)
        tokenized = time.perf_counter()
        out["tokenize_seconds"] = tokenized - started
        if self._observer is not None:
            self._observer.on_tokenize(tokenized - started)
        runs: list[RunStats] = []
        owners = [row for row, parts in enumerate(windows) for _ in parts]
        flat = [window for parts in windows for window in parts]
        if not flat:
            return BatchOutput(out, runs, errors or None)
        order = sorted(range(len(flat)), key=lambda i: len(flat[i].ids))
        lengths = [len(flat[i].ids) for i in order]
        inputs = self.tokenization.pad([flat[i].ids.tolist() for i in order])
        logits = np.zeros((len(order), lengths[-1], len(self.labels)), np.float32)
        failed: dict[int, Exception] = {}
        for start, end in self.plan_runs(lengths):
            self._run_range(inputs, lengths, start, end, logits, runs, failed)
        probabilities = softmax(logits)
        by_window: list[np.ndarray] = [np.empty(0)] * len(flat)
        for position, window in enumerate(order):
            by_window[window] = probabilities[position, : lengths[position]]
        if failed:
            errors.update(self._blame(payloads, [owners[window] for window in order], failed))
        first = 0
        found: list[list[Entity]] = []
        for row, parts in enumerate(windows):
            count = len(parts)
            if count and row not in errors:
                entities = self.tagger.entities(
                    payloads[row].text,
                    parts,
                    by_window[first : first + count],
                    requests[row].options,
                )
                out["entities"][row] = entities
                out["answered"][row] = True
                found.append(entities)
            first += count
        if self.entity_observer is not None and found:
            self.entity_observer.observe(found)
        return BatchOutput(out, runs, errors or None)

    def _windows(
        self, payloads: list[TextItem], requests: list[TagRequest], out: np.ndarray
    ) -> tuple[list[list[Window]], dict[int, Exception]]:
        """Each text's windows (none for a refused one) and the refusals; fills num_tokens,
        full_tokens and windows. A refused request's other texts do not run either."""
        windows: list[list[Window]] = [[] for _ in payloads]
        errors: dict[int, Exception] = {}
        by_stride: dict[int, list[int]] = {}
        for row, request in enumerate(requests):
            by_stride.setdefault(-1 if request.stride is None else request.stride, []).append(row)
        chars = tokens = 0
        for stride, rows in by_stride.items():
            encodings = self._windower(max(stride, 0)).encode_batch(
                [payloads[row].text for row in rows]
            )
            for row, encoding in zip(rows, encodings, strict=True):
                payload = payloads[row]
                parts: list[Encoding] = [encoding]
                if encoding.overflowing:
                    if stride >= 0:
                        parts.extend(encoding.overflowing)
                    elif not payload.truncate:
                        errors[row] = ValidationError(
                            f"texts[{payload.position}] is longer than the {self.max_length} "
                            f"tokens model {self.name!r} takes (send truncate=true to cut it, "
                            "or turn windows on)"
                        )
                        continue
                if len(parts) > self.max_windows:
                    errors[row] = ValidationError(
                        f"texts[{payload.position}] makes {len(parts)} windows of "
                        f"{self.max_length} tokens; at most {self.max_windows} per text "
                        "(--max-texts-per-request: split the text)"
                    )
                    continue
                if not encoding.ids:
                    errors[row] = ValidationError(
                        f"texts[{payload.position}] gives no tokens (nothing of it is left after "
                        "the tokenizer's normalization)"
                    )
                    continue
                windows[row] = [Window.of(part) for part in parts]
                seen = sum(len(part.ids) for part in parts)
                out["num_tokens"][row] = seen
                out["windows"][row] = len(parts)
                cut = 0 if stride >= 0 else sum(len(o.ids) for o in encoding.overflowing)
                out["full_tokens"][row] = seen + cut
                chars += len(payload.text)
                tokens += seen
        if tokens:
            self.chars_per_token = max(1.0, chars / tokens)
        if errors:
            refused = {id(payloads[row].request) for row in errors}
            for row, payload in enumerate(payloads):
                if id(payload.request) in refused:
                    windows[row] = []
        return windows, errors


def runner_for(
    manifest: Manifest,
    session: Session,
    tokenization: Tokenization,
    *,
    max_batch_tokens: int,
    max_windows: int,
    observer: TokenizeObserver | None,
) -> TextRunner:
    """The batch function of a version: a TokenRunner for a token classifier (entities per
    text, token_runner.py), else a TextRunner. THE tokenization, as the manifest says: a format
    1 version whose tokenizer has no [UNK] was refused by Tokenization.for_manifest."""
    name, version, labels = manifest.name, manifest.version, manifest.labels
    if manifest.tags_tokens:
        return TokenRunner(
            session, tokenization, labels=labels, max_batch_tokens=max_batch_tokens,
            defaults=tag_defaults(manifest), max_windows=max_windows, name=name,
            version=version, observer=observer,
        )  # fmt: skip
    return TextRunner(
        session, tokenization, labels=labels, max_batch_tokens=max_batch_tokens,
        activation=manifest.activation, name=name, version=version, observer=observer,
    )  # fmt: skip
