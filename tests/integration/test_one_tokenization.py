"""THE tokenization: training, the export's checks, serving and the benchmark's ceilings feed the
model identical ids and masks, on the real test split of a real run, through each path's own
code (not through textserve.tokenization called here); a tokenizer without [UNK] is one clear
error on every path."""

from __future__ import annotations

import dataclasses
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests.handmade import make_version  # noqa: E402
from textserve.artifact import TOKENIZER_FILE, Manifest, sha256_file  # noqa: E402
from textserve.bench import ceilings  # noqa: E402
from textserve.export.checks import Encoder  # noqa: E402
from textserve.export.options import ExportOptions  # noqa: E402
from textserve.export.sources import RunSource  # noqa: E402
from textserve.model.checkpoint import load_run  # noqa: E402
from textserve.model.train import collate  # noqa: E402
from textserve.service.config import ServerConfig  # noqa: E402
from textserve.service.engine import runtime  # noqa: E402
from textserve.service.engine.inference import TextItem  # noqa: E402
from textserve.service.repository.loader import LoadError, load_version_dir  # noqa: E402
from textserve.tokenization import TokenizationError, encode_ids  # noqa: E402

# Beyond the split: a text over max_length (truncation) and one that normalizes to no token
# at all (BERT's normalizer drops control characters: the contract's single [UNK]).
EXTRA = ["a long rambling review " * 40, "\u0000\u0001"]


def rows(ids: np.ndarray, mask: np.ndarray, pad_id: int) -> list[tuple[int, ...]]:
    """Each row's real ids, after checking the padding is the contract's: a 1s-prefix mask and
    pad ids wherever the mask is 0."""
    assert ids.dtype == mask.dtype == np.int64
    for row in mask:
        real = int(row.sum())
        assert row[:real].all() and not row[real:].any()
    assert (ids[mask == 0] == pad_id).all()
    return [tuple(r[m == 1].tolist()) for r, m in zip(ids, mask, strict=True)]


@pytest.fixture
def recorded_runs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[np.ndarray, ...]]]:
    """Every (input_ids, attention_mask) onnxruntime is given through the server's Session."""
    seen: list[tuple[np.ndarray, ...]] = []
    real = runtime.Session.run

    def run(self: Any, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        seen.append((input_ids.copy(), attention_mask.copy()))
        return real(self, input_ids, attention_mask)

    monkeypatch.setattr(runtime.Session, "run", run)
    yield seen


def test_training_export_serving_and_ceilings_give_identical_ids_and_masks(
    tiny_run: Path, tiny_repository: Path, recorded_runs: list[tuple[np.ndarray, ...]]
) -> None:
    run = load_run(tiny_run)
    version_dir = tiny_repository / "tiny" / "1"
    manifest = Manifest.read(version_dir)
    texts = [*run.test_texts, *EXTRA]
    pad = run.pad_token_id
    assert (manifest.max_length, manifest.pad_token_id) == (run.max_length, pad)

    # training: how model/train.py encodes a split and batches it
    ids, mask = collate(encode_ids(run.tokenizer, texts, run.max_length), torch.device("cpu"))
    training = (ids.numpy(), mask.numpy())
    expected = rows(*training, pad)
    assert max(map(len, expected)) == run.max_length  # truncation was exercised
    assert (run.tokenizer.token_to_id("[UNK]"),) in expected  # so was the empty text's [UNK]

    # the export's checks (accuracy and parity on the test split)
    description = RunSource(tiny_run).describe(ExportOptions(threads=1))
    (export,) = Encoder.of(description).batches(texts, batch_size=len(texts))
    np.testing.assert_array_equal(export["input_ids"], training[0])
    np.testing.assert_array_equal(export["attention_mask"], training[1])

    # the benchmark's in-process ceiling, from the published version's own tokenizer file
    recorded_runs.clear()
    ceilings.onnxruntime_ceiling(
        version_dir, texts, batch_size=len(texts), intra_op_threads=1, min_seconds=0, min_texts=0
    )
    ceiling_ids, ceiling_mask = recorded_runs[0]
    np.testing.assert_array_equal(ceiling_ids, training[0])
    np.testing.assert_array_equal(ceiling_mask, training[1])

    # serving: the version loaded as the server loads it, one batch through the inference
    # worker (sorted by length and cut into sub-batches, so compared row by row)
    handle = load_version_dir(version_dir, ServerConfig(repository=tiny_repository), metrics=None)
    recorded_runs.clear()
    output = handle.runner([TextItem(t, True, i, texts) for i, t in enumerate(texts)])
    assert output.errors is None
    served = [row for ids, mask in recorded_runs for row in rows(ids, mask, pad)]
    assert sorted(served) == sorted(expected)
    assert output.outputs["num_tokens"].tolist() == [len(r) for r in expected]


def _without_unk(version_dir: Path) -> None:
    """Rewrite a version's tokenizer with [UNK] renamed (and its manifest's checksum)."""
    path = version_dir / TOKENIZER_FILE
    path.write_text(path.read_text().replace('"[UNK]"', '"[UNKNOWN]"'))
    manifest = Manifest.read(version_dir)
    manifest.sha256[TOKENIZER_FILE] = sha256_file(path)
    manifest.write(version_dir)


def test_a_tokenizer_without_unk_is_one_clear_error_on_every_path(
    tiny_run: Path, tmp_path: Path
) -> None:
    run = load_run(tiny_run)
    broken = run.tokenizer.from_str(run.tokenizer.to_str().replace('"[UNK]"', '"[UNKNOWN]"'))
    assert broken.token_to_id("[UNK]") is None
    message = re.escape("the tokenizer has no [UNK] token")
    with pytest.raises(TokenizationError, match=message):
        encode_ids(broken, ["a text"], 8)  # training
    broken.save(str(tmp_path / "broken.json"))
    description = RunSource(tiny_run).describe(ExportOptions(threads=1))
    description = dataclasses.replace(description, tokenizer_file=tmp_path / "broken.json")
    with pytest.raises(TokenizationError, match=message):
        Encoder.of(description).batches(["a text"])  # export checks

    version_dir = make_version(tmp_path / "models", "handmade", 1)
    _without_unk(version_dir)
    with pytest.raises(TokenizationError, match=message):  # benchmark ceilings
        ceilings.onnxruntime_ceiling(version_dir, ["a text"], 1, min_seconds=0, min_texts=0)
    with pytest.raises(LoadError, match=r"\[UNK\]"):  # serving refuses the version
        load_version_dir(version_dir, ServerConfig(repository=tmp_path / "models"), metrics=None)
    shutil.rmtree(version_dir)
