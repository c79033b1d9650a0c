"""Runs real tritonclient calls for the system tests, in a process of its own.

tritonclient registers its own copy of the `inference` protobuf package in the default
descriptor pool; textserve's generated `inference` package registers the same names, and
protobuf refuses both in one process ("duplicate symbol"). So the tests keep the server in
their process and drive tritonclient here, one JSON request per stdin line, one JSON reply per
stdout line::

    {"op": "call", "method": "get_model_metadata", "kwargs": {"model_name": "m", "as_json": true}}
    {"op": "infer", "model": "m", "inputs": [{"name": "TEXT", "datatype": "BYTES",
        "shape": [2, 1], "texts": ["a", "b"]}], "outputs": ["LABEL"], "parameters": {...}}
    {"op": "stub", "method": "ModelInfer", "request": {<ModelInferRequest as JSON>}}

Replies are {"result": ...} or {"error": {"status": "StatusCode.X", "message": "..."}}.
"stub" sends a hand-built message through tritonclient's own generated stub (typed contents,
malformed framing: what the high-level client never sends).
"""

from __future__ import annotations

import base64
import json
import sys
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc as triton
from google.protobuf import json_format
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException


def _input(spec: dict[str, Any]) -> triton.InferInput:
    if "texts" in spec:
        data = np.array([t.encode("utf-8") for t in spec["texts"]], dtype=np.object_)
    elif "bytes_b64" in spec:
        data = np.array([base64.b64decode(b) for b in spec["bytes_b64"]], dtype=np.object_)
    else:
        data = np.array(spec["floats"], dtype=np.float32)
    if data.size == int(np.prod(spec["shape"])):
        data = data.reshape(spec["shape"])
    tensor = triton.InferInput(spec["name"], list(data.shape), spec["datatype"])
    tensor.set_data_from_numpy(data)
    # A shape that disagrees with the data: the client checks it against the array, so it is
    # set after the data to reach the server.
    tensor.set_shape(spec["shape"])
    return tensor


def _tensor(result: triton.InferResult, name: str) -> dict[str, Any]:
    array = result.as_numpy(name)
    output = result.get_output(name)
    values = [v.decode("utf-8") if isinstance(v, bytes) else v for v in array.ravel().tolist()]
    return {"datatype": output.datatype, "shape": list(output.shape), "data": values}


def infer(client: triton.InferenceServerClient, op: dict[str, Any]) -> dict[str, Any]:
    outputs = [triton.InferRequestedOutput(name) for name in op.get("outputs", [])]
    result = client.infer(
        op["model"],
        [_input(spec) for spec in op["inputs"]],
        model_version=op.get("version", ""),
        outputs=outputs or None,
        request_id=op.get("request_id", ""),
        parameters=op.get("parameters"),
    )
    response = result.get_response()
    return {
        "model_name": response.model_name,
        "model_version": response.model_version,
        "id": response.id,
        "raw": len(response.raw_output_contents) > 0,
        "outputs": {o.name: _tensor(result, o.name) for o in response.outputs},
    }


def stub_call(stub: service_pb2_grpc.GRPCInferenceServiceStub, op: dict[str, Any]) -> Any:
    rpc = getattr(stub, op["method"])
    request_type = getattr(service_pb2, op["method"] + "Request")
    response = rpc(json_format.ParseDict(op["request"], request_type()), timeout=30)
    return json_format.MessageToDict(response, preserving_proto_field_name=True)


def handle(client: triton.InferenceServerClient, stub: Any, op: dict[str, Any]) -> Any:
    if op["op"] == "call":
        return getattr(client, op["method"])(**op.get("kwargs", {}))
    if op["op"] == "infer":
        return infer(client, op)
    if op["op"] == "stub":
        return stub_call(stub, op)
    raise ValueError(f"unknown op {op['op']!r}")


def main() -> int:
    url = sys.argv[1]
    client = triton.InferenceServerClient(url)
    channel = grpc.insecure_channel(url)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        op = json.loads(line)
        try:
            reply: dict[str, Any] = {"result": handle(client, stub, op)}
        except InferenceServerException as exc:
            reply = {"error": {"status": exc.status(), "message": exc.message()}}
        except grpc.RpcError as exc:
            reply = {"error": {"status": str(exc.code()), "message": exc.details()}}
        except Exception as exc:  # a mistake in the op: report it, keep serving the others
            reply = {"error": {"status": "worker", "message": repr(exc)}}
        print(json.dumps(reply), flush=True)
    client.close()
    channel.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
