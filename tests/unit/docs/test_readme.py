"""The README is a front door: short, with nothing a commit would have to update, and its tour
blocks (run by tests/integration/test_readme_tour.py) matched by shape as tests/tour.py says."""

from __future__ import annotations

import re
from pathlib import Path

from tests.tour import matches, output_lines, parse

ROOT = Path(__file__).resolve().parents[3]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_readme_is_short() -> None:
    assert len(README.splitlines()) <= 250


def test_the_readme_holds_no_figure_that_every_commit_changes() -> None:
    # Test counts and CI times belong to a CI run, not to the front door.
    stale = re.findall(
        r"\b\d[\d,]* tests\b|\btests? passed\b|\bpassed in\b|\.ci/run[^.\n]*\b\d+ ?(?:min|s)\b"
        r"|\bCI\b[^.\n]*\btook\b",
        README,
    )
    assert not stale


def test_the_tour_has_its_steps() -> None:
    blocks = parse(README)
    commands = [c.text for b in blocks for c in b.commands]
    for step in ("textserve train", "textserve export", "textserve serve", "textserve classify"):
        assert any(step in c for c in commands), step
    assert any(b.lang == "python" for b in blocks)
    assert all(c.expected for b in blocks for c in b.commands), "a tour command shows no output"


def test_shapes_allow_other_figures_but_not_other_words() -> None:
    shown = [
        "2026-12-01 22:11:47,496 INFO textserve.model.train: data: reviews.csv[train] — train "
        "10248, validation 1280, test 1280; labels {'rotten': 4325, 'fresh': 5923}",
        "...",
        "published models/reviews/1: fp32, opset 18, 5.7 MB, test accuracy 77.50%",
    ]
    got = output_lines(
        "2027-01-02 03:04:05,006 INFO textserve.model.train: data: reviews.csv[train] — train "
        "215, validation 26, test 26; labels {'fresh': 107, 'rotten': 108}\n"
        "epoch 1/2: 0%\repoch 1/2: 100%\n"
        "published models/reviews/1: fp32, opset 18, 0.11 MB, test accuracy 65.38%\n"
    )
    assert matches(shown, got)
    assert not matches(shown, [*got[:-1], got[-1].replace("reviews/1", "reviews/2")])
    assert not matches(shown, [*got[:-1], got[-1].replace("fp32", "int8")])
    assert not matches(shown[:1] + shown[2:], got)  # without `...` the epoch lines do not fit
    assert not matches(shown, got[:1])  # a line missing


def test_version_numbers_stay_literal() -> None:
    shown = ['{"model":"reviews","model_version":2,"results":[{"score":0.9566,"num_tokens":6}]}']
    same_shape = '{"model":"reviews","model_version":2,"results":[{"score":0.51,"num_tokens":14}]}'
    assert matches(shown, [same_shape])
    assert not matches(shown, [same_shape.replace('"model_version":2', '"model_version":1')])
    assert not matches(["(reviews version 2, 1 texts)"], ["(reviews version 1, 1 texts)"])
