"""A loaded model version: tokenizer + onnxruntime session + batcher behind `await classify()`.

This is the core API both front ends (textserve.v1 and the Open Inference Protocol) call; see
docs/architecture.md. Tokenization follows the contract exactly: ids cut to max_length, [UNK]
for a text with no tokens, [PAD] to the longest in the batch, mask 1 on real tokens.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from service.batcher import Batcher, BatchStats
from service.coalesce import Coalescer
from service.config import BatcherConfig
from service.errors import ValidationError
from service.manifest import Manifest

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from service.metrics import Metrics
    from service.runtime import Session

logger = logging.getLogger(__name__)

UNK_TOKEN = "[UNK]"
# Only the first MAX_CHARS_PER_TOKEN x max_length characters of a text are tokenized: the model
# sees max_length tokens at most, and tokenizing is linear in characters (a 1 MB text held the
# shared tokenizer thread for 2-7 s, stalling every request). A token averages 2-5 characters
# (BPE, English); a text needs over 32 characters per token (long runs of whitespace, control or
# other characters the normalizer drops) before the cut changes what the model sees.
MAX_CHARS_PER_TOKEN = 32
# Run through tokenizer and model at warm-up: a tokenizer whose ids the model does not know
# fails here, before the version serves, not on the first request.
WARMUP_TEXT = "The quick brown fox jumps over the lazy dog. A gripping, beautifully acted film!"


@dataclass(frozen=True)
class Timings:
    queue_seconds: float  # longest wait of any of the texts before its batch started
    tokenize_seconds: float  # tokenization of the request's texts (with any wait for the tokenizer)
    inference_seconds: float  # summed run time of the batches that carried the texts
    total_seconds: float  # from the call to its answer


@dataclass(frozen=True)
class ClassifyResult:
    probabilities: np.ndarray  # float32 (n, num_labels), rows in input order
    num_tokens: np.ndarray  # int64 (n,), tokens the model saw per text
    truncated: np.ndarray  # bool (n,)
    timings: Timings


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float32, stable for large logits."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    np.exp(shifted, out=shifted)
    shifted /= shifted.sum(axis=1, keepdims=True)
    return shifted


def pad(rows: Sequence[Sequence[int]], pad_token_id: int) -> tuple[np.ndarray, np.ndarray]:
    """input_ids and attention_mask, int64 (B, longest)."""
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), pad_token_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    return ids, mask


class _MetricsObserver:
    """Feeds the batcher's hooks into the Prometheus metrics of one model."""

    def __init__(self, metrics: Metrics, model: str) -> None:
        self._metrics = metrics
        self._model = model
        self._queue = metrics.queue_duration.labels(model)

    def on_batch(self, size: int, padded_tokens: int, padding_ratio: float, seconds: float) -> None:
        self._metrics.observe_batch(
            self._model, size, padded_tokens, min(1.0, max(0.0, padding_ratio))
        )
        self._metrics.observe_inference(self._model, seconds)

    def on_queue_waits(self, waits: Sequence[float]) -> None:
        observe = self._queue.observe
        for wait in waits:
            observe(wait)

    def on_queue_depth(self, depth: int) -> None:
        self._metrics.set_queue_depth(self._model, depth)


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
        tokenize_executor: Executor,
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
        self._tokenizer = tokenizer
        self._pad_id = manifest.pad_token_id
        unk = tokenizer.token_to_id(UNK_TOKEN)
        self._unk_id = manifest.pad_token_id if unk is None else int(unk)
        self._metrics = metrics
        self._encoder: Coalescer[str, list[int]] = Coalescer(
            self._encode, tokenize_executor, on_run=self._observe_tokenize
        )
        # Requests that picked this handle and have not finished (tokenizing, queued or running):
        # a retired version is released only once this reaches zero (see drain()).
        self._active = 0
        self._inactive: asyncio.Event | None = None
        self.batcher: Batcher[list[int]] = Batcher(
            self._run_batch,
            batcher_config,
            workers=inference_workers,
            observer=_MetricsObserver(metrics, self.name) if metrics is not None else None,
            name=f"{self.name}:{self.version}",
        )

    # -- lifecycle (ModelRepository calls these) -----------------------------------------------

    def warmup(self) -> None:
        """Blocking: run representative shapes through the session (before SERVING)."""
        logits = self._session.warmup(
            self.max_length, self.batcher.config.max_batch_size, self._unk_id
        )
        if logits.shape[-1] != len(self.labels):
            raise ValueError(
                f"model.onnx gives {logits.shape[-1]} logits but the manifest has "
                f"{len(self.labels)} labels"
            )
        sample = self._run_batch([self._encode([WARMUP_TEXT])[0][: self.max_length]])
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
        method: str = "Classify",
    ) -> ClassifyResult:
        """Probabilities for each text. `deadline`: absolute time.monotonic() seconds.

        Raises ValidationError, OverloadedError, DeadlineExceededError, NotReadyError.
        `method` names the calling front end (reserved for per-method accounting).
        """
        # Counted before the first await, i.e. in the same loop step as repository.get(): a
        # version retired meanwhile still waits for this request (see drain()).
        self._active += 1
        try:
            return await self._classify(texts, truncate, deadline)
        finally:
            self._active -= 1
            if not self._active and self._inactive is not None:
                self._inactive.set()

    async def _classify(
        self, texts: Sequence[str], truncate: bool, deadline: float | None
    ) -> ClassifyResult:
        started = time.perf_counter()
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
        # Queue places are taken before tokenizing: when the queue is full the request is
        # refused at once, and refusing excess load costs no tokenizer time.
        self.batcher.reserve(len(texts))
        try:
            encoded = await self._encoder.run(texts)
            tokenized = time.perf_counter()
            limit = self.max_length
            payloads: list[list[int]] = []
            lengths: list[int] = []
            for index, ids in enumerate(encoded):
                n = len(ids)
                if n > limit:
                    if not truncate:
                        raise ValidationError(
                            f"texts[{index}] is {n} tokens long; model {self.name!r} takes at "
                            f"most {limit} (send truncate=true to cut it, or shorten the text)"
                        )
                    ids = ids[:limit]
                    n = limit
                payloads.append(ids)
                lengths.append(n)
        except BaseException:  # invalid, or the caller went away while tokenizing
            self.batcher.release(len(texts))
            raise
        result = await self.batcher.submit(payloads, lengths, deadline=deadline, reserved=True)
        full = np.fromiter((len(ids) for ids in encoded), dtype=np.int64, count=len(encoded))
        num_tokens = np.asarray(lengths, dtype=np.int64)
        truncated = full > num_tokens
        truncated[cut] = True  # cut by characters: the model did not see all of the text
        return ClassifyResult(
            probabilities=result.outputs,
            num_tokens=num_tokens,
            truncated=truncated,
            timings=Timings(
                queue_seconds=result.queue_seconds,
                tokenize_seconds=tokenized - started,
                inference_seconds=result.inference_seconds,
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

    def _encode(self, texts: list[str]) -> list[list[int]]:
        """Untruncated ids per text (the caller truncates, or refuses with truncate=false)."""
        unk = [self._unk_id]
        return [enc.ids or unk for enc in self._tokenizer.encode_batch(texts)]

    def _run_batch(self, rows: list[list[int]]) -> np.ndarray:
        ids, mask = pad(rows, self._pad_id)
        return softmax(self._session.run(ids, mask))

    def _observe_tokenize(self, items: int, seconds: float) -> None:
        if self._metrics is not None:
            self._metrics.observe_tokenize(self.name, seconds)
