"""What a Hugging Face config becomes in the manifest: max_length, activation, graph inputs;
which loading reports from_pretrained gives are refused."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")
from textserve.export import huggingface as hf
from textserve.export import loading
from textserve.export.errors import ExportError

HERE = Path("folder")


def config(**kw: object) -> SimpleNamespace:
    return SimpleNamespace(**{"model_type": "bert", "pad_token_id": 0, **kw})


@pytest.mark.parametrize(
    ("cfg", "tokenizer_max", "cap", "want"),
    [
        (config(max_position_embeddings=512), 10**30, None, 512),  # model_max_length unset
        (config(model_type="roberta", pad_token_id=1, max_position_embeddings=514), 10**30, None,
         512),  # positions start after the pad id: 514 - (1 + 1)
        (config(model_type="xlm-roberta", pad_token_id=1, max_position_embeddings=514), 256, None,
         256),  # the tokenizer's model_max_length caps it
        (config(model_type="deberta-v2", max_position_embeddings=512), 10**30, 128, 128),  # flag
        (config(), 77, None, 77),  # no max_position_embeddings: the tokenizer's limit
    ],
)  # fmt: skip
def test_max_length_as_tei_derives_it(
    cfg: SimpleNamespace, tokenizer_max: int, cap: int | None, want: int
) -> None:
    assert hf.max_length(cfg, tokenizer_max, cap, HERE) == want


def test_no_length_anywhere_asks_for_the_flag() -> None:
    with pytest.raises(ExportError, match="pass --max-length"):
        hf.max_length(config(), 10**30, None, HERE)


@pytest.mark.parametrize(
    ("problem", "labels", "want"),
    [
        (None, 3, "softmax"),
        ("single_label_classification", 2, "softmax"),
        ("multi_label_classification", 4, "sigmoid"),
        ("regression", 1, "none"),
        (None, 1, "sigmoid"),  # transformers' pipeline: one logit without a problem_type
    ],
)
def test_activation_from_problem_type(problem: str | None, labels: int, want: str) -> None:
    assert hf.activation(config(problem_type=problem), labels, HERE) == want


def test_regression_with_several_outputs_is_refused() -> None:
    with pytest.raises(ExportError, match="regression model with 3 outputs"):
        hf.activation(config(problem_type="regression"), 3, HERE)


def test_graph_inputs_follow_forward_and_the_type_vocabulary() -> None:
    def bert(input_ids, attention_mask=None, token_type_ids=None, position_ids=None):  # type: ignore[no-untyped-def]
        ...

    def odd(input_ids, token_type_ids=None, attention_mask=None):  # type: ignore[no-untyped-def]
        ...

    assert hf.graph_inputs(bert, 2) == ["input_ids", "attention_mask", "token_type_ids"]
    assert hf.graph_inputs(bert, 1) == ["input_ids", "attention_mask"]  # RoBERTa: one type
    assert hf.graph_inputs(odd, 2) == ["input_ids", "token_type_ids", "attention_mask"]


class Loaded:
    """What check_loading asks of a model: its buffers' names."""

    def named_buffers(self) -> list[tuple[str, None]]:
        return [("bert.embeddings.token_type_ids", None)]


def info(**kw: object) -> dict[str, object]:
    return {"missing_keys": set(), "unexpected_keys": set(), "mismatched_keys": set(),
            "error_msgs": [], **kw}  # fmt: skip


def test_a_complete_load_and_a_saved_buffer_pass() -> None:
    loading.check_loading(HERE, Loaded(), info())
    loading.check_loading(HERE, Loaded(), info(unexpected_keys={"bert.embeddings.token_type_ids"}))


@pytest.mark.parametrize(
    ("report", "message"),
    [
        (info(missing_keys={"k3", "k1", "k2", "k0"}), "lacks 4 weights the model needs (k0, k1, "
         "k2, k3), which transformers would fill with random values: refusing"),
        (info(missing_keys={f"k{i}" for i in range(6)}), "(k0, k1, k2, ... 3 more)"),
        (info(unexpected_keys={"head.weight"}), "holds 1 weight the model has no place for "
         "(head.weight), which transformers would drop: refusing"),
        (info(mismatched_keys={("a.weight", (4, 3), (4, 4)), ("b.weight", (2,), (3,))}),
         "a.weight is [4, 3], config.json's model needs [4, 4] (and 1 more); transformers "
         "would fill them with random values"),
        (info(mismatched_keys={("classifier.weight", (2, 8), (3, 8))}),
         "config.json's id2label has 3 labels, the classifier gives 2 logits"),
        (info(error_msgs=["size mismatch\nfor x"]), "cannot load the weights: size mismatch"),
    ],
)  # fmt: skip
def test_an_incomplete_load_is_refused_naming_the_weights(
    report: dict[str, object], message: str
) -> None:
    with pytest.raises(ExportError) as refused:
        loading.check_loading(HERE, Loaded(), report)
    assert message in str(refused.value) and "\n" not in str(refused.value)
