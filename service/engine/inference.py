"""The batch function of one model version: tokenize, plan runs, run, bisect failures, activate.

`TextRunner` is what the Batcher calls on its inference thread with a batch of queued texts. It
tokenizes the whole batch (textserve.tokenization, the one tokenization), truncates or refuses
over-long texts, sorts the texts by token length and runs them as one or more sub-batches (a
split wherever the padding it saves costs more than one more onnxruntime run, see
subbatches.split_runs), so a request costs one thread hop and a batch of mixed lengths pads
little. A run that fails is bisected down to the texts that fail alone, which are refused
(INVALID_ARGUMENT) while the others are answered. The logits become scores in one named step,
the version's activation (ACTIVATIONS: softmax, sigmoid, none). Sentence pairs are encoded with
the tokenizer's pair template, and token_type_ids reach a graph that takes them.

It also checks, once at load, that the model fits its tokenizer and manifest (check) and warms
the session up (warmup). No asyncio here: the handle and the batcher own the loop side.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np

from textserve.service.engine.batches import BatchOutput, RunStats
from textserve.service.engine.subbatches import (
    RUN_COST_TOKENS,
    RUN_COST_TOKENS_OTHER,
    softmax,
    split_runs,
)
from textserve.service.errors import ValidationError
from textserve.tokenization import Row, Tokenization, TokenizationError

if TYPE_CHECKING:
    from textserve.service.engine.cache import VersionCache
    from textserve.service.engine.runtime import Session

logger = logging.getLogger(__name__)

# Run through tokenizer and model at warm-up: a tokenizer whose ids the model does not know
# fails here, before the version serves, not on the first request.
WARMUP_TEXT = "The quick brown fox jumps over the lazy dog. A gripping, beautifully acted film!"


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """Element-wise logistic in float32, each label on its own; exp of -|x| only (no overflow)."""
    x = logits.astype(np.float32, copy=False)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(np.float32)


def identity(logits: np.ndarray) -> np.ndarray:
    return logits.astype(np.float32, copy=True)


# logits (float32, (B, num_labels)) -> the scores a version answers with, by the manifest's
# activation. softmax: single-label probabilities; sigmoid: multi-label, every label scored on
# its own; none: a regression model's raw output.
ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "softmax": softmax,
    "sigmoid": sigmoid,
    "none": identity,
}


def logits_of(scores: np.ndarray, activation: str) -> np.ndarray:
    """The logits behind a version's scores (float64), as far as its activation lets them be
    known: sigmoid's inverse exactly; softmax's up to the constant softmax discards (the log of
    the probabilities: the same softmax); 'none': the scores themselves."""
    values = scores.astype(np.float64)
    if activation == "softmax":
        return np.log(np.clip(values, 1e-45, None))
    if activation == "sigmoid":
        clipped = np.clip(values, 1e-12, 1 - 1e-12)
        return np.log(clipped / (1 - clipped))
    return values


class ModelCheckError(ValueError):
    """The model does not fit its tokenizer or manifest; `reason` is a load-failure label
    (textserve.service.metrics.LOAD_FAILURE_REASONS)."""

    def __init__(self, message: str, reason: str = "contract_mismatch") -> None:
        super().__init__(message)
        self.reason = reason


class Cut(NamedTuple):
    """A request's own truncation, within the model's (TEI's truncation_direction, vLLM's
    truncate_prompt_tokens, Cohere's max_tokens_per_doc): TextItem.options of a classifier."""

    max_tokens: int | None = None  # tokens kept, special tokens included; None: max_length
    side: str | None = None  # "right" or "left"; None: the version's truncation_side
    document_tokens: int | None = None  # a pair's second text cut to its first N tokens first


class TextItem(NamedTuple):
    """One text in the batcher's queue (the payload ModelHandle submits)."""

    text: str
    truncate: bool
    position: int  # in its request, for error messages
    request: object  # the same object for every text of a request
    pair: str | None = None  # the second text of a sentence pair
    options: object = None  # a token classifier's request options (engine/token_runner.py)


class TokenizeObserver(Protocol):
    def on_tokenize(self, seconds: float) -> None: ...


class PredictionObserver(Protocol):
    def observe(self, probabilities: np.ndarray) -> None: ...


def row_dtype(num_labels: int) -> np.dtype:
    """One text's result: what TextRunner returns per row and the handle reads back."""
    return np.dtype(
        [
            ("probabilities", np.float32, (num_labels,)),  # the activation's scores
            ("logits", np.float32, (num_labels,)),  # the graph's, before the activation (a run)
            ("num_tokens", np.int64),  # tokens the model saw
            ("full_tokens", np.int64),  # tokens before truncation
            ("tokenize_seconds", np.float64),  # tokenization of the text's batch
            ("cached", np.bool_),  # answered from the response cache, not run
            ("answered", np.bool_),  # run (or cached) and answered: what predictions count
        ]
    )


class Prepared(NamedTuple):
    """A batch tokenized and padded (TextRunner.prepare), waiting for its runs."""

    payloads: list[TextItem]
    out: np.ndarray  # the rows, tokenization's fields filled
    encoded: list[Row]  # each payload's tokens
    keep: list[int]  # the rows to run
    errors: dict[int, Exception] | None  # rows refused at tokenization
    lengths: list[int]  # tokens of each kept row
    inputs: tuple[np.ndarray, ...]  # the graph's inputs for the kept rows


class TextRunner:
    """Runs batches of TextItems through one tokenizer and onnxruntime session (thread-side).

    `session` and `tokenization` are plain attributes, so a test can put a failing one in."""

    def __init__(
        self,
        session: Session,
        tokenization: Tokenization,
        *,
        labels: Sequence[str],
        max_batch_tokens: int,
        activation: str = "softmax",
        name: str = "model",
        version: int = 0,
        observer: TokenizeObserver | None = None,
    ) -> None:
        self.session = session
        self.tokenization = tokenization
        self.labels = tuple(labels)
        self.max_length = tokenization.max_length
        self.max_batch_tokens = max_batch_tokens
        self.activation = activation
        self._activate = ACTIVATIONS[activation]
        self.name = name
        self.version = version
        self._observer = observer
        self.rows = row_dtype(len(self.labels))
        self.run_cost = RUN_COST_TOKENS.get(session.provider, RUN_COST_TOKENS_OTHER)
        # Characters per token seen so far, for the batcher's length estimate (written by the
        # inference thread, read on the loop: a float, replaced whole).
        self.chars_per_token = 4.0
        # token_type_ids are computed and fed only for a graph that takes them.
        self.feeds_token_type_ids = getattr(session, "takes_token_type_ids", False)
        # The response cache of this version (engine/cache.py), when the model has one: texts
        # that tokenize like a cached one are answered without a run, the others stored.
        self.cache: VersionCache | None = None
        self._cuts: dict[tuple[int, str], Tokenization] = {}  # requests' own truncations
        # Every answered row counted by its winning label (drift), once per batch here on the
        # inference thread rather than once per request on the event loop.
        self.predictions: PredictionObserver | None = None

    def estimate_lengths(
        self, texts: Sequence[str], pairs: Sequence[str | None] | None = None
    ) -> list[int]:
        """Each text's token count as the queue sees it before tokenization (from its length in
        characters, a pair's both texts): the queue sees a request at once, and a refused one
        costs no tokenizing."""
        limit, per_token = self.max_length, self.chars_per_token
        if pairs is not None:
            texts = [text + (pair or "") for text, pair in zip(texts, pairs, strict=True)]
        return [min(limit, int(len(text) / per_token) + 1) for text in texts]

    # -- load-time checks ------------------------------------------------------------------------

    def check(self) -> None:
        """Blocking: raise ModelCheckError unless model.onnx fits its tokenizer and manifest.

        Each check is one tiny run (at load, before any request can reach the version): every
        id the tokenizer can give must be one the model takes, max_length tokens must be a shape
        the graph accepts, the logits must be one per label, and the pad id a token of the
        vocabulary. A version that fails is refused; the one being served goes on."""
        tokenizer = self.tokenization.tokenizer
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        pad_id = self.tokenization.pad_token_id
        if tokenizer.id_to_token(pad_id) is None:
            raise ModelCheckError(
                f"the manifest's pad_token_id {pad_id} is not in the tokenizer's vocabulary "
                f"({len(vocab)} tokens)"
            )
        # Vocabulary vs embedding: the server has no `onnx` package to read the embedding's
        # size from the graph, so it is checked by behaviour: the tokenizer's largest id must
        # run and give finite logits. On CPU onnxruntime's Gather refuses an id beyond the
        # table; a provider that reads out of bounds instead may pass this check, and then the
        # batch a text with such an id is in still answers its other texts (see _run_range).
        largest = max(vocab.values())
        self._probe(
            [largest],
            f"the tokenizer's ids go up to {largest} ({len(vocab)} tokens) but the model "
            f"cannot take id {largest}: is its embedding smaller than the vocabulary?",
        )
        self._probe(
            [self.tokenization.unk_id] * self.max_length,
            f"the manifest's max_length is {self.max_length} but the model cannot take "
            f"{self.max_length} tokens",
        )

    def _probe(self, ids: list[int], failure: str) -> None:
        """Run one row of `ids`; ModelCheckError (`failure`, and why) unless it gives one finite
        logit per label."""
        row = np.asarray([ids], dtype=np.int64)
        try:
            logits = self.session.run(row, np.ones_like(row))
        except Exception as exc:
            raise ModelCheckError(f"{failure} (onnxruntime: {exc})") from None
        if logits.shape != (1, len(self.labels)):
            raise ModelCheckError(
                f"model.onnx gives {logits.shape[-1] if logits.ndim else 0} logits but the "
                f"manifest has {len(self.labels)} labels"
            )
        if not np.isfinite(logits).all():
            raise ModelCheckError(f"{failure} (its logits are not finite: {logits.tolist()})")

    def warmup(self, max_batch_size: int) -> None:
        """Blocking: run representative shapes through the session, then a real text."""
        # (one logit per label was checked before, by check(): the loader always runs it first)
        self.session.warmup(self.max_length, max_batch_size, self.tokenization.unk_id)
        output = self([TextItem(WARMUP_TEXT, True, 0, None)])
        sample = output.outputs["probabilities"]
        if sample.shape != (1, len(self.labels)) or not np.isfinite(sample).all():
            raise ValueError(f"model.onnx gives {sample!r} for a sample text")

    # -- the batch function ----------------------------------------------------------------------

    def __call__(self, payloads: list[TextItem]) -> BatchOutput:
        """The batcher's run_batch: tokenize, truncate (or refuse), then run the texts sorted by
        length as sub-batches (see split_runs). One output row per text (see self.rows)."""
        return self.run(self.prepare(payloads))

    def prepare(self, payloads: list[TextItem]) -> Prepared:
        """The host's half of a batch (tokenized, looked up in the cache, padded): a pipeline
        (engine/hub.py) prepares the next batch while `run` runs this one."""
        started = time.perf_counter()
        out = np.zeros(len(payloads), self.rows)
        encoded, keep, errors = self._tokenize(payloads, out)
        cache = self.cache
        if cache is not None:
            keep = self._answer_cached(cache, payloads, encoded, keep, out)
        tokenized = time.perf_counter()
        out["tokenize_seconds"] = tokenized - started
        if self._observer is not None:
            self._observer.on_tokenize(tokenized - started)
        lengths = [len(encoded[row].ids) for row in keep]
        # Padded once, sorted by length; each sub-batch is a slice as wide as its longest text.
        inputs = self._pad([encoded[row] for row in keep]) if keep else ()
        return Prepared(payloads, out, encoded, keep, errors, lengths, inputs)

    def run(self, prepared: Prepared) -> BatchOutput:
        """The model's half of a batch: its runs, the activation, the cache's new entries."""
        payloads, out, encoded, keep, errors, lengths, inputs = prepared
        runs: list[RunStats] = []
        if not keep:  # every text of the batch was refused (or answered from the cache)
            self._count_predictions(out)
            return BatchOutput(out, runs, errors)
        logits = np.empty((len(keep), len(self.labels)), np.float32)
        failed: dict[int, Exception] = {}  # index in `keep` -> why it failed, run alone
        for start, end in self.plan_runs(lengths):
            self._run_range(inputs, lengths, start, end, logits, runs, failed)
        if failed:
            logits[list(failed)] = 0.0  # rows never written: keep the activation off garbage
            errors = errors or {}
            errors.update(self._blame(payloads, keep, failed))
        out["probabilities"][keep] = self._activate(logits)
        out["logits"][keep] = logits
        answered = out["answered"]
        answered[keep] = True
        if failed:
            answered[[keep[index] for index in failed]] = False
        if self.cache is not None:
            for index, row in enumerate(keep):
                # (pairs: not cached; a request's own cut: not under its text, which the
                # handle looks up before tokenizing with the model's own truncation)
                if index not in failed and payloads[row].pair is None and not payloads[row].options:
                    self.cache.store(
                        payloads[row].text, encoded[row].ids, int(out["full_tokens"][row]),
                        out["probabilities"][row],
                    )  # fmt: skip
        self._count_predictions(out)
        return BatchOutput(out, runs, errors)

    def observe_output(self, output: BatchOutput) -> None:
        """The observations a batch run elsewhere (remote.EngineProcess) owes this process's
        metrics: its tokenization time and its answered rows by label."""
        out = output.outputs
        if self._observer is not None and len(out):
            self._observer.on_tokenize(float(out["tokenize_seconds"].max()))
        self._count_predictions(out)

    def _count_predictions(self, out: np.ndarray) -> None:
        """Count the batch's answered rows by winning label: not those refused or failed, nor
        the other texts of a refused request (they never ran)."""
        if self.predictions is None:
            return
        answered = out["answered"]
        probabilities = out["probabilities"]
        self.predictions.observe(probabilities if answered.all() else probabilities[answered])

    @staticmethod
    def _answer_cached(
        cache: VersionCache,
        payloads: list[TextItem],
        encoded: list[Row],
        keep: list[int],
        out: np.ndarray,
    ) -> list[int]:
        """Fill the rows whose ids (after truncation) are cached, and remember their texts
        (the next time they are answered before the queue); the rows left to run. Sentence
        pairs always run: the cache keys single texts (a pair's type ids are not in its ids)."""
        left = []
        for row in keep:
            ids = encoded[row].ids
            hit = None if payloads[row].pair is not None else cache.by_ids(ids)
            if hit is None:
                left.append(row)
                continue
            out["probabilities"][row] = hit
            out["cached"][row] = True
            out["answered"][row] = True
            if not payloads[row].options:  # (a request's own cut: not under its text)
                cache.store(payloads[row].text, ids, int(out["full_tokens"][row]), hit)
        return left

    def _pad(self, rows: list[Row]) -> tuple[np.ndarray, ...]:
        """The graph's inputs for `rows`: (input_ids, attention_mask[, token_type_ids])."""
        if self.feeds_token_type_ids:
            return tuple(self.tokenization.pad_rows(rows))
        return self.tokenization.pad([row.ids for row in rows])

    def _encode(self, payloads: list[TextItem]) -> list[Row | TokenizationError]:
        """Each payload's Row (single texts and pairs encoded apart: a batch may hold both;
        texts with a Cut of their own apart too)."""
        encoded: list[Row | TokenizationError] = [Row([], [], 0)] * len(payloads)
        groups: dict[tuple[bool, Cut | None], list[int]] = {}
        for row, p in enumerate(payloads):
            cut = p.options if isinstance(p.options, Cut) else None
            groups.setdefault((p.pair is not None, cut), []).append(row)
        for (paired, cut), rows in groups.items():
            texts = [payloads[row].text for row in rows]
            pairs = [payloads[row].pair or "" for row in rows] if paired else None
            if pairs is not None and cut is not None and cut.document_tokens is not None:
                pairs = self._first_tokens(pairs, cut.document_tokens)
            try:  # a failure refuses this group's texts only, never the rest of the batch
                tokenization = self.tokenization if cut is None else self._cut(cut)
                results: Sequence[Row | TokenizationError] = tokenization.rows(
                    texts, pairs, type_ids=self.feeds_token_type_ids
                )
            except TokenizationError as exc:  # e.g. max_length shorter than a pair's template
                results = [exc] * len(rows)
            for row, result in zip(rows, results, strict=True):
                encoded[row] = result
        return encoded

    def check_cut(self, cut: Cut) -> None:
        """ValidationError, before the request is queued, when its own truncation leaves no
        room for a token of its text beside the tokenizer's special tokens."""
        try:
            self._cut(cut)
        except TokenizationError:
            specials = self.tokenization.tokenizer.num_special_tokens_to_add(False)
            raise ValidationError(
                f"the request keeps {cut.max_tokens} token(s) of each text, which model "
                f"{self.name!r} needs for its {specials} special token(s) alone: keep at least "
                f"{specials + 1}"
            ) from None

    def _cut(self, cut: Cut) -> Tokenization:
        """The tokenization of a request's own Cut (kept per cut, a few dozen at most)."""
        base = self.tokenization
        length = min(cut.max_tokens or self.max_length, self.max_length)
        side = cut.side or base.truncation_side
        if (length, side) == (base.max_length, base.truncation_side):
            return base
        variant = self._cuts.get((length, side))
        if variant is None:
            variant = Tokenization(
                base.tokenizer, length, base.pad_token_id, unk_token_id=base.unk_token_id,
                truncation_side=side,
            )  # fmt: skip
            if len(self._cuts) < 64:
                self._cuts[(length, side)] = variant
        return variant

    def _first_tokens(self, texts: list[str], limit: int) -> list[str]:
        """Each text cut after its first `limit` tokens (by the tokenizer's character offsets:
        what the text is up to the end of its token number `limit`)."""
        encodings = self.tokenization.tokenizer.encode_batch(texts, add_special_tokens=False)
        return [
            text if len(e.offsets) <= limit else text[: e.offsets[limit - 1][1]]
            for text, e in zip(texts, encodings, strict=True)
        ]

    def _tokenize(
        self, payloads: list[TextItem], out: np.ndarray
    ) -> tuple[list[Row], list[int], dict[int, Exception] | None]:
        """Token rows per payload (cut to max_length where truncation is on), the rows that run
        (sorted by token length) and the rows refused (over-long without truncation, no tokens
        without an unknown token: their request's other texts do not run either). Fills out's
        num_tokens and full_tokens."""
        encoded = self._encode(payloads)
        full = out["full_tokens"]
        errors: dict[int, Exception] = {}
        keep: list[int] = []  # rows that run
        rows: list[Row] = []
        chars = tokens = 0
        for row, (payload, result) in enumerate(zip(payloads, encoded, strict=True)):
            encoding = result if isinstance(result, Row) else Row([], [], 0)
            rows.append(encoding)
            full[row] = encoding.length
            chars += len(payload.text) + len(payload.pair or "")
            tokens += encoding.length
            refused = self._refusal(payload, result)
            if refused is not None:
                errors[row] = refused
                continue
            keep.append(row)
        if errors:  # a refused request's other texts do not run either
            refused_requests = {id(payloads[row].request) for row in errors}
            keep = [row for row in keep if id(payloads[row].request) not in refused_requests]
        if tokens:
            self.chars_per_token = max(1.0, chars / tokens)
        keep.sort(key=lambda row: len(rows[row].ids))
        out["num_tokens"][keep] = [len(rows[row].ids) for row in keep]
        return rows, keep, errors or None

    def _refusal(self, payload: TextItem, result: Row | TokenizationError) -> Exception | None:
        """Why a text does not run (ValidationError), or None."""
        where = f"texts[{payload.position}]"
        if isinstance(result, TokenizationError):
            what = "a pair" if payload.pair is not None else "it"
            return ValidationError(f"{where}: model {self.name!r} cannot take {what}: {result}")
        if not result.ids:
            return ValidationError(
                f"{where} gives no tokens (nothing of it is left after the tokenizer's "
                f"normalization) and model {self.name!r} has no unknown token to stand for it"
            )
        if result.truncated and not payload.truncate:
            pair = "" if payload.pair is None else " with its text pair"
            return ValidationError(
                f"{where}{pair} is {result.length} tokens long; model {self.name!r} takes at "
                f"most {self.max_length} (send truncate=true to cut it, or shorten the text)"
            )
        return None

    def plan_runs(self, lengths: list[int]) -> list[tuple[int, int]]:
        """(start, end) of each sub-batch of `lengths` (ascending): split_runs, then any
        sub-batch over max_batch_tokens cut into pieces within it (the batcher budgets batches
        by estimated lengths; this holds every onnxruntime run to the budget in real tokens)."""
        budget = self.max_batch_tokens
        plan: list[tuple[int, int]] = []
        bounds = [0, *split_runs(lengths, self.run_cost), len(lengths)]
        for start, end in itertools.pairwise(bounds):
            step = max(1, budget // lengths[end - 1])
            plan.extend((s, min(end, s + step)) for s in range(start, end, step))
        return plan

    def _run_range(
        self,
        inputs: tuple[np.ndarray, ...],
        lengths: list[int],
        start: int,
        end: int,
        logits: np.ndarray,
        runs: list[RunStats],
        failed: dict[int, Exception],
    ) -> None:
        """Run rows start:end into `logits`; if the run fails, run each half again (down to
        single rows, recorded in `failed`), so that a text the model cannot take (an id its
        embedding lacks, a shape its graph refuses) fails alone, not the texts batched with it:
        2·log2(n) more runs for one bad text among n."""
        run_started = time.perf_counter()
        width = lengths[end - 1]
        try:
            result = self.session.run(
                *(np.ascontiguousarray(array[start:end, :width]) for array in inputs)
            )
            if logits.ndim == 3:  # a token classifier's (rows, tokens, labels), padded wider
                logits[start:end, :width] = result
            else:
                logits[start:end] = result
        except Exception as exc:
            if end - start == 1:
                failed[start] = exc
                return
            middle = (start + end) // 2
            for lo, hi in ((start, middle), (middle, end)):
                self._run_range(inputs, lengths, lo, hi, logits, runs, failed)
            return
        runs.append(
            RunStats(
                size=end - start,
                padded_tokens=(end - start) * width,
                real_tokens=sum(lengths[start:end]),
                seconds=time.perf_counter() - run_started,
            )
        )

    def _blame(
        self, payloads: list[TextItem], keep: list[int], failed: dict[int, Exception]
    ) -> dict[int, Exception]:
        """The errors of the rows that failed even alone: the texts' (INVALID_ARGUMENT) while
        the model runs others; the model's (raised: the batch fails, INTERNAL) when no text ran
        and it cannot even run the one-[UNK] row that passed at load (a device fault)."""
        if len(failed) == len(keep):
            unk = np.asarray([[self.tokenization.unk_id]], dtype=np.int64)
            try:
                self.session.run(unk, np.ones_like(unk))
            except Exception:
                raise next(iter(failed.values())) from None
        errors: dict[int, Exception] = {}
        for index, exc in failed.items():
            payload = payloads[keep[index]]
            logger.warning(
                "%s:%d: texts[%d] of a request fails alone; refusing it: %s",
                self.name, self.version, payload.position, exc,
            )  # fmt: skip
            errors[keep[index]] = ValidationError(
                f"texts[{payload.position}]: model {self.name!r} version {self.version} cannot "
                "take this text (the model fails on it alone; e.g. it holds a token the model "
                "does not know)"
            )
        return errors
