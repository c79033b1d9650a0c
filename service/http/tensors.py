"""KServe v2 REST inference bodies <-> the Open Inference Protocol's protobuf messages; pure.

An HTTP infer request becomes the `ModelInferRequest` the gRPC front end takes, so that every
check of `dataplane/oip_codec.py` (tensor names, shapes, datatypes, UTF-8, the `truncate`
parameter) holds for both transports with the same messages:

    request = parse_infer(body, header_length, model, version)   # ValidationError if bad
    decoded = decode_request(request)                              # the gRPC path's checks
    body, header_length = render_infer(response, binary)           # the answer's bytes

Triton's binary tensor extension: with an `Inference-Header-Content-Length` header the body is
that many bytes of JSON followed by each input's data whose JSON names a `binary_data_size`
(BYTES elements framed as in `raw_input_contents`: a 4-byte little-endian length each). Outputs
are answered in binary when the output asks (`parameters.binary_data`) or, for outputs without
a say, when the request's `parameters.binary_data_output` does (tritonclient's default).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from textserve.artifact import shown
from textserve.oip import grpc_service_pb2 as pb
from textserve.service.dataplane.oip_codec import pack_bytes
from textserve.service.errors import ValidationError
from textserve.service.http.messages import load_json, unicode_text

HEADER_LENGTH = "inference-header-content-length"
_MAX_SHAPE_RANK = 8


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValidationError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def _flatten(data: Any, out: list[Any]) -> None:
    """KServe v2 allows tensor data flat (row-major) or nested by the shape."""
    if isinstance(data, list):
        for item in data:
            _flatten(item, out)
    else:
        out.append(data)


def _shape(tensor: dict[str, Any], name: str) -> list[int]:
    shape = tensor.get("shape")
    if (
        not isinstance(shape, list)
        or len(shape) > _MAX_SHAPE_RANK
        or not all(type(d) is int and 0 <= d < 2**63 for d in shape)
    ):
        raise ValidationError(
            f"input tensor {name}: shape must be a list of non-negative integers, got "
            f"{json.dumps(shape)[:100]}"
        )
    return shape


def _parameters(request: Any, source: dict[str, Any], what: str) -> dict[str, Any]:
    """Copy a JSON `parameters` object into a protobuf parameters map (bool, int, string)."""
    params = _object(source.get("parameters", {}), f"{what} parameters")
    for key, value in params.items():
        unicode_text(key, f"{what} parameter name {shown(key)}")
        if isinstance(value, bool):
            request.parameters[key].bool_param = value
        elif isinstance(value, int):
            if not -(2**63) <= value < 2**63:
                raise ValidationError(f"{what} parameter {shown(key)} is out of the int64 range")
            request.parameters[key].int64_param = value
        elif isinstance(value, str):
            request.parameters[key].string_param = unicode_text(value, f"{what} parameter")
        elif isinstance(value, float):
            request.parameters[key].double_param = value
        else:
            raise ValidationError(
                f"{what} parameter {shown(key)} must be a bool, number or string, got "
                f"{type(value).__name__}"
            )
    return params


def _add_input(
    request: pb.ModelInferRequest, tensor: dict[str, Any], binary: memoryview, offset: int
) -> int:
    """Add one JSON input tensor to `request`; returns the offset past its binary data."""
    raw_name = tensor.get("name")
    if not isinstance(raw_name, str):
        raise ValidationError("every input tensor needs a `name` (a string)")
    name = shown(raw_name)  # in messages: a name is the client's text, quoted shortened
    unicode_text(raw_name, f"input tensor name {name}")
    datatype = tensor.get("datatype")
    if not isinstance(datatype, str):
        raise ValidationError(f"input tensor {name}: `datatype` must be a string")
    shape = _shape(tensor, name)
    item = request.inputs.add(
        name=raw_name, datatype=unicode_text(datatype, "a datatype"), shape=shape
    )
    params = _parameters(item, tensor, f"input tensor {name}")
    size = params.pop("binary_data_size", None)
    item.parameters.pop("binary_data_size", None)
    if size is not None:
        if type(size) is not int or size < 0 or offset + size > len(binary):
            raise ValidationError(
                f"input tensor {name}: binary_data_size {size!r} does not fit the "
                f"{len(binary) - offset} byte(s) of binary data left in the body"
            )
        if "data" in tensor:
            raise ValidationError(
                f"input tensor {name}: give its data either in `data` or as binary, not both"
            )
        request.raw_input_contents.append(bytes(binary[offset : offset + size]))
        return offset + size
    data = tensor.get("data")
    if data is None:
        raise ValidationError(f"input tensor {name} has no `data`")
    elements: list[Any] = []
    _flatten(data, elements)
    if datatype == "BYTES":
        if not all(isinstance(e, str) for e in elements):
            raise ValidationError(f"input tensor {name}: BYTES data must be strings")
        # (lone surrogates pass as their bytes: decode_request names the element that is not
        # UTF-8, as it does for a gRPC request's bytes)
        item.contents.bytes_contents.extend(e.encode("utf-8", "surrogatepass") for e in elements)
    # Other datatypes are no tensor this model takes: decode_request names the problem.
    return offset


def parse_infer(
    body: bytes, header_length: int | None, model: str, version: str
) -> tuple[pb.ModelInferRequest, dict[str, bool]]:
    """The ModelInferRequest an HTTP infer body carries, and which outputs are wanted binary
    (name -> bool; "" is the request's `binary_data_output` default)."""
    if header_length is None:
        header_length = len(body)
    if not 0 <= header_length <= len(body):
        raise ValidationError(
            f"Inference-Header-Content-Length {header_length} is larger than the body "
            f"({len(body)} bytes)"
        )
    document = _object(load_json(body[:header_length]), "the request body")
    request = pb.ModelInferRequest(model_name=model, model_version=version)
    request_id = document.get("id", "")
    if not isinstance(request_id, str):
        raise ValidationError("`id` must be a string")
    request.id = unicode_text(request_id, "`id`")
    params = _parameters(request, document, "request")
    binary_default = params.pop("binary_data_output", False) is True
    request.parameters.pop("binary_data_output", None)
    inputs = document.get("inputs")
    if not isinstance(inputs, list):
        raise ValidationError("`inputs` must be a list of tensors")
    binary = memoryview(body)
    offset = header_length
    for tensor in inputs:
        offset = _add_input(request, _object(tensor, "an input tensor"), binary, offset)
    if request.raw_input_contents and len(request.raw_input_contents) != len(request.inputs):
        raise ValidationError("send every input tensor as binary data, or none")
    if offset != len(body):
        raise ValidationError(
            f"{len(body) - offset} byte(s) of binary data follow the inputs that declared theirs"
        )
    wanted = {"": binary_default}
    for output in document.get("outputs", []) or []:
        output = _object(output, "a requested output")
        name = output.get("name")
        if not isinstance(name, str):
            raise ValidationError("every requested output needs a `name` (a string)")
        request.outputs.add(name=unicode_text(name, f"output {shown(name)}"))
        out_params = _object(output.get("parameters", {}), f"output {name} parameters")
        wanted[name] = bool(out_params.get("binary_data", binary_default))
    return request, wanted


def _output_values(output: pb.ModelInferResponse.InferOutputTensor, raw: bytes | None) -> Any:
    """One output's elements as JSON values (from typed contents or raw bytes)."""
    if output.datatype == "BYTES":
        if raw is not None:
            from textserve.service.dataplane.oip_codec import unpack_bytes

            items: Sequence[bytes] = unpack_bytes(raw, math.prod(output.shape), output.name)
        else:
            items = output.contents.bytes_contents
        return [item.decode("utf-8") for item in items]
    if raw is not None:
        return np.frombuffer(raw, dtype="<f4").tolist()
    return list(output.contents.fp32_contents)


def _output_bytes(output: pb.ModelInferResponse.InferOutputTensor, raw: bytes | None) -> bytes:
    if raw is not None:
        return raw
    if output.datatype == "BYTES":
        return pack_bytes(list(output.contents.bytes_contents))
    return np.asarray(output.contents.fp32_contents, dtype="<f4").tobytes()


def render_infer(response: pb.ModelInferResponse, binary: dict[str, bool]) -> tuple[bytes, int]:
    """The HTTP body of `response` and the length of its JSON part (== len(body) when no
    output is binary: then no Inference-Header-Content-Length is needed)."""
    raws: list[bytes | None] = list(response.raw_output_contents) or [None] * len(response.outputs)
    outputs: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for output, raw in zip(response.outputs, raws, strict=True):
        entry: dict[str, Any] = {
            "name": output.name,
            "datatype": output.datatype,
            "shape": list(output.shape),
        }
        if binary.get(output.name, binary[""]):
            blob = _output_bytes(output, raw)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = _output_values(output, raw)
        outputs.append(entry)
    document = {
        "model_name": response.model_name,
        "model_version": response.model_version,
        "outputs": outputs,
    }
    if response.id:
        document["id"] = response.id
    header = json.dumps(document, separators=(",", ":")).encode()
    return header + b"".join(blobs), len(header)
