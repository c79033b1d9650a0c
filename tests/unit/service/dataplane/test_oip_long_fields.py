"""Every request field a ModelInfer error echoes goes through the one cut (textserve.artifact
.shown, and the shape's own): a 3 MiB tensor name or datatype, a 20 k-character output name or
a 300 k-entry shape answers with a short message, not one too big for grpc's metadata (which
the client would see as RESOURCE_EXHAUSTED instead of the real error)."""

from __future__ import annotations

import pytest

from textserve.oip import grpc_service_pb2 as pb
from textserve.service.dataplane.oip_codec import decode_request
from textserve.service.errors import ValidationError

HUGE = "x" * (3 << 20)


def text_tensor(**fields: object) -> pb.ModelInferRequest.InferInputTensor:
    tensor = pb.ModelInferRequest.InferInputTensor(name="TEXT", datatype="BYTES", shape=[1])
    tensor.contents.bytes_contents.append(b"a good film")
    for name, value in fields.items():
        if name == "shape":
            del tensor.shape[:]
            tensor.shape.extend(value)  # type: ignore[arg-type]
        else:
            setattr(tensor, name, value)
    return tensor


CASES = {
    "input name": pb.ModelInferRequest(inputs=[text_tensor(name=HUGE)]),
    "datatype": pb.ModelInferRequest(inputs=[text_tensor(datatype=HUGE)]),
    "output name": pb.ModelInferRequest(
        inputs=[text_tensor()],
        outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="y" * 20_000)],
    ),
    "duplicate output": pb.ModelInferRequest(
        inputs=[text_tensor()],
        outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="LABEL")] * 2,
    ),
    "shape": pb.ModelInferRequest(inputs=[text_tensor(shape=[1] * 300_000)]),
    "empty shape": pb.ModelInferRequest(inputs=[text_tensor(shape=[0] + [1] * 0)]),
    "count": pb.ModelInferRequest(inputs=[text_tensor(shape=[5])]),
}


@pytest.mark.parametrize("case", CASES)
def test_an_oversize_field_gets_a_short_message(case: str) -> None:
    with pytest.raises(ValidationError) as raised:
        decode_request(CASES[case])
    message = str(raised.value)
    assert len(message) < 400, (case, len(message), message[:200])
    if case in ("input name", "datatype"):
        assert f"({len(HUGE)} characters)" in message
    if case == "shape":
        assert "(300000 dimensions)" in message
