"""The ONNX side of the artifact contract, in one place: onnxruntime session options and the graph
input/output check, for the server (service/engine/runtime.py) and the export's checks
(export/checks.py) alike, so a graph is checked and run the same way on both sides.

    session = inference_session("model.onnx", ["CPUExecutionProvider"], intra_op_threads=1)
    check_graph(session)                                   # or an onnx.ModelProto
    check_graph(model, inputs=("input_ids", "attention_mask", "token_type_ids"), strict=True)

Torch-free and onnx-free: onnxruntime is imported only when a session is made, and an ONNX
ModelProto is read by its fields (the ONNX spec's element type numbers), never through `onnx`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from textserve.artifact import INPUT_NAMES, OUTPUT_NAME

TOKEN_TYPE_IDS = "token_type_ids"
# Inputs a graph may take: input_ids and attention_mask always, token_type_ids where the
# architecture has it (the manifest lists which).
KNOWN_INPUTS = (*INPUT_NAMES, TOKEN_TYPE_IDS)
LOGITS_TYPES = ("tensor(float)", "tensor(float16)")  # float16 is widened by the server
# TensorProto.DataType numbers of the ONNX spec (onnx.proto), as onnxruntime names them
_ELEM_TYPES = {
    1: "float", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
    8: "string", 9: "bool", 10: "float16", 11: "double", 12: "uint32", 13: "uint64", 16: "bfloat16",
}  # fmt: skip


class GraphContractError(ValueError):
    """A graph breaks the contract: names, element types, ranks or axes of its inputs/outputs."""


@dataclass(frozen=True)
class GraphArg:
    """One graph input or output, as onnxruntime describes it."""

    name: str
    type: str  # "tensor(int64)", "tensor(float)", ...
    shape: tuple[int | str | None, ...]  # int: fixed; str: a named dynamic axis; None: unknown


def disabled_optimizers(requested: Sequence[str]) -> list[str]:
    """onnxruntime graph optimizers to leave out of a session on these providers: part of the
    contract, because the export's checks must run a graph exactly as the server will.

    CPU only: SkipLayerNormFusion. onnxruntime's CPU SkipLayerNormalization kernel runs ~5x
    slower than the Add + LayerNormalization it replaces (onnxruntime 1.32: 0.8 vs 0.15 ms at
    800 tokens x 128, the same ratio at 256 and 768 wide); the int8 graph gets two of them
    (7-10% of a batch of 32). Sessions with CUDA keep the fusion: it was not measured there, and
    onnxruntime's transformer optimizations target that kernel on GPUs.

    >>> disabled_optimizers(["CPUExecutionProvider"])
    ['SkipLayerNormFusion']
    >>> disabled_optimizers(["CUDAExecutionProvider", "CPUExecutionProvider"])
    []
    """
    return ["SkipLayerNormFusion"] if list(requested) == ["CPUExecutionProvider"] else []


def session_options(*, intra_op_threads: int | None = None, inter_op_threads: int = 1) -> Any:
    """onnxruntime SessionOptions as every textserve session uses them: ORT_ENABLE_ALL (so the
    export's parity covers the online fusions the server runs), sequential execution (our graphs
    are one chain of operators), no spinning and errors-only logging. `intra_op_threads`
    None or 0: onnxruntime's default (one per core)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if intra_op_threads:
        options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = inter_op_threads
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Idle intra-op threads would otherwise spin between runs, taking CPU from tokenization
    # and the gRPC loop on small machines; the latency cost of waking them is microseconds.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3  # errors only: provider fallbacks are reported by the caller
    return options


def inference_session(
    model: str | bytes,
    providers: Sequence[str],
    *,
    intra_op_threads: int | None = None,
    inter_op_threads: int = 1,
    provider_options: Mapping[str, Mapping[str, str]] | None = None,
) -> Any:
    """An onnxruntime InferenceSession on `providers` (best first) with session_options() and
    the contract's disabled optimizers; `provider_options`: per provider name, its options
    (e.g. the CUDA provider's device_id)."""
    import onnxruntime as ort

    requested = list(providers)
    options_by_provider = provider_options or {}
    return ort.InferenceSession(
        model,
        session_options(intra_op_threads=intra_op_threads, inter_op_threads=inter_op_threads),
        providers=requested,
        provider_options=[dict(options_by_provider.get(name, {})) for name in requested],
        disabled_optimizers=disabled_optimizers(requested),
    )


def graph_args(graph: Any) -> tuple[list[GraphArg], list[GraphArg]]:
    """(inputs, outputs) of an onnxruntime InferenceSession or an onnx ModelProto."""
    if hasattr(graph, "get_inputs"):  # an InferenceSession: NodeArgs already say it our way
        return (
            [GraphArg(a.name, a.type, tuple(a.shape)) for a in graph.get_inputs()],
            [GraphArg(a.name, a.type, tuple(a.shape)) for a in graph.get_outputs()],
        )
    return (
        [_proto_arg(value) for value in graph.graph.input],
        [_proto_arg(value) for value in graph.graph.output],
    )


def _proto_arg(value: Any) -> GraphArg:
    tensor = value.type.tensor_type
    shape = tuple(
        dim.dim_param or (dim.dim_value if dim.dim_value > 0 else None) for dim in tensor.shape.dim
    )
    elem = _ELEM_TYPES.get(tensor.elem_type, f"type {tensor.elem_type}")
    return GraphArg(value.name, f"tensor({elem})", shape)


def check_graph(
    graph: Any,
    inputs: Sequence[str] = INPUT_NAMES,
    *,
    num_labels: int | None = None,
    strict: bool = False,
    per_token: bool = False,
) -> None:
    """GraphContractError unless `graph` (an InferenceSession or an onnx ModelProto) takes
    exactly `inputs` (the manifest's list; input_ids and attention_mask, and token_type_ids
    where listed) as int64 (batch, sequence), and gives `logits` (batch, num_labels), or with
    `per_token` (a token classifier's) (batch, sequence, num_labels).

    Lenient by default, as the server is with what it can run: logits float32 or float16 (it
    widens them), other outputs ignored. `strict` (the export's check before it publishes): the
    only output is float32 logits and the batch and sequence axes are dynamic. `num_labels`:
    the logits' width where it is known.
    """
    _check_names(inputs)
    args, outs = graph_args(graph)
    names, out_names = [a.name for a in args], [o.name for o in outs]
    expected_outputs = [OUTPUT_NAME]
    if sorted(names) != sorted(inputs) or (
        out_names != expected_outputs if strict else OUTPUT_NAME not in out_names
    ):
        raise GraphContractError(
            f"inputs {names} and outputs {out_names}; the contract is inputs "
            f"{list(inputs)} and output {OUTPUT_NAME!r}"
        )
    logits = next(o for o in outs if o.name == OUTPUT_NAME)
    wrong = [_wrong(arg, ("tensor(int64)",), ("batch", "sequence"), strict) for arg in args]
    wrong.append(
        _wrong(
            logits,
            ("tensor(float)",) if strict else LOGITS_TYPES,
            ("batch", "sequence", num_labels) if per_token else ("batch", num_labels),
            strict,
        )
    )
    problems = [problem for problem in wrong if problem]
    if problems:
        shape = "(batch, sequence, labels)" if per_token else "(batch, labels)"
        raise GraphContractError(
            f"{'; '.join(problems)}; the contract is int64 (batch, sequence) inputs and a "
            f"float32 {shape} output"
        )


def _check_names(inputs: Sequence[str]) -> None:
    unknown = [name for name in inputs if name not in KNOWN_INPUTS]
    if unknown or not set(INPUT_NAMES) <= set(inputs) or len(set(inputs)) != len(inputs):
        raise GraphContractError(
            f"the inputs {list(inputs)} are not a contract's: input_ids and attention_mask, "
            f"and {TOKEN_TYPE_IDS} where the architecture has it"
        )


def _wrong(
    arg: GraphArg, types: tuple[str, ...], dims: tuple[str | int | None, ...], strict: bool
) -> str | None:
    """What is wrong with one input or output, or None."""
    if arg.type not in types or len(arg.shape) != len(dims):
        return f"{arg.name} is {arg.type} of rank {len(arg.shape)}"
    for axis, (dim, want) in enumerate(zip(arg.shape, dims, strict=True)):
        if strict and isinstance(want, str) and not isinstance(dim, str):
            # A fixed size here means the exporter baked the example shape into the graph.
            return f"{arg.name} axis {axis} ({want}) is fixed at {dim}, not dynamic"
        if isinstance(want, int) and dim != want and (strict or isinstance(dim, int)):
            return f"{arg.name} axis {axis} is {dim}, expected {want}"
    return None
