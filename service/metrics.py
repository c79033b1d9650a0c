"""Every Prometheus metric of the server, in one place, with an injectable registry.

Use::

    metrics = Metrics()                      # a fresh registry with process/platform/GC metrics
    metrics.init_model("default")            # every series of the model exists, at zero
    metrics.set_model_info("default", "3", "CPUExecutionProvider", "fp32")
    metrics.observe_request("Classify", "default", "OK", 0.0042)
    model = metrics.for_model("default")     # the engine's series of one model (batcher observer)
    model.on_batch(size=8, padded_tokens=8 * 24, padding_ratio=0.21, seconds=0.003)
    server, port = start_metrics_server(8000, "0.0.0.0", metrics.registry)  # server.close()

Tests pass ``Metrics(CollectorRegistry())`` and read values with ``registry.get_sample_value``.

Label values come only from small fixed sets (methods, gRPC codes, failure reasons) or from
model names the server loaded: a request naming an unknown model is counted under
``UNKNOWN_MODEL``, so user text never becomes a label value.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

# The label sets, buckets and the HTTP endpoint live in modules of their own; every name is
# re-exported here, the one import path of the server's metrics.
from textserve.service.histograms import observe, observe_many
from textserve.service.metric_labels import (
    BATCH_SIZE_BUCKETS,
    BATCH_TOKEN_BUCKETS,
    CODES,
    CONFIDENCE_BUCKETS,
    ENTITY_COUNT_BUCKETS,
    FAILURE_REASONS,
    LATENCY_BUCKETS,
    LIMITS,
    LOAD_FAILURE_REASONS,
    METHODS,
    PADDING_RATIO_BUCKETS,
    SPAN_DROP_REASONS,
    UNKNOWN_MODEL,
    reason_for_code,
)
from textserve.service.metrics_server import (
    DRAINING,
    NO_MODEL,
    READY_STATES,
    SERVING,
    WARMING,
    MetricsServer,
    start_metrics_server,
)

__all__ = [
    "BATCH_SIZE_BUCKETS",
    "BATCH_TOKEN_BUCKETS",
    "CODES",
    "CONFIDENCE_BUCKETS",
    "DRAINING",
    "ENTITY_COUNT_BUCKETS",
    "FAILURE_REASONS",
    "LATENCY_BUCKETS",
    "LIMITS",
    "LOAD_FAILURE_REASONS",
    "METHODS",
    "NO_MODEL",
    "PADDING_RATIO_BUCKETS",
    "READY_STATES",
    "SERVING",
    "SPAN_DROP_REASONS",
    "UNKNOWN_MODEL",
    "WARMING",
    "Metrics",
    "MetricsServer",
    "PredictionMetrics",
    "multiprocess",
    "reason_for_code",
    "start_metrics_server",
]


def _default_registry() -> CollectorRegistry:
    """A fresh registry with what prometheus_client's global one has: process, platform, GC
    (not the global REGISTRY: servers in one process, tests, never clash on a duplicate series)."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def multiprocess() -> bool:
    """Whether this process writes its metrics to prometheus-client's multiprocess files
    (PROMETHEUS_MULTIPROC_DIR: a worker of `textserve serve --workers N`, and its supervisor)."""
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


class Metrics:
    """The server's metrics on one registry (a fresh one with process metrics by default)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = _default_registry() if registry is None else registry
        r = self.registry
        self._add_time_metrics(r)
        self._add_batch_metrics(r)
        self._add_request_metrics(r)
        self._add_observability_metrics(r)
        self._add_cache_metrics(r)
        self._lock = threading.Lock()
        self._models: set[str] = set()
        self._info: dict[str, tuple[str, str, str]] = {}
        # (method, model, code) -> the labelled children observe_request updates (labels() costs
        # more than an observation, once per request); emptied whenever the models change.
        self._request_children: dict[tuple[str, str, str], tuple[Any, Any, Any]] = {}

    def _add_time_metrics(self, r: CollectorRegistry) -> None:
        """The latency histograms: a request's whole time, then its stages (queue wait,
        tokenization, one onnxruntime run)."""
        self.request_duration = Histogram(
            "textserve_request_duration_seconds",
            "Time from receiving a request to sending its response, by RPC and status code",
            ["method", "model", "code"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_duration = Histogram(
            "textserve_queue_duration_seconds",
            "Time an item waited in the batching queue before its batch started",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tokenize_duration = Histogram(
            "textserve_tokenize_duration_seconds",
            "Time to tokenize, truncate and pad one batch",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.inference_duration = Histogram(
            "textserve_inference_duration_seconds",
            "Time of one onnxruntime run over a batch",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

    def _add_batch_metrics(self, r: CollectorRegistry) -> None:
        """What the batches hold (texts, tokens, padding) and what waits for one."""
        self.batch_size = Histogram(
            "textserve_batch_size",
            "Items (texts) per batch sent to the model",
            ["model"],
            buckets=BATCH_SIZE_BUCKETS,
            registry=r,
        )
        self.batch_tokens = Histogram(
            "textserve_batch_tokens",
            "Tokens per batch including padding (items x padded length)",
            ["model"],
            buckets=BATCH_TOKEN_BUCKETS,
            registry=r,
        )
        self.batch_padding_ratio = Histogram(
            "textserve_batch_padding_ratio",
            "Fraction of a batch's tokens that are padding (wasted compute)",
            ["model"],
            buckets=PADDING_RATIO_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "textserve_queue_depth",
            "Items waiting in the model's batching queue",
            ["model"],
            registry=r,
            multiprocess_mode="livesum",  # --workers: the server's queue is every worker's
        )
        self.queue_expected_wait = Gauge(
            "textserve_queue_expected_wait_seconds",
            "Seconds of work queued ahead of a new request (queued tokens over the measured "
            "drain rate), with --max-queue-wait-ms",
            ["model"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.admission_refusals = Counter(
            "textserve_admission_refusals",
            "Requests refused at once by the model's queue, by reason: queue_full (the count "
            "bound), queue_wait (--max-queue-wait-ms), deadline (nearer than the wait)",
            ["model", "reason"],
            registry=r,
        )
        self.inflight_texts = Gauge(
            "textserve_inflight_texts",
            "Texts accepted and not yet answered (queued or running): the autoscaling signal",
            ["model"],
            registry=r,
            multiprocess_mode="livesum",
        )

    def _add_request_metrics(self, r: CollectorRegistry) -> None:
        """Requests and their failures, the versions served and those that failed to load."""
        self.requests = Counter(
            "textserve_requests",
            "Requests received, by RPC (a stream counts each message)",
            ["method", "model"],
            registry=r,
        )
        self.drain_refusals = Counter(
            "textserve_drain_refusals",
            "gRPC calls answered UNAVAILABLE because the server was draining (they reach no "
            "model, so textserve_requests_total does not count them)",
            registry=r,
        )
        self.backlog_refusals = Counter(
            "textserve_backlog_refusals",
            "gRPC calls answered RESOURCE_EXHAUSTED because they waited in grpc before the server "
            "could take them (they reach no model), by bound: max_wait (--max-backlog-wait-ms), "
            "target (a standing backlog shed to --backlog-target-ms)",
            ["bound"],
            registry=r,
        )
        for bound in ("max_wait", "target"):  # both series from 0, before any refusal
            self.backlog_refusals.labels(bound=bound)
        self.grpc_unhandled = Counter(
            "textserve_grpc_calls_unhandled",
            "gRPC calls grpc ended with no handler run: under overload those grpc.aio refused at "
            "--max-concurrent-rpcs; also auth refusals, UNIMPLEMENTED, cancelled while held",
            registry=r,
        )
        self.limit_refusals = Counter(
            "textserve_request_limit_refusals",
            "Requests refused for a per-request limit (never split or cut silently), by limit",
            ["method", "limit"], registry=r,
        )  # fmt: skip
        self.inflight_limit = Gauge(
            "textserve_inflight_limit", "Inference requests let in at once: "
            "--max-concurrent-rpcs, or under overload what is answered in --inflight-wait-ms",
            registry=r, multiprocess_mode="livesum",
        )  # fmt: skip
        self.request_failures = Counter(
            "textserve_request_failures",
            "Requests that ended with a non-OK status, by reason",
            ["method", "model", "reason"],
            registry=r,
        )
        self.model_info = Gauge(
            "textserve_model_info",
            "1 for the version of each model being served, with its execution provider and "
            "precision (fp32, fp16, int8)",
            ["model", "version", "provider", "precision"],
            registry=r,
            # --workers: 1 per version any live worker serves (a retired one is 0, dropped at
            # the scrape: server_registry), a dead worker's series go with it
            multiprocess_mode="livemax",
        )
        self.model_load_failures = Counter(
            "textserve_model_load_failures",
            "Model versions that failed to load, by reason",
            ["model", "reason"],
            registry=r,
        )

    def _add_observability_metrics(self, r: CollectorRegistry) -> None:
        """What the model predicts, and what tracing and the access log dropped."""
        # Observability (issue 17): what the model predicts, and what tracing and the access
        # log had to drop rather than slow requests down.
        self.predictions = Counter(
            "textserve_predictions",
            "Texts answered, by the label the model predicted (its highest probability)",
            ["model", "version", "label"],
            registry=r,
        )
        self.prediction_confidence = Histogram(
            "textserve_prediction_confidence",
            "The winning (highest) probability of each prediction: falling confidence is drift",
            ["model", "version"],
            buckets=CONFIDENCE_BUCKETS,
            registry=r,
        )
        # A token classifier's counterpart of the two above: what it finds, per label and text.
        self.entities = Counter(
            "textserve_entities",
            "Entities a token classifier reported, by label (after grouping and ignore_labels)",
            ["model", "version", "label"],
            registry=r,
        )
        self.entities_per_text = Histogram(
            "textserve_entities_per_text",
            "Entities a token classifier reported per text",
            ["model", "version"],
            buckets=ENTITY_COUNT_BUCKETS,
            registry=r,
        )
        self.trace_spans_dropped = Counter(
            "textserve_trace_spans_dropped",
            "Finished trace spans never exported (OTLP endpoint unreachable, slow or refusing)",
            ["reason"],
            registry=r,
        )
        self.access_log_dropped = Counter(
            "textserve_access_log_dropped",
            "Access log lines not written because the log's rate limit was reached",
            registry=r,
        )
        for reason in SPAN_DROP_REASONS:
            self.trace_spans_dropped.labels(reason)
        for method, limit in ((m, limit) for m in METHODS for limit in LIMITS):
            self.limit_refusals.labels(method, limit)

    # -- models --------------------------------------------------------------------------

    def init_model(self, model: str) -> None:
        """Create every series of ``model`` at zero so dashboards have data before traffic."""
        if not model:
            raise ValueError("model name must not be empty")
        with self._lock:
            self._models.add(model)
            self._request_children.clear()
        for method in METHODS:
            self.request_duration.labels(method, model, "OK")
            self.requests.labels(method, model)
            for reason in FAILURE_REASONS:
                self.request_failures.labels(method, model, reason)
        for histogram in (
            self.queue_duration,
            self.tokenize_duration,
            self.inference_duration,
            self.batch_size,
            self.batch_tokens,
            self.batch_padding_ratio,
        ):
            histogram.labels(model)
        self.queue_depth.labels(model).set(0)
        self.inflight_texts.labels(model).set(0)
        for reason in LOAD_FAILURE_REASONS:
            self.model_load_failures.labels(model, reason)

    def set_model_info(
        self, model: str, version: str | int, provider: str, precision: str = "fp32"
    ) -> None:
        """Mark ``version`` of ``model`` as served; drops the previous version's series."""
        version = str(version)
        with self._lock:
            previous = self._info.get(model)
            self._info[model] = (version, provider, precision)
        if previous is not None and previous != (version, provider, precision):
            self._drop_info(model, *previous)
        self.model_info.labels(model, version, provider, precision).set(1)

    def _drop_info(self, model: str, version: str, provider: str, precision: str) -> None:
        if multiprocess():
            # prometheus-client cannot remove a series from its files: 0 means "not served",
            # and the supervisor's /metrics leaves such samples out (server_registry)
            self.model_info.labels(model, version, provider, precision).set(0)
        else:
            self.model_info.remove(model, version, provider, precision)

    def clear_model_info(self, model: str) -> None:
        """No version of ``model`` is served any more: drop its textserve_model_info series."""
        with self._lock:
            previous = self._info.pop(model, None)
        if previous is not None:
            self._drop_info(model, *previous)

    def _add_cache_metrics(self, r: CollectorRegistry) -> None:
        """The response cache's series (docs/cache.md): texts answered from it or not, and what
        it holds. --workers: each worker has its own cache, the gauges sum them."""
        self.cache_requests = Counter(
            "textserve_cache_requests",
            "Texts looked up in the model's response cache: hit (answered without inference) "
            "or miss",
            ["model", "result"],
            registry=r,
        )
        self.cache_bytes = Gauge(
            "textserve_cache_bytes",
            "Bytes the model's response cache holds (as it counts them, within --cache-size)",
            ["model"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.cache_entries = Gauge(
            "textserve_cache_entries",
            "Texts the model's response cache holds",
            ["model"],
            registry=r,
            multiprocess_mode="livesum",
        )

    def for_cache(self, model: str) -> CacheMetrics:
        """The series of ``model``'s response cache (its observer)."""
        return CacheMetrics(self, model)

    def for_model(self, model: str) -> ModelMetrics:
        """The series the engine writes for ``model`` (its batcher's observer, tokenization)."""
        return ModelMetrics(self, model)

    # -- observations --------------------------------------------------------------------

    def observe_request(
        self,
        method: str,
        model: str,
        code: str,
        seconds: float,
        exemplar: dict[str, str] | None = None,
    ) -> None:
        """Count one finished request: its total, its latency and, if not OK, its failure.
        ``exemplar`` (``{"trace_id": ...}`` of a sampled request) is attached to the latency
        bucket it falls in (OpenMetrics exposition only)."""
        children = self._request_children.get((method, model, code))
        if children is None:
            children = self._children(method, model, code)
        requests, duration, failures = children
        requests.inc()
        if exemplar is None:
            observe(duration, seconds)
        else:
            duration.observe(seconds, exemplar)
        if failures is not None:
            failures.inc()

    def _children(self, method: str, model: str, code: str) -> tuple[Any, Any, Any]:
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
        if code not in CODES:
            raise ValueError(f"unknown gRPC status code name {code!r}; expected one of {CODES}")
        with self._lock:
            label = model if model in self._models else UNKNOWN_MODEL
            children = (
                self.requests.labels(method, label),
                self.request_duration.labels(method, label, code),
                None
                if code == "OK"
                else self.request_failures.labels(method, label, reason_for_code(code)),
            )
            if label != UNKNOWN_MODEL:  # unknown names are user text: never a cache key
                self._request_children[(method, model, code)] = children
        return children

    def for_predictions(
        self, model: str, version: str | int, labels: Sequence[str]
    ) -> PredictionMetrics:
        """The prediction series of one model version (its handle counts every answer)."""
        return PredictionMetrics(self, model, str(version), labels)

    def for_entities(self, model: str, version: str | int, labels: Sequence[str]) -> EntityMetrics:
        """The entity series of one token classifier version (its runner counts each batch)."""
        return EntityMetrics(self, model, str(version), labels)

    def count_dropped_spans(self, reason: str, spans: int) -> None:
        """Count finished spans that never reached the OTLP endpoint."""
        if reason not in SPAN_DROP_REASONS:
            raise ValueError(f"unknown span drop reason {reason!r}; expected {SPAN_DROP_REASONS}")
        self.trace_spans_dropped.labels(reason).inc(spans)

    def count_load_failure(self, model: str, reason: str) -> None:
        """Count a model version that failed to load."""
        if reason not in LOAD_FAILURE_REASONS:
            raise ValueError(
                f"unknown load failure reason {reason!r}; expected one of {LOAD_FAILURE_REASONS}"
            )
        self.model_load_failures.labels(model, reason).inc()


# Why a model's queue refused a request at once (textserve_admission_refusals_total's reason).
ADMISSION_REASONS = ("queue_full", "queue_wait", "deadline")


class ModelMetrics:
    """One model's engine series: the batcher's observer (on_batch, on_queue_waits,
    on_queue_depth, on_inflight) and tokenization (on_tokenize). The labelled children are
    looked up once: labels() costs more than an observation. Production and tests write
    through this."""

    def __init__(self, metrics: Metrics, model: str) -> None:
        self.model = model
        self._queue = metrics.queue_duration.labels(model)
        self._depth = metrics.queue_depth.labels(model)
        self._inflight = metrics.inflight_texts.labels(model)
        self._size = metrics.batch_size.labels(model)
        self._tokens = metrics.batch_tokens.labels(model)
        self._padding = metrics.batch_padding_ratio.labels(model)
        self._inference = metrics.inference_duration.labels(model)
        self._tokenize = metrics.tokenize_duration.labels(model)
        self._expected_wait = metrics.queue_expected_wait.labels(model)
        # every reason at zero from the start (a rate of 0 reads as "none", not "no series")
        self._refusals = {r: metrics.admission_refusals.labels(model, r) for r in ADMISSION_REASONS}

    def on_batch(self, size: int, padded_tokens: int, padding_ratio: float, seconds: float) -> None:
        """One model run: ``size`` texts, ``padded_tokens`` (size x width), the wasted fraction,
        and its onnxruntime time."""
        observe(self._size, size)
        observe(self._tokens, padded_tokens)
        observe(self._padding, min(1.0, max(0.0, padding_ratio)))
        observe(self._inference, seconds)

    def on_queue_waits(self, waits: Sequence[float] | np.ndarray) -> None:
        """How long each text of a batch waited in the queue (one pass for the batch)."""
        observe_many(self._queue, waits)

    def on_queue_depth(self, depth: int) -> None:
        """Texts waiting in the model's queue now."""
        self._depth.set(depth)

    def on_inflight(self, texts: int) -> None:
        """Texts accepted and not yet answered now (queued or running)."""
        self._inflight.set(texts)

    def on_expected_wait(self, seconds: float) -> None:
        """Seconds of work queued ahead of a new request now."""
        self._expected_wait.set(seconds)

    def on_refused(self, reason: str) -> None:
        """A request refused at once by the queue (ADMISSION_REASONS)."""
        self._refusals[reason].inc()

    def on_tokenize(self, seconds: float) -> None:
        """The tokenization of one batch."""
        observe(self._tokenize, seconds)


class CacheMetrics:
    """One model's response cache: lookups by result, bytes and entries held (every series at
    zero from the start)."""

    def __init__(self, metrics: Metrics, model: str) -> None:
        self._hits = metrics.cache_requests.labels(model, "hit")
        self._misses = metrics.cache_requests.labels(model, "miss")
        self._bytes = metrics.cache_bytes.labels(model)
        self._entries = metrics.cache_entries.labels(model)

    def on_lookups(self, hits: int, misses: int) -> None:
        if hits:
            self._hits.inc(hits)
        if misses:
            self._misses.inc(misses)

    def on_size(self, nbytes: int, entries: int) -> None:
        self._bytes.set(nbytes)
        self._entries.set(entries)


class EntityMetrics:
    """One token classifier version's entities: textserve_entities_total per label (every
    entity group of its labels at zero from the start) and the entities per text."""

    def __init__(self, metrics: Metrics, model: str, version: str, labels: Sequence[str]) -> None:
        groups = dict.fromkeys(label.split("-", 1)[-1] for label in labels)
        self._series = metrics.entities
        self._key = (model, version)
        self._labels = {group: metrics.entities.labels(model, version, group) for group in groups}
        self._per_text = metrics.entities_per_text.labels(model, version)

    def observe(self, entities: Sequence[Sequence[Any]]) -> None:
        """Count a batch's entities (per text: a list of textserve.tagging.Entity)."""
        counts: dict[str, int] = {}
        for found in entities:
            for entity in found:
                counts[entity.label] = counts.get(entity.label, 0) + 1
        for label, count in counts.items():
            child = self._labels.get(label)
            if child is None:  # aggregation none: a token's full label (B-PER)
                if len(self._labels) >= 4096:
                    continue
                child = self._labels[label] = self._series.labels(*self._key, label)
            child.inc(count)
        observe_many(self._per_text, np.fromiter((len(f) for f in entities), np.float64))


class PredictionMetrics:
    """One model version's predictions: textserve_predictions_total per label and the winning
    probability. Every series exists at zero from the start (a label never predicted is a
    share of 0, not a missing series)."""

    def __init__(self, metrics: Metrics, model: str, version: str, labels: Sequence[str]) -> None:
        self._labels = [metrics.predictions.labels(model, version, label) for label in labels]
        self._confidence = metrics.prediction_confidence.labels(model, version)

    def observe(self, probabilities: np.ndarray) -> None:
        """Count the predictions of a batch or a request (rows: texts, columns: labels): each
        text's winning label and its probability, in one pass."""
        if not len(probabilities):
            return
        winners = probabilities.argmax(axis=1).tolist()
        counts: dict[int, int] = {}
        for winner in winners:
            counts[winner] = counts.get(winner, 0) + 1
        for winner, count in counts.items():
            self._labels[winner].inc(count)
        observe_many(self._confidence, probabilities.max(axis=1))
