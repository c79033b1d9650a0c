"""textserve.nli: an NLI model's entailment and contradiction labels found by name, as
transformers' zero-shot pipeline finds the entailment one (a label starting with "entail", case
aside), and two labels of one class refused."""

from __future__ import annotations

import pytest

from textserve.nli import AmbiguousLabels, nli_labels, zero_shot_problem


@pytest.mark.parametrize(
    ("labels", "found"),
    [
        (["entailment", "neutral", "contradiction"], {"entailment": 0, "contradiction": 2}),
        (["CONTRADICTION", "Neutral", "ENTAILMENT"], {"entailment": 2, "contradiction": 0}),
        (["entailed", "contra"], {"entailment": 0, "contradiction": 1}),
        (["not_entailment", "entailment"], {"entailment": 1, "contradiction": None}),
        (["negative", "positive"], None),
        (["contradiction", "neutral"], None),  # no entailment class: no NLI model
        (["entail-ish", "contradiction", "contradicts"], AmbiguousLabels),
        (["Entailment", "entailment_2"], AmbiguousLabels),
    ],
)
def test_the_nli_labels_are_found_by_name(labels: list[str], found: object) -> None:
    if found is AmbiguousLabels:
        with pytest.raises(AmbiguousLabels, match="start with"):
            nli_labels(labels)
    else:
        assert nli_labels(labels) == found


def test_a_recorded_index_must_be_a_label_and_the_two_distinct() -> None:
    assert zero_shot_problem(None, 1) is None
    assert zero_shot_problem({"entailment": 0, "contradiction": None}, 1) is None
    assert "past the model's 3" in str(zero_shot_problem({"entailment": 3, "contradiction": 0}, 3))
    assert "different" in str(zero_shot_problem({"entailment": 1, "contradiction": 1}, 3))
