"""A loaded model version behind `await classify()`: validate → submit → result, and drain.

This is the core API every front end (textserve.v1, the Open Inference Protocol) calls; see
docs/architecture.md. The handle validates a request's texts and submits them as they are to
its batcher, whose batch function, inference.TextRunner, tokenizes and runs whole batches on
the inference thread (one thread hop per request); the handle turns the rows that come back
into a ClassifyResult. The batcher groups texts by an estimate of their token count from their
length in characters (the characters per token the runner has seen so far).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from textserve.artifact import Manifest
from textserve.service.config import BatcherConfig
from textserve.service.engine.batcher import Batcher
from textserve.service.engine.batches import BatchOutput, BatchResult, BatchStats, BatchTrace
from textserve.service.engine.batches import Timings as Timings  # (its home: batches.py)
from textserve.service.engine.cache import Hit, VersionCache
from textserve.service.engine.inference import Cut, TextItem
from textserve.service.engine.inference import (
    ModelCheckError as ModelCheckError,  # re-exported: the repository's loader catches it
)
from textserve.service.engine.token_runner import TagRequest, TagResult, TokenRunner, runner_for
from textserve.service.errors import LimitExceededError, ValidationError
from textserve.tokenization import Tokenization

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from textserve.service.engine.remote import EngineProcess
    from textserve.service.engine.runtime import Session
    from textserve.service.metrics import Metrics

logger = logging.getLogger(__name__)

# Only the first MAX_CHARS_PER_TOKEN x max_length characters of a text are tokenized: the model
# sees max_length tokens at most, and tokenizing is linear in characters (a 1 MB text held the
# shared tokenizer thread for 2-7 s, stalling every request). A token averages 2-5 characters
# (BPE, English); a text needs over 32 characters per token (long runs of whitespace, control or
# other characters the normalizer drops) before the cut changes what the model sees.
MAX_CHARS_PER_TOKEN = 32


@dataclass(frozen=True)
class ClassifyResult:
    # float32 (n, num_labels), rows in input order: the activation's scores (softmax or sigmoid
    # probabilities, or a regression model's raw output)
    probabilities: np.ndarray
    num_tokens: np.ndarray  # int64 (n,), tokens the model saw per text
    truncated: np.ndarray  # bool (n,)
    timings: Timings
    cached: np.ndarray | None = None  # bool (n,): answered from the response cache; None: none
    windows: np.ndarray | None = None  # int64 (n,): windows per text, when split (windows.py)
    # float32 (n, num_labels): the graph's logits, when every row ran (none from the cache)
    logits: np.ndarray | None = None

    @property
    def cached_count(self) -> int:
        return 0 if self.cached is None else int(self.cached.sum())


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
        inference_nice: int = 0,
        metrics: Metrics | None = None,
    ) -> None:
        self.manifest = manifest
        self.path = path
        self.name = manifest.name
        self.version = manifest.version
        self.labels: tuple[str, ...] = tuple(manifest.labels)
        self.max_length = manifest.max_length
        self.provider = session.provider
        self.precision = manifest.precision  # fp32, fp16, int8: the graph's (the logits: float32)
        self.max_texts_per_request = max_texts_per_request
        # Where each version runs, logged (GetModel and textserve_model_info say it too).
        logger.info(
            "model %s version %d runs on %s, %s weights, I/O binding %s%s",
            self.name, self.version, self.provider, self.precision,
            "on" if session.io_binding else "off",
            "".join(f", {k}={v}" for k, v in session.provider_options.items()),
        )  # fmt: skip
        observer = None if metrics is None else metrics.for_model(self.name)
        # The batch function. THE tokenization (textserve.tokenization), as the manifest says:
        # a format 1 version whose tokenizer has no [UNK] is refused here.
        self.runner = runner_for(
            manifest,
            session,
            Tokenization.for_manifest(tokenizer, manifest),
            max_batch_tokens=batcher_config.max_batch_tokens,
            max_windows=max_texts_per_request,
            observer=observer,
        )
        # Requests that picked this handle and have not finished (tokenizing, queued or running):
        # a retired version is released only once this reaches zero (see drain()).
        self._active = 0
        self._inactive: asyncio.Event | None = None
        self._engine: EngineProcess | None = None  # --engine process: where batches run
        self.batcher: Batcher[TextItem] = Batcher(
            self.runner,
            batcher_config,
            workers=inference_workers,
            nice=inference_nice,
            observer=observer,
            name=f"{self.name}:{self.version}",
            trace_attributes={
                "textserve.model": self.name,
                "textserve.model.version": self.version,
                "textserve.provider": self.provider,
            },
        )
        if metrics is not None and isinstance(self.runner, TokenRunner):
            self.runner.entity_observer = metrics.for_entities(self.name, self.version, self.labels)
        # The model's response cache as this version sees it (use_cache; None: no cache).
        self.cache: VersionCache | None = None
        # Every answer counted by its winning label (drift monitoring): the rows a batch
        # answered by the runner, once per batch; those answered from the cache here.
        self._predictions = (
            None
            if metrics is None
            else metrics.for_predictions(self.name, self.version, self.labels)
        )

    # -- lifecycle (ModelRepository calls these) -----------------------------------------------

    def check(self) -> None:
        """Blocking: ModelCheckError unless the model fits its tokenizer and manifest."""
        self.runner.check()

    def warmup(self) -> None:
        """Blocking: run representative shapes through the session (before SERVING)."""
        self.runner.warmup(self.batcher.config.max_batch_size)

    def use_cache(self, cache: VersionCache | None) -> None:
        """Answer repeated texts from `cache` (before it serves: the repository calls this).
        A token classifier keeps no cache (its answers are entities, not a row of scores)."""
        if self.tags_tokens:
            return
        self.cache = self.runner.cache = cache

    def use_engine(self, engine: EngineProcess) -> None:
        """Run this version's batches in `engine` (--engine process), before start(): this
        process keeps the check, the warm-up, the queue and the metrics."""
        runner = self.runner

        def run_batch(payloads: list[TextItem]) -> BatchOutput:
            output = engine(payloads)
            runner.observe_output(output)
            return output

        self._engine = engine
        self.batcher.run_batch = run_batch

    async def _close_engine(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            await asyncio.to_thread(engine.close)

    def start(self) -> None:
        self.runner.predictions = self._predictions  # from now on (warm-up runs are not answers)
        self.batcher.start()

    def flush(self) -> None:
        self.batcher.flush()

    async def close(self, timeout: float | None = 0.0) -> None:
        await self.batcher.close(timeout)
        await self._close_engine()

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
        self.runner.session.close()
        await self._close_engine()

    async def _wait_inactive(self) -> None:
        assert self._inactive is not None
        while self._active:
            self._inactive.clear()
            await self._inactive.wait()

    @property
    def takes_pairs(self) -> bool:
        """Whether the tokenizer has a pair template (sentence pairs are refused otherwise)."""
        return self.runner.tokenization.takes_pairs

    def stats(self) -> BatchStats:
        return self.batcher.snapshot()

    # -- the API ---------------------------------------------------------------------------------

    async def classify(
        self,
        texts: Sequence[str],
        *,
        pairs: Sequence[str | None] | None = None,
        truncate: bool = True,
        deadline: float | None = None,
        trace: BatchTrace | None = None,
        cut: Cut | None = None,
    ) -> ClassifyResult:
        """Scores for each text (the version's activation). `pairs`: each text's second text
        (sentence pairs), or None; `deadline`: absolute time.monotonic() seconds; `trace`: the
        request's trace, linked from the span of each batch that carries it; `cut`: the
        request's own truncation (within the model's; implies truncate).

        Raises ValidationError, OverloadedError, DeadlineExceededError, NotReadyError.
        """
        started = time.perf_counter()
        # Counted before the first await, i.e. in the same loop step as repository.get(): a
        # version retired meanwhile still waits for this request (see drain()).
        self._active += 1
        try:
            payloads, lengths, shortened = self._prepare(texts, pairs, truncate, cut)
            hits = None if cut is not None else self._cached(payloads, truncate)
            if hits is None:
                batch = await self.batcher.submit(payloads, lengths, deadline=deadline, trace=trace)
                return self._result(batch, shortened, started)
            # Hits answered here, before the queue; only the misses are queued.
            misses = [i for i, hit in enumerate(hits) if hit is None]
            ran: BatchResult | None = None
            if misses:
                ran = await self.batcher.submit(
                    [payloads[i] for i in misses],
                    [lengths[i] for i in misses],
                    deadline=deadline,
                    trace=trace,
                )
            return self._merged(hits, misses, ran, shortened, started)
        finally:
            self._finish_one()

    def classify_nowait(
        self,
        texts: Sequence[str],
        done: Callable[[ClassifyResult | None, BaseException | None], None],
        *,
        pairs: Sequence[str | None] | None = None,
        truncate: bool = True,
        deadline: float | None = None,
        trace: BatchTrace | None = None,
    ) -> asyncio.Future[None]:
        """classify() without a coroutine, for a caller with many requests in flight (a stream):
        raises what classify() raises before queueing, else calls `done(result, None)` or
        `done(None, exception)` on the loop. Cancel the returned future to give up on it."""
        started = time.perf_counter()
        payloads, lengths, cut = self._prepare(texts, pairs, truncate)
        hits = self._cached(payloads, truncate)
        misses = list(range(len(payloads))) if hits is None else [
            i for i, hit in enumerate(hits) if hit is None
        ]  # fmt: skip

        def finished(batch: BatchResult | None, exc: BaseException | None) -> None:
            self._finish_one()
            if batch is None and misses:
                done(None, exc)
                return
            try:
                if hits is None:
                    assert batch is not None
                    result = self._result(batch, cut, started)
                else:
                    result = self._merged(hits, misses, batch, cut, started)
            except Exception as error:  # pragma: no cover - reading our own rows
                done(None, error)
                return
            done(result, None)

        self._active += 1  # in the same loop step as repository.get(): see classify()
        if not misses:  # every text answered from the cache: nothing to queue
            # `done` on the loop's next step, as the batcher calls it: never before this returns
            answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            answered.add_done_callback(lambda _: finished(None, None))
            answered.set_result(None)
            return answered
        try:
            if hits is not None:
                payloads = [payloads[i] for i in misses]
                lengths = [lengths[i] for i in misses]
            return self.batcher.submit_nowait(
                payloads, lengths, finished, deadline=deadline, trace=trace
            )
        except BaseException:
            self._finish_one()
            raise

    @property
    def tags_tokens(self) -> bool:
        """A token classifier (tag(), not classify())."""
        return isinstance(self.runner, TokenRunner)

    async def tag(
        self,
        texts: Sequence[str],
        request: TagRequest,
        *,
        truncate: bool = True,
        deadline: float | None = None,
        trace: BatchTrace | None = None,
    ) -> TagResult:
        """Each text's entities (a token classifier's). Raises what classify() raises."""
        started = time.perf_counter()
        self._active += 1  # in the same loop step as repository.get(): see classify()
        try:
            self._validate(texts)
            payloads = [
                TextItem(text, truncate, index, texts, None, request)
                for index, text in enumerate(texts)
            ]
            lengths = self.runner.estimate_lengths(texts)
            batch = await self.batcher.submit(payloads, lengths, deadline=deadline, trace=trace)
        finally:
            self._finish_one()
        rows = batch.outputs
        tokenize = float(rows["tokenize_seconds"].max())
        return TagResult(
            entities=rows["entities"].tolist(),
            num_tokens=rows["num_tokens"].astype(np.int64),
            truncated=rows["full_tokens"] > rows["num_tokens"],
            windows=rows["windows"].astype(np.int64),
            timings=Timings(
                batch.queue_seconds,
                tokenize,
                max(0.0, batch.inference_seconds - tokenize),
                time.perf_counter() - started,
            ),
        )

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """A request in flight for the block, as classify() counts one: a caller that awaits
        something of its own between repository.get() and classify() (windows.py splits long
        texts on a thread) enters it in the same loop step as get(), so that a version retired
        meanwhile waits for the request instead of closing under it (see drain())."""
        self._active += 1
        try:
            yield
        finally:
            self._finish_one()

    def _finish_one(self) -> None:
        self._active -= 1
        if not self._active and self._inactive is not None:
            self._inactive.set()

    def validate(self, texts: Sequence[str], pairs: Sequence[str | None] | None = None) -> None:
        """The checks classify() runs first on a request's texts and pairs, for a caller that
        works on them before (windows.py splits them): ValidationError, LimitExceededError."""
        if self.tags_tokens:
            raise ValidationError(
                f"model {self.name!r} is a token classifier (entities per text): send it to Tag "
                "(POST /v1/tag); Classify is for sequence classifiers"
            )
        self._validate(texts)
        if pairs is not None:
            self._validate_pairs(texts, pairs)

    def _prepare(
        self,
        texts: Sequence[str],
        pairs: Sequence[str | None] | None,
        truncate: bool,
        cut: Cut | None = None,
    ) -> tuple[list[TextItem], list[int], list[int]]:
        """Validate a request's texts (and pairs): the batcher's payloads and estimated
        lengths, and the positions of the texts cut by characters (see MAX_CHARS_PER_TOKEN)."""
        self.validate(texts, pairs)
        if cut is not None and cut.max_tokens is not None:
            self.runner.check_cut(cut)
        truncate = truncate or cut is not None
        max_chars = MAX_CHARS_PER_TOKEN * self.max_length
        shortened = self._cut_by_characters(texts, max_chars, "texts", truncate)
        if pairs is not None:
            shortened = sorted(
                {
                    *shortened,
                    *self._cut_by_characters(
                        [p or "" for p in pairs], max_chars, "text_pairs", truncate
                    ),
                }
            )
        if shortened:
            side = (cut.side if cut else None) or self.runner.tokenization.truncation_side
            texts = _shorten(texts, max_chars, side)
            pairs = None if pairs is None else [
                None if p is None else p[-max_chars:] if side == "left" else p[:max_chars]
                for p in pairs
            ]  # fmt: skip
        # Tokenized in the batch, by the inference worker: the queue (and its refusal when full,
        # before any tokenizing) sees the texts at once, with their length in tokens estimated.
        if pairs is None:
            payloads = [
                TextItem(text, truncate, index, texts, None, cut)
                for index, text in enumerate(texts)
            ]
        else:
            payloads = [
                TextItem(text, truncate, index, texts, pair, cut)
                for index, (text, pair) in enumerate(zip(texts, pairs, strict=True))
            ]
        return payloads, self.runner.estimate_lengths(texts, pairs), shortened

    def _cut_by_characters(
        self, texts: Sequence[str], max_chars: int, field: str, truncate: bool
    ) -> list[int]:
        """Positions of the texts over `max_chars`; ValidationError for one without truncate."""
        cut = [index for index, text in enumerate(texts) if len(text) > max_chars]
        if cut and not truncate:
            raise ValidationError(
                f"{field}[{cut[0]}] is {len(texts[cut[0]])} characters long; model "
                f"{self.name!r} takes at most {self.max_length} tokens, and without "
                f"truncation at most {max_chars} characters (send truncate=true to cut it, "
                "or shorten the text)"
            )
        return cut

    def _cached(self, payloads: list[TextItem], truncate: bool) -> list[Hit | None] | None:
        """Each text's cached answer or None (a miss); None without a cache, and for sentence
        pairs (the cache keys single texts)."""
        if self.cache is None or any(p.pair is not None for p in payloads):
            return None
        return self.cache.lookup([p.text for p in payloads], truncate)

    def _merged(
        self,
        hits: list[Hit | None],
        misses: list[int],
        batch: BatchResult | None,
        cut: list[int],
        started: float,
    ) -> ClassifyResult:
        """The answers from the cache and those of the batch that ran the misses, in order."""
        n = len(hits)
        if not misses:  # all from the cache: the common case of a hit, built in one go
            found = [hit for hit in hits if hit is not None]
            probabilities = np.array([h.probabilities for h in found])
            self._observe(probabilities)
            return self._answer(
                probabilities,
                np.array([h.num_tokens for h in found], np.int64),
                np.array([h.full_tokens > h.num_tokens for h in found]) | _marks(n, cut),
                np.ones(n, np.bool_),
                Timings(0.0, 0.0, 0.0, time.perf_counter() - started),
            )
        probabilities = np.empty((n, len(self.labels)), np.float32)
        num_tokens = np.zeros(n, np.int64)
        truncated = np.zeros(n, np.bool_)
        cached = np.zeros(n, np.bool_)
        for i, hit in enumerate(hits):
            if hit is not None:
                probabilities[i] = hit.probabilities
                num_tokens[i] = hit.num_tokens
                truncated[i] = hit.full_tokens > hit.num_tokens
                cached[i] = True
        self._observe(probabilities[cached])  # (the batch's rows were counted by the runner)
        queue = tokenize = inference = 0.0
        if batch is not None and misses:
            rows = batch.outputs
            probabilities[misses] = rows["probabilities"]
            num_tokens[misses] = rows["num_tokens"]
            truncated[misses] = rows["full_tokens"] > rows["num_tokens"]
            cached[misses] = rows["cached"]
            queue, tokenize = batch.queue_seconds, float(rows["tokenize_seconds"].max())
            inference = max(0.0, batch.inference_seconds - tokenize)
        return self._answer(
            probabilities,
            num_tokens,
            truncated | _marks(n, cut),
            cached,
            Timings(queue, tokenize, inference, time.perf_counter() - started),
        )

    def _answer(
        self,
        probabilities: np.ndarray,
        num_tokens: np.ndarray,
        truncated: np.ndarray,
        cached: np.ndarray,
        timings: Timings,
    ) -> ClassifyResult:
        """A result with the cache's share counted."""
        cache = self.cache  # (None if the model's cache was turned off meanwhile)
        if cache is not None:
            hit_count = int(np.count_nonzero(cached))
            cache.count(hit_count, len(cached) - hit_count)
        return ClassifyResult(probabilities, num_tokens, truncated, timings, cached)

    def _observe(self, probabilities: np.ndarray) -> None:
        """Count answers from the cache (the runner counts those of its batches)."""
        if self._predictions is not None and len(probabilities):
            self._predictions.observe(probabilities)

    def _result(self, result: BatchResult, cut: list[int], started: float) -> ClassifyResult:
        rows = result.outputs
        num_tokens = rows["num_tokens"].astype(np.int64)
        truncated = rows["full_tokens"] > num_tokens
        if cut:
            truncated[cut] = True  # cut by characters: the model did not see all of the text
        tokenize_seconds = float(rows["tokenize_seconds"].max())
        probabilities = np.ascontiguousarray(rows["probabilities"])
        return ClassifyResult(
            probabilities=probabilities,
            logits=None if rows["cached"].any() else rows["logits"],
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
            raise LimitExceededError(
                f"{len(texts)} texts in one request; the limit is {self.max_texts_per_request} "
                "(--max-texts-per-request: split the request)",
                "texts_per_request",
            )
        for index, text in enumerate(texts):
            if not isinstance(text, str):
                raise ValidationError(f"texts[{index}] is not a string")
            if not text or text.isspace():
                raise ValidationError(f"texts[{index}] is empty; every text needs some content")

    def _validate_pairs(self, texts: Sequence[str], pairs: Sequence[str | None]) -> None:
        """One pair per text (None: that text is single, as in TEI's mixed batches)."""
        if len(pairs) != len(texts):
            raise ValidationError(
                f"{len(pairs)} text pairs for {len(texts)} texts; send one text_pair per text, "
                "or none"
            )
        if not self.takes_pairs:
            raise ValidationError(
                f"model {self.name!r} takes no sentence pairs: its tokenizer has no pair "
                "template (the two texts would run together as one)"
            )
        for index, pair in enumerate(pairs):
            if pair is None:
                continue
            if not isinstance(pair, str):
                raise ValidationError(f"text_pairs[{index}] is not a string")
            if not pair or pair.isspace():
                raise ValidationError(
                    f"text_pairs[{index}] is empty; every pair needs some content"
                )


def _shorten(texts: Sequence[str], max_chars: int, side: str) -> list[str]:
    """Texts cut to max_chars at the end the truncation keeps (left truncation: the end)."""
    if side == "left":
        return [text[-max_chars:] for text in texts]
    return [text[:max_chars] for text in texts]


def _marks(n: int, cut: list[int]) -> np.ndarray:
    """True at the texts cut by characters: the model did not see all of them."""
    marks = np.zeros(n, np.bool_)
    if cut:
        marks[cut] = True
    return marks
