"""`textserve export` of Hugging Face token classifiers (issue #41), as a user runs it.

Every listed architecture is built here as a ...ForTokenClassification (tests/foreign.py:
random weights, tokenizers trained in the test, save_pretrained) and exported through the CLI:
the version's manifest says the task and its tagging defaults (the label scheme read from
id2label), its graph gives logits per token with dynamic batch and sequence axes, and the export
checked it against PyTorch at several shapes and against transformers' tokenizer (offsets too)
and token-classification pipeline. Label schemes that do not parse and tokenizers whose offsets
cannot place an entity are refused, one line and exit 2. Nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")

from tests import foreign  # noqa: E402
from textserve import cli  # noqa: E402
from textserve.artifact import (  # noqa: E402
    MODEL_FILE,
    TOKEN_CLASSIFICATION,
    TOKENIZER_FILE,
    Manifest,
)
from textserve.export.checks import TOKEN_CHECK_TEXTS  # noqa: E402
from textserve.tokenization import Tokenization, load_tokenizer  # noqa: E402

BIO = {"scheme": "BIO", "aggregation": "simple", "ignore_labels": ["O"], "stride": 16}
TEXTS = ["Ada Lovelace met Charles Babbage in London.", "Ünïcödé café — 北京 🙂", "two  spaces"]


def export(
    folder: Path, repository: Path, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, str, str]:
    """`textserve export FOLDER` as model "t" of `repository`: exit status, stdout, stderr."""
    capsys.readouterr()  # not the export's: a build's progress bars
    argv = [str(folder), "--repository", str(repository), "--name", "t", *extra]
    try:
        code = cli.main(["export", *argv, "--threads", "1"])
    except SystemExit as exc:  # argparse's own refusals
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def nothing_published(repository: Path) -> bool:
    return not (repository / "t").exists() or not any((repository / "t").iterdir())


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("taggers")
    return {arch: foreign.build_token(arch, root / arch) for arch in foreign.ARCHITECTURES}


@pytest.fixture(scope="module")
def repository(folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("tagger-models")
    for name, folder in folders.items():
        argv = ["export", str(folder), "--repository", str(repo), "--name", name, "--threads", "1"]
        assert cli.main(argv) == 0, name
    return repo


@pytest.fixture(scope="module")
def wordpiece() -> Any:
    """One trained tokenizer for the label-scheme folders (DistilBERT: the quickest export)."""
    return foreign.tokenizer_for("distilbert")


@pytest.fixture
def tagger(wordpiece: Any, tmp_path: Path) -> Any:
    """labels -> a DistilBERT token classifier's folder with those labels."""
    return lambda labels: foreign.build_token(
        "distilbert", tmp_path / "tagger", labels=labels, tokenizer=wordpiece
    )


@pytest.mark.parametrize("arch", foreign.ARCHITECTURES)
def test_each_architecture_exports_a_token_classifier(
    arch: str, folders: dict[str, Path], repository: Path
) -> None:
    version = repository / arch / "1"
    manifest = Manifest.read(version)
    config = json.loads((folders[arch] / "config.json").read_text())
    assert (manifest.task, manifest.tags_tokens) == (TOKEN_CLASSIFICATION, True)
    assert manifest.tagging == BIO  # stride: max_length 64 // 4
    assert manifest.labels == list(foreign.TOKEN_LABELS)
    assert (manifest.activation, manifest.threshold) == ("softmax", None)
    assert manifest.source.architecture == config["architectures"][0]
    assert manifest.source.architecture.endswith("ForTokenClassification")
    assert manifest.max_length == foreign.MAX_LENGTH and manifest.test_accuracy is None
    # graph parity with PyTorch at 3 batch sizes x 4 lengths, padding in every batch of more
    # than one text (real tokens compared), recorded
    parity = manifest.parity
    assert parity["max_abs_logit_diff"] <= parity["tolerance"] == 1e-4
    assert len(manifest.extra["parity_shapes"]) == 12
    assert {"1x1", "7x37", "64x64"} <= set(manifest.extra["parity_shapes"])
    # tokenization (ids and character offsets) and every token's label and score as
    # transformers' tokenizer and token-classification pipeline give them
    assert parity["tokenization_texts"] == parity["tokenization_offsets"] == len(TOKEN_CHECK_TEXTS)
    assert parity["served_max_abs_score_diff"] <= 1e-4
    assert "tokenization_pairs" not in parity  # a token classifier tags single texts


@pytest.mark.parametrize("arch", ["bert", "roberta", "xlm-roberta"])
def test_the_graph_gives_logits_per_token_at_any_batch_and_length(
    arch: str, folders: dict[str, Path], repository: Path
) -> None:
    """(batch, sequence, labels), both axes dynamic: a padded batch's real tokens get the
    logits PyTorch gives each text alone, on transformers' own tokenization."""
    import onnx
    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    version = repository / arch / "1"
    manifest = Manifest.read(version)
    (output,) = onnx.load(str(version / MODEL_FILE)).graph.output
    dims = [d.dim_param or d.dim_value for d in output.type.tensor_type.shape.dim]
    assert dims == ["batch_size", "sequence_length", len(manifest.labels)]
    tokenization = Tokenization.for_manifest(load_tokenizer(version / TOKENIZER_FILE), manifest)
    batch = tokenization.arrays(TEXTS)._asdict()
    session = ort.InferenceSession(str(version / MODEL_FILE), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {n: batch[n] for n in manifest.inputs})
    model = AutoModelForTokenClassification.from_pretrained(folders[arch]).eval()
    tokenizer = AutoTokenizer.from_pretrained(folders[arch])
    for row, text in enumerate(TEXTS):
        alone = tokenizer(text, return_tensors="pt")
        with torch.inference_mode():
            want = model(**alone).logits[0].numpy()
        assert int(batch["attention_mask"][row].sum()) == len(want)
        np.testing.assert_allclose(logits[row, : len(want)], want, atol=1e-4)


@pytest.mark.parametrize(
    ("labels", "tagging"),
    [
        (("O", "B-PER", "I-PER", "B-LOC", "I-LOC"), BIO),
        # IOB1's I-only types are BIO's prefixes too
        (("I-PER", "O", "I-LOC", "B-LOC"), BIO),
        (
            ("O", "B-PER", "I-PER", "E-PER", "S-PER", "B-ORG", "I-ORG", "E-ORG", "S-ORG"),
            {**BIO, "scheme": "IOBES"},
        ),
        (("O", "EMAIL", "PHONE", "first-name"), {**BIO, "scheme": "plain"}),
        (("PER", "LOC"), {**BIO, "scheme": "plain", "ignore_labels": []}),
    ],
    ids=["BIO", "IOB1", "IOBES", "plain", "plain-without-O"],
)
def test_the_label_scheme_is_read_from_id2label(
    labels: tuple[str, ...],
    tagging: dict[str, Any],
    tagger: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = export(tagger(labels), tmp_path / "m", capsys)
    assert code == 0, err
    manifest = Manifest.read(tmp_path / "m" / "t" / "1")
    assert manifest.labels == list(labels) and manifest.tagging == tagging
    ignored = ", ".join(tagging["ignore_labels"]) or "no label"
    assert (
        f"  token classification: {tagging['scheme']} labels, aggregation simple, "
        f"ignoring {ignored}, stride 16\n"
    ) in out


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (
            ("O", "B-PER", "I-PER", "PER"),
            "label 'PER' has no B-/I- prefix beside 'B-PER': the label scheme does not parse",
        ),
        (("O", "X-PER", "B-LOC"), "label 'X-PER' is neither O nor <B|I|E|S>-<TYPE>"),
        (("O", "B-", "I-PER"), "label 'B-' is neither O nor <B|I|E|S>-<TYPE>"),
    ],
    ids=["prefixed-beside-plain", "unknown-prefix", "no-type"],
)
def test_a_label_scheme_that_does_not_parse_is_refused(
    labels: tuple[str, ...],
    message: str,
    tagger: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = export(tagger(labels), tmp_path / "m", capsys)
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("textserve export: error: "), err
    assert message in err and "config.json's id2label" in err
    assert nothing_published(tmp_path / "m")


def test_a_tokenizer_whose_offsets_place_no_entity_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A normalizer that replaces the whole text: every token's offsets are its last character,
    so no entity could be placed in the text (transformers' offsets agree: the same library)."""
    from tokenizers import Regex, normalizers

    tokenizer, names = foreign.tokenizer_for("distilbert")
    tokenizer.normalizer = normalizers.Replace(Regex(r"[\s\S]+"), "the story of a film")
    folder = foreign.build_token("distilbert", tmp_path / "t", tokenizer=(tokenizer, names))
    code, _, err = export(folder, tmp_path / "m", capsys)
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("textserve export: error: "), err
    assert nothing_published(tmp_path / "m")
    assert "offsets unsupported by the tokenizer" in err and "cover 1 of its 36 letters" in err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--activation", "sigmoid"], "--activation sigmoid: "),
        (["--test-data", "labels.csv"], "--test-data scores a label per text; a token classifier"),
        (["--fp16"], "--fp16 is for textserve runs"),
    ],
)
def test_options_a_token_classifier_does_not_take_are_refused(
    extra: list[str],
    message: str,
    folders: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = export(folders["distilbert"], tmp_path / "m", capsys, *extra)
    assert code == 2, err
    assert err.count("\n") == 1 and message in err, err


def test_int8_and_the_listing(
    folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """int8 goes through its gate on the check texts' tokens; `textserve models` says the task."""
    repo = tmp_path / "m"
    int8 = ("--quantize", "int8", "--max-accuracy-drop", "100")
    code, _, err = export(folders["bert"], repo, capsys, *int8)
    assert code == 0, err
    manifest = Manifest.read(repo / "t" / "1")
    assert (manifest.precision, manifest.task, manifest.tagging) == (
        "int8",
        TOKEN_CLASSIFICATION,
        BIO,
    )
    assert manifest.extra["quantization"]["checked_on"] == "the check texts"
    assert 0 < manifest.extra["quantization"]["fp32_argmax_agreement"] <= 1
    assert cli.main(["models", "--repository", str(repo)]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert row[header.index("TASK") :].split()[0] == "token"
    assert cli.main(["models", "--repository", str(repo), "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert (listed["task"], listed["tagging"]) == (TOKEN_CLASSIFICATION, BIO)


def test_offsets_that_differ_from_transformers_are_not_published(
    folders: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RoBERTa's offsets untrimmed (its post-processor's trim_offsets off: a "Ġword" token then
    spans the space before it) where transformers trims them: the ids agree, the offsets do
    not, and the export fails, exit 1, nothing published."""
    from tokenizers import processors

    from textserve.export import token_checks

    def untrimmed(path: Any) -> Any:
        tokenizer = load_tokenizer(path)
        tokenizer.post_processor = processors.RobertaProcessing(
            ("</s>", 2), ("<s>", 0), trim_offsets=False, add_prefix_space=False
        )
        return tokenizer

    monkeypatch.setattr(token_checks, "load_tokenizer", untrimmed)
    out = tmp_path / "m"
    code, _, err = export(folders["roberta"], out, capsys)
    assert code == 1, err
    assert "offsets parity check failed: text 0" in err and "nothing was published" in err
    assert nothing_published(out)
