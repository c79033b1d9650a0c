"""A model that does next to nothing, for showing the load generator is not the bottleneck.

    version_dir = write_trivial_version(Path("models/default/1"), scratch_repository)

It keeps the real model's tokenizer, labels and max_length (tokenization, batching and gRPC
stay real) and replaces the network with one tiny lookup: logits = sum of W[input_ids] over the
sequence, W of (vocab, labels). A server on it is bound by everything *but* the model, so the
load generator driving it faster than the real server shows the load generator has headroom.
Building the graph needs the `onnx` package (textserve[train]); without it the check is skipped.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from textserve.artifact import MODEL_FILE, TOKENIZER_FILE, Manifest, sha256_file

TRIVIAL_NAME = "trivial"


def write_trivial_version(source_version: Path, repository: Path, name: str = TRIVIAL_NAME) -> Path:
    """Write repository/name/1/ (model.onnx, tokenizer.json, manifest.json); returns it.
    Raises ModuleNotFoundError when onnx is not installed."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from tokenizers import Tokenizer

    manifest = Manifest.read(source_version)
    vocab = Tokenizer.from_file(str(source_version / TOKENIZER_FILE)).get_vocab_size()
    labels = len(manifest.labels)
    weights = np.random.default_rng(0).normal(size=(vocab, labels)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["W", "input_ids"], ["emb"], axis=0),  # (B, T, L)
            helper.make_node("ReduceSum", ["emb", "axis1"], ["logits"], keepdims=0),  # (B, L)
        ],
        "trivial",
        [
            helper.make_tensor_value_info(
                "input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]
            ),
            # in the contract's inputs but unused: onnxruntime accepts it all the same
            helper.make_tensor_value_info(
                "attention_mask", TensorProto.INT64, ["batch_size", "sequence_length"]
            ),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch_size", labels])],
        initializer=[
            numpy_helper.from_array(weights, "W"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    target = repository / name / "1"
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    onnx.save(model, str(target / MODEL_FILE))
    shutil.copyfile(source_version / TOKENIZER_FILE, target / TOKENIZER_FILE)
    dataclasses.replace(
        manifest,
        name=name,
        version=1,
        opset=17,
        sha256={f: sha256_file(target / f) for f in (MODEL_FILE, TOKENIZER_FILE)},
        extra={"benchmark": "trivial model for the load generator check; not a classifier"},
    ).write(target)
    return target
