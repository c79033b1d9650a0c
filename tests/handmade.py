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


def make_onnx(
    vocab_size: int, num_labels: int, seed: int = 0, *, max_positions: int | None = None
) -> onnx.ModelProto:
    """logits = mean over real tokens of W[input_ids]  (B, T) -> (B, num_labels).

    `max_positions`: add a position table of that many rows (zeros: the logits do not change),
    so that, as with a learned position embedding, the graph refuses longer inputs."""
    rng = np.random.default_rng(seed)
    weights = rng.normal(size=(vocab_size, num_labels)).astype(np.float32)
    tokens = "emb" if max_positions is None else "tokens"
    nodes = [helper.make_node("Gather", ["W", "input_ids"], [tokens], axis=0)]  # (B, T, L)
    initializers: list[onnx.TensorProto] = []
    if max_positions is not None:
        nodes += [
            helper.make_node("Shape", ["input_ids"], ["shape"]),
            helper.make_node("Gather", ["shape", "one"], ["length"], axis=0),  # T
            helper.make_node("Range", ["zero", "length", "one"], ["positions"]),  # (T,)
            helper.make_node("Gather", ["P", "positions"], ["pos"], axis=0),  # (T, L)
            helper.make_node("Add", ["tokens", "pos"], ["emb"]),
        ]
        initializers += [
            numpy_helper.from_array(np.zeros((max_positions, num_labels), np.float32), "P"),
            numpy_helper.from_array(np.array(0, dtype=np.int64), "zero"),
            numpy_helper.from_array(np.array(1, dtype=np.int64), "one"),
        ]
    nodes += [
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
            *initializers,
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
    words: Sequence[str] = WORDS,
    embedding_rows: int | None = None,
    max_positions: int | None = None,
) -> Path:
    """Write repository/name/version/ with model.onnx, tokenizer.json and manifest.json.

    `words`: the tokenizer's vocabulary (after [PAD] and [UNK]); `embedding_rows`: the ids the
    model takes (default: the tokenizer's, fewer makes a model that does not fit its tokenizer);
    `max_positions`: the longest input the graph takes (default: any)."""
    path = repository / name / str(version)
    path.mkdir(parents=True)
    tokenizer = make_tokenizer(words)
    tokenizer.save(str(path / TOKENIZER_FILE))
    rows = tokenizer.get_vocab_size() if embedding_rows is None else embedding_rows
    model = make_onnx(rows, len(labels), seed, max_positions=max_positions)
    onnx.save(model, str(path / MODEL_FILE))
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
