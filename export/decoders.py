"""Decoder sequence classifiers (Qwen2, Qwen3, Llama, Gemma, …): what sets them apart from
encoders at export. transformers scores such a model at its last token that is not
`config.pad_token_id` (the rightmost one: left or right padding alike), so the pad id is part
of the model: the graph finds that token from input_ids, and the server must pad with the very
id the graph skips.

    if pools_last_token(model):
        pad = decide_pad(model.config, tokenizer, folder)   # sets config.pad_token_id
        pad.id, pad.note()    # the manifest's pad_token_id and its extra.pad_token
        length = capped_length(length, opts.max_length)

A decoder's tokenizer often has no pad token (Llama's): the pad is then its eos token, else its
unk token, as a fine-tune sets `model.config.pad_token_id = tokenizer.eos_token_id`; the choice
is logged, set on the model's config (so every check compares with the model so padded) and is
the manifest's pad_token_id.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, NamedTuple

from textserve.export.errors import ExportError

logger = logging.getLogger(__name__)

# The longest max_length a decoder classifier gets unless --max-length asks for more: their
# max_position_embeddings run to 32768 and beyond (Qwen2, Llama 3: 131072), which a classifier
# request never needs and the export's parity checks (batches of 64 at max_length) could not run.
DECODER_MAX_LENGTH = 512


def pools_last_token(model: Any) -> bool:
    """Whether transformers scores the model at its last non-pad token: the decoder
    classifiers built on its shared GenericForSequenceClassification."""
    try:
        from transformers.modeling_layers import GenericForSequenceClassification
    except ImportError:  # a transformers without it has no such classifier either
        return False
    return isinstance(model, GenericForSequenceClassification)


class Pad(NamedTuple):
    """The pad token a decoder classifier is served with."""

    id: int
    token: str | None  # as the tokenizer spells it
    source: str  # config.json, or the tokenizer's pad_token / eos_token / unk_token

    def note(self) -> dict[str, Any]:
        """The manifest's extra.pad_token: where its pad_token_id came from."""
        return {"id": self.id, "token": self.token, "source": self.source}


def decide_pad(config: Any, tokenizer: Any, folder: Path) -> Pad:
    """The pad the server pads with: config.pad_token_id (what the classifier skips); without
    one, the tokenizer's pad, eos or unk token, in that order, set as config.pad_token_id and
    logged. ExportError when there is none of them.

    A text's own last token that equals the pad id is skipped too, as transformers skips it
    once config.pad_token_id is set: the checks compare with the model so configured."""
    text_config = config.get_text_config()
    configured = getattr(text_config, "pad_token_id", None)
    if configured is not None:
        pad = int(configured)
        theirs = tokenizer.pad_token_id
        if theirs is not None and theirs != pad:
            logger.warning(
                "%s: the tokenizer pads with id %s, the classifier skips config.pad_token_id %d; "
                "the server pads with %d",
                folder, theirs, pad, pad,
            )  # fmt: skip
        return Pad(pad, tokenizer.convert_ids_to_tokens(pad), "config.json")
    for role in ("pad", "eos", "unk"):
        token, pad = getattr(tokenizer, f"{role}_token"), getattr(tokenizer, f"{role}_token_id")
        if pad is not None:
            break
    else:
        raise ExportError(
            f"{folder}: a decoder classifier scores its last token before the padding, and "
            "neither config.json (pad_token_id) nor the tokenizer (pad, eos or unk token) names "
            "a pad token; set model.config.pad_token_id and save_pretrained again"
        )
    text_config.pad_token_id = int(pad)
    logger.warning(
        "%s: config.json has no pad_token_id: padding with the tokenizer's %s token %r (id %d), "
        "set as config.pad_token_id for every check; the manifest's pad_token_id is %d",
        folder, role, token, pad, pad,
    )  # fmt: skip
    return Pad(int(pad), str(token), f"{role}_token")


def capped_length(length: int, asked: int | None) -> int:
    """max_length as derived (positions, model_max_length, --max-length), no more than
    DECODER_MAX_LENGTH unless --max-length asked for more."""
    if asked is not None or length <= DECODER_MAX_LENGTH:
        return length
    logger.warning(
        "max_length %d (DECODER_MAX_LENGTH) of the model's %d: pass --max-length for longer texts",
        DECODER_MAX_LENGTH, length,
    )  # fmt: skip
    return DECODER_MAX_LENGTH


def refuses_empty_text(tokenizer: Any) -> bool:
    """Whether an empty text has no tokens at all (a tokenizer that adds none, Qwen's):
    transformers cannot score it, so neither does the server (the manifest names no unk
    token for it to become)."""
    return not tokenizer("", add_special_tokens=True)["input_ids"]
