"""The training loop's parts, reproducibility, and `textserve train` end to end on tiny data."""

from __future__ import annotations

import csv
import itertools
import json
import math
import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import load_file  # noqa: E402

from textserve.cli import main  # noqa: E402
from textserve.model.synthetic import synthetic_rows, write_jsonl  # noqa: E402
from textserve.model.train import (  # noqa: E402
    TrainConfig,
    TrainConfigError,
    make_batches,
    train,
    warmup_cosine,
)


def test_warmup_then_cosine() -> None:
    warmup, total = 10, 110
    assert warmup_cosine(0, warmup, total) == pytest.approx(0.1)
    assert warmup_cosine(9, warmup, total) == pytest.approx(1.0)
    assert warmup_cosine(10, warmup, total) == pytest.approx(1.0)
    assert warmup_cosine(60, warmup, total) == pytest.approx(0.5)
    assert warmup_cosine(110, warmup, total) == pytest.approx(0.0, abs=1e-12)
    values = [warmup_cosine(s, warmup, total) for s in range(10, 111)]
    assert all(a >= b for a, b in itertools.pairwise(values))


def test_batches_cover_every_row_once_and_group_lengths() -> None:
    lengths = [random.Random(i).randint(1, 60) for i in range(1000)]
    batches = make_batches(lengths, 32, random.Random(0))
    assert sorted(i for b in batches for i in b) == list(range(1000))
    assert all(len(b) <= 32 for b in batches)
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    naive = sum(
        32 * max(lengths[j] for j in range(i, min(i + 32, 1000))) for i in range(0, 1000, 32)
    )
    assert padded < 0.7 * naive  # length grouping cuts padding a lot
    assert make_batches(lengths, 32, random.Random(0)) == batches  # seeded
    eval_batches = make_batches(lengths, 100, None)
    assert [i for b in eval_batches for i in b] == sorted(range(1000), key=lambda i: lengths[i])


def small_config(tmp_path: Path, name: str, **changes: object) -> TrainConfig:
    data = tmp_path / "syn.jsonl"
    if not data.exists():
        write_jsonl(synthetic_rows(120, seed=1), data)
    base: dict[str, object] = {
        "data": data, "preset": "tiny", "epochs": 2, "batch_size": 16, "seed": 3,
        "device": "cpu", "threads": 1, "output_dir": tmp_path / name, "progress": False,
    }  # fmt: skip
    base.update(changes)
    return TrainConfig(**base)  # type: ignore[arg-type]


def test_training_is_seeded_and_reproducible(tmp_path: Path) -> None:
    first = load_file(str(train(small_config(tmp_path, "a")) / "model.safetensors"))
    second = load_file(str(train(small_config(tmp_path, "b")) / "model.safetensors"))
    third = load_file(str(train(small_config(tmp_path, "c", seed=4)) / "model.safetensors"))
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert not all(torch.equal(first[k], third[k]) for k in first)


def test_metrics_file(tmp_path: Path) -> None:
    run = train(small_config(tmp_path, "m", epochs=3, patience=1, lr=1e-9))
    metrics = json.loads((run / "metrics.json").read_text())
    # lr ~0: nothing improves after epoch 1, so patience 1 stops after epoch 2.
    assert metrics["epochs_run"] == 2 and metrics["best_epoch"] == 1
    assert [h["epoch"] for h in metrics["history"]] == [1, 2]
    assert sum(map(sum, metrics["test"]["confusion_matrix"])) == metrics["test"]["n"]
    assert not math.isnan(metrics["test_macro_f1"])
    assert {"data_seconds", "train_seconds", "total_seconds"} <= set(metrics["timings"])


def test_user_given_test_split(tmp_path: Path) -> None:
    test_file = write_jsonl(synthetic_rows(30, seed=9), tmp_path / "test.jsonl")
    run = train(small_config(tmp_path, "t", epochs=1, test_data=test_file))
    assert len((run / "test.jsonl").read_text().splitlines()) == 30


def test_output_dir_must_be_new_or_empty(tmp_path: Path) -> None:
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("x")
    with pytest.raises(TrainConfigError, match=r"busy already exists and is not empty"):
        train(small_config(tmp_path, "busy"))


# --- `textserve train`: success, and each bad input as one line with exit status 2 ----------------


def test_cli_trains_and_prints_the_run_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_jsonl(synthetic_rows(90, seed=2), tmp_path / "d.jsonl")
    out = tmp_path / "run"
    argv = ["train", str(data), "--preset", "tiny", "--epochs", "1", "--threads", "1",
            "--no-progress", "--output-dir", str(out),
            "--d-model", "16", "--norm-first"]  # fmt: skip
    assert main(argv) == 0
    assert capsys.readouterr().out.strip() == str(out)
    model = json.loads((out / "config.json").read_text())["model"]
    assert model["d_model"] == 16 and model["norm_first"] is True


def write_rows(path: Path, rows: list[dict[str, str]]) -> Path:
    with open(path, "w", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def bad_inputs(tmp: Path) -> list[tuple[list[str], str]]:
    one_label = write_rows(tmp / "one.csv", [{"text": f"t{i}", "label": "a"} for i in range(9)])
    few = write_rows(
        tmp / "few.csv", [{"text": f"t{i}", "label": "a" if i < 8 else "b"} for i in range(10)]
    )
    (tmp / "latin1.csv").write_bytes("text,label\nna\u00efve,a\n".encode("latin-1"))
    (tmp / "empty.jsonl").write_text("")
    (tmp / "d.xml").write_text("<x/>")
    cols = write_rows(tmp / "cols.csv", [{"review": "x", "label": "a"}])
    return [
        ([str(tmp / "missing.csv")], "missing.csv does not exist"),
        ([str(tmp / "d.xml")], "unknown data format '.xml'"),
        ([str(cols)], "no text column 'text'; its columns are: 'review', 'label'"),
        ([str(one_label)], "only one label ('a'); a classifier needs at least two"),
        ([str(few)], "label 'b' has only 2 example(s); each label needs at least 3"),
        ([str(tmp / "latin1.csv")], "is not UTF-8 text"),
        ([str(tmp / "empty.jsonl")], "empty.jsonl is empty"),
        ([str(one_label), "--epochs", "0"], "epochs must be >= 1"),
        ([str(few), "--d-model", "30", "--n-heads", "4"], "must be divisible by n_heads"),
    ]


@pytest.mark.parametrize("case", range(9))
def test_cli_bad_input_is_one_line_exit_2(
    case: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args, message = bad_inputs(tmp_path)[case]
    if "--d-model" in args:  # a valid data set, so the model options are what fails
        args[0] = str(write_jsonl(synthetic_rows(60), tmp_path / "ok.jsonl"))
    code = main(["train", *args, "--threads", "1", "--output-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("textserve train: error: ")
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cli_cuda_without_a_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = write_jsonl(synthetic_rows(30), tmp_path / "d.jsonl")
    assert main(["train", str(data), "--device", "cuda"]) == 2
    assert "no CUDA device is available" in capsys.readouterr().err
