"""`textserve export` of Hugging Face folders and --module factories, as a user runs it.

Every listed architecture is built here (tests/foreign.py: random weights, tokenizers trained in
the test, save_pretrained), exported once per session through the CLI, and its published
version scored the way the server scores it (textserve.tokenization from the version's files,
onnxruntime, the manifest's activation) against transformers' own pipeline. Nothing is
downloaded.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")

from tests import foreign  # noqa: E402
from textserve import cli  # noqa: E402
from textserve.artifact import MODEL_FILE, TOKENIZER_FILE, Manifest, sha256_file  # noqa: E402
from textserve.export import huggingface  # noqa: E402
from textserve.export.checks import CHECK_PAIRS, CHECK_TEXTS, apply_activation  # noqa: E402
from textserve.tokenization import Tokenization, load_tokenizer  # noqa: E402

# inputs each architecture's graph takes, in its forward()'s order
INPUTS = {
    "bert": ["input_ids", "attention_mask", "token_type_ids"],
    "electra": ["input_ids", "attention_mask", "token_type_ids"],
    "distilbert": ["input_ids", "attention_mask"],
    "roberta": ["input_ids", "attention_mask"],
    "xlm-roberta": ["input_ids", "attention_mask"],
    "deberta-v2": ["input_ids", "attention_mask"],
    "modernbert": ["input_ids", "attention_mask"],
}
OVER_LONG = ["word " * 300, "the film " * 200 + "dull"]


def export(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = cli.main(["export", *argv, "--threads", "1"])
    except SystemExit as exc:  # argparse's own refusals (a bad choice): one line too
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="session")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every architecture's save_pretrained folder, plus a multi-label and a regression BERT."""
    root = tmp_path_factory.mktemp("hf")
    # two labels, the default: transformers 5 then writes no id2label at all
    built = {arch: foreign.build(arch, root / arch, num_labels=2) for arch in foreign.ARCHITECTURES}
    wordpiece = foreign.tokenizer_for("bert")
    built["multi-label"] = foreign.build(
        "bert",
        root / "multi",
        tokenizer=wordpiece,
        problem_type="multi_label_classification",
        id2label={0: "action", 1: "comedy", 2: "drama"},
        label2id={"action": 0, "comedy": 1, "drama": 2},
    )
    built["regression"] = foreign.build(
        "distilbert", root / "regression", num_labels=1, problem_type="regression"
    )
    return built


@pytest.fixture(scope="session")
def repository(folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("models")
    for name, folder in folders.items():
        code = cli.main(
            ["export", str(folder), "--repository", str(repo), "--name", name, "--threads", "1"]
        )
        assert code == 0, name
    return repo


def served_scores(version_dir: Path, texts: list[str]) -> np.ndarray:
    """Scores as the server computes them, from the published files only."""
    manifest = Manifest.read(version_dir)
    tokenization = Tokenization.for_manifest(load_tokenizer(version_dir / TOKENIZER_FILE), manifest)
    batch = tokenization.arrays(texts)._asdict()
    session = ort.InferenceSession(
        str(version_dir / MODEL_FILE), providers=["CPUExecutionProvider"]
    )
    (logits,) = session.run(None, {n: batch[n] for n in manifest.inputs})
    return apply_activation(np.asarray(logits, dtype=np.float64), manifest.activation)


def pipeline_scores(folder: Path, texts: list[str], labels: list[str], activation: str) -> Any:
    from transformers import pipeline

    pipe = pipeline(
        "text-classification",
        model=str(folder),
        top_k=None,
        function_to_apply=activation,
        device="cpu",
    )
    answers = pipe(texts, truncation=True, max_length=foreign.MAX_LENGTH)
    return np.array(
        [[{a["label"]: a["score"] for a in row}[lab] for lab in labels] for row in answers]
    )


@pytest.mark.parametrize("name", [*foreign.ARCHITECTURES, "multi-label", "regression"])
def test_served_scores_equal_transformers_pipeline(
    name: str, folders: dict[str, Path], repository: Path
) -> None:
    version_dir = repository / name / "1"
    manifest = Manifest.read(version_dir)
    texts = [*CHECK_TEXTS[:6], *OVER_LONG]
    got = served_scores(version_dir, texts)
    want = pipeline_scores(folders[name], texts, manifest.labels, manifest.activation)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-4
    assert manifest.parity["served_max_abs_score_diff"] <= 1e-4
    assert manifest.parity["tokenization_texts"] == len(CHECK_TEXTS)
    # every tokenizer here has a pair template: the export checked sentence pairs too
    assert manifest.parity["tokenization_pairs"] == len(CHECK_PAIRS)
    assert manifest.parity["served_pairs_max_abs_score_diff"] <= 1e-4


def test_a_pair_encoding_that_differs_from_transformers_is_not_published(
    folders: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pair checks catch what the single-text ones cannot: pairs cut the wrong way (here
    the second text always first, instead of the longer one) fail the export, exit 1."""
    from textserve import tokenization

    def second_first(first: int, second: int, budget: int) -> tuple[int, int]:
        if first + second <= budget:
            return first, second
        return first if budget >= first else budget, max(0, budget - first)

    monkeypatch.setattr(tokenization, "longest_first", second_first)
    out = tmp_path / "models"
    code, _, err = export([str(folders["bert"]), "--repository", str(out), "--name", "p"], capsys)
    assert code == 1, err
    assert "pair tokenization parity" in err and "nothing was published" in err
    assert not (out / "p").exists() or not any((out / "p").iterdir())


def test_served_scores_that_differ_from_the_pipeline_are_not_published(
    folders: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The served-score check is the one that compares what the server will answer with
    transformers' pipeline: scores off by 0.01 (graph and tokenization still equal) fail the
    export, exit 1, nothing published. Switching the check off fails this test."""
    from textserve.export import checks

    real = checks.apply_activation
    monkeypatch.setattr(checks, "apply_activation", lambda logits, how: real(logits, how) + 0.01)
    out = tmp_path / "models"
    code, _, err = export(
        [str(folders["distilbert"]), "--repository", str(out), "--name", "s"], capsys
    )
    assert code == 1, err
    assert "served-score parity" in err and "nothing was published" in err
    assert not (out / "s").exists() or not any((out / "s").iterdir())


@pytest.mark.parametrize("arch", foreign.ARCHITECTURES)
def test_the_manifest_says_what_the_graph_is(
    arch: str, folders: dict[str, Path], repository: Path
) -> None:
    manifest = Manifest.read(repository / arch / "1")
    config = json.loads((folders[arch] / "config.json").read_text())
    assert manifest.format_version == 2
    assert manifest.inputs == INPUTS[arch]
    assert (manifest.source.kind, manifest.source.model_type) == (
        "huggingface",
        config["model_type"],
    )
    assert manifest.source.architecture == config["architectures"][0]
    # no id2label (transformers 5 writes none for default labels): LABEL_i, as its pipeline says
    assert "id2label" not in config
    assert manifest.labels == ["LABEL_0", "LABEL_1"]
    assert manifest.activation == "softmax" and manifest.threshold is None
    # RoBERTa-family positions are 64 + pad 1 + 1 here; the offset rule alone is unit-tested
    assert manifest.max_length == foreign.MAX_LENGTH
    assert manifest.test_accuracy is None
    assert manifest.truncation_side == "right"
    pad = {"roberta": 1, "xlm-roberta": 1}.get(arch, 0)
    assert manifest.pad_token_id == pad
    import onnx

    graph = onnx.load(str(repository / arch / "1" / MODEL_FILE))
    assert [i.name for i in graph.graph.input] == INPUTS[arch]


def test_multi_label_and_regression(repository: Path) -> None:
    multi = Manifest.read(repository / "multi-label" / "1")
    assert (multi.activation, multi.threshold) == ("sigmoid", 0.5)
    assert multi.labels == ["action", "comedy", "drama"]  # from id2label
    scores = served_scores(repository / "multi-label" / "1", ["a film", "another film"])
    assert not np.allclose(scores.sum(axis=1), 1.0)  # independent sigmoid scores
    regression = Manifest.read(repository / "regression" / "1")
    assert (regression.activation, regression.labels) == ("none", ["LABEL_0"])


def test_inputs_in_the_wrong_order_are_refused(
    folders: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the tokenizer's model_input_names order instead of forward()'s: mask and type ids swap
    monkeypatch.setattr(
        huggingface,
        "graph_inputs",
        lambda forward, types: ["input_ids", "token_type_ids", "attention_mask"],
    )
    code, _, err = export(
        [str(folders["bert"]), "--repository", str(tmp_path), "--name", "m"], capsys
    )
    assert code == 1, err
    assert "parity (fp32) check failed: max |Δlogit|" in err and "forward()'s order" in err
    assert list((tmp_path / "m").iterdir()) == []


def test_max_length_truncation_side_and_test_data(
    folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "test.jsonl"
    texts = [t for t in CHECK_TEXTS if t.strip()]  # a data file's blank rows are dropped
    rows = [{"text": t, "label": f"LABEL_{i % 2}"} for i, t in enumerate(texts)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, err = export(
        [
            str(folders["roberta"]),
            "--repository",
            str(tmp_path),
            "--name",
            "r",
            "--max-length",
            "24",
            "--truncation-side",
            "left",
            "--test-data",
            str(data),
        ],
        capsys,
    )
    assert code == 0, err
    manifest = Manifest.read(tmp_path / "r" / "1")
    assert (manifest.max_length, manifest.truncation_side) == (24, "left")
    assert manifest.test_accuracy is not None and 0 <= manifest.test_accuracy <= 1
    predicted = served_scores(tmp_path / "r" / "1", texts).argmax(axis=1)
    assert manifest.test_accuracy == pytest.approx(np.mean(predicted == np.arange(len(texts)) % 2))
    assert f"published {tmp_path}/r/1: fp32" in out


def test_padding_and_truncation_baked_into_tokenizer_json_are_ignored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a tokenizer.json saved after a padding="max_length" call pads every text to 64 (a mask of
    # ones over the pads would silently change every score) and cuts at 8
    tokenizer, names = foreign.tokenizer_for("bert")
    tokenizer.enable_padding(length=foreign.MAX_LENGTH, pad_id=0, pad_token="[PAD]")
    tokenizer.enable_truncation(max_length=8)
    folder = foreign.build("bert", tmp_path / "baked", num_labels=2, tokenizer=(tokenizer, names))
    assert '"padding": {' in (folder / "tokenizer.json").read_text()
    code, _, err = export([str(folder), "--repository", str(tmp_path / "m"), "--name", "b"], capsys)
    assert code == 0, err  # tokenization and served-score parity held
    scores = served_scores(tmp_path / "m" / "b" / "1", ["a film", "the story " * 100])
    want = pipeline_scores(
        folder, ["a film", "the story " * 100], ["LABEL_0", "LABEL_1"], "softmax"
    )
    assert np.abs(scores - want).max() <= 1e-4


def test_pytorch_model_bin(
    folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # older save_pretrained (and safe_serialization=False) write pickled weights instead
    import torch
    from safetensors.torch import load_file

    folder = Path(shutil.copytree(folders["distilbert"], tmp_path / "bin"))
    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    code, _, err = export([str(folder), "--repository", str(tmp_path / "m"), "--name", "b"], capsys)
    assert code == 0, err
    manifest = Manifest.read(tmp_path / "m" / "b" / "1")
    assert manifest.parity["served_max_abs_score_diff"] <= 1e-4
    assert manifest.source_checkpoint_sha256 == sha256_file(folder / "pytorch_model.bin")


REMOTE_CONFIG = """
from transformers import BertConfig


class MineConfig(BertConfig):
    model_type = "mine"
"""
REMOTE_MODEL = """
from transformers import BertForSequenceClassification

from .configuration_mine import MineConfig


class MineForSequenceClassification(BertForSequenceClassification):
    config_class = MineConfig
"""


def test_remote_code_runs_with_trust_remote_code(
    folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _edit_config(
        tmp_path,
        folders,
        model_type="mine",
        architectures=["MineForSequenceClassification"],
        auto_map={
            "AutoConfig": "configuration_mine.MineConfig",
            "AutoModelForSequenceClassification": "modeling_mine.MineForSequenceClassification",
        },
    )
    (folder / "configuration_mine.py").write_text(REMOTE_CONFIG)
    (folder / "modeling_mine.py").write_text(REMOTE_MODEL)
    argv = [str(folder), "--repository", str(tmp_path / "m"), "--name", "mine"]
    assert export(argv, capsys)[0] == 2  # refused without the flag (the message: below)
    code, _, err = export([*argv, "--trust-remote-code"], capsys)
    assert code == 0, err
    manifest = Manifest.read(tmp_path / "m" / "mine" / "1")
    assert (manifest.source.architecture, manifest.source.model_type) == (
        "MineForSequenceClassification",
        "mine",
    )
    assert manifest.inputs == INPUTS["bert"]


def test_int8(folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = export(
        [
            str(folders["bert"]),
            "--repository",
            str(tmp_path),
            "--name",
            "q",
            "--quantize",
            "int8",
            "--max-accuracy-drop",
            "100",
        ],
        capsys,
    )
    assert code == 0, err
    manifest = Manifest.read(tmp_path / "q" / "1")
    assert manifest.precision == "int8" and manifest.inputs == INPUTS["bert"]
    assert manifest.extra["quantization"]["checked_on"] == "the check texts"
    assert manifest.extra["quantization"]["accuracy_delta_points"] <= 0


MODULE = '''
import torch

class Bag(torch.nn.Module):
    """Mean of token embeddings over the mask, then a linear layer."""
    def __init__(self, vocab, width):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(vocab, 16)
        self.out = torch.nn.Linear(16, width)
    def forward(self, input_ids, attention_mask):
        m = attention_mask.unsqueeze(-1).float()
        return self.out((self.embed(input_ids) * m).sum(1) / m.sum(1).clamp(min=1))

def build():
    return Bag({vocab}, 2)

def wrong_width():
    return Bag({vocab}, 5)

def broken():
    raise RuntimeError("no weights here")
'''


@pytest.fixture
def user_module(folders: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    tokenizer = folders["bert"] / "tokenizer.json"
    vocab = load_tokenizer(tokenizer).get_vocab_size()
    package = tmp_path / "mymodels"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "bag.py").write_text(textwrap.dedent(MODULE).replace("{vocab}", str(vocab)))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tokenizer


def test_module_factory(
    user_module: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = export(
        [
            "--module",
            "mymodels.bag:build",
            "--tokenizer",
            str(user_module),
            "--labels",
            "neg,pos",
            "--max-length",
            "32",
            "--repository",
            str(tmp_path / "models"),
            "--name",
            "bag",
        ],
        capsys,
    )
    assert code == 0, err
    manifest = Manifest.read(tmp_path / "models" / "bag" / "1")
    assert (manifest.source.kind, manifest.source.architecture) == ("module", "mymodels.bag:build")
    assert manifest.labels == ["neg", "pos"] and manifest.inputs == INPUTS["distilbert"]
    assert (manifest.activation, manifest.threshold) == ("softmax", None)
    texts = ["a film", "", "the plot is a mess"]
    scores = served_scores(tmp_path / "models" / "bag" / "1", texts)
    assert np.allclose(scores.sum(axis=1), 1.0)
    # --activation sigmoid: the same module as a multi-label model (each label on its own)
    code, _, err = export(
        [
            *("--module", "mymodels.bag:build", "--tokenizer", str(user_module)),
            *("--labels", "neg,pos", "--max-length", "32", "--activation", "sigmoid"),
            *("--repository", str(tmp_path / "models"), "--name", "tags"),
        ],
        capsys,
    )
    assert code == 0, err
    tags = Manifest.read(tmp_path / "models" / "tags" / "1")
    assert (tags.activation, tags.threshold) == ("sigmoid", 0.5)
    sigmoid = served_scores(tmp_path / "models" / "tags" / "1", texts)
    assert not np.allclose(sigmoid.sum(axis=1), 1.0)
    logits = np.log(sigmoid / (1 - sigmoid))  # the same logits under both activations
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    np.testing.assert_allclose(e / e.sum(axis=1, keepdims=True), scores, atol=1e-5)


def _neither(tmp: Path) -> Path:
    (tmp / "stuff").mkdir()
    (tmp / "stuff" / "notes.txt").write_text("hello")
    return tmp / "stuff"


def _slow_tokenizer(tmp: Path, folders: dict[str, Path]) -> Path:
    folder = Path(shutil.copytree(folders["bert"], tmp / "slow"))
    (folder / "tokenizer.json").unlink()
    (folder / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    return folder


def _edit_config(tmp: Path, folders: dict[str, Path], **changes: Any) -> Path:
    folder = Path(shutil.copytree(folders["bert"], tmp / "edited"))
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    ("make", "extra", "message"),
    [
        (lambda t, f: _neither(t), [], "is neither a textserve run folder"),
        (
            lambda t, f: _slow_tokenizer(t, f),
            [],
            "has no tokenizer.json, the fast tokenizer's "
            "file textserve serves with (it has the slow tokenizer's vocab.txt); convert it once",
        ),
        (
            lambda t, f: _edit_config(t, f, architectures=["BertForMaskedLM"]),
            [],
            "holds a BertForMaskedLM, not a sequence classifier",
        ),
        (
            lambda t, f: _edit_config(t, f, id2label={"0": "a", "1": "b", "2": "c"}),
            [],
            "id2label has 3 labels, the classifier gives 2 logits",
        ),
        (
            lambda t, f: _edit_config(
                t, f, auto_map={"AutoModelForSequenceClassification": "modeling_mine.Mine"}
            ),
            [],
            "points at the folder's own Python code (modeling_mine.Mine); textserve runs it only "
            "with --trust-remote-code",
        ),
        (lambda t, f: t, ["--module", "nosuch.pkg:build"], "cannot import nosuch.pkg"),
        (
            lambda t, f: t,
            ["--module", "mymodels.bag:wrong_width"],
            "gives logits of shape [2, 5] for a batch of 2, expected [2, 2]",
        ),
        (
            lambda t, f: t,
            ["--module", "mymodels.bag:broken"],
            "the factory failed: RuntimeError: no weights here",
        ),
        (lambda t, f: f["bert"], ["--fp16"], "--fp16 is for textserve runs"),
        (
            lambda t, f: t,
            ["--module", "mymodels.bag:build", "--activation", "none"],
            "--activation none (regression) serves one output, got 2 labels",
        ),
        (lambda t, f: f["bert"], ["--activation", "none"], "serves one output; "),
        (lambda t, f: f["bert"], ["--activation", "relu"], "invalid choice: 'relu'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    make: Any,
    extra: list[str],
    message: str,
    folders: dict[str, Path],
    user_module: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    source = make(tmp_path, folders)
    if "--module" in extra:
        argv = [*extra, "--tokenizer", str(user_module), "--labels", "neg,pos", "--max-length", "8"]
    else:
        argv = [str(source), *extra]
    code, _out, err = export(
        [*argv, "--repository", str(tmp_path / "models"), "--name", "m"], capsys
    )
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("textserve export: error: "), err
    assert message in err
    assert not (tmp_path / "models" / "m").exists() or not any(
        (tmp_path / "models" / "m").iterdir()
    )
