"""A loaded model version: tokenizer + onnxruntime session + batcher behind `await classify()`.

This is the core API both front ends (textserve.v1 and the Open Inference Protocol) call; see
docs/architecture.md. Tokenization follows the contract exactly: ids cut to max_length, [UNK]
for a text with no tokens, [PAD] to the longest in the batch, mask 1 on real tokens.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from service.batcher import Batcher, BatchStats, Coalescer
from service.config import BatcherConfig
from service.errors import ValidationError
from service.manifest import Manifest

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from service.metrics import Metrics
    from service.runtime import Session

UNK_TOKEN = "[UNK]"


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

    def start(self) -> None:
        self.batcher.start()

    def flush(self) -> None:
        self.batcher.flush()

    async def close(self, timeout: float | None = 0.0) -> None:
        await self.batcher.close(timeout)

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
        started = time.perf_counter()
        self._validate(texts)
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
                        f"texts[{index}] is {n} tokens long; model {self.name!r} takes at most "
                        f"{limit} (send truncate=true to cut it, or shorten the text)"
                    )
                ids = ids[:limit]
                n = limit
            payloads.append(ids)
            lengths.append(n)
        result = await self.batcher.submit(payloads, lengths, deadline=deadline)
        full = np.fromiter((len(ids) for ids in encoded), dtype=np.int64, count=len(encoded))
        num_tokens = np.asarray(lengths, dtype=np.int64)
        return ClassifyResult(
            probabilities=result.outputs,
            num_tokens=num_tokens,
            truncated=full > num_tokens,
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
