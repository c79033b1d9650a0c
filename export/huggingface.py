"""A local Hugging Face sequence or token classifier (a `save_pretrained` folder) as a
`Description`.

    description = load_folder(Path("my-finetuned-bert"), ExportOptions())

What the manifest needs is derived as transformers and text-embeddings-inference derive it:
labels from id2label (LABEL_i where missing), the activation from problem_type, max_length from
max_position_embeddings less the position offset (RoBERTa-family: pad_token_id + 1), capped by
tokenizer_config.json's model_max_length and --max-length; graph inputs in forward()'s order.
A decoder classifier (Qwen2, Llama, …: export/decoders.py) is scored at its last non-pad token:
its pad id is config.pad_token_id, else decided from the tokenizer and set there.
Remote code runs only with --trust-remote-code. Every file is checked before a library reads
it (export/folders.py) and config.json's values before transformers builds from them
(export/config_values.py): a broken folder is one line naming the file. A checkpoint must hold
every weight the model needs, of its shape, and nothing else (transformers would fill a gap with
random values: export/loading.py).
A token classifier (…ForTokenClassification: named entities, PII spans) gives logits per token,
(batch, sequence, labels), softmax per token; its label scheme and its tokenizer's character
offsets are checked here (export/tagging.py).
A sequence classifier whose id2label names an entailment class (an NLI model: textserve.nli) has
its entailment and contradiction label indexes recorded for zero-shot; two labels of one class
are refused.
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any

import torch

from textserve.artifact import SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION
from textserve.export import decoders, tagging, vetting
from textserve.export.config_values import check_config
from textserve.export.description import Description
from textserve.export.errors import ExportError, first_line
from textserve.export.folders import HF_WEIGHTS, check_huggingface_files, read_json_object
from textserve.export.loading import load_checked
from textserve.export.options import ExportOptions
from textserve.nli import AmbiguousLabels, nli_labels
from textserve.tokenization import load_tokenizer

logger = logging.getLogger(__name__)

GRAPH_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# Model types whose positions start after the pad id (position ids = cumsum(mask) + pad id),
# so max_position_embeddings - (pad_token_id + 1) positions are usable (TEI's rule).
POSITION_OFFSET_TYPES = ("roberta", "xlm-roberta", "xlm-roberta-xl", "camembert")
# onnxruntime.transformers.optimizer's model type per Hugging Face model type (its BERT fusions
# also match these encoders' attention); others are optimized by onnxruntime's basic level only.
ORT_MODEL_TYPES = {
    "bert": "bert",
    "distilbert": "bert",
    "roberta": "bert",
    "xlm-roberta": "bert",
    "camembert": "bert",
    "electra": "bert",
}
# What each task's folder holds (config.json's architectures end so) and transformers loads it with
HEADS = {
    SEQUENCE_CLASSIFICATION: "ForSequenceClassification",
    TOKEN_CLASSIFICATION: "ForTokenClassification",
}
# tokenizer_config.json's model_max_length when it was never set (transformers' VERY_LARGE_INTEGER)
_UNSET_LENGTH = 10**12
ACTIVATIONS = {
    "single_label_classification": "softmax",
    "multi_label_classification": "sigmoid",
    "regression": "none",
}


class _Logits(torch.nn.Module):
    """The classifier's logits, inputs by name: the exporter passes them positionally in
    `inputs` order, which must be forward()'s (the parity checks prove it was)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: torch.Tensor, **kwargs: torch.Tensor) -> torch.Tensor:
        # (B, num_labels); a token classifier's (B, T, num_labels)
        return self.model(*args, **kwargs, return_dict=True).logits


def load_folder(folder: Path, opts: ExportOptions) -> Description:
    """ExportError (exit 2) for a folder textserve cannot export, saying what to do."""
    check_huggingface_files(folder)
    transformers = _import_transformers()
    config, task = _read_config(transformers, folder, opts)
    model = _load_model(transformers, folder, config, opts, task)
    tokenizer = _load_tokenizer(transformers, folder, opts)
    labels_origin = f"{folder / 'config.json'}'s id2label"
    labels = _labels(config, model, folder)
    vetting.check_labels(labels, labels_origin)  # before the tagging scheme is read from them
    inputs = graph_inputs(model.forward, getattr(config, "type_vocab_size", 0))
    length = max_length(config, tokenizer.model_max_length, opts.max_length, folder)
    tags, zero_shot = None, None
    if task == TOKEN_CLASSIFICATION:
        tags = tagging.tagging_defaults(labels, length, labels_origin)
        tagging.check_offsets(load_tokenizer(folder / "tokenizer.json"), str(folder))
    else:
        zero_shot = nli_indexes(labels, labels_origin)
    unk = tokenizer.unk_token_id
    notes: dict[str, Any] = {}  # the manifest's extra: a decoder's pad decision
    if decoders.pools_last_token(model):
        decided = decoders.decide_pad(model.config, tokenizer, folder)
        pad, notes["pad_token"] = decided.id, decided.note()
        model.config.use_cache = False  # one pass per batch: no key/value cache to build
        length = decoders.capped_length(length, opts.max_length)
        if decoders.refuses_empty_text(tokenizer):
            unk = None
    else:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else config.pad_token_id
    if pad is None or pad < 0:
        raise ExportError(
            f"{folder}: neither the tokenizer nor config.json names a pad token; set "
            "tokenizer.pad_token (e.g. to its eos token) and save_pretrained again"
        )
    model_type = getattr(config, "model_type", None)
    return Description(
        model=_Logits(model).eval(),
        inputs=inputs,
        labels=labels,
        labels_origin=labels_origin,
        activation=activation(config, len(labels), folder, opts.activation, task),
        max_length=length,
        pad_token_id=int(pad),
        unk_token_id=unk,
        tokenizer_file=folder / "tokenizer.json",
        checkpoint=next(folder / n for n in HF_WEIGHTS if (folder / n).is_file()),
        source={
            "kind": "huggingface",
            "architecture": type(model).__name__,
            "model_type": model_type,
        },
        vocab_size=_embedding_rows(model, config),
        type_vocab_size=int(getattr(config, "type_vocab_size", 0) or 0),
        truncation_side=opts.truncation_side,
        folder=folder,
        hf_model=model,
        ort_model_type=ORT_MODEL_TYPES.get(model_type or ""),
        shape=_attention_shape(config),
        versions={"transformers": transformers.__version__},
        notes=notes,
        task=task,
        tagging=tags,
        zero_shot=zero_shot,
    )


def nli_indexes(labels: list[str], where: str) -> dict[str, int | None] | None:
    """The manifest's zero_shot: an NLI model's entailment and contradiction label indexes
    (textserve.nli), None for other models; ExportError for two labels of one class."""
    try:
        return nli_labels(labels)
    except AmbiguousLabels as exc:
        raise ExportError(f"{where}: {exc}") from None


def _read_config(transformers: Any, folder: Path, opts: ExportOptions) -> tuple[Any, str]:
    """The folder's config as transformers reads it, and its task; ExportError naming the field
    of config.json that no classifier could be built from."""
    config_path = folder / "config.json"
    raw = read_json_object(config_path)
    check_config(raw, config_path)
    task = task_of(raw)
    _check_remote_code(folder, raw, opts, task)
    _check_architecture(folder, raw)
    from huggingface_hub.errors import StrictDataclassError  # its config classes' field checks

    try:
        config = transformers.AutoConfig.from_pretrained(
            folder, trust_remote_code=opts.trust_remote_code, local_files_only=True
        )
    except (ValueError, KeyError, TypeError, OSError, StrictDataclassError) as exc:
        # a strict field's error says which field on its first line and what is wrong on its last
        said = str(exc).split("\n")[-1].strip() if isinstance(exc, StrictDataclassError) else ""
        raise ExportError(
            f"{config_path}: transformers cannot read it: {said or first_line(exc)}"
        ) from None
    return config, task


def task_of(raw: dict[str, Any]) -> str:
    """TOKEN_CLASSIFICATION for a folder whose config.json names a …ForTokenClassification,
    else SEQUENCE_CLASSIFICATION (what _check_architecture then holds it to)."""
    architectures = raw.get("architectures")
    if isinstance(architectures, list) and any(
        isinstance(a, str) and a.endswith(HEADS[TOKEN_CLASSIFICATION]) for a in architectures
    ):
        return TOKEN_CLASSIFICATION
    return SEQUENCE_CLASSIFICATION


def graph_inputs(forward: Any, type_vocab_size: int) -> list[str]:
    """The graph's inputs in forward()'s parameter order: input_ids, attention_mask and, where
    the embeddings have more than one token type, token_type_ids (a RoBERTa's one type is 0)."""
    names = [n for n in inspect.signature(forward).parameters if n in GRAPH_INPUTS]
    if type_vocab_size <= 1 and "token_type_ids" in names:
        names.remove("token_type_ids")
    if names[:2] != ["input_ids", "attention_mask"] and set(names) >= {"input_ids"}:
        # Only order matters for the export, which passes inputs positionally; say what it is.
        logger.info("graph inputs in forward()'s order: %s", names)
    if "input_ids" not in names or "attention_mask" not in names:
        raise ExportError(
            f"the model's forward() takes {names}; textserve feeds input_ids and attention_mask"
        )
    return names


def activation(
    config: Any,
    num_labels: int,
    folder: Path,
    asked: str | None = None,
    task: str = SEQUENCE_CLASSIFICATION,
) -> str:
    """What transformers' text-classification pipeline applies: sigmoid for multi-label, none
    for regression, softmax for single-label; a config without problem_type and one logit
    gets sigmoid, as the pipeline does. `asked` (--activation) overrides problem_type, e.g.
    for a multi-label model saved without it; the pipeline check is then run with it too.
    A token classifier: softmax per token, as the token-classification pipeline applies."""
    if task == TOKEN_CLASSIFICATION:
        if asked not in (None, "softmax"):
            raise ExportError(
                f"--activation {asked}: {folder} is a token classifier, served with softmax over "
                "its labels per token (as transformers' token-classification pipeline)"
            )
        return "softmax"
    if asked is not None:
        if asked == "none" and num_labels != 1:
            raise ExportError(
                f"--activation none (regression) serves one output; {folder} has {num_labels}"
            )
        return asked
    problem = getattr(config, "problem_type", None)
    if problem is None:
        return "sigmoid" if num_labels == 1 else "softmax"
    if problem not in ACTIVATIONS:
        raise ExportError(f"{folder}/config.json: unknown problem_type {problem!r}")
    if problem == "regression" and num_labels != 1:
        raise ExportError(
            f"{folder}/config.json: a regression model with {num_labels} outputs; textserve "
            "serves regression with one output (num_labels 1)"
        )
    return ACTIVATIONS[problem]


def max_length(config: Any, tokenizer_max: Any, cap: int | None, folder: Path) -> int:
    """max_position_embeddings less the position offset, capped by the tokenizer's
    model_max_length and by `cap` (--max-length)."""
    candidates = []
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        offset = 0
        if getattr(config, "model_type", None) in POSITION_OFFSET_TYPES:
            offset = int(getattr(config, "pad_token_id", 0) or 0) + 1
        candidates.append(positions - offset)
    if isinstance(tokenizer_max, int) and 0 < tokenizer_max < _UNSET_LENGTH:
        candidates.append(tokenizer_max)
    if cap is not None:
        candidates.append(cap)
    if not candidates:
        raise ExportError(
            f"{folder}: neither config.json (max_position_embeddings) nor tokenizer_config.json "
            "(model_max_length) says how long an input may be; pass --max-length"
        )
    length = min(candidates)
    if length < 1:
        raise ExportError(f"{folder}: the derived max_length is {length}; pass --max-length")
    return length


def _import_transformers() -> Any:
    try:
        import transformers
    except ModuleNotFoundError:
        raise ExportError(
            "exporting a Hugging Face folder needs transformers: pip install 'textserve[train]'"
        ) from None
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers


def _check_remote_code(folder: Path, raw: dict[str, Any], opts: ExportOptions, task: str) -> None:
    auto_map = raw.get("auto_map")
    if auto_map and not opts.trust_remote_code:
        where = auto_map.get(f"AutoModel{HEADS[task]}") if isinstance(auto_map, dict) else auto_map
        raise ExportError(
            f"{folder}/config.json points at the folder's own Python code ({where}); "
            "textserve runs it only with --trust-remote-code (read that code first)"
        )


def _check_architecture(folder: Path, raw: dict[str, Any]) -> None:
    architectures = raw.get("architectures")
    if (
        isinstance(architectures, list)
        and architectures
        and not any(isinstance(a, str) and a.endswith(tuple(HEADS.values())) for a in architectures)
    ):
        raise ExportError(
            f"{folder} holds a {', '.join(map(str, architectures))}, not a sequence classifier "
            "nor a token classifier; textserve serves ...ForSequenceClassification and "
            "...ForTokenClassification models (fine-tune one with AutoModelForSequence"
            "Classification or ...ForTokenClassification and save_pretrained it)"
        )


def _load_model(
    transformers: Any, folder: Path, config: Any, opts: ExportOptions, task: str
) -> Any:
    auto = getattr(transformers, f"AutoModel{HEADS[task]}")
    kind = "token" if task == TOKEN_CLASSIFICATION else "sequence"
    model = load_checked(auto, folder, config, f"{kind} classifier", opts.trust_remote_code)
    if opts.threads:
        torch.set_num_threads(opts.threads)
    return model.eval()


def _load_tokenizer(transformers: Any, folder: Path, opts: ExportOptions) -> Any:
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            folder, trust_remote_code=opts.trust_remote_code, local_files_only=True
        )
    except (ValueError, OSError, KeyError, TypeError, AttributeError) as exc:
        raise ExportError(
            f"{folder}: transformers cannot load the tokenizer: {first_line(exc)}"
        ) from None
    if not getattr(tokenizer, "is_fast", False):
        raise ExportError(f"{folder}: the tokenizer is not a fast (tokenizer.json) one")
    tokenizer.truncation_side = opts.truncation_side
    return tokenizer


def _labels(config: Any, model: Any, folder: Path) -> list[str]:
    """Label names in logit order: id2label, LABEL_i where an index has none; ExportError when
    config.json's labels and the classifier's width disagree."""
    width = _logits_width(model, folder)
    id2label = {int(k): str(v) for k, v in (getattr(config, "id2label", None) or {}).items()}
    if id2label and len(id2label) > width:
        raise ExportError(
            f"{folder}/config.json's id2label has {len(id2label)} labels, the classifier gives "
            f"{width} logits"
        )
    if id2label and max(id2label) >= width:
        raise ExportError(
            f"{folder}/config.json's id2label names label {max(id2label)}, the classifier gives "
            f"{width} logits (labels 0 to {width - 1})"
        )
    return [id2label.get(i, f"LABEL_{i}") for i in range(width)]


def _logits_width(model: Any, folder: Path) -> int:
    """The classifier's output width, from a forward pass on one short text."""
    ids = torch.tensor([[1, 2, 3]]).clamp(max=_embedding_rows(model, None) - 1)
    try:
        with torch.inference_mode():
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    except (RuntimeError, IndexError, ValueError) as exc:
        raise ExportError(
            f"{folder}: the model fails on a three-token input: {first_line(exc)}"
        ) from None
    return int(logits.shape[-1])


def _embedding_rows(model: Any, config: Any) -> int:
    """How many token ids the model's input embedding has rows for (config.vocab_size where
    the model does not say)."""
    try:
        return int(model.get_input_embeddings().num_embeddings)
    except (AttributeError, NotImplementedError):
        return int(getattr(config, "vocab_size", None) or model.config.vocab_size)


def _attention_shape(config: Any) -> tuple[int, int]:
    """(heads, hidden size) as the config names them (DistilBERT: n_heads, dim); 0 unknown."""
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_heads", 0)
    hidden = getattr(config, "hidden_size", None) or getattr(config, "dim", 0)
    return int(heads or 0), int(hidden or 0)
