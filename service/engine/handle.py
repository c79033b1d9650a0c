"""A loaded model version: tokenizer + onnxruntime session + batcher behind `await classify()`.

This is the core API both front ends (textserve.v1 and the Open Inference Protocol) call; see
docs/architecture.md. Tokenization follows the contract exactly: ids cut to max_length, [UNK]
for a text with no tokens, [PAD] to the longest in the batch, mask 1 on real tokens.

A request's texts go into the batcher as they are; the inference worker tokenizes a whole batch,
sorts it by token length and runs it as one or more sub-batches (a split wherever the padding it
saves costs more than one more onnxruntime run), so a request costs one thread hop, not two, and
a batch of mixed lengths pads little. The batcher groups texts by an estimate of their token
count from their length in characters (the characters per token seen so far).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from textserve.artifact import Manifest
from textserve.service.config import BatcherConfig
from textserve.service.engine.batcher import (
    Batcher,
    BatchOutput,
    BatchResult,
    BatchStats,
    BatchTrace,
    RunStats,
)
from textserve.service.engine.subbatches import (
    RUN_COST_TOKENS,
    RUN_COST_TOKENS_OTHER,
    softmax,
    split_runs,
)
from textserve.service.errors import ValidationError
from textserve.tokenization import Tokenization

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from textserve.service.engine.runtime import Session
    from textserve.service.metrics import Metrics

logger = logging.getLogger(__name__)

# Only the first MAX_CHARS_PER_TOKEN x max_length characters of a text are tokenized: the model
# sees max_length tokens at most, and tokenizing is linear in characters (a 1 MB text held the
# shared tokenizer thread for 2-7 s, stalling every request). A token averages 2-5 characters
# (BPE, English); a text needs over 32 characters per token (long runs of whitespace, control or
# other characters the normalizer drops) before the cut changes what the model sees.
MAX_CHARS_PER_TOKEN = 32
# Run through tokenizer and model at warm-up: a tokenizer whose ids the model does not know
# fails here, before the version serves, not on the first request.
WARMUP_TEXT = "The quick brown fox jumps over the lazy dog. A gripping, beautifully acted film!"


class ModelCheckError(ValueError):
    """The model does not fit its tokenizer or manifest; `reason` is a load-failure label
    (textserve.service.metrics.LOAD_FAILURE_REASONS)."""

    def __init__(self, message: str, reason: str = "contract_mismatch") -> None:
        super().__init__(message)
        self.reason = reason


class _Text(NamedTuple):
    """One text in the batcher's queue (the payload ModelHandle gives it)."""

    text: str
    truncate: bool
    position: int  # in its request, for error messages
    request: object  # the same object for every text of a request


@dataclass(frozen=True)
class Timings:
    queue_seconds: float  # longest wait of any of the texts before its batch started
    tokenize_seconds: float  # tokenization of the batches that carried the texts (the longest)
    inference_seconds: float  # summed run time of those batches, less the tokenization
    total_seconds: float  # from the call to its answer


@dataclass(frozen=True)
class ClassifyResult:
    probabilities: np.ndarray  # float32 (n, num_labels), rows in input order
    num_tokens: np.ndarray  # int64 (n,), tokens the model saw per text
    truncated: np.ndarray  # bool (n,)
    timings: Timings


class ModelHandle:
    """One servable model version. Create through ModelRepository; use on its event loop."""

    def __init__(
        self,
        manifest: Manifest,
        path: Path,
        session: Session,
        tokenizer: Tokenizer,
        *,
        batcher_config: BatcherConfig,
        max_texts_per_request: int,
        inference_workers: int = 1,
        metrics: Metrics | None = None,
    ) -> None:
        self.manifest = manifest
        self.path = path
        self.name = manifest.name
        self.version = manifest.version
        self.labels: tuple[str, ...] = tuple(manifest.labels)
        self.max_length = manifest.max_length
        self.provider = session.provider
        self.max_texts_per_request = max_texts_per_request
        self._session = session
        # THE tokenization (textserve.tokenization): a tokenizer without [UNK] is refused here
        self._tokenization = Tokenization(tokenizer, manifest.max_length, manifest.pad_token_id)
        self._metrics = metrics
        self._observer = None if metrics is None else metrics.for_model(self.name)
        self._run_cost = RUN_COST_TOKENS.get(session.provider, RUN_COST_TOKENS_OTHER)
        # Characters per token seen so far, for the batcher's length estimate (written by the
        # inference worker, read on the loop: a float, replaced whole).
        self._chars_per_token = 4.0
        # One text's result: what _run_texts returns per row and classify() reads back.
        self._rows = np.dtype(
            [
                ("probabilities", np.float32, (len(self.labels),)),
                ("num_tokens", np.int64),  # tokens the model saw
                ("full_tokens", np.int64),  # tokens before truncation
                ("tokenize_seconds", np.float64),  # tokenization of the text's batch
            ]
        )
        # Requests that picked this handle and have not finished (tokenizing, queued or running):
        # a retired version is released only once this reaches zero (see drain()).
        self._active = 0
        self._inactive: asyncio.Event | None = None
        self.batcher: Batcher[_Text] = Batcher(
            self._run_texts,
            batcher_config,
            workers=inference_workers,
            observer=self._observer,
            name=f"{self.name}:{self.version}",
            trace_attributes={
                "textserve.model": self.name,
                "textserve.model.version": self.version,
                "textserve.provider": self.provider,
            },
        )
        # Every answer counted by its winning label (drift monitoring).
        self._predictions = (
            None
            if metrics is None
            else metrics.for_predictions(self.name, self.version, self.labels)
        )

    # -- lifecycle (ModelRepository calls these) -----------------------------------------------

    def check(self) -> None:
        """Blocking: raise ModelCheckError unless model.onnx fits its tokenizer and manifest.

        Each check is one tiny run (at load, before any request can reach the version): every
        id the tokenizer can give must be one the model takes, max_length tokens must be a shape
        the graph accepts, the logits must be one per label, and the pad id a token of the
        vocabulary. A version that fails is refused; the one being served goes on."""
        tokenizer = self._tokenization.tokenizer
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        pad_id = self._tokenization.pad_token_id
        if tokenizer.id_to_token(pad_id) is None:
            raise ModelCheckError(
                f"the manifest's pad_token_id {pad_id} is not in the tokenizer's vocabulary "
                f"({len(vocab)} tokens)"
            )
        # Vocabulary vs embedding: the server has no `onnx` package to read the embedding's
        # size from the graph, so it is checked by behaviour: the tokenizer's largest id must
        # run and give finite logits. On CPU onnxruntime's Gather refuses an id beyond the
        # table; a provider that reads out of bounds instead may pass this check, and then the
        # batch a text with such an id is in still answers its other texts (see _run_texts).
        largest = max(vocab.values())
        self._probe(
            [largest],
            f"the tokenizer's ids go up to {largest} ({len(vocab)} tokens) but the model "
            f"cannot take id {largest}: is its embedding smaller than the vocabulary?",
        )
        self._probe(
            [self._tokenization.unk_id] * self.max_length,
            f"the manifest's max_length is {self.max_length} but the model cannot take "
            f"{self.max_length} tokens",
        )

    def _probe(self, ids: list[int], failure: str) -> None:
        """Run one row of `ids`; ModelCheckError (`failure`, and why) unless it gives one finite
        logit per label."""
        row = np.asarray([ids], dtype=np.int64)
        try:
            logits = self._session.run(row, np.ones_like(row))
        except Exception as exc:
            raise ModelCheckError(f"{failure} (onnxruntime: {exc})") from None
        if logits.shape != (1, len(self.labels)):
            raise ModelCheckError(
                f"model.onnx gives {logits.shape[-1] if logits.ndim else 0} logits but the "
                f"manifest has {len(self.labels)} labels"
            )
        if not np.isfinite(logits).all():
            raise ModelCheckError(f"{failure} (its logits are not finite: {logits.tolist()})")

    def warmup(self) -> None:
        """Blocking: run representative shapes through the session (before SERVING)."""
        # (one logit per label was checked before, by check(): the loader always runs it first)
        self._session.warmup(
            self.max_length, self.batcher.config.max_batch_size, self._tokenization.unk_id
        )
        output = self._run_texts([_Text(WARMUP_TEXT, True, 0, None)])
        sample = output.outputs["probabilities"]
        if sample.shape != (1, len(self.labels)) or not np.isfinite(sample).all():
            raise ValueError(f"model.onnx gives {sample!r} for a sample text")

    def start(self) -> None:
        self.batcher.start()

    def flush(self) -> None:
        self.batcher.flush()

    async def close(self, timeout: float | None = 0.0) -> None:
        await self.batcher.close(timeout)

    async def drain(self, timeout: float | None) -> None:
        """Retire this version once the repository no longer hands it out: wait up to `timeout`
        seconds (None: no limit) for the requests that already picked it to finish here, then
        close the batcher (failing anything left with NotReadyError) and release the session."""
        started = time.monotonic()
        self.batcher.flush()  # no new traffic comes: run what is queued without waiting to fill
        if self._active:
            self._inactive = asyncio.Event()
            try:
                await asyncio.wait_for(self._wait_inactive(), timeout)
            except TimeoutError:
                logger.warning(
                    "%s:%d: %d requests still running after %.1fs; cancelling them",
                    self.name, self.version, self._active, timeout,
                )  # fmt: skip
        left = None if timeout is None else max(0.0, timeout - (time.monotonic() - started))
        await self.batcher.close(left)
        self._session.close()

    async def _wait_inactive(self) -> None:
        assert self._inactive is not None
        while self._active:
            self._inactive.clear()
            await self._inactive.wait()

    def stats(self) -> BatchStats:
        return self.batcher.snapshot()

    # -- the API ---------------------------------------------------------------------------------

    async def classify(
        self,
        texts: Sequence[str],
        *,
        truncate: bool = True,
        deadline: float | None = None,
        trace: BatchTrace | None = None,
    ) -> ClassifyResult:
        """Probabilities for each text. `deadline`: absolute time.monotonic() seconds;
        `trace`: the request's trace, linked from the span of each batch that carries it.

        Raises ValidationError, OverloadedError, DeadlineExceededError, NotReadyError.
        """
        # Counted before the first await, i.e. in the same loop step as repository.get(): a
        # version retired meanwhile still waits for this request (see drain()).
        self._active += 1
        try:
            return await self._classify(texts, truncate, deadline, trace)
        finally:
            self._finish_one()

    def classify_nowait(
        self,
        texts: Sequence[str],
        done: Callable[[ClassifyResult | None, BaseException | None], None],
        *,
        truncate: bool = True,
        deadline: float | None = None,
        trace: BatchTrace | None = None,
    ) -> asyncio.Future[None]:
        """classify() without a coroutine, for a caller with many requests in flight (a stream):
        raises what classify() raises before queueing, else calls `done(result, None)` or
        `done(None, exception)` on the loop. Cancel the returned future to give up on it."""
        started = time.perf_counter()
        payloads, lengths, cut = self._prepare(texts, truncate)

        def finished(batch: BatchResult | None, exc: BaseException | None) -> None:
            self._finish_one()
            if batch is None:
                done(None, exc)
                return
            try:
                result = self._result(batch, cut, started)
            except Exception as error:  # pragma: no cover - reading our own rows
                done(None, error)
                return
            done(result, None)

        self._active += 1  # in the same loop step as repository.get(): see classify()
        try:
            return self.batcher.submit_nowait(
                payloads, lengths, finished, deadline=deadline, trace=trace
            )
        except BaseException:
            self._finish_one()
            raise

    def _finish_one(self) -> None:
        self._active -= 1
        if not self._active and self._inactive is not None:
            self._inactive.set()

    async def _classify(
        self,
        texts: Sequence[str],
        truncate: bool,
        deadline: float | None,
        trace: BatchTrace | None,
    ) -> ClassifyResult:
        started = time.perf_counter()
        payloads, lengths, cut = self._prepare(texts, truncate)
        result = await self.batcher.submit(payloads, lengths, deadline=deadline, trace=trace)
        return self._result(result, cut, started)

    def _prepare(
        self, texts: Sequence[str], truncate: bool
    ) -> tuple[list[_Text], list[int], list[int]]:
        """Validate a request's texts: the batcher's payloads and estimated lengths, and the
        positions of the texts cut by characters (see MAX_CHARS_PER_TOKEN)."""
        self._validate(texts)
        max_chars = MAX_CHARS_PER_TOKEN * self.max_length
        cut = [index for index, text in enumerate(texts) if len(text) > max_chars]
        if cut:
            if not truncate:
                raise ValidationError(
                    f"texts[{cut[0]}] is {len(texts[cut[0]])} characters long; model "
                    f"{self.name!r} takes at most {self.max_length} tokens, and without "
                    f"truncation at most {max_chars} characters (send truncate=true to cut it, "
                    "or shorten the text)"
                )
            texts = [text[:max_chars] for text in texts]
        # Tokenized in the batch, by the inference worker: the queue (and its refusal when full,
        # before any tokenizing) sees the texts at once, with their length in tokens estimated.
        limit, per_token = self.max_length, self._chars_per_token
        payloads = [_Text(text, truncate, index, texts) for index, text in enumerate(texts)]
        lengths = [min(limit, int(len(text) / per_token) + 1) for text in texts]
        return payloads, lengths, cut

    def _result(self, result: BatchResult, cut: list[int], started: float) -> ClassifyResult:
        rows = result.outputs
        num_tokens = rows["num_tokens"].astype(np.int64)
        truncated = rows["full_tokens"] > num_tokens
        if cut:
            truncated[cut] = True  # cut by characters: the model did not see all of the text
        tokenize_seconds = float(rows["tokenize_seconds"].max())
        probabilities = np.ascontiguousarray(rows["probabilities"])
        if self._predictions is not None:
            self._predictions.observe(
                probabilities.argmax(axis=1).tolist(), probabilities.max(axis=1).tolist()
            )
        return ClassifyResult(
            probabilities=probabilities,
            num_tokens=num_tokens,
            truncated=truncated,
            timings=Timings(
                queue_seconds=result.queue_seconds,
                tokenize_seconds=tokenize_seconds,
                inference_seconds=max(0.0, result.inference_seconds - tokenize_seconds),
                total_seconds=time.perf_counter() - started,
            ),
        )

    def _validate(self, texts: Sequence[str]) -> None:
        if not texts:
            raise ValidationError("no texts: send at least one text")
        if len(texts) > self.max_texts_per_request:
            raise ValidationError(
                f"{len(texts)} texts in one request; the limit is {self.max_texts_per_request} "
                "(split the request)"
            )
        for index, text in enumerate(texts):
            if not isinstance(text, str):
                raise ValidationError(f"texts[{index}] is not a string")
            if not text or text.isspace():
                raise ValidationError(f"texts[{index}] is empty; every text needs some content")

    # -- executor-side work ----------------------------------------------------------------------

    def _run_texts(self, payloads: list[_Text]) -> BatchOutput:
        """The batcher's run_batch: tokenize, truncate (or refuse), then run the texts sorted by
        length as sub-batches (see split_runs). One output row per text (see self._rows)."""
        started = time.perf_counter()
        encoded = self._tokenization.full_ids([p.text for p in payloads])
        limit = self.max_length
        out = np.zeros(len(payloads), self._rows)
        full = out["full_tokens"]
        errors: dict[int, Exception] | None = None
        keep: list[int] = []  # rows that run
        chars = tokens = 0
        for row, (payload, ids) in enumerate(zip(payloads, encoded, strict=True)):
            n = full[row] = len(ids)
            chars += len(payload.text)
            tokens += n
            if n > limit:
                if not payload.truncate:
                    errors = errors or {}
                    errors[row] = ValidationError(
                        f"texts[{payload.position}] is {n} tokens long; model {self.name!r} takes "
                        f"at most {limit} (send truncate=true to cut it, or shorten the text)"
                    )
                    continue
                encoded[row] = ids[:limit]
            keep.append(row)
        if errors:  # a refused request's other texts do not run either
            refused = {id(payloads[row].request) for row in errors}
            keep = [row for row in keep if id(payloads[row].request) not in refused]
        if tokens:
            self._chars_per_token = max(1.0, chars / tokens)
        keep.sort(key=lambda row: len(encoded[row]))
        lengths = [len(encoded[row]) for row in keep]
        out["num_tokens"][keep] = lengths
        tokenized = time.perf_counter()
        out["tokenize_seconds"] = tokenized - started
        if self._observer is not None:
            self._observer.on_tokenize(tokenized - started)
        runs: list[RunStats] = []
        if not keep:  # every text of the batch was refused
            return BatchOutput(out, runs, errors)
        # Padded once, sorted by length; each sub-batch is a slice as wide as its longest text.
        input_ids, attention_mask = self._tokenization.pad([encoded[row] for row in keep])
        logits = np.empty((len(keep), len(self.labels)), np.float32)
        failed: dict[int, Exception] = {}  # index in `keep` -> why it failed, run alone
        for start, end in self._plan_runs(lengths):
            self._run_range(input_ids, attention_mask, lengths, start, end, logits, runs, failed)
        if failed:
            logits[list(failed)] = 0.0  # rows never written: keep softmax off garbage
            errors = errors or {}
            errors.update(self._blame(payloads, keep, failed))
        out["probabilities"][keep] = softmax(logits)
        return BatchOutput(out, runs, errors)

    def _run_range(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
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
            logits[start:end] = self._session.run(
                np.ascontiguousarray(input_ids[start:end, :width]),
                np.ascontiguousarray(attention_mask[start:end, :width]),
            )
        except Exception as exc:
            if end - start == 1:
                failed[start] = exc
                return
            middle = (start + end) // 2
            for lo, hi in ((start, middle), (middle, end)):
                self._run_range(input_ids, attention_mask, lengths, lo, hi, logits, runs, failed)
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
        self, payloads: list[_Text], keep: list[int], failed: dict[int, Exception]
    ) -> dict[int, Exception]:
        """The errors of the rows that failed even alone: the texts' (INVALID_ARGUMENT) while
        the model runs others; the model's (raised: the batch fails, INTERNAL) when no text ran
        and it cannot even run the one-[UNK] row that passed at load (a device fault)."""
        if len(failed) == len(keep):
            unk = np.asarray([[self._tokenization.unk_id]], dtype=np.int64)
            try:
                self._session.run(unk, np.ones_like(unk))
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

    def _plan_runs(self, lengths: list[int]) -> list[tuple[int, int]]:
        """(start, end) of each sub-batch of `lengths` (ascending): split_runs, then any
        sub-batch over max_batch_tokens cut into pieces within it (the batcher budgets batches
        by estimated lengths; this holds every onnxruntime run to the budget in real tokens)."""
        budget = self.batcher.config.max_batch_tokens
        plan: list[tuple[int, int]] = []
        bounds = [0, *split_runs(lengths, self._run_cost), len(lengths)]
        for start, end in itertools.pairwise(bounds):
            step = max(1, budget // lengths[end - 1])
            plan.extend((s, min(end, s + step)) for s in range(start, end, step))
        return plan
