"""The field's operations on one server, each beside the plain operation that does the same
work: `Rerank` of a query and 32 documents against a `Classify` of the same 32 pairs, and long
documents classified by windows against the same documents cut to the model's length.

    python -m textserve.bench.field [--texts runs/default] [--output bench/results/field]

The model is a cross-encoder (a BERT with one output, random weights, built here from its
config class with a WordPiece tokenizer trained on the bench texts, exported with `textserve
export`): rerank needs a pair template, which our own runs' tokenizers do not have. It is
small (4 layers, width 128, 256 tokens), so the server's own work shows beside the model's.
Rows: documents (or windows) per second, requests per second, p50/p99 and the server's CPU per
document, medians of the rounds, which alternate the steps on one running server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from textserve import procfs
from textserve.bench.loadgen import closed_loop
from textserve.bench.process import ServerProcess, start_server
from textserve.bench.requests import RequestPool, load_texts
from textserve.bench.stats import summarize
from textserve.v1 import classifier_pb2 as pb

MODEL = "reranker"
DOCUMENTS = 32  # per rerank request
LONG_TEXTS = 40  # bench texts joined into one long document (~1,000 tokens)
CLASSIFY = "/textserve.v1.Classifier/Classify"
RERANK = "/textserve.v1.Classifier/Rerank"


def build_cross_encoder(folder: Path, texts: Sequence[str], max_length: int = 256) -> Path:
    """save_pretrained of a one-output BERT (random weights) and a WordPiece tokenizer."""
    return build_bert(folder, texts, "BertForSequenceClassification", max_length, num_labels=1)


def build_bert(
    folder: Path, texts: Sequence[str], kind: str, max_length: int = 256, **config: Any
) -> Path:
    """save_pretrained of a small BERT (4 layers, width 128, random weights) of transformers'
    class `kind` and a WordPiece tokenizer trained on `texts` (with a pair template)."""
    import torch
    import transformers as tf
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=4000, special_tokens=specials, show_progress=False
    )
    tok.train_from_iterator(texts, trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    bert = tf.BertConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=128, num_hidden_layers=4,
        num_attention_heads=2, intermediate_size=256, max_position_embeddings=max_length,
        pad_token_id=0, **config,
    )  # fmt: skip
    torch.manual_seed(0)
    getattr(tf, kind)(bert).eval().save_pretrained(folder)
    names = {"unk_token": "[UNK]", "pad_token": "[PAD]", "cls_token": "[CLS]"}
    names.update(sep_token="[SEP]", mask_token="[MASK]")
    fast = tf.PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=max_length, **names)
    fast.save_pretrained(folder)
    return folder


def pools(texts: list[str], rounds: int) -> dict[str, RequestPool]:
    """The steps' requests, serialized ahead (the same documents for each pair of steps)."""
    rng = np.random.default_rng(0)

    def pick(k: int) -> list[str]:
        return [texts[int(i)] for i in rng.integers(0, len(texts), size=(k,)).tolist()]

    rerank, pairs, cut, windowed = [], [], [], []
    for _ in range(64 * rounds):
        query, documents = pick(1)[0], pick(DOCUMENTS)
        rerank.append(pb.RerankRequest(model=MODEL, query=query, documents=documents))
        same = pb.ClassifyRequest(model=MODEL, texts=[query] * DOCUMENTS, text_pairs=documents)
        pairs.append(same)
        long = " ".join(pick(LONG_TEXTS))
        cut.append(pb.ClassifyRequest(model=MODEL, texts=[long]))
        windowed.append(pb.ClassifyRequest(model=MODEL, texts=[long], windows=pb.Windows()))
    serialized = lambda ms: [m.SerializeToString() for m in ms]  # noqa: E731
    return {
        "rerank 32 documents": RequestPool("v1", RERANK, DOCUMENTS, serialized(rerank)),
        "classify the same 32 pairs": RequestPool("v1", CLASSIFY, DOCUMENTS, serialized(pairs)),
        "long document, windows": RequestPool("v1", CLASSIFY, 1, serialized(windowed)),
        "long document, cut": RequestPool("v1", CLASSIFY, 1, serialized(cut)),
    }


def windows_per_document(server: ServerProcess, pool: RequestPool) -> float:
    """How many windows the long documents take (asked of the server, a few of them)."""
    import grpc

    from textserve.v1 import classifier_pb2_grpc as pb_grpc

    counts = []
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.ClassifierStub(channel)
        for payload in pool.payloads[:16]:
            request = pb.ClassifyRequest.FromString(payload)
            counts.append(stub.Classify(request, timeout=60).results[0].windows)
    return float(np.mean(counts))


def measure(server: ServerProcess, pool: RequestPool, args: argparse.Namespace) -> dict[str, Any]:
    cpu: list[float] = []
    pid = server.pid

    async def probe() -> None:
        cpu.append(procfs.tree_cpu_seconds(pid) or 0.0)  # type: ignore[arg-type]

    raw, _ = asyncio.run(
        closed_loop(
            server.address, pool, args.concurrency,
            warmup=args.warmup, duration=args.duration, probe=probe, timeout=60,
        )
    )  # fmt: skip
    step = summarize(raw, os.cpu_count() or 1)
    seconds = cpu[-1] - cpu[0] if len(cpu) >= 2 else float("nan")
    return {
        "documents_per_s": step["throughput_texts_per_s"],
        "requests_per_s": step["throughput_requests_per_s"],
        "p50_ms": step["latency_ms"]["p50"],
        "p99_ms": step["latency_ms"]["p99"],
        "errors": sum(raw.errors.values()),
        "cpu_ms_per_document": seconds / max(1, raw.texts) * 1e3,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m textserve.bench.field", description=__doc__)
    parser.add_argument("--texts", type=Path, default=Path("runs/default"))
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--output", type=Path, help="write field.json here")
    args = parser.parse_args(argv)
    texts = load_texts(args.texts)
    from textserve import cli

    rows: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="textserve-field-") as scratch:
        folder = build_cross_encoder(Path(scratch) / "hf", texts)
        repository = Path(scratch) / "models"
        code = cli.main(["export", str(folder), "--repository", str(repository), "--name", MODEL])
        if code != 0:
            return code
        steps = pools(texts, args.rounds)
        with start_server(repository, MODEL, ["--workers", "1"]) as server:
            windows = windows_per_document(server, steps["long document, windows"])
            for round_ in range(args.rounds):
                for label, pool in steps.items():
                    row = measure(server, pool, args)
                    rows.setdefault(label, []).append(row)
                    print(f"round {round_} {label:28} {row['documents_per_s']:8.1f} docs/s  "
                          f"p50 {row['p50_ms']:7.1f} p99 {row['p99_ms']:7.1f} ms  "
                          f"errors {row['errors']}", flush=True)  # fmt: skip
    report = {label: _median(samples) for label, samples in rows.items()}
    report["long document, windows"]["windows_per_s"] = (
        report["long document, windows"]["documents_per_s"] * windows
    )
    summary = {
        "windows_per_document": windows,
        "rerank / classify (documents per second)": report["rerank 32 documents"]["documents_per_s"]
        / report["classify the same 32 pairs"]["documents_per_s"],
        "windows per second / cut documents per second": report["long document, windows"][
            "windows_per_s"
        ]
        / report["long document, cut"]["documents_per_s"],
    }
    print(json.dumps({"steps": report, "summary": summary}, indent=1))
    if args.output is not None:
        args.output.mkdir(parents=True, exist_ok=True)
        machine = {"cpus": os.cpu_count(), "concurrency": args.concurrency}
        document = {"machine": machine, "steps": report, "summary": summary, "rounds": rows}
        (args.output / "field.json").write_text(json.dumps(document, indent=1) + "\n")
    return 0


def _median(samples: list[dict[str, Any]]) -> dict[str, Any]:
    return {key: statistics.median(s[key] for s in samples) for key in samples[0]}


if __name__ == "__main__":
    raise SystemExit(main())
