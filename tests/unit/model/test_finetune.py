"""`textserve train --init-from DIR`: fine-tuning tiny local BERT- and RoBERTa-style encoders.

The folders are built here (tests/pretrained.py: config classes, tokenizers trained on the
data); nothing is downloaded. A run must be a save_pretrained folder that transformers reloads
with the trained scores, tokenizing as transformers does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from safetensors.torch import load_file  # noqa: E402

from tests.pretrained import ENCODER_SIZE, bert_folder, roberta_folder, vit_folder  # noqa: E402
from textserve.cli import main  # noqa: E402
from textserve.model.finetune import encode  # noqa: E402
from textserve.model.report import classification_metrics  # noqa: E402
from textserve.model.synthetic import synthetic_rows, write_jsonl  # noqa: E402
from textserve.model.train import TrainConfig, train  # noqa: E402
from textserve.tokenization import pad  # noqa: E402

BUILDERS = {"bert": bert_folder, "roberta": roberta_folder}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("finetune_data")
    return write_jsonl(synthetic_rows(240, seed=4), root / "reviews.jsonl")


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def source(request: pytest.FixtureRequest, data: Path, tmp_path_factory: pytest.TempPathFactory):
    texts = [json.loads(line)["text"] for line in data.read_text().splitlines()]
    folder = tmp_path_factory.mktemp(f"pretrained_{request.param}")
    return BUILDERS[request.param](folder, texts)


def _config(data: Path, source: Path, out: Path, **changes: object) -> TrainConfig:
    settings: dict[str, object] = {
        "data": data, "init_from": str(source), "epochs": 5, "lr": 3e-3, "batch_size": 8,
        "layer_decay": 1.0, "patience": 5, "seed": 0, "device": "cpu", "threads": 1,
        "output_dir": out, "progress": False, "model_overrides": {"max_length": 24},
    }  # fmt: skip
    settings.update(changes)
    return TrainConfig(**settings)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def run(data: Path, source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train(_config(data, source, tmp_path_factory.mktemp("ft") / "run"))


def test_the_run_is_a_save_pretrained_folder_with_the_trained_scores(run: Path) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    metrics = json.loads((run / "metrics.json").read_text())
    labels = json.loads((run / "textserve_run.json").read_text())["labels"]
    model = AutoModelForSequenceClassification.from_pretrained(run).eval()
    assert model.config.id2label == dict(enumerate(labels))
    assert model.config.label2id == {name: i for i, name in enumerate(labels)}
    tokenizer = AutoTokenizer.from_pretrained(run)
    assert tokenizer.model_max_length == metrics["max_length"] == 24
    rows = [json.loads(line) for line in (run / "test.jsonl").read_text().splitlines()]
    texts = [r["text"] for r in rows] + ["a long review " * 40]  # one over max_length
    ids = encode(tokenizer, texts, 24)
    # The training's tokenization is transformers' own, special tokens kept on truncation.
    assert ids == tokenizer(texts, truncation=True, max_length=24)["input_ids"]
    assert ids[-1][-1] == tokenizer.sep_token_id and len(ids[-1]) == 24
    batch_ids, mask = pad(ids[:-1], tokenizer.pad_token_id)
    with torch.no_grad():
        logits = model(
            input_ids=torch.from_numpy(batch_ids), attention_mask=torch.from_numpy(mask)
        ).logits
    index = {name: i for i, name in enumerate(labels)}
    reloaded = classification_metrics(
        [index[r["label"]] for r in rows], logits.argmax(dim=1).numpy(), labels
    )
    # The reloaded weights give exactly the predictions training scored.
    assert reloaded["confusion_matrix"] == metrics["test"]["confusion_matrix"]
    assert metrics["test_accuracy"] > 0.5  # it learned (3 labels: chance is 1/3)
    assert metrics["baseline"]["accuracy"] is not None
    assert metrics["architecture"].endswith("ForSequenceClassification")


def test_the_run_exports_and_serves_the_trained_scores(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ort = pytest.importorskip("onnxruntime")
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from textserve.artifact import MODEL_FILE, TOKENIZER_FILE, Manifest
    from textserve.tokenization import Tokenization, load_tokenizer

    repo = tmp_path / "models"
    argv = ["export", str(run), "--repository", str(repo), "--name", "ft", "--threads", "1",
            "--test-data", str(run / "test.jsonl")]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    version = repo / "ft" / "1"
    manifest = Manifest.read(version)
    metrics = json.loads((run / "metrics.json").read_text())
    assert manifest.source.kind == "huggingface"
    assert manifest.max_length == metrics["max_length"]
    # The published graph, fed as the server feeds it, scores the test split as training did ...
    assert manifest.test_accuracy == pytest.approx(metrics["test_accuracy"])
    texts = [json.loads(line)["text"] for line in (run / "test.jsonl").read_text().splitlines()]
    tokenization = Tokenization.for_manifest(load_tokenizer(version / TOKENIZER_FILE), manifest)
    batch = tokenization.arrays(texts)._asdict()
    session = ort.InferenceSession(str(version / MODEL_FILE), providers=["CPUExecutionProvider"])
    (served,) = session.run(None, {name: batch[name] for name in manifest.inputs})
    # ... and its logits are transformers' on the same texts.
    model = AutoModelForSequenceClassification.from_pretrained(run).eval()
    encoded = AutoTokenizer.from_pretrained(run)(
        texts, truncation=True, max_length=manifest.max_length, padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        expected = model(**encoded).logits.numpy()
    assert abs(served - expected).max() < 1e-4


def test_finetuning_is_seeded(run: Path, data: Path, source: Path, tmp_path: Path) -> None:
    again = train(_config(data, source, tmp_path / "again"))
    first, second = (load_file(str(p / "model.safetensors")) for p in (run, again))
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_layerwise_learning_rates() -> None:
    from transformers import BertConfig, BertForSequenceClassification

    from textserve.model.finetune import layerwise_groups

    config = BertConfig(vocab_size=50, num_labels=2, **ENCODER_SIZE)
    model = BertForSequenceClassification(config)
    groups = layerwise_groups(model, 1.0, 0.5, 0.01)
    lr_of = {id(p): g["lr"] for g in groups for p in g["params"]}
    decay_of = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
    params = dict(model.named_parameters())
    assert len(lr_of) == len(params)  # every parameter in exactly one group
    # 2 layers: the head 1, layer 1: 1/2, layer 0: 1/4, the embeddings 1/8
    assert lr_of[id(params["classifier.weight"])] == 1.0
    assert lr_of[id(params["bert.encoder.layer.1.attention.self.query.weight"])] == 0.5
    assert lr_of[id(params["bert.encoder.layer.0.output.dense.weight"])] == 0.25
    assert lr_of[id(params["bert.embeddings.word_embeddings.weight"])] == 0.125
    assert decay_of[id(params["bert.encoder.layer.0.output.LayerNorm.weight"])] == 0.0
    assert decay_of[id(params["bert.encoder.layer.0.output.dense.bias"])] == 0.0
    assert decay_of[id(params["bert.encoder.layer.0.output.dense.weight"])] == 0.01


def _cli_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main([*argv, "--threads", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("textserve train: error: --init-from ")
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_a_folder_that_is_not_a_model_is_one_line_exit_2(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("not a model")
    base = ["train", str(data), "--no-progress", "--output-dir", str(tmp_path / "out")]
    err = _cli_error([*base, "--init-from", str(tmp_path / "notes")], capsys)
    assert "is not a Hugging Face model folder (no config.json)" in err
    err = _cli_error([*base, "--init-from", str(tmp_path / "missing")], capsys)
    assert "no such model folder" in err
    assert not (tmp_path / "out").exists()


def test_a_model_without_a_classification_head_is_one_line_exit_2(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    vit = vit_folder(tmp_path / "vit")
    capsys.readouterr()  # save_pretrained's progress bar
    argv = ["train", str(data), "--no-progress", "--output-dir", str(tmp_path / "out"),
            "--init-from", str(vit)]  # fmt: skip
    err = _cli_error(argv, capsys)
    assert "has no sequence-classification head" in err and "'vit'" in err
