"""A small, learnable, seeded synthetic data set for tests and smoke runs (no download).

Each text is filler words with one or two cue words of its label mixed in, so a tiny model
learns it in a few epochs, while the texts still vary in length (padding matters).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

CUES = {
    "negative": ["awful", "dull", "terrible", "boring", "tedious", "clumsy"],
    "neutral": ["average", "okay", "middling", "passable", "ordinary", "fair"],
    "positive": ["great", "superb", "wonderful", "delightful", "brilliant", "moving"],
}
_FILLER_WORDS = (
    "the film movie story plot actors cast director scenes script camera music ending "
    "characters dialogue pace it was is and a of with this that its in on at"
)
FILLER = _FILLER_WORDS.split()


def synthetic_rows(n: int = 300, seed: int = 0, labels: int = 3) -> list[dict[str, str]]:
    """`n` rows {"text", "label"}, labels balanced, drawn from the first `labels` classes."""
    rng = random.Random(seed)
    names = sorted(CUES)[:labels] if labels < 3 else sorted(CUES)
    rows = []
    for i in range(n):
        label = names[i % len(names)]
        words = rng.choices(FILLER, k=rng.randint(3, 20))
        for _ in range(rng.randint(1, 2)):
            words.insert(rng.randrange(len(words) + 1), rng.choice(CUES[label]))
        rows.append({"text": " ".join(words).capitalize() + ".", "label": label})
    rng.shuffle(rows)
    return rows


def write_jsonl(rows: list[dict[str, str]], path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path
