"""The one description of a model every export source yields (export/sources.py), and the
labelled split it is scored on: what the export pipeline (export/pipeline.py) takes.

    Description(model=module, inputs=["input_ids", "attention_mask"], labels=["neg", "pos"], ...)

No torch here: a description holds a torch module, but this module imports none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from textserve.artifact import SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION


class Split(NamedTuple):
    """Labelled texts the published graph is scored on (a run's test split, --test-data)."""

    texts: list[str]
    labels: list[int]  # indices into the description's labels
    origin: str = "--test-data"  # what it is, as the manifest says where int8 was checked


@dataclass
class Description:
    """A model ready to export, whatever its source: a torch module called with the graph's
    inputs by name (`model(**inputs)` → logits) and everything the manifest says."""

    model: Any  # torch.nn.Module: model(input_ids=…, attention_mask=…[, token_type_ids=…])
    inputs: list[str]  # graph inputs, in the order forward() takes them
    labels: list[str]
    activation: str  # softmax | sigmoid | none
    max_length: int
    pad_token_id: int
    unk_token_id: int | None  # textserve.artifact.UNK_BY_NAME: the id of "[UNK]"
    tokenizer_file: Path
    checkpoint: Path  # hashed into source_checkpoint_sha256
    # kind, architecture, model_type; kind "textserve" (a TransformerClassifier) has its own graph
    # forms (padding-free, --exporter): export/transforms.py's write_graph
    source: dict[str, Any]
    vocab_size: int  # the input embedding's rows: every token id must be below it
    labels_origin: str = "labels"  # where the labels were read, for a message refusing one
    type_vocab_size: int = 0  # token_type_ids take values below this (inputs has it when > 1)
    truncation_side: str = "right"  # which end of an over-long text is cut
    split: Split | None = None  # scored into test_accuracy; None: no test split
    folder: Path | None = None  # a Hugging Face folder: checked against transformers itself
    hf_model: Any = None  # the transformers model, for its pipeline
    ort_model_type: str | None = None  # onnxruntime.transformers.optimizer's model type
    shape: tuple[int, int] = (0, 0)  # (attention heads, hidden size) for it; 0: read the graph
    versions: dict[str, Any] = field(default_factory=dict)  # beside torch/onnx/onnxruntime's
    notes: dict[str, Any] = field(default_factory=dict)  # more for the manifest's extra
    # SEQUENCE_CLASSIFICATION (logits (B, labels)) or TOKEN_CLASSIFICATION (logits (B, T, labels),
    # softmax per token; `tagging`: the manifest's defaults: export/tagging.py)
    task: str = SEQUENCE_CLASSIFICATION
    tagging: dict[str, Any] | None = None
    # an NLI model's entailment and contradiction label indexes (textserve.nli): the manifest's
    zero_shot: dict[str, int | None] | None = None

    @property
    def per_token(self) -> bool:
        """A token classifier: a row of logits per token, compared on real tokens only."""
        return self.task == TOKEN_CLASSIFICATION
