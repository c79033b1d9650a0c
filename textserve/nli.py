"""Which labels of a natural-language-inference (NLI) model zero-shot classification reads: its
entailment class and its contradiction class, found by name as transformers' zero-shot pipeline
finds the entailment one (a label starting with "entail", case aside; "contra" likewise).

    nli_labels(["Entailment", "neutral", "contradiction"])  # {"entailment": 0, "contradiction": 2}
    nli_labels(["negative", "positive"])                    # None: no NLI model
    zero_shot_problem({"entailment": 0, "contradiction": 0}, 3)  # "...two different labels"

`textserve export` finds them in a Hugging Face folder's id2label and records them in the
manifest's `zero_shot` (two labels of one class refuse the export); the server scores zero-shot
by the manifest's indexes. A version exported before manifests recorded them has no `zero_shot`:
the server searches its labels by this same rule. The standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

PREFIXES = {"entailment": "entail", "contradiction": "contra"}  # transformers' rule, lower case


class AmbiguousLabels(ValueError):
    """Two labels of one class: which of them zero-shot should read cannot be told."""


def nli_labels(labels: Sequence[str]) -> dict[str, int | None] | None:
    """{"entailment": i, "contradiction": j} (j None: no contradiction label, so no multi-label
    zero-shot), or None when no label names an entailment class. AmbiguousLabels for two labels
    of one class."""
    found: dict[str, int | None] = {}
    for kind, prefix in PREFIXES.items():
        matches = [i for i, label in enumerate(labels) if label.lower().startswith(prefix)]
        if len(matches) > 1:
            named = " and ".join(f"{_cut(labels[i])} ({i})" for i in matches[:3])
            raise AmbiguousLabels(
                f"labels {named} start with {prefix!r}: zero-shot cannot tell which is the "
                f"{kind} class; rename all but one"
            )
        found[kind] = matches[0] if matches else None
    return found if found["entailment"] is not None else None


def zero_shot_problem(zero_shot: Any, labels: int) -> str | None:
    """What is wrong with a manifest's `zero_shot` (of the schema's shape) for a model of
    `labels` labels, or None: each index must be a label's, the two different labels."""
    if zero_shot is None:
        return None
    indexes = [i for i in (zero_shot["entailment"], zero_shot["contradiction"]) if i is not None]
    past = [i for i in indexes if i >= labels]
    if past:
        return f"zero_shot: label index {past[0]} is past the model's {labels} label(s)"
    if len(set(indexes)) != len(indexes):
        return "zero_shot: the entailment and contradiction classes must be two different labels"
    return None


def _cut(label: str, limit: int = 40) -> str:
    return repr(label if len(label) <= limit else label[:limit] + "…")
