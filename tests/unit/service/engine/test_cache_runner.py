"""The inference thread's side of the response cache (TextRunner with a cache): texts that
tokenize like a cached one are answered without a run; what a run answered is stored; texts
refused or failing alone never are (real onnxruntime on a hand-made version)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.unit.service.engine.helpers import FailsOn, load
from textserve.service.engine.cache import CacheSize, ResponseCache
from textserve.service.engine.inference import TextItem


def items(*texts: str, truncate: bool = True) -> list[TextItem]:
    return [TextItem(text, truncate, i, object()) for i, text in enumerate(texts)]


def test_the_runner_answers_alike_texts_from_the_cache_and_stores_what_it_ran(
    tmp_path: Path,
) -> None:
    handle, _ = load(tmp_path)
    runner = handle.runner
    cache = ResponseCache(CacheSize(entries=100))
    runner.cache = view = cache.view(1, runner.max_length)
    session = FailsOn(runner.session, bad=runner.tokenization.encode(["plot"])[0][0])
    runner.session = session  # type: ignore[assignment]
    first = runner(items("good film", "a bad plot", "awful"))
    assert first.outputs["cached"].tolist() == [False, False, False]
    assert sorted(first.errors or {}) == [1]  # "plot" fails alone: refused, not stored
    assert cache.entries == 2 and view.lookup(["a bad plot"], truncate=True) == [None]
    runs = session.runs
    # The hand-made tokenizer lowercases: "GOOD FILM" has the ids of "good film".
    again = runner(items("GOOD FILM", "awful"))
    assert again.outputs["cached"].tolist() == [True, True] and session.runs == runs
    np.testing.assert_array_equal(
        again.outputs["probabilities"][0], first.outputs["probabilities"][0]
    )
    hit = view.lookup(["GOOD FILM"], truncate=True)[0]  # remembered under its own text now
    assert (
        hit is not None and hit.probabilities.tolist() == first.outputs["probabilities"][0].tolist()
    )
    # Over max_length (6 tokens) without truncation: refused by the runner, never stored.
    long = " ".join(["good"] * 9)
    refused = runner(items(long, truncate=False))
    assert sorted(refused.errors or {}) == [0] and view.lookup([long], truncate=True) == [None]


def test_a_cut_that_fails_refuses_its_own_texts_never_the_batch(tmp_path: Path) -> None:
    """One request's own truncation that the tokenization cannot take (refused up front by
    ModelHandle, but whatever else fails there) refuses that request's texts; the other
    requests of the batch are answered."""
    from textserve.service.engine.inference import Cut
    from textserve.tokenization import TokenizationError

    handle, _ = load(tmp_path)
    runner = handle.runner
    bad = Cut(max_tokens=2, side="left")

    def cut(wanted: Cut) -> object:
        raise TokenizationError("max_length 2 leaves no room for a token")

    runner._cut = cut  # type: ignore[method-assign]
    payloads = [
        TextItem("good film", True, 0, object()),
        TextItem("a bad plot", True, 0, object(), None, bad),
        TextItem("awful", True, 0, object()),
    ]
    output = runner(payloads)
    assert sorted(output.errors or {}) == [1]
    assert "cannot take it: max_length 2" in str((output.errors or {})[1])
    assert output.outputs["answered"].tolist() == [True, False, True]
