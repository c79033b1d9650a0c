"""Unit tests of textserve.onnx_contract: the one graph I/O check (on an onnxruntime session and
on an ONNX ModelProto alike) and the one way sessions are made, for serving and export."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from tests.handmade import make_onnx
from textserve.onnx_contract import (
    KNOWN_INPUTS,
    GraphContractError,
    check_graph,
    graph_args,
    inference_session,
    session_options,
)

LABELS = 3
WITH_TYPES = ("input_ids", "attention_mask", "token_type_ids")


def with_token_type_ids(model: onnx.ModelProto) -> onnx.ModelProto:
    """The graph with a third int64 (batch, sequence) input, as BERT-like exports have."""
    model.graph.input.append(
        helper.make_tensor_value_info(
            "token_type_ids", TensorProto.INT64, ["batch_size", "sequence_length"]
        )
    )
    return model


def session(model: onnx.ModelProto) -> object:
    return inference_session(model.SerializeToString(), ["CPUExecutionProvider"])


def test_a_contract_graph_passes_as_a_session_and_as_a_proto() -> None:
    model = make_onnx(16, LABELS)
    for graph in (model, session(model)):
        check_graph(graph)
        check_graph(graph, num_labels=LABELS, strict=True)
    inputs, outputs = graph_args(model)
    assert [(a.name, a.type, a.shape) for a in inputs] == [
        ("input_ids", "tensor(int64)", ("batch_size", "sequence_length")),
        ("attention_mask", "tensor(int64)", ("batch_size", "sequence_length")),
    ]
    assert [(a.name, a.type, a.shape) for a in outputs] == [
        ("logits", "tensor(float)", ("batch_size", LABELS))
    ]


def test_token_type_ids_is_taken_only_where_the_manifest_lists_it() -> None:
    model = with_token_type_ids(make_onnx(16, LABELS))
    for graph in (model, session(model)):
        check_graph(graph, WITH_TYPES, num_labels=LABELS, strict=True)
        with pytest.raises(GraphContractError, match="the contract is inputs \\['input_ids', 'at"):
            check_graph(graph)  # the manifest does not list it: the graph breaks the contract
    plain = make_onnx(16, LABELS)
    with pytest.raises(GraphContractError, match=r"inputs \['input_ids', 'attention_mask'\] and"):
        check_graph(plain, WITH_TYPES)  # listed, but the graph does not take it


@pytest.mark.parametrize(
    "inputs",
    [("input_ids",), ("input_ids", "attention_mask", "position_ids"), ("input_ids",) * 2],
)
def test_an_inputs_list_outside_the_contract_is_refused(inputs: tuple[str, ...]) -> None:
    assert KNOWN_INPUTS == WITH_TYPES
    with pytest.raises(GraphContractError, match="are not a contract's"):
        check_graph(make_onnx(16, LABELS), inputs)


def test_strict_wants_dynamic_axes_float32_logits_alone_and_the_label_count() -> None:
    model = make_onnx(16, LABELS)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2  # frozen at export shape
    check_graph(model)  # the server runs what it can
    with pytest.raises(GraphContractError, match=r"input_ids axis 0 \(batch\) is fixed at 2"):
        check_graph(model, strict=True)
    with pytest.raises(GraphContractError, match="logits axis 1 is 3, expected 4"):
        check_graph(make_onnx(16, LABELS), num_labels=LABELS + 1)
    model = make_onnx(16, LABELS)
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    check_graph(model)  # widened by the server
    with pytest.raises(GraphContractError, match=r"logits is tensor\(float16\) of rank 2"):
        check_graph(model, strict=True)
    model = make_onnx(16, LABELS)
    model.graph.output.append(helper.make_tensor_value_info("maskf", TensorProto.FLOAT, None))
    check_graph(model)  # another output: unused
    with pytest.raises(GraphContractError, match=r"outputs \['logits', 'maskf'\]"):
        check_graph(model, strict=True)


def test_wrong_types_and_ranks_are_named() -> None:
    model = make_onnx(16, LABELS)
    model.graph.input[1].type.tensor_type.elem_type = TensorProto.INT32
    with pytest.raises(GraphContractError, match=r"attention_mask is tensor\(int32\) of rank 2;"):
        check_graph(model)
    model = make_onnx(16, LABELS)
    del model.graph.input[0].type.tensor_type.shape.dim[1]
    with pytest.raises(GraphContractError, match=r"input_ids is tensor\(int64\) of rank 1"):
        check_graph(model)


def test_session_options_are_the_servers() -> None:
    options = session_options(intra_op_threads=3)
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (3, 1)
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert options.log_severity_level == 3
    assert session_options().intra_op_num_threads == 0  # onnxruntime's own default
