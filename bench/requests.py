"""Benchmark inputs: texts from a real test split, and requests serialized once, ahead of time.

    texts = load_texts(Path("runs/default"))            # a run dir (its test.jsonl) or a JSONL
    pool = build_requests(texts, "v1", texts_per_request=16, model="default")
    pool.payloads[0]                                    # bytes, sent as they are

The "stream" API sends the same textserve.v1 ClassifyRequests as "v1", over ClassifyStream,
each with its own id (`pool.ids`): a stream answers in completion order.

Serializing ahead keeps the load generator's per-call cost to the gRPC call itself, so it can
drive more than the server on the same two cores.
"""

from __future__ import annotations

import dataclasses
import json
import random
import struct
from dataclasses import dataclass
from pathlib import Path

APIS = ("v1", "oip", "stream", "http")
# Full method names of the calls the load generator makes, per API.
METHODS = {
    "v1": "/textserve.v1.Classifier/Classify",
    "oip": "/inference.GRPCInferenceService/ModelInfer",
    "stream": "/textserve.v1.Classifier/ClassifyStream",
    "http": "/v1/classify",  # POST, JSON (the load generator's HTTP calls: loadgen.py)
}
TEST_SPLIT = "test.jsonl"


class BenchInputError(ValueError):
    """The texts given to the benchmark cannot be used; the message says what to do."""


@dataclass(frozen=True)
class RequestPool:
    api: str
    method: str  # full gRPC method name
    texts_per_request: int
    payloads: list[bytes]  # serialized requests, used round-robin
    ids: list[bytes] = dataclasses.field(default_factory=list)  # "stream": each payload's id


def load_texts(source: Path, text_field: str = "text") -> list[str]:
    """Non-empty texts of a JSONL file (one object per line) or of a run dir's test.jsonl."""
    path = source / TEST_SPLIT if source.is_dir() else source
    if not path.is_file():
        raise BenchInputError(
            f"no texts at {path}: pass --texts with a training run directory (it holds "
            f"{TEST_SPLIT}) or a JSONL file with a {text_field!r} field per line"
        )
    texts: list[str] = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise BenchInputError(f"{path}:{number}: not JSON ({exc.msg})") from None
            text = row.get(text_field) if isinstance(row, dict) else None
            if not isinstance(text, str):
                raise BenchInputError(f"{path}:{number}: no string field {text_field!r}")
            if text.strip():
                texts.append(text)
    if not texts:
        raise BenchInputError(f"{path} holds no non-empty texts")
    return texts


def sample_batches(
    texts: list[str], texts_per_request: int, count: int, seed: int = 0
) -> list[list[str]]:
    """`count` requests' worth of texts drawn from `texts` in a shuffled order (every text
    is used before any repeats), keeping the real length distribution."""
    if texts_per_request < 1:
        raise BenchInputError(f"--texts-per-request must be at least 1, got {texts_per_request}")
    rng = random.Random(seed)
    order: list[str] = []
    needed = texts_per_request * count
    while len(order) < needed:
        chunk = list(texts)
        rng.shuffle(chunk)
        order.extend(chunk)
    return [order[i * texts_per_request : (i + 1) * texts_per_request] for i in range(count)]


def _v1_request(texts: list[str], model: str, request_id: str = "") -> bytes:
    from textserve.v1 import classifier_pb2 as pb

    return pb.ClassifyRequest(id=request_id, texts=texts, model=model).SerializeToString()


def _oip_request(texts: list[str], model: str) -> bytes:
    # raw_input_contents with 4-byte little-endian length prefixes: what tritonclient and
    # perf_analyzer send, so the server's decoding cost is the one those clients meet
    from textserve.oip import grpc_service_pb2 as pb

    raw = b"".join(struct.pack("<I", len(b)) + b for b in (t.encode("utf-8") for t in texts))
    request = pb.ModelInferRequest(
        model_name=model,
        inputs=[pb.ModelInferRequest.InferInputTensor(name="TEXT", datatype="BYTES",
                                                      shape=[len(texts)])],
        raw_input_contents=[raw],
    )  # fmt: skip
    return request.SerializeToString()


def build_requests(
    texts: list[str], api: str, texts_per_request: int, model: str, count: int = 1024, seed: int = 0
) -> RequestPool:
    """A pool of `count` serialized requests of `texts_per_request` texts each."""
    if api not in APIS:
        raise BenchInputError(f"--api must be one of {', '.join(APIS)}, got {api!r}")
    batches = sample_batches(texts, texts_per_request, count, seed)
    if api == "stream":
        ids = [str(i) for i in range(count)]
        payloads = [_v1_request(b, model, i) for b, i in zip(batches, ids, strict=True)]
        keys = [i.encode() for i in ids]
        return RequestPool(api, METHODS[api], texts_per_request, payloads, keys)
    if api == "http":
        encoded = [json.dumps({"model": model, "texts": b}).encode() for b in batches]
        return RequestPool(api, METHODS[api], texts_per_request, encoded)
    encode = _v1_request if api == "v1" else _oip_request
    return RequestPool(api, METHODS[api], texts_per_request, [encode(b, model) for b in batches])
