"""Graph producers: PyTorch → ONNX, onnxruntime's optimizers, INT8 and FP16 variants.

Each takes a file and writes a file; the checks live in export/checks.py and the order of
things (and what is published) in export/pipeline.py.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import onnx
import onnxruntime as ort
import torch

from textserve.artifact import INPUT_NAMES, OUTPUT_NAME
from textserve.export.options import (
    DEFAULT_EXPORTER,
    DEFAULT_OPSET,
    DEFAULT_PADDING_FREE,
    EXPORTERS,
    ExportOptions,
)

if TYPE_CHECKING:
    from textserve.export.description import Description

logger = logging.getLogger(__name__)

# The defaults (DEFAULT_OPSET 18, DEFAULT_EXPORTER, DEFAULT_PADDING_FREE) are ExportOptions'
# (export/options.py); why they are what they are is measured here.
# Exporter choice (torch 2.13, onnxruntime 1.32, "small" preset, 1 thread, dense graph):
# both exporters give a correct graph with truly dynamic batch_size/sequence_length axes — each
# passes assert_parity at batch 1/7/64 × length 1/5/37/64 with max |Δlogit| ~3e-7 — but
#  * TorchScript (dynamo=False) exports in 0.2 s, dynamo in 8–13 s (it matters for `make serve`
#    and for a test suite that exports several times);
#  * under the server's ORT_ENABLE_ALL session the TorchScript graph runs ~30% faster at batch
#    32 (ORT profile: 18–22 ms vs 26–30 ms per batch of 32 × 48 tokens). onnxruntime fuses its
#    Linear+GELU into BiasGelu, while the dynamo graph (GELU decomposed into Erf/Mul/Add at
#    opset 18) gets Add+LayerNorm fused into SkipLayerNormalization, which is slow on CPU here
#    (~22% of the batch; CPU sessions now leave that fusion out, service/engine/runtime.py's
#    disabled_optimizers). At batch 1 the two are within noise of each other.
# The TorchScript exporter is deprecated upstream but still supported in the pinned torch; the
# dynamo path stays available (`--exporter dynamo`) and is tested, for when it must take over.

# Graph form: padding-free by default (export/padding_free.py). Measured on the default model
# (small preset, 1 thread, onnxruntime 1.32, test split, `python -m textserve.export.bench`,
# medians of 3 runs): at batch 32 the dense graph ran at 0.87x PyTorch eager, the padding-free
# one at 1.75x
# (2056 vs 1167 texts/s); at batch 1 (nothing to remove, a few more nodes) 2.4x vs 2.7x. The
# ORT profile of the dense graph at batch 32: MatMul 47% of the time, half of it on padding;
# Softmax 16%, mostly subnormal-exp assists on the padding keys; Where (the mask) 5%.
# Since then its attention gathers q, k, v straight into (B, H, T, D) (no split/transposes):
# 1.69x PyTorch at batch 32 in `make bench`, 2.41x at batch 1; and padding keys are outweighed
# instead of masked with a softmax floor (padding_free._attend): another 1.15x fp32, 1.19x int8.
# `padding_free=False` exports the model's own forward.

# Offline optimization level: BASIC. Its rewrites (constant folding, redundant-node elimination,
# standard-op fusions) are semantics-preserving and provider-independent, so the published graph
# holds only standard ONNX ops and loads on any execution provider (CPU, CUDA, TensorRT, ...).
# EXTENDED/ALL emit com.microsoft contrib ops and layout changes decided for the provider used
# at optimization time, and onnxruntime's docs say such a model should then run on that same
# provider and hardware. Nothing is lost: the server's session applies ORT_ENABLE_ALL online for
# whatever provider it got, and an offline EXTENDED graph was not faster than BASIC + online ALL.
OFFLINE_LEVEL = "basic"
_LEVELS = {
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
}


def example_inputs(max_length: int, pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The export shape: batch 2 × min(16, max_length), second row padded.

    Deliberately not a shape the parity check uses, so parity proves the axes are dynamic.
    """
    t = min(16, max_length)
    ids = torch.randint(1, 50, (2, t), dtype=torch.int64)
    mask = torch.ones((2, t), dtype=torch.int64)
    mask[1, max(1, t // 2) :] = 0
    ids[mask == 0] = pad_token_id
    return ids, mask


def export_onnx(
    model: torch.nn.Module,
    path: Path,
    *,
    max_length: int,
    pad_token_id: int = 0,
    opset: int = DEFAULT_OPSET,
    exporter: str = DEFAULT_EXPORTER,
    padding_free: bool = DEFAULT_PADDING_FREE,
) -> None:
    """Write `model` (eval mode) as an ONNX graph with dynamic batch_size and sequence_length.

    padding_free: export the model's PaddingFreeClassifier form (a TransformerClassifier only).
    """
    if exporter not in EXPORTERS:
        raise ValueError(f"exporter must be one of {', '.join(EXPORTERS)}, got {exporter!r}")
    if padding_free:
        from textserve.export.padding_free import PaddingFreeClassifier

        model = PaddingFreeClassifier(model)  # type: ignore[arg-type] # TypeError if it is not one
    model.eval()
    args = example_inputs(max_length, pad_token_id)
    with warnings.catch_warnings():
        # The legacy exporter's deprecation notice, and TracerWarnings about `split(c)` reading
        # the (fixed) model width as a Python int: harmless, and assert_parity at other shapes
        # is the real proof that nothing shape-dependent was frozen into the graph.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", FutureWarning)
        if exporter == "dynamo":
            batch = torch.export.Dim("batch_size")
            # The positional table has max_length rows: the bound is part of the model.
            length = torch.export.Dim("sequence_length", max=max_length)
            shapes = ({0: batch, 1: length}, {0: batch, 1: length})
            _torch_export(model, args, path, INPUT_NAMES, opset, dynamo=True,
                          dynamic_shapes=shapes, external_data=False, verbose=False)  # fmt: skip
        else:
            _torch_export(model, args, path, INPUT_NAMES, opset, **_torchscript(INPUT_NAMES))


def write_graph(description: Description, path: Path, options: ExportOptions) -> dict[str, str]:
    """The description's model as an ONNX graph at `path`; what the manifest's extra says of it.

    A textserve run's TransformerClassifier: its padding-free form unless --no-padding-free, by
    --exporter (export_onnx). Any other source's module: TorchScript, its inputs in forward()'s
    order (export_named)."""
    d = description
    if d.source["kind"] == "textserve":
        form = "padding-free" if options.padding_free else "dense"
        logger.info(
            "exporting to ONNX (%s exporter, opset %d, %s graph)",
            options.exporter, options.opset, form,
        )  # fmt: skip
        export_onnx(
            d.model, path, max_length=d.max_length, pad_token_id=d.pad_token_id,
            opset=options.opset, exporter=options.exporter, padding_free=options.padding_free,
        )  # fmt: skip
        return {"exporter": f"torch.onnx.export ({options.exporter})", "graph_form": form}
    logger.info("exporting %s to ONNX (opset %d)", d.source["architecture"], options.opset)
    export_named(
        d.model, path, inputs=d.inputs, max_length=d.max_length, vocab_size=d.vocab_size,
        pad_token_id=d.pad_token_id, opset=options.opset, per_token=d.per_token,
    )  # fmt: skip
    return {"exporter": "torch.onnx.export (torchscript)"}


def export_named(
    model: torch.nn.Module,
    path: Path,
    *,
    inputs: Sequence[str],
    max_length: int,
    vocab_size: int,
    pad_token_id: int,
    opset: int = DEFAULT_OPSET,
    per_token: bool = False,
) -> None:
    """torch.onnx.export (TorchScript) of the model, its inputs passed positionally in `inputs`
    order (forward()'s), with dynamic batch_size and sequence_length axes; `per_token`: logits
    (batch_size, sequence_length, labels), a token classifier's."""
    t = min(16, max_length)
    ids = torch.randint(0, vocab_size, (2, t), dtype=torch.int64)
    ids[ids == pad_token_id] = (pad_token_id + 1) % vocab_size
    mask = torch.ones((2, t), dtype=torch.int64)
    mask[1, max(1, t // 2) :] = 0  # padding in the example, so the mask path is traced
    ids[mask == 0] = pad_token_id
    example = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer and deprecation notices; parity is the proof
        args = tuple(example[n] for n in inputs)
        options = _torchscript(inputs, per_token=per_token)
        _torch_export(model.eval(), args, path, inputs, opset, **options)


def _torchscript(inputs: Sequence[str], *, per_token: bool = False) -> dict[str, object]:
    """The TorchScript exporter's options: dynamic batch_size and sequence_length axes (of the
    logits too, `per_token`)."""
    axes = {0: "batch_size", 1: "sequence_length"}
    dynamic = {
        **dict.fromkeys(inputs, axes),
        OUTPUT_NAME: dict(axes) if per_token else {0: "batch_size"},
    }
    return {"dynamo": False, "dynamic_axes": dynamic, "do_constant_folding": True}


def _torch_export(
    model: torch.nn.Module,
    args: tuple[torch.Tensor, ...],
    path: Path,
    inputs: Sequence[str],
    opset: int,
    **exporter: object,
) -> None:
    """torch.onnx.export with the contract's input and output names; `exporter`: the rest."""
    torch.onnx.export(
        model,
        args,
        str(path),
        input_names=list(inputs),
        output_names=[OUTPUT_NAME],
        opset_version=opset,
        **exporter,  # type: ignore[arg-type]
    )


def optimize(src: Path, dst: Path, model_type: str | None, shape: tuple[int, int] = (0, 0)) -> str:
    """Write an optimized copy of `src`: onnxruntime's transformer optimizer for the model types
    it knows, its offline level (OFFLINE_LEVEL) for the others; returns which it was."""
    if model_type is None:
        optimize_offline(src, dst)
        return f"onnxruntime offline ({OFFLINE_LEVEL})"
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    fusions = FusionOptions(model_type)
    # SkipLayerNormalization is slow on CPU here: the server's CPU sessions leave that fusion
    # out online too (textserve.onnx_contract.disabled_optimizers): the offline optimizer leaves it
    fusions.enable_skip_layer_norm = False

    # shape (heads, hidden): the config's (0: the optimizer reads them from the graph); opt_level
    # 0: the Python fusions only (the server's session applies onnxruntime's own levels online,
    # for whatever provider it has)
    model = optimize_model(
        str(src),
        model_type=model_type,
        num_heads=shape[0],
        hidden_size=shape[1],
        opt_level=0,
        use_gpu=False,
        optimization_options=fusions,
    )
    model.save_model_to_file(str(dst))
    return f"onnxruntime.transformers.optimizer ({model_type})"


def optimize_offline(src: Path, dst: Path, *, level: str = OFFLINE_LEVEL) -> None:
    """onnxruntime's offline graph optimization (see OFFLINE_LEVEL for why basic)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = _LEVELS[level]
    options.optimized_model_filepath = str(dst)
    options.log_severity_level = 3
    ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])


def quantize_int8(src: Path, dst: Path) -> dict[str, object]:
    """Dynamic INT8 quantization (weights int8 once, activations uint8 per batch at run time).

    Per-tensor weights: per-channel gave the same test accuracy on the default model (75.39%)
    and was slower at batch 32 in our CPU measurement. MatMul and Gemm only: the quantizer's
    default also stores the embedding table as int8 and dequantizes every looked-up row at run
    time, a pass over (B, T, C) per batch (~1% of a batch of 32) for no arithmetic saved, and
    0.08 points of test accuracy lost; the cost of keeping it is ~3 MB more on disk.
    Returns the settings, for the manifest.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    settings: dict[str, object] = {
        "method": "onnxruntime.quantization.quantize_dynamic",
        "weight_type": "QInt8",
        "activation_type": "QUInt8 (dynamic)",
        "per_channel": False,
        "reduce_range": False,
        "op_types": ["MatMul", "Gemm"],
    }
    # The quantizer logs each tensor it skips to the root logger at INFO; keep that out of the
    # export's output without touching the root logger's level.
    noise = _DropRecordsFrom("onnxruntime/quantization")
    logging.getLogger().addFilter(noise)
    try:
        quantize_dynamic(
            str(src),
            str(dst),
            weight_type=QuantType.QInt8,
            per_channel=False,
            reduce_range=False,
            op_types_to_quantize=["MatMul", "Gemm"],
            # onnxruntime.transformers.optimizer's fused graphs (com.microsoft ops) leave some
            # MatMul outputs without an inferred type; they are float, as every output here
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
    finally:
        logging.getLogger().removeFilter(noise)
    return settings


class _DropRecordsFrom(logging.Filter):
    def __init__(self, path_fragment: str) -> None:
        super().__init__()
        self.path_fragment = path_fragment

    def filter(self, record: logging.LogRecord) -> bool:
        return self.path_fragment not in record.pathname.replace("\\", "/")


def convert_fp16(src: Path, dst: Path) -> dict[str, object]:
    """Float16 weights and arithmetic for the CUDA provider; inputs stay int64, logits float32.

    Constants beyond float16's range (the dense graph's attention mask: float32's minimum) are
    clamped to ±65504, which still gives padding keys a zero softmax weight; the padding-free
    graph has no such constant. Ops on the converter's default list stay in float32.
    """
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(str(src))
    converted = convert_float_to_float16(model, keep_io_types=True)
    onnx.save(converted, str(dst))
    return {
        "method": "onnxruntime.transformers.float16",
        "keep_io_types": True,
        "op_block_list": "default",
    }
