"""A hand-built model version for unit tests: a mean-of-embeddings ONNX graph and a word tokenizer.

It follows the artifact contract (input_ids/attention_mask -> logits, tokenizer.json, manifest)
and is mask-correct, so a text's logits do not depend on what it is batched with; it needs no
torch and builds in milliseconds. Integration tests use the real exported tiny model instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from textserve.artifact import MODEL_FILE, TOKENIZER_FILE, Manifest, sha256_file

WORDS = ["good", "bad", "film", "great", "awful", "plot", "a", "the", "is", "and"]


def make_tokenizer(words: Sequence[str] = WORDS) -> Tokenizer:
    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(words)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return tokenizer


def make_onnx(vocab_size: int, num_labels: int, seed: int = 0) -> onnx.ModelProto:
    """logits = mean over real tokens of W[input_ids]  (B, T) -> (B, num_labels)."""
    weights = np.random.default_rng(seed).normal(size=(vocab_size, num_labels)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["W", "input_ids"], ["emb"], axis=0),  # (B, T, L)
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "axis2"], ["mask3"]),  # (B, T, 1)
        helper.make_node("Mul", ["emb", "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axis1"], ["summed"], keepdims=0),  # (B, L)
        helper.make_node("ReduceSum", ["maskf", "axis1"], ["count"], keepdims=1),  # (B, 1)
        helper.make_node("Div", ["summed", "count"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "handmade",
        [
            helper.make_tensor_value_info(
                "input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]
            ),
            helper.make_tensor_value_info(
                "attention_mask", TensorProto.INT64, ["batch_size", "sequence_length"]
            ),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch_size", num_labels])],
        initializer=[
            numpy_helper.from_array(weights, "W"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
            numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def make_version(
    repository: Path,
    name: str = "handmade",
    version: int = 1,
    *,
    labels: Sequence[str] = ("negative", "positive"),
    max_length: int = 8,
    seed: int = 0,
) -> Path:
    """Write repository/name/version/ with model.onnx, tokenizer.json and manifest.json."""
    path = repository / name / str(version)
    path.mkdir(parents=True)
    tokenizer = make_tokenizer()
    tokenizer.save(str(path / TOKENIZER_FILE))
    onnx.save(make_onnx(tokenizer.get_vocab_size(), len(labels), seed), str(path / MODEL_FILE))
    Manifest(
        name=name,
        version=version,
        labels=list(labels),
        max_length=max_length,
        pad_token_id=0,
        opset=17,
        precision="fp32",
        sha256={f: sha256_file(path / f) for f in (MODEL_FILE, TOKENIZER_FILE)},
        source_checkpoint_sha256="0" * 64,
        parity={"max_abs_logit_diff": 0.0, "argmax_agreement": 1.0, "tolerance": 1e-4},
        test_accuracy=0.5,
        created_at="2024-01-01T00:00:00Z",
    ).write(path)
    return path
