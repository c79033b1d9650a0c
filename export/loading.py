"""A Hugging Face folder's model, loaded by transformers only once it is known to fit, and
refused unless the checkpoint filled it.

    model = load_checked(auto, folder, config, "sequence classifier", trust_remote_code=False)

First the model config.json describes is built on the meta device (nothing allocated) and its
size compared with what the checkpoint's files hold: a config.json claiming millions of
vocabulary rows over a checkpoint of thousands would have transformers allocate and draw them at
random, gigabytes before any check could refuse them. Then from_pretrained loads it, its loading
report kept (not printed: its errors point at "the above report", which must then be said),
and check_loading refuses a checkpoint that lacks, mis-shapes or adds a weight.
"""

from __future__ import annotations

import logging
import re
import warnings
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from textserve.export.errors import ExportError, first_line
from textserve.export.folders import safetensors_values, weight_files

# values (256 MiB of float32) the model may need beyond what the checkpoint holds before it is
# refused unloaded; smaller gaps (a lost head, a lost layer) are named by check_loading
UNHELD_MOST = 2**26
# What building a model from its config raises when a value makes no model: an unknown
# activation (KeyError), heads that do not divide the hidden size (ValueError), a pad id past
# the embedding (AssertionError), a negative size (RuntimeError), ...
_BUILD_ERRORS = (
    ValueError,
    TypeError,
    KeyError,
    AttributeError,
    AssertionError,
    ArithmeticError,
    IndexError,
    RuntimeError,
)
# What reading weights raises that export/folders.py's checks of the files did not foresee
_READ_ERRORS = (RuntimeError, OSError, EOFError)
# torch.load(weights_only=True) refuses anything but tensors with pickle's UnpicklingError,
# known here by name (this package imports no pickle module: tests/unit/textserve/
# test_no_unpickling.py)
_UNPICKLING = "UnpicklingError"
# transformers' loading report (modeling_utils' logger), a table row: "key | STATUS | details"
_REPORT_LOGGER = "transformers.modeling_utils"
_ROW = re.compile(r"^\s*(\S+)\s*\|\s*(?:\x1b\[[0-9;]*m)?([A-Z]+)")


def load_checked(auto: Any, folder: Path, config: Any, what: str, trust_remote_code: bool) -> Any:
    """auto.from_pretrained(folder) of the model `config` describes, `what` it is ("sequence
    classifier"); ExportError naming what is wrong (see the module docstring)."""
    check_size(auto, folder, config, what, trust_remote_code)
    report: list[str] = []
    try:
        with warnings.catch_warnings(), _kept_report(report):
            warnings.simplefilter("ignore")
            model, info = auto.from_pretrained(
                folder,
                config=config,
                trust_remote_code=trust_remote_code,
                local_files_only=True,
                # eager attention: the one every architecture exports through torch.onnx as traced
                attn_implementation="eager",
                # a weight of the wrong shape comes back in the loading info, refused by name
                # below, instead of as an error pointing at a report we silenced
                ignore_mismatched_sizes=True,
                output_loading_info=True,
            )
    except Exception as exc:
        if not (isinstance(exc, (ValueError, *_READ_ERRORS)) or type(exc).__name__ == _UNPICKLING):
            raise
        raise ExportError(
            f"{folder}: transformers cannot load the model: {_said(exc, report)}"
        ) from None
    check_loading(folder, model, info)
    return model


def check_size(auto: Any, folder: Path, config: Any, what: str, trust_remote_code: bool) -> None:
    """ExportError unless transformers can build the model `config` describes (on the meta
    device: nothing allocated) and it needs at most UNHELD_MOST values more than the
    checkpoint's files hold."""
    from transformers import initialization  # the contexts from_pretrained builds a model in

    try:
        with warnings.catch_warnings(), torch.device("meta"), initialization.no_init_weights():
            warnings.simplefilter("ignore")
            with initialization.no_tie_weights():
                skeleton = auto.from_config(config, trust_remote_code=trust_remote_code)
            skeleton.tie_weights()  # as from_pretrained ties them, once the model is whole
    except _BUILD_ERRORS as exc:
        if isinstance(exc, ValueError) and "Unrecognized configuration class" in str(exc):
            raise ExportError(
                f"{folder}: transformers has no {what} for model_type "
                f"{getattr(config, 'model_type', None)!r}"
            ) from None
        raise ExportError(
            f"{folder / 'config.json'}: transformers cannot build the model it describes: "
            f"{type(exc).__name__}: {first_line(exc)}"
        ) from None
    needed = sum(p.numel() for p in skeleton.parameters())
    held = sum(values_held(path) for path in weight_files(folder))
    if needed - held > UNHELD_MOST:
        raise ExportError(
            f"{folder / 'config.json'} describes a model of {needed:,} weight values, the "
            f"checkpoint holds {held:,}: transformers would draw the other {needed - held:,} at "
            "random; refusing (is this config.json the checkpoint's own?)"
        )


def values_held(path: Path) -> int:
    """How many values a weights file holds, from its header (safetensors) or its tensors'
    metadata (a torch.save file, read onto the meta device: nothing allocated, nothing run)."""
    if path.name.endswith(".safetensors"):
        return safetensors_values(path)
    try:
        # torch.load's zip format is read in place (mmap); the legacy one has no such reader
        state = torch.load(
            path, map_location="meta", weights_only=True, mmap=zipfile.is_zipfile(path)
        )
    except Exception as exc:
        refused = type(exc).__name__ == _UNPICKLING
        if not (refused or isinstance(exc, _READ_ERRORS)):
            raise
        if refused:
            reason = (
                "not a torch.save file of tensors (anything else would need its pickled code run)"
            )
        elif isinstance(exc, EOFError):
            reason = "it ends early (empty or truncated)"
        else:
            reason = first_line(exc)
        raise ExportError(f"{path} cannot be read as a PyTorch checkpoint: {reason}") from None
    if not isinstance(state, dict):
        raise ExportError(f"{path} holds a {type(state).__name__}, not a dict of weights")
    return sum(t.numel() for t in state.values() if isinstance(t, torch.Tensor))


def check_loading(folder: Path, model: Any, info: dict[str, Any]) -> None:
    """ExportError unless the checkpoint gave the model every weight it needs, each of its
    shape, and nothing else. from_pretrained fills a missing or mis-shaped weight with random
    values (every parity check then compares against that same random model, and each export
    publishes another one) and drops a weight it has no place for (a renamed head).

        model, info = auto.from_pretrained(folder, output_loading_info=True,
                                           ignore_mismatched_sizes=True)
        check_loading(folder, model, info)

    transformers has already struck from `info` the tied weights it filled from their source
    and the keys the model class declares ignorable (old checkpoints' position_ids).
    """
    _check_shapes(folder, info.get("mismatched_keys") or ())
    missing = sorted(info.get("missing_keys") or ())
    # a key naming one of the model's non-persistent buffers (an old checkpoint's
    # token_type_ids) is rebuilt by the model itself, not drawn at random: harmless
    buffers = {name for name, _ in model.named_buffers()}
    unexpected = sorted(set(info.get("unexpected_keys") or ()) - buffers)
    problems = []
    if missing:
        problems.append(
            f"lacks {_weights(len(missing))} the model needs ({_names(missing)}), which "
            "transformers would fill with random values"
        )
    if unexpected:
        problems.append(
            f"holds {_weights(len(unexpected))} the model has no place for ({_names(unexpected)}), "
            "which transformers would drop"
        )
    if problems:
        raise ExportError(
            f"{folder}: the checkpoint {', and '.join(problems)}: refusing (save_pretrained the "
            "fine-tuned model with its config.json)"
        )
    errors = info.get("error_msgs") or []
    if errors:
        raise ExportError(
            f"{folder}: transformers cannot load the weights: {first_line(errors[0])}"
        )


# how many key names a refusal lists: enough to tell a lost head from a lost layer
_NAMED_KEYS = 3


def _check_shapes(folder: Path, mismatched: Any) -> None:
    """Refuse weights of another shape than the model's; a classifier of another width is
    config.json's labels disagreeing with the checkpoint, and said so."""
    found = sorted((key, list(saved), list(wanted)) for key, saved, wanted in mismatched)
    for key, saved, wanted in found:
        if key in ("classifier.weight", "classifier.out_proj.weight") and saved[0] != wanted[0]:
            raise ExportError(
                f"{folder}/config.json's id2label has {wanted[0]} labels, the classifier gives "
                f"{saved[0]} logits"
            )
    if found:
        key, saved, wanted = found[0]
        others = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise ExportError(
            f"{folder}: the checkpoint's {key} is {saved}, config.json's model needs {wanted}"
            f"{others}; transformers would fill {'them' if others else 'it'} with random values: "
            "refusing"
        )


def _weights(count: int) -> str:
    return f"{count} weight{'s' if count != 1 else ''}"


def _names(keys: list[str]) -> str:
    if len(keys) <= _NAMED_KEYS + 1:
        return ", ".join(keys)
    return ", ".join(keys[:_NAMED_KEYS]) + f", ... {len(keys) - _NAMED_KEYS} more"


@contextmanager
def _kept_report(report: list[str]) -> Iterator[None]:
    """transformers' loading report, kept in `report` while a model loads instead of printed
    (its verbosity is set to errors only): the error it raises may point at it."""
    logger = logging.getLogger(_REPORT_LOGGER)
    handler = _Keeper(report)
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


class _Keeper(logging.Handler):
    def __init__(self, kept: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.kept = kept

    def emit(self, record: logging.LogRecord) -> None:
        self.kept.append(record.getMessage())


def _said(exc: BaseException, report: list[str]) -> str:
    """The error's first line; where it points at transformers' report (never shown here), the
    weights that report names instead, with their status (CONVERSION, MISMATCH, ...)."""
    said = first_line(exc)
    if "report" not in said:
        return said
    rows = [
        (m.group(1), m.group(2))
        for text in report
        for line in text.splitlines()
        if (m := _ROW.match(line)) and m.group(1) != "Key"
    ]
    if not rows:
        return "its loading report names no weight"
    shown = ", ".join(f"{key} ({status.lower()})" for key, status in rows[:3])
    more = f", ... {len(rows) - 3} more" if len(rows) > 3 else ""
    return f"its loading report names {shown}{more}"
