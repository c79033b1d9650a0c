"""Open Inference Protocol tensors <-> texts and class probabilities; pure, no I/O, no grpc.

The model as OIP clients see it: input ``TEXT`` (BYTES, shape ``[n]`` or ``[n, 1]``, UTF-8) and,
for sentence pairs, ``TEXT_PAIR`` (BYTES, the same shape: each text's second text);
outputs ``LABEL`` (BYTES), ``SCORE`` (FP32) — both shaped like the input — and
``PROBABILITIES`` (FP32, ``[n, num_labels]``). Use::

    request = decode_request(model_infer_request)        # raises ValidationError on bad input
    probabilities = ...                                  # (n, num_labels) from the batcher
    response = encode_response(request, probabilities, labels, model_name="m", model_version="3")

Inputs may come in ``contents.bytes_contents`` or in ``raw_input_contents`` (each element a
4-byte little-endian length followed by its bytes, the framing tritonclient, KServe and
MLServer use); the response answers in the same form the request used, because tritonclient
sends raw and reads raw, while JSON-minded OIP clients send and read typed contents.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from textserve.artifact import shown
from textserve.oip import grpc_service_pb2 as pb
from textserve.service.errors import ValidationError

__all__ = [
    "INPUT_NAME",
    "OUTPUT_NAMES",
    "PAIR_INPUT_NAME",
    "DecodedRequest",
    "decode_request",
    "encode_response",
    "pack_bytes",
    "unpack_bytes",
]

INPUT_NAME = "TEXT"
PAIR_INPUT_NAME = "TEXT_PAIR"  # optional: the second texts of sentence pairs, shaped as TEXT
INPUT_NAMES = (INPUT_NAME, PAIR_INPUT_NAME)
OUTPUT_NAMES: tuple[str, ...] = ("LABEL", "SCORE", "PROBABILITIES")
# A token classifier's one output: per text, a JSON list of its entities as transformers'
# pipeline gives them ({"entity_group", "score", "word", "start", "end"}).
TOKEN_OUTPUT_NAMES: tuple[str, ...] = ("ENTITIES",)
TRUNCATE_PARAMETER = "truncate"
_LENGTH = struct.Struct("<I")


@dataclass(frozen=True)
class DecodedRequest:
    """What textserve needs from a ModelInferRequest, checked."""

    texts: list[str]  # the TEXT elements in row-major order
    column: bool  # True when TEXT was [n, 1]: LABEL and SCORE are then [n, 1] too
    outputs: tuple[str, ...]  # requested outputs in the order asked (all three if none asked)
    raw: bool  # the inputs came in raw_input_contents: answer in raw_output_contents
    truncate: bool | None  # the `truncate` parameter; None leaves the server's default
    request_id: str  # echoed in the response
    pairs: list[str] | None = None  # the TEXT_PAIR elements (sentence pairs), or None


def unpack_bytes(raw: bytes, count: int, tensor: str = INPUT_NAME) -> list[bytes]:
    """Split ``count`` length-prefixed elements out of ``raw``.

    ``unpack_bytes(b"\\x01\\x00\\x00\\x00a", 1) == [b"a"]``.

    Raises ValidationError naming ``tensor`` when the framing is cut short, overruns, or leaves
    bytes over.
    """
    items: list[bytes] = []
    offset = 0
    view = memoryview(raw)
    while offset < len(raw):
        if offset + _LENGTH.size > len(raw):
            raise ValidationError(
                f"input tensor {tensor!r}: raw_input_contents is malformed: element {len(items)} "
                f"has a truncated 4-byte length prefix ({len(raw) - offset} byte(s) left)"
            )
        (length,) = _LENGTH.unpack_from(raw, offset)
        offset += _LENGTH.size
        if offset + length > len(raw):
            raise ValidationError(
                f"input tensor {tensor!r}: raw_input_contents is malformed: element {len(items)} "
                f"declares {length} bytes but only {len(raw) - offset} remain"
            )
        items.append(bytes(view[offset : offset + length]))
        offset += length
    if len(items) != count:
        raise ValidationError(
            f"input tensor {tensor!r}: raw_input_contents holds {len(items)} element(s) but the "
            f"shape needs {count}"
        )
    return items


def pack_bytes(items: Sequence[bytes]) -> bytes:
    """Frame ``items`` as raw BYTES contents: each a 4-byte little-endian length, then itself."""
    return b"".join(_LENGTH.pack(len(item)) + item for item in items)


def _shape(shape: Sequence[int], limit: int = 8) -> str:
    """A request's shape for a message: at most `limit` dimensions, the count said (a client
    may send hundreds of thousands, and the message must stay small enough for grpc's
    metadata)."""
    if len(shape) <= limit:
        return str(list(shape))
    return f"[{', '.join(map(str, shape[:limit]))}, …] ({len(shape)} dimensions)"


def _datatype(datatype: str) -> str:
    """A datatype as sent, for a message: as is when short (FP32), else cut (shown)."""
    if not datatype:
        return "none"
    return datatype if len(datatype) <= 64 and datatype.isprintable() else shown(datatype)


def _element_count(tensor: pb.ModelInferRequest.InferInputTensor) -> int:
    shape = list(tensor.shape)
    if len(shape) not in (1, 2) or (len(shape) == 2 and shape[1] != 1):
        raise ValidationError(
            f"input tensor {tensor.name!r}: shape must be [n] or [n, 1], got {_shape(shape)}"
        )
    if shape[0] < 1:
        raise ValidationError(
            f"input tensor {tensor.name!r}: shape {_shape(shape)} has no elements; send at least "
            "one text"
        )
    return math.prod(shape)


def _decode_utf8(items: Sequence[bytes], tensor: str) -> list[str]:
    texts = []
    for index, item in enumerate(items):
        try:
            texts.append(item.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise ValidationError(
                f"input tensor {tensor!r}: element {index} is not valid UTF-8 ({exc.reason} at "
                f"byte {exc.start})"
            ) from None
    return texts


def _requested_outputs(
    request: pb.ModelInferRequest, known: tuple[str, ...] = OUTPUT_NAMES
) -> tuple[str, ...]:
    names = [output.name for output in request.outputs]
    if not names:
        return known
    for name in names:
        if name not in known:
            raise ValidationError(
                f"unknown output tensor {shown(name)}; the model's outputs are {', '.join(known)}"
            )
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValidationError(f"output tensor {shown(duplicates[0])} is requested more than once")
    return tuple(names)


def _truncate(request: pb.ModelInferRequest) -> bool | None:
    if TRUNCATE_PARAMETER not in request.parameters:
        return None
    parameter = request.parameters[TRUNCATE_PARAMETER]
    kind = parameter.WhichOneof("parameter_choice")
    if kind != "bool_param":
        got = kind or "no value"
        raise ValidationError(
            f"parameter {TRUNCATE_PARAMETER!r} must be a bool (bool_param), got {got}"
        )
    return parameter.bool_param


def decode_request(
    request: pb.ModelInferRequest, outputs: tuple[str, ...] = OUTPUT_NAMES
) -> DecodedRequest:
    """Check a ModelInferRequest and take out its texts (and pairs) and options; ValidationError
    if bad. `outputs`: the model's (OUTPUT_NAMES, or a token classifier's TOKEN_OUTPUT_NAMES)."""
    names = [tensor.name for tensor in request.inputs]
    unexpected = [name for name in names if name not in INPUT_NAMES]
    if unexpected:
        raise ValidationError(
            f"unexpected input tensor {shown(unexpected[0])}; the model takes {INPUT_NAME!r} (and, "
            f"for sentence pairs, {PAIR_INPUT_NAME!r})"
        )
    if INPUT_NAME not in names:
        raise ValidationError(f"input tensor {INPUT_NAME!r} is missing; send the texts in it")
    for name in INPUT_NAMES:
        if names.count(name) > 1:
            raise ValidationError(f"input tensor {name!r} is given {names.count(name)} times")
    raw = len(request.raw_input_contents) > 0
    if raw and len(request.raw_input_contents) != len(names):
        raise ValidationError(
            f"raw_input_contents has {len(request.raw_input_contents)} entries but the "
            f"request has {len(names)} input tensor{'s' if len(names) > 1 else ''}; send "
            "exactly one entry per input"
        )
    # raw_input_contents are in the order of the inputs
    decoded = {
        tensor.name: _tensor_texts(tensor, request.raw_input_contents[i] if raw else None)
        for i, tensor in enumerate(request.inputs)
    }
    texts, shape = decoded[INPUT_NAME]
    pairs = None
    if PAIR_INPUT_NAME in decoded:
        pairs, pair_shape = decoded[PAIR_INPUT_NAME]
        if pair_shape != shape:
            raise ValidationError(
                f"input tensor {PAIR_INPUT_NAME!r} has shape {_shape(pair_shape)} but "
                f"{INPUT_NAME!r} has {_shape(shape)}: send one pair per text"
            )
    return DecodedRequest(
        texts=texts,
        column=len(shape) == 2,
        outputs=_requested_outputs(request, outputs),
        raw=raw,
        truncate=_truncate(request),
        request_id=request.id,
        pairs=pairs,
    )


def _tensor_texts(
    tensor: pb.ModelInferRequest.InferInputTensor, raw: bytes | None
) -> tuple[list[str], list[int]]:
    """The texts of one BYTES input tensor (from its raw entry, or its contents) and its shape."""
    name = tensor.name
    if tensor.datatype != "BYTES":
        raise ValidationError(
            f"input tensor {name!r}: datatype must be BYTES, got {_datatype(tensor.datatype)}"
        )
    count = _element_count(tensor)
    if raw is not None:
        if tensor.HasField("contents"):
            raise ValidationError(
                f"input tensor {name!r}: give its data either in contents or in "
                "raw_input_contents, not both"
            )
        items = unpack_bytes(raw, count, name)
    else:
        items = list(tensor.contents.bytes_contents)
        if len(items) != count:
            typed = [
                field.name
                for field, _ in tensor.contents.ListFields()
                if field.name != "bytes_contents"
            ]
            hint = f"; BYTES data goes there, not in {', '.join(typed)}" if typed else ""
            raise ValidationError(
                f"input tensor {name!r}: shape {_shape(tensor.shape)} needs {count} "
                f"element(s) but contents.bytes_contents has {len(items)}{hint}"
            )
    return _decode_utf8(items, name), list(tensor.shape)


def encode_response(
    request: DecodedRequest,
    probabilities: Sequence[Sequence[float]] | np.ndarray,
    labels: Sequence[str],
    *,
    model_name: str,
    model_version: str,
) -> pb.ModelInferResponse:
    """Build the ModelInferResponse for ``request`` from ``probabilities`` (n, len(labels)).

    LABEL is the most probable label and SCORE its probability; outputs come in the order
    requested, raw or typed as the request was.
    """
    probs = np.asarray(probabilities, dtype=np.float32)
    n = len(request.texts)
    if probs.shape != (n, len(labels)):
        # A bug upstream, not bad input: the batcher owes one row of len(labels) per text.
        raise ValueError(f"probabilities have shape {probs.shape}, expected {(n, len(labels))}")
    best = probs.argmax(axis=1)
    row_shape = [n, 1] if request.column else [n]
    tensors: dict[str, tuple[str, list[int], list[bytes] | np.ndarray]] = {
        "LABEL": ("BYTES", row_shape, [labels[i].encode("utf-8") for i in best]),
        "SCORE": ("FP32", row_shape, probs[np.arange(n), best]),
        "PROBABILITIES": ("FP32", [n, len(labels)], probs),
    }
    response = pb.ModelInferResponse(
        model_name=model_name, model_version=model_version, id=request.request_id
    )
    for name in request.outputs:
        datatype, shape, data = tensors[name]
        output = response.outputs.add(name=name, datatype=datatype, shape=shape)
        if isinstance(data, np.ndarray):
            if request.raw:
                response.raw_output_contents.append(data.astype("<f4").tobytes())
            else:
                output.contents.fp32_contents.extend(data.ravel().tolist())
        elif request.raw:
            response.raw_output_contents.append(pack_bytes(data))
        else:
            output.contents.bytes_contents.extend(data)
    return response


def encode_entities(
    request: DecodedRequest,
    entities: Sequence[str],
    *,
    model_name: str,
    model_version: str,
) -> pb.ModelInferResponse:
    """A token classifier's ModelInferResponse: ENTITIES, BYTES shaped as TEXT was, each
    element one text's entities as JSON (`entities`: those JSON strings)."""
    n = len(request.texts)
    response = pb.ModelInferResponse(
        model_name=model_name, model_version=model_version, id=request.request_id
    )
    output = response.outputs.add(
        name="ENTITIES", datatype="BYTES", shape=[n, 1] if request.column else [n]
    )
    data = [one.encode("utf-8") for one in entities]
    if request.raw:
        response.raw_output_contents.append(pack_bytes(data))
    else:
        output.contents.bytes_contents.extend(data)
    return response
