"""What a classify call gives back, for every client (gRPC unary and stream, HTTP): the result and
its predictions, and the error a failed call raises.

    result = to_result(response)         # a textserve.v1 ClassifyResponse -> ClassifyResult
    raise ClientError("INVALID_ARGUMENT", "texts[0] is empty")
"""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc

from textserve.v1 import classifier_pb2 as pb

# grpc status code number -> its name (a stream response's `error.code` is the number)
CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}


class ClientError(Exception):
    """A call that failed: `code` is the gRPC status code name (e.g. "INVALID_ARGUMENT")."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    @classmethod
    def from_rpc(cls, error: grpc.RpcError) -> ClientError:
        code = error.code() if hasattr(error, "code") else None
        details = error.details() if hasattr(error, "details") else str(error)
        return cls(code.name if code is not None else "UNKNOWN", details or "")


@dataclass(frozen=True)
class Prediction:
    label: str
    score: float
    scores: dict[str, float] = field(default_factory=dict)  # every label, with all_scores=True
    top: list[tuple[str, float]] = field(default_factory=list)  # best top_k, with top_k > 0
    num_tokens: int = 0
    truncated: bool = False
    # multi-label models: every label whose score reaches the threshold
    labels_over_threshold: list[str] = field(default_factory=list)
    cached: bool = False  # answered from the server's response cache, without inference


@dataclass(frozen=True)
class ClassifyResult:
    model: str
    version: int
    predictions: list[Prediction]
    timing: dict[str, float]  # queue/tokenize/inference/total seconds on the server


def to_result(response: pb.ClassifyResponse) -> ClassifyResult:
    labels = list(response.labels)
    predictions = [
        Prediction(
            label=r.label,
            score=r.score,
            scores=dict(zip(labels, r.scores, strict=False)) if r.scores else {},
            top=[(t.label, t.score) for t in r.top],
            num_tokens=r.num_tokens,
            truncated=r.truncated,
            labels_over_threshold=list(r.labels_over_threshold),
            cached=r.cached,
        )
        for r in response.results
    ]
    t = response.timing
    return ClassifyResult(
        model=response.model,
        version=response.model_version,
        predictions=predictions,
        timing={
            "queue_seconds": t.queue_seconds,
            "tokenize_seconds": t.tokenize_seconds,
            "inference_seconds": t.inference_seconds,
            "total_seconds": t.total_seconds,
        },
    )
