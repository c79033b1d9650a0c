"""Token classification beside sequence classification on one server: the same BERT body (4
layers, width 128, 256 tokens, random weights, a WordPiece tokenizer trained on the bench
texts), once with a token head (9 BIO labels: Tag) and once with a sequence head (9 labels:
Classify), at 1 and 16 texts per request.

    python -m textserve.bench.tagging [--texts runs/default] [--output bench/results/tagging]

What a token classifier costs beyond a sequence classifier is its answer: per-token logits
(batch x tokens x labels) out of the graph, a softmax over them, and entities grouped per text
(textserve.tagging) — the graph's work is the same. Rows: texts per second, p50/p99 and the
server's CPU per text, medians of the rounds, which alternate the steps on one running server;
the summary is each Tag step's texts per second over its Classify twin's.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from textserve.bench.field import _median, build_bert, measure
from textserve.bench.process import start_server
from textserve.bench.requests import RequestPool, load_texts
from textserve.v1 import classifier_pb2 as pb

LABELS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
TAG = "/textserve.v1.Classifier/Tag"
CLASSIFY = "/textserve.v1.Classifier/Classify"


def pools(texts: list[str], rounds: int) -> dict[str, RequestPool]:
    rng = np.random.default_rng(0)
    steps: dict[str, RequestPool] = {}
    for size in (1, 16):
        tag, classify = [], []
        for _ in range(64 * rounds):
            chosen = [texts[int(i)] for i in rng.integers(0, len(texts), size=(size,)).tolist()]
            tag.append(pb.TagRequest(model="tagger", texts=chosen).SerializeToString())
            classify.append(
                pb.ClassifyRequest(model="classifier", texts=chosen).SerializeToString()
            )
        steps[f"tag, {size} per request"] = RequestPool("v1", TAG, size, tag)
        steps[f"classify, {size} per request"] = RequestPool("v1", CLASSIFY, size, classify)
    return steps


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m textserve.bench.tagging", description=__doc__)
    parser.add_argument("--texts", type=Path, default=Path("runs/default"))
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--output", type=Path, help="write tagging.json here")
    args = parser.parse_args(argv)
    texts = load_texts(args.texts)
    from textserve import cli

    id2label = dict(enumerate(LABELS))
    rows: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="textserve-tagging-") as scratch:
        repository = Path(scratch) / "models"
        for name, kind in (
            ("tagger", "BertForTokenClassification"),
            ("classifier", "BertForSequenceClassification"),
        ):
            folder = build_bert(
                Path(scratch) / name, texts, kind, num_labels=len(LABELS), id2label=id2label,
                label2id={label: i for i, label in id2label.items()},
            )  # fmt: skip
            argv_ = ["export", str(folder), "--repository", str(repository), "--name", name]
            code = cli.main(argv_)
            if code != 0:
                return code
        steps = pools(texts, args.rounds)
        with start_server(repository, "tagger", ["--workers", "1"]) as server:
            for round_ in range(args.rounds):
                for label, pool in steps.items():
                    row = measure(server, pool, args)
                    rows.setdefault(label, []).append(row)
                    print(f"round {round_} {label:26} {row['documents_per_s']:8.1f} texts/s  "
                          f"p50 {row['p50_ms']:7.1f} p99 {row['p99_ms']:7.1f} ms  "
                          f"errors {row['errors']}", flush=True)  # fmt: skip
    report = {label: _median(samples) for label, samples in rows.items()}
    summary = {
        f"tag / classify, {size} per request (texts per second)": report[
            f"tag, {size} per request"
        ]["documents_per_s"]
        / report[f"classify, {size} per request"]["documents_per_s"]
        for size in (1, 16)
    }
    print(json.dumps({"steps": report, "summary": summary}, indent=1))
    if args.output is not None:
        args.output.mkdir(parents=True, exist_ok=True)
        machine = {"cpus": os.cpu_count(), "concurrency": args.concurrency}
        document = {"machine": machine, "steps": report, "summary": summary, "rounds": rows}
        (args.output / "tagging.json").write_text(json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
