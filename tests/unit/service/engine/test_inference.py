"""Unit tests of how a model version runs a batch: tokenized in the batch, sorted by length and
split into sub-batches (split_runs), per-text errors, and the batcher's side of BatchOutput."""

from __future__ import annotations

import asyncio
import itertools
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.unit.service.engine.helpers import FailsOn, load
from textserve.service.config import BatcherConfig
from textserve.service.engine.batcher import Batcher, BatchOutput, RunStats
from textserve.service.engine.inference import TextItem
from textserve.service.engine.subbatches import softmax, split_runs
from textserve.service.errors import ValidationError


def cost(lengths: list[int], cuts: list[int], run_cost: int) -> int:
    bounds = [0, *cuts, len(lengths)]
    return sum(run_cost + (e - s) * lengths[e - 1] for s, e in itertools.pairwise(bounds))


def cheapest(lengths: list[int], run_cost: int) -> int:
    """Every way to cut `lengths`, tried."""
    n = len(lengths)
    return min(
        cost(lengths, [i + 1 for i in range(n - 1) if mask >> i & 1], run_cost)
        for mask in range(1 << (n - 1))
    )


def test_split_runs_finds_the_cheapest_split() -> None:
    rng = random.Random(0)
    for _ in range(300):
        lengths = sorted(rng.randint(1, 64) for _ in range(rng.randint(1, 10)))
        run_cost = rng.choice([0, 1, 16, 64, 1000])
        cuts = split_runs(lengths, run_cost)
        assert cuts == sorted(set(cuts)) and all(0 < c < len(lengths) for c in cuts)
        assert cost(lengths, cuts, run_cost) == cheapest(lengths, run_cost), (lengths, run_cost)


def test_split_runs_edges() -> None:
    assert split_runs([], 16) == []
    assert split_runs([7] * 50, 0) == []  # equal lengths: nothing to save
    assert split_runs([1, 64], 0) == [1]
    assert split_runs([1, 64], 10**6) == []


TEXTS = ["good", "a good film and a great plot", "bad", "the plot is bad", "awful film", "zzz"]


def test_a_batch_runs_as_length_sorted_sub_batches_with_answers_in_input_order(
    tmp_path: Path,
) -> None:
    handle, _ = load(tmp_path)
    handle.runner.run_cost = 0  # split wherever padding would be wasted
    shapes: list[tuple[int, ...]] = []
    real_run = handle.runner.session.run

    def recording_run(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        shapes.append(ids.shape)
        assert (mask.sum(axis=1) == ids.shape[1]).any()  # padded to its own longest
        return real_run(ids, mask)

    handle.runner.session.run = recording_run  # type: ignore[method-assign,assignment]
    output = handle.runner([TextItem(t, True, i, None) for i, t in enumerate(TEXTS)])
    handle.runner.session.run = real_run  # type: ignore[method-assign]
    rows = output.outputs
    # each text alone, through the same tokenizer and model: the reference
    ids = handle.runner.tokenization.encode(TEXTS)
    tokenization = handle.runner.tokenization
    expected = np.concatenate([softmax(real_run(*tokenization.batch([t]))) for t in TEXTS])
    np.testing.assert_allclose(rows["probabilities"], expected, atol=1e-6)
    assert rows["num_tokens"].tolist() == [len(r) for r in ids] == [1, 6, 1, 4, 2, 1]
    assert rows["full_tokens"].tolist() == [1, 7, 1, 4, 2, 1]
    assert output.errors is None
    # sorted and split: the three 1-token texts together, then 2, 4 and 6 tokens; no padding
    assert sorted(shapes) == [(1, 2), (1, 4), (1, 6), (3, 1)]
    assert sum(r.size for r in list(output.runs or ())) == len(TEXTS)
    assert all(r.padded_tokens == r.real_tokens for r in list(output.runs or ()))


def test_runs_keep_to_max_batch_tokens_in_real_tokens(tmp_path: Path) -> None:
    handle, _ = load(tmp_path, max_batch_tokens=8)
    handle.runner.run_cost = 10**6  # one run, were it not for the budget
    output = handle.runner([TextItem("a good film and plot", True, i, None) for i in range(5)])
    # 5 tokens each: one fits in 8
    assert [r.size for r in list(output.runs or ())] == [1, 1, 1, 1, 1]
    assert all(r.padded_tokens <= 8 for r in list(output.runs or ()))


def test_an_over_long_text_without_truncation_fails_its_request_only(tmp_path: Path) -> None:
    handle, _ = load(tmp_path)
    refused, kept = object(), object()
    payloads = [
        TextItem("good film", False, 0, refused),
        TextItem("a good film and a great plot", False, 1, refused),  # 7 tokens > 6
        TextItem("a good film and a great plot", True, 0, kept),
    ]
    output = handle.runner(payloads)
    assert output.errors is not None and list(output.errors) == [1]
    assert "texts[1] is 7 tokens long" in str(output.errors[1])
    # the refused request's other text did not run either
    assert [r.size for r in list(output.runs or ())] == [1]
    assert output.outputs["num_tokens"][2] == 6


def test_classify_end_to_end_counts_runs_and_padding_from_real_tokens(tmp_path: Path) -> None:
    handle, metrics = load(tmp_path)

    async def main() -> Any:
        handle.start()
        try:
            handle.batcher.pause()  # one batch for all of them
            tasks = [asyncio.create_task(handle.classify([t])) for t in TEXTS]
            while handle.stats().queue_depth < len(TEXTS):
                await asyncio.sleep(0.001)
            handle.batcher.resume()
            results = await asyncio.gather(*tasks)
            with pytest.raises(ValidationError, match=r"texts\[0\] is 7 tokens long"):
                await handle.classify([TEXTS[1]], truncate=False)
            return results
        finally:
            await handle.close()

    results = asyncio.run(main())
    assert [bool(r.truncated[0]) for r in results] == [False, True, False, False, False, False]
    assert [int(r.num_tokens[0]) for r in results] == [1, 6, 1, 4, 2, 1]
    stats = handle.stats()
    assert stats.items == len(TEXTS)  # the refused request never reached the model
    assert stats.padded_tokens - stats.padding_tokens == 1 + 6 + 1 + 4 + 2 + 1
    registry = metrics.registry
    assert registry.get_sample_value("textserve_batch_size_count", {"model": "m"}) == stats.batches
    assert registry.get_sample_value("textserve_tokenize_duration_seconds_count", {"model": "m"})


def test_batcher_fails_the_rows_a_batch_output_names_and_counts_its_runs() -> None:
    def run_batch(payloads: list[int]) -> BatchOutput:
        out = np.array(payloads, dtype=np.float32)[:, None]
        errors = {i: ValidationError(f"no {p}") for i, p in enumerate(payloads) if p < 0}
        runs = [RunStats(size=len(payloads) - len(errors), padded_tokens=10, real_tokens=7,
                         seconds=0.001)]  # fmt: skip
        return BatchOutput(out, runs, errors or None)

    async def main() -> None:
        batcher: Batcher[int] = Batcher(run_batch, BatcherConfig())
        batcher.start()
        batcher.pause()
        good = asyncio.create_task(batcher.submit([1, 2], [1, 1]))
        bad = asyncio.create_task(batcher.submit([3, -4], [1, 1]))
        while batcher.snapshot().queue_depth < 4:
            await asyncio.sleep(0.001)
        batcher.resume()
        assert (await good).outputs[:, 0].tolist() == [1.0, 2.0]
        with pytest.raises(ValidationError, match="no -4"):
            await bad
        stats = batcher.snapshot()
        assert (stats.batches, stats.items, stats.padding_tokens) == (1, 3, 3)
        await batcher.close()

    asyncio.run(main())


def test_a_failing_run_is_bisected_so_that_only_the_unusable_texts_fail(tmp_path: Path) -> None:
    handle, _ = load(tmp_path)
    session = FailsOn(handle.runner.session, bad=handle.runner.tokenization.encode(["plot"])[0][0])
    handle.runner.session = session  # type: ignore[assignment]
    texts = ["good film", "a bad plot", "great", "awful film", "the film", "a plot", "bad", "is"]
    requests = [object() for _ in texts]
    payloads = [TextItem(t, True, 0, r) for t, r in zip(texts, requests, strict=True)]
    output = handle.runner(payloads)
    assert sorted(output.errors or {}) == [1, 5]  # the texts holding "plot", nothing else
    for row in (1, 5):
        error = (output.errors or {})[row]
        assert isinstance(error, ValidationError) and "cannot take this text" in str(error)
    alone = [handle.runner([p]).outputs["probabilities"][0] for p in payloads]
    for row in (0, 2, 3, 4, 6, 7):  # answered as if run without the bad ones
        np.testing.assert_allclose(output.outputs["probabilities"][row], alone[row], atol=1e-6)
    assert sum(run.size for run in output.runs or ()) == 6


def test_a_model_that_fails_on_every_text_fails_the_batch(tmp_path: Path) -> None:
    handle, _ = load(tmp_path)
    session = FailsOn(handle.runner.session, bad=-1)
    handle.runner.session = session  # type: ignore[assignment]
    session.broken = True  # a device fault: not the texts'; the batch fails (INTERNAL)
    payloads = [TextItem(t, True, 0, object()) for t in ("good", "bad film", "a plot")]
    with pytest.raises(RuntimeError, match="out of data bounds"):
        handle.runner(payloads)
    session.broken = False
    assert handle.runner(payloads).errors is None
