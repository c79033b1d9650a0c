"""`textserve export` of a Hugging Face folder whose weights do not fill its model is refused.

transformers' from_pretrained fills a weight the checkpoint lacks (or has in another shape) with
random values and drops one the model has no place for; every parity check would then compare
against that same random model and each export would publish another one. Each case below edits
a complete save_pretrained folder (tests/foreign.py: a tiny BERT and a DistilBERT) and expects
exit 2, one line naming the folder and the weights, and nothing published. Complete folders, tied
weights and the buffers old checkpoints carry still export, and two exports of one folder give
the same graph, byte for byte.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

import torch
from safetensors.torch import load_file, save_file

from tests import foreign
from textserve import cli
from textserve.artifact import MODEL_FILE

Weights = dict[str, torch.Tensor]
# per architecture: its encoder's layer 1, its embeddings, its layer-count field, a 32x32 weight
LAYER_ONE = {"bert": "bert.encoder.layer.1.", "distilbert": "distilbert.transformer.layer.1."}
EMBEDDINGS = {"bert": "bert.embeddings.", "distilbert": "distilbert.embeddings."}
LAYERS_FIELD = {"bert": "num_hidden_layers", "distilbert": "n_layers"}
QUERY = {
    "bert": "layer.0.attention.self.query.weight",
    "distilbert": "layer.0.attention.q_lin.weight",
}
# foreign.build's tiny models (2 layers): 16 weights a layer; 36 beyond the embeddings (BERT: 2
# layers, pooler, classifier; DistilBERT: 2 layers, pre_classifier, classifier)
LAYER_WEIGHTS = 16
BEYOND_EMBEDDINGS = 36


def export(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = cli.main(["export", *argv, "--threads", "1"])
    return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("complete")
    wordpiece = foreign.tokenizer_for("bert")
    return {
        arch: foreign.build(arch, root / arch, num_labels=2, tokenizer=wordpiece)
        for arch in LAYER_ONE
    }


def edited(
    source: Path,
    into: Path,
    weights: Callable[[Weights], Weights] | None = None,
    config: Callable[[dict[str, Any]], None] | None = None,
) -> Path:
    """A copy of `source` with its model.safetensors and config.json edited."""
    folder = Path(shutil.copytree(source, into))
    if weights is not None:
        path = folder / "model.safetensors"
        save_file(weights(load_file(path)), path, metadata={"format": "pt"})
    if config is not None:
        raw = json.loads((folder / "config.json").read_text())
        config(raw)
        (folder / "config.json").write_text(json.dumps(raw))
    return folder


def _without(prefix: str) -> Callable[[Weights], Weights]:
    return lambda w: {k: v for k, v in w.items() if not k.startswith(prefix)}


def _only(prefix: str) -> Callable[[Weights], Weights]:
    return lambda w: {k: v for k, v in w.items() if k.startswith(prefix)}


def _renamed(old: str, new: str) -> Callable[[Weights], Weights]:
    return lambda w: {(new + k[len(old) :] if k.startswith(old) else k): v for k, v in w.items()}


def _narrowed(suffix: str) -> Callable[[Weights], Weights]:
    """The first weight named ...suffix one column narrower."""

    def edit(w: Weights) -> Weights:
        key = next(k for k in sorted(w) if k.endswith(suffix))
        return {**w, key: w[key][:, :-1].contiguous()}

    return edit


def _one_more_layer(arch: str) -> Callable[[dict[str, Any]], None]:
    field = LAYERS_FIELD[arch]
    return lambda c: c.update({field: c[field] + 1})


def _cases(arch: str) -> list[tuple[str, dict[str, Any], str]]:
    """(case, edits, what the refusal says) for one architecture."""
    head = "classifier.bias, classifier.weight"
    random = "which transformers would fill with random values"
    layer_two = LAYER_ONE[arch].replace(".1.", ".2.")
    return [
        (
            "no classifier head",
            {"weights": _without("classifier.")},
            f"the checkpoint lacks 2 weights the model needs ({head}), {random}: refusing",
        ),
        (
            "classifier saved under another name",
            {"weights": _renamed("classifier.", "head.")},
            f"lacks 2 weights the model needs ({head}), {random}, and holds 2 weights the model "
            "has no place for (head.bias, head.weight), which transformers would drop: refusing",
        ),
        (
            "an encoder layer missing",
            {"weights": _without(LAYER_ONE[arch])},
            f"lacks {LAYER_WEIGHTS} weights the model needs ({LAYER_ONE[arch]}",
        ),
        (
            "config.json claims one more layer",
            {"config": _one_more_layer(arch)},
            f"lacks {LAYER_WEIGHTS} weights the model needs ({layer_two}",
        ),
        (
            "only the embeddings",
            {"weights": _only(EMBEDDINGS[arch])},
            f"lacks {BEYOND_EMBEDDINGS} weights the model needs (",
        ),
        (
            "a weight of another shape",
            {"weights": _narrowed(QUERY[arch])},
            "is [32, 31], config.json's model needs [32, 32]; transformers would fill it with "
            "random values: refusing",
        ),
    ]


CASES = [
    pytest.param(arch, edits, message, id=f"{arch}: {case}")
    for arch in LAYER_ONE
    for case, edits, message in _cases(arch)
]


@pytest.mark.parametrize(("arch", "edits", "message"), CASES)
def test_a_checkpoint_that_does_not_fill_its_model_is_refused(
    arch: str,
    edits: dict[str, Any],
    message: str,
    folders: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder = edited(folders[arch], tmp_path / "damaged", **edits)
    code, err = export(
        [str(folder), "--repository", str(tmp_path / "models"), "--name", "m"], capsys
    )
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith(f"textserve export: error: {folder}: "), err
    assert message in err, err
    assert not (tmp_path / "models" / "m").exists() or not any(
        (tmp_path / "models" / "m").iterdir()
    )


def test_buffers_old_checkpoints_carry_are_no_reason_to_refuse(
    folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # transformers < 4.31 saved BERT's position_ids (transformers itself ignores them); a saved
    # token_type_ids names a buffer the model builds itself: neither is a weight drawn at random
    def with_buffers(w: Weights) -> Weights:
        return {
            **w,
            "bert.embeddings.position_ids": torch.arange(foreign.MAX_LENGTH)[None],
            "bert.embeddings.token_type_ids": torch.zeros(1, foreign.MAX_LENGTH, dtype=torch.long),
        }

    folder = edited(folders["bert"], tmp_path / "old", weights=with_buffers)
    code, err = export(
        [str(folder), "--repository", str(tmp_path / "models"), "--name", "m"], capsys
    )
    assert code == 0, err


TIED = '''
import torch
from transformers import BertForSequenceClassification


class TiedForSequenceClassification(BertForSequenceClassification):
    """A classifier with a projection tied to the word embeddings: save_pretrained leaves it out
    of the checkpoint and from_pretrained ties it back."""

    _tied_weights_keys = {"decoder.weight": "bert.embeddings.word_embeddings.weight"}

    def __init__(self, config):
        super().__init__(config)
        self.decoder = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()
'''


@pytest.mark.parametrize("tied", [True, False])
def test_a_tied_weight_is_not_missing(
    tied: bool, folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the checkpoint has no decoder.weight, as save_pretrained of a tied model writes it
    auto_map = {"AutoModelForSequenceClassification": "modeling_tied.TiedForSequenceClassification"}
    folder = edited(
        folders["bert"],
        tmp_path / "tied",
        config=lambda c: c.update(
            architectures=["TiedForSequenceClassification"], auto_map=auto_map
        ),
    )
    source = TIED if tied else TIED.replace("_tied_weights_keys", "_not_tied")
    (folder / "modeling_tied.py").write_text(source)
    argv = [str(folder), "--repository", str(tmp_path / "models"), "--name", "m"]
    code, err = export([*argv, "--trust-remote-code"], capsys)
    if tied:
        assert code == 0, err
    else:  # the same weights untied: decoder.weight would be random
        assert code == 2 and "lacks 1 weight the model needs (decoder.weight)" in err, err


@pytest.mark.parametrize("arch", list(LAYER_ONE))
def test_two_exports_of_one_folder_are_the_same_bytes(
    arch: str, folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # torch's random state differs between the two: nothing exported may be drawn from it.
    # --no-optimize: the optimizer's graph is published only when it times faster, so with it
    # the two could publish different (equivalent) graphs; the exporter's graph is the same.
    repo = tmp_path / "models"
    for seed, name in ((1, "first"), (2, "second")):
        torch.manual_seed(seed)
        argv = [str(folders[arch]), "--repository", str(repo), "--name", name, "--no-optimize"]
        code, err = export(argv, capsys)
        assert code == 0, err
    first, second = (repo / name / "1" / MODEL_FILE for name in ("first", "second"))
    assert first.read_bytes() == second.read_bytes()
