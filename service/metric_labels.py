"""The fixed values the server's metrics take: label value sets and histogram buckets.

Label values come only from these small sets (methods, gRPC codes, failure reasons) or from
model names the server loaded, so user text never becomes a label value. service/metrics.py
defines the metrics over them and re-exports every name here.
"""

from __future__ import annotations

from collections.abc import Sequence

# The RPCs that are measured: the label `method` takes exactly these values.
# HttpClassify (POST /v1/classify, TEI's /predict, vLLM's /classify), HttpInfer (KServe v2 REST
# infer) and HttpRerank (TEI's /rerank, Cohere's and Jina's /v1|v2/rerank) are the HTTP front
# end's (service/http/routes.py, compat.py).
METHODS: tuple[str, ...] = (
    "Classify",
    "ClassifyStream",
    "ModelInfer",
    "Rerank",
    "ZeroShot",
    "Tag",
    "TagStream",
    "HttpClassify",
    "HttpInfer",
    "HttpRerank",
    "HttpZeroShot",
    "HttpTag",
)

# gRPC status code names (grpc.StatusCode.X.name); the label `code` takes exactly these values.
CODES: tuple[str, ...] = (
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
)

# Why a request failed: the label `reason` of textserve_request_failures_total.
FAILURE_REASONS: tuple[str, ...] = (
    "invalid_argument",  # bad input: empty text, over-long text with truncate=false, bad tensor
    "not_found",  # no such model or version
    "resource_exhausted",  # the queue was full (back-pressure)
    "deadline_exceeded",  # the caller's deadline passed before the result was ready
    "cancelled",  # the caller went away
    "unavailable",  # not ready yet, or draining for shutdown
    "unauthenticated",  # missing or wrong credentials
    "permission_denied",  # credentials valid but not allowed (e.g. admin RPCs)
    "failed_precondition",  # the request is valid but the model's state forbids it
    "unimplemented",  # an RPC or feature the server does not offer
    "internal",  # a bug or a runtime failure (UNKNOWN, INTERNAL, DATA_LOSS)
    "other",  # any other non-OK code
)

# The per-request limits a request can be refused for: the label `limit` of
# textserve_request_limit_refusals_total (errors.LimitExceededError).
LIMITS: tuple[str, ...] = (
    "texts_per_request",  # --max-texts-per-request
    "windows_per_request",  # the same limit, on the windows of long texts (dataplane/windows.py)
    "concurrent_requests",  # --max-concurrent-rpcs over HTTP (gRPC's: refused by grpc.aio itself)
    "inflight_wait",  # --inflight-wait-ms under overload, gRPC and HTTP (service/door.py)
)

# Why a model version failed to load: the label `reason` of textserve_model_load_failures_total.
LOAD_FAILURE_REASONS: tuple[str, ...] = (
    "invalid_manifest",  # manifest.json missing fields or unreadable
    "checksum_mismatch",  # model.onnx does not match the sha256 in the manifest
    "session_error",  # onnxruntime could not load model.onnx (missing, not ONNX, bad graph...)
    # model.onnx inputs/outputs have the wrong names, types or ranks, or the model does not fit
    # its tokenizer and manifest (vocabulary, max_length, labels, pad id: ModelHandle.check)
    "contract_mismatch",
    "tokenizer_error",  # tokenizer.json missing or not a loadable tokenizers file
    "warmup_error",  # the warm-up inference failed (or gave wrong-shaped or non-finite logits)
    "unsafe_file",  # a symbolic link, not a regular file, or over its size cap: not read
    "other",  # anything else, including errors nobody foresaw (the reason says which)
)

# The model label of requests that named a model the server never loaded.
UNKNOWN_MODEL = "_unknown"

_REASON_BY_CODE: dict[str, str] = {
    "CANCELLED": "cancelled",
    "UNKNOWN": "internal",
    "INVALID_ARGUMENT": "invalid_argument",
    "OUT_OF_RANGE": "invalid_argument",
    "DEADLINE_EXCEEDED": "deadline_exceeded",
    "NOT_FOUND": "not_found",
    "PERMISSION_DENIED": "permission_denied",
    "RESOURCE_EXHAUSTED": "resource_exhausted",
    "FAILED_PRECONDITION": "failed_precondition",
    "UNIMPLEMENTED": "unimplemented",
    "INTERNAL": "internal",
    "DATA_LOSS": "internal",
    "UNAVAILABLE": "unavailable",
    "UNAUTHENTICATED": "unauthenticated",
}


def _decades(
    low_exponent: int, high_exponent: int, mantissas: Sequence[float]
) -> tuple[float, ...]:
    bounds = [round(m * 10.0**e, 6) for e in range(low_exponent, high_exponent) for m in mantissas]
    return (*bounds, round(10.0**high_exponent, 6))


# 100 µs … 10 s, nine bounds a decade (at most 50 % apart) so that p50/p95/p99 from
# histogram_quantile are within a few per cent across the whole range; 46 buckets.
LATENCY_BUCKETS: tuple[float, ...] = _decades(-4, 1, (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8))
# Items per batch: 1 … 1024.
BATCH_SIZE_BUCKETS: tuple[float, ...] = tuple(float(2**i) for i in range(11))
# Padded tokens per batch (items × longest item): 1 … 65536.
BATCH_TOKEN_BUCKETS: tuple[float, ...] = tuple(float(2**i) for i in range(17))
# Fraction of a batch's tokens that are padding; the 0 bucket counts batches without any.
PADDING_RATIO_BUCKETS: tuple[float, ...] = (
    0.0,
    0.05,
    0.1,
    0.2,
    0.3,
    0.4,
    0.5,
    0.6,
    0.7,
    0.8,
    0.9,
    1.0,
)


# Entities a token classifier reports per text: none, a few, many (a PII-dense document).
ENTITY_COUNT_BUCKETS: tuple[float, ...] = (0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144)

# The winning (highest) probability of a prediction: fine near 1, where a confident model
# lives and where a drift of confidence shows first.
CONFIDENCE_BUCKETS: tuple[float, ...] = (
    0.1,
    0.2,
    0.3,
    0.4,
    0.5,
    0.6,
    0.7,
    0.8,
    0.85,
    0.9,
    0.95,
    0.98,
    0.99,
    0.999,
    1.0,
)
# Why finished spans never reached the OTLP endpoint: the label `reason` of
# textserve_trace_spans_dropped_total.
SPAN_DROP_REASONS: tuple[str, ...] = (
    "export_failed",  # the endpoint refused them or could not be reached in time
    "queue_full",  # the exporter's queue was full (the endpoint is slower than the traffic)
)


def reason_for_code(code: str) -> str:
    """The failure reason for a gRPC status code name: ``reason_for_code("NOT_FOUND")``."""
    if code not in CODES:
        raise ValueError(f"unknown gRPC status code name {code!r}; expected one of {CODES}")
    if code == "OK":
        raise ValueError("OK is not a failure")
    return _REASON_BY_CODE.get(code, "other")
