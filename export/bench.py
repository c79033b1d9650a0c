"""In-process export benchmarks on the CPU: onnxruntime against PyTorch eager, one run each.

    .venv/bin/python -m textserve.export.bench runs/<run-id> [--repository models --name default]
    .venv/bin/python -m textserve.export.bench --bert-shaped [--threads 1 --batch-sizes 1,32]

A training run: on its test-split texts, PyTorch eager fp32 and int8 against onnxruntime's fp32
and int8 graphs (the newest of each precision exported from that checkpoint in --repository, else
built here). Texts are tokenized once beforehand by the contract's rules, so the figures are
model time only. Targets (reported, never asserted): onnxruntime >= 1.5x PyTorch eager at both
batch sizes; int8 >= 1.3x fp32 with <= 1 point accuracy loss.

--bert-shaped: a BERT-shaped Hugging Face classifier built here (4 layers, d=256, 4 heads, random
weights) as PyTorch eager, the exporter's ONNX graph, onnxruntime's transformer optimizer's graph
and its dynamic int8; batches of random token ids of 16-128 tokens (padded to the longest in
each batch), the same for every engine. Figures only: nothing is asserted.

Either way, at batch 1 and 32 (--batch-sizes), each engine with the same number of CPU threads
(--threads); the graphs are written by the source's own exporter and optimizer, as the export
pipeline writes them (export/pipeline.py). Engines take turns every 64 texts (SLICE_TEXTS) and
the median round counts, which keeps drift and neighbours' load from favouring one engine.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from textserve.artifact import MODEL_FILE, Manifest, ManifestError, iter_versions, sha256_file
from textserve.export import checks, transforms
from textserve.export.checks import Encoder, Feed
from textserve.export.description import Description
from textserve.export.errors import ExportError
from textserve.export.options import ExportOptions
from textserve.export.sources import RunSource

Predict = Callable[[Feed], np.ndarray]

RATIO_PAIRS = {  # label -> (numerator engine, denominator engine)
    "onnxruntime/pytorch fp32": ("onnxruntime fp32", "pytorch fp32"),
    "onnxruntime/pytorch int8": ("onnxruntime int8", "pytorch int8"),
    "int8/fp32 onnxruntime": ("onnxruntime int8", "onnxruntime fp32"),
    "int8/fp32 pytorch": ("pytorch int8", "pytorch fp32"),
}


@dataclass
class Measurement:
    engine: str  # "onnxruntime int8", ...
    batch_size: int
    texts_per_second: float  # median over rounds
    accuracy: float  # on the benchmarked texts
    rounds: list[float] = field(default_factory=list)


@dataclass
class BenchResult:
    threads: int
    n_texts: int
    model: dict[str, Any]
    graphs: dict[str, str]  # engine -> where its ONNX graph came from
    measurements: list[Measurement]

    def get(self, engine: str, batch_size: int) -> Measurement | None:
        return next(
            (m for m in self.measurements if m.engine == engine and m.batch_size == batch_size),
            None,
        )

    def _batch_sizes(self) -> list[int]:
        return sorted({m.batch_size for m in self.measurements})

    def _pairs(self, b: int) -> Iterator[tuple[str, Measurement, Measurement]]:
        """("<ratio label> @ batch <b>", numerator, denominator) for every RATIO_PAIRS ratio
        both of whose engines were measured at batch size b."""
        for label, (num, den) in RATIO_PAIRS.items():
            a, c = self.get(num, b), self.get(den, b)
            if a and c:
                yield f"{label} @ batch {b}", a, c

    def ratios(self) -> dict[str, float]:
        """Speed ratios and int8 accuracy changes (points) per batch size."""
        out: dict[str, float] = {}
        for b in self._batch_sizes():
            for key, a, c in self._pairs(b):
                if c.texts_per_second > 0:
                    out[key] = a.texts_per_second / c.texts_per_second
            a8, f32 = self.get("onnxruntime int8", b), self.get("onnxruntime fp32", b)
            if a8 and f32:
                out[f"int8 accuracy change (points) @ batch {b}"] = (
                    a8.accuracy - f32.accuracy
                ) * 100
        return out

    def round_ratios(self) -> dict[str, tuple[float, float, float]]:
        """(min, median, max) over rounds of each speed ratio, taken round by round: engines run
        in turn within a round, so a round's ratio compares like with like when the machine's
        speed drifts between rounds; the spread shows how far one run can be trusted."""
        out: dict[str, tuple[float, float, float]] = {}
        for b in self._batch_sizes():
            for key, a, c in self._pairs(b):
                if len(a.rounds) != len(c.rounds):
                    continue
                per_round = sorted(x / y for x, y in zip(a.rounds, c.rounds, strict=True) if y > 0)
                if per_round:
                    out[key] = (per_round[0], statistics.median(per_round), per_round[-1])
        return out

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratios": self.ratios(), "round_ratios": self.round_ratios()}


def run_benchmark(
    run_dir: str | Path,
    *,
    repository: str | Path | None = None,
    name: str = "default",
    batch_sizes: Sequence[int] = (1, 32),
    threads: int = 1,
    rounds: int = 9,
    min_seconds: float = 0.3,
    max_texts: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> BenchResult:
    """Measure every engine at every batch size on a run's test split (the module docstring)."""
    say = progress or (lambda _msg: None)
    run = RunSource(Path(run_dir)).describe(ExportOptions(threads=threads))
    assert run.split is not None  # a run always brings its test split
    texts, labels = run.split.texts[:max_texts], run.split.labels[:max_texts]
    encoder = Encoder.of(run)
    with tempfile.TemporaryDirectory(prefix="textserve-bench-") as tmp:
        graphs = _graphs(run, Path(tmp), repository, name, say)
        engines = _engines(run, graphs, threads)
        measurements = []
        for b in batch_sizes:
            batches = encoder.batches(texts, batch_size=b)
            measurements += _measure(engines, batches, labels, b, rounds, min_seconds, say)
    cfg = run.model.config
    return BenchResult(
        threads=threads,
        n_texts=len(texts),
        model={
            "run_dir": run.notes["run_dir"],
            "d_model": cfg.d_model,
            "n_layers": cfg.n_layers,
            "n_heads": cfg.n_heads,
            "d_ff": cfg.d_ff,
            "max_length": cfg.max_length,
            "parameters": run.model.num_parameters(),
        },
        graphs={k: str(v) for k, v in graphs.items()},
        measurements=measurements,
    )


def exported(description: Description, raw: Path, optimized: Path) -> str:
    """The source's graph and its optimizer's, written as the export writes them; which
    optimizer it was."""
    transforms.write_graph(description, raw, ExportOptions())
    return transforms.optimize(raw, optimized, description.ort_model_type, description.shape)


def _graphs(
    run: Description,
    tmp: Path,
    repository: str | Path | None,
    name: str,
    say: Callable[[str], None],
) -> dict[str, Path]:
    """fp32 and int8 graphs: the newest of each precision in the repository, or built here."""
    found: dict[str, Path] = {}
    if repository is not None:
        found = _from_repository(Path(repository) / name, sha256_file(run.checkpoint))
    if "fp32" not in found:
        say("building the fp32 graph (export + onnxruntime offline optimization)")
        found["fp32"] = tmp / "fp32.onnx"
        exported(run, tmp / "raw.onnx", found["fp32"])
    if "int8" not in found:
        say("building the int8 graph (onnxruntime dynamic quantization)")
        found["int8"] = tmp / "int8.onnx"
        transforms.quantize_int8(found["fp32"], found["int8"])
    return found


def _from_repository(model_dir: Path, weights_sha: str) -> dict[str, Path]:
    if not model_dir.is_dir():
        raise ExportError(f"{model_dir} does not exist")
    found: dict[str, Path] = {}
    for _, version_dir in reversed(list(iter_versions(model_dir))):  # newest first
        try:
            manifest = Manifest.read(version_dir)
        except ManifestError:
            continue  # broken or not a version at all: not a graph to measure
        if manifest.source_checkpoint_sha256 != weights_sha:
            continue  # exported from another checkpoint: comparing it with this run means nothing
        found.setdefault(manifest.precision, version_dir / MODEL_FILE)
    return found


def _engines(run: Description, graphs: dict[str, Path], threads: int) -> dict[str, Predict]:
    engines: dict[str, Predict] = {"pytorch fp32": _torch_predict(run.model)}
    with warnings.catch_warnings():
        # torch.ao dynamic quantization is deprecated upstream (moving to torchao) but is still
        # PyTorch's own eager int8 path in the pinned torch, the fair counterpart here.
        warnings.simplefilter("ignore")
        quantized = torch.ao.quantization.quantize_dynamic(
            copy.deepcopy(run.model), {torch.nn.Linear}, dtype=torch.qint8
        )
    engines["pytorch int8"] = _torch_predict(quantized)
    for precision in ("fp32", "int8"):
        engines[f"onnxruntime {precision}"] = _ort_predict(graphs[precision], threads)
    return engines


def _torch_predict(model: torch.nn.Module) -> Predict:
    def predict(feed: Feed) -> np.ndarray:
        return checks.torch_logits(model, feed)

    return predict


def _ort_predict(graph: Path, threads: int) -> Predict:
    session = checks.make_session(graph, threads=threads)

    def predict(feed: Feed) -> np.ndarray:
        return checks.onnx_logits(session, feed)

    return predict


# Engines take turns every SLICE_TEXTS texts (2 batches of 32, 64 of 1): ~20-150 ms each, short
# enough that the machine's drift (this shared host's speed moves by 1.5x within seconds) falls on
# every engine alike, long enough that reloading an engine's weights into cache (~1 MB) is noise.
# Taking turns per whole pass instead (0.3-1 s) gave int8/fp32 ratios of 0.9-1.8 round to round.
SLICE_TEXTS = 64


def _measure(
    engines: dict[str, Predict],
    batches: list[Feed],
    labels: Sequence[int],
    batch_size: int,
    rounds: int,
    min_seconds: float,
    say: Callable[[str], None],
) -> list[Measurement]:
    n_texts = sum(len(feed["input_ids"]) for feed in batches)
    per_slice = max(1, SLICE_TEXTS // batch_size)
    slices = [batches[i : i + per_slice] for i in range(0, len(batches), per_slice)]
    rates: dict[str, list[float]] = {name: [] for name in engines}
    acc: dict[str, float] = {}
    for name, predict in engines.items():  # warm-up pass, which also gives the accuracy
        logits = np.concatenate([predict(feed) for feed in batches])
        acc[name] = checks.accuracy(logits, labels)
    names = list(engines)
    order = random.Random(0)
    for r in range(rounds):
        # A round: whole passes over the texts until each engine has run min_seconds, engines
        # taking turns slice by slice in a shuffled order, so that no engine always runs right
        # after the same other one (whatever state that one leaves: caches, clock speed).
        elapsed = dict.fromkeys(names, 0.0)
        passes = 0
        while passes == 0 or min(elapsed.values()) < min_seconds:
            for part in slices:
                for name in order.sample(names, len(names)):
                    predict, start = engines[name], time.perf_counter()
                    for feed in part:
                        predict(feed)
                    elapsed[name] += time.perf_counter() - start
            passes += 1
        for name in names:
            rates[name].append(passes * n_texts / elapsed[name])
            rate = rates[name][-1]
            say(f"batch {batch_size:>3}  round {r + 1}/{rounds}  {name:<17} {rate:9.1f} texts/s")
    return [
        Measurement(name, batch_size, statistics.median(rates[name]), acc[name], rates[name])
        for name in names
    ]


SHAPE = {
    "num_hidden_layers": 4,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "intermediate_size": 1024,
    "max_position_embeddings": 512,
    "vocab_size": 30522,
}
BERT_ENGINES = ("pytorch fp32", "onnxruntime fp32", "onnxruntime optimized", "onnxruntime int8")


@dataclass
class BertBench:
    threads: int
    n_texts: int
    model: dict[str, Any]
    measurements: list[Measurement]

    def ratio(self, engine: str, batch_size: int) -> float:
        get = {(m.engine, m.batch_size): m.texts_per_second for m in self.measurements}
        return get[(engine, batch_size)] / get[("pytorch fp32", batch_size)]


def bert_shaped(seed: int = 0, shape: dict[str, int] | None = None) -> Description:
    """The benchmarked model: BertForSequenceClassification with SHAPE (or `shape`), 2 labels,
    described as a Hugging Face folder's model is."""
    shape = shape or SHAPE
    import transformers

    transformers.utils.logging.set_verbosity_error()
    from textserve.export.huggingface import _Logits

    torch.manual_seed(seed)
    settings: dict[str, Any] = {"num_labels": 2, "attn_implementation": "eager", **shape}
    model = transformers.BertForSequenceClassification(transformers.BertConfig(**settings)).eval()
    return Description(
        model=_Logits(model).eval(),
        inputs=["input_ids", "attention_mask", "token_type_ids"],
        labels=["LABEL_0", "LABEL_1"],
        activation="softmax",
        max_length=128,
        pad_token_id=0,
        unk_token_id=100,
        tokenizer_file=Path(),
        checkpoint=Path(),
        source={
            "kind": "huggingface",
            "architecture": "BertForSequenceClassification",
            "model_type": "bert",
        },
        vocab_size=shape["vocab_size"],
        type_vocab_size=2,
        hf_model=model,
        ort_model_type="bert",
        shape=(shape["num_attention_heads"], shape["hidden_size"]),
    )


def random_texts(
    n_texts: int, batch_size: int, seed: int = 0, vocab: int = SHAPE["vocab_size"]
) -> list[Feed]:
    """Random batches of texts 16-128 tokens long, padded to each batch's longest, type ids 0."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(16, 129, size=n_texts)
    out = []
    for i in range(0, n_texts, batch_size):
        part = lengths[i : i + batch_size]
        t = int(part.max())
        mask = (np.arange(t)[None, :] < part[:, None]).astype(np.int64)
        ids = rng.integers(vocab // 30, vocab, size=mask.shape, dtype=np.int64) * mask
        out.append({"input_ids": ids, "attention_mask": mask, "token_type_ids": 0 * ids})
    return out


def bert_benchmark(
    *,
    threads: int = 1,
    batch_sizes: Sequence[int] = (1, 32),
    n_texts: int = 256,
    rounds: int = 5,
    min_seconds: float = 0.3,
    shape: dict[str, int] | None = None,
) -> tuple[BertBench, dict[str, Any]]:
    """Measure every engine at every batch size; `shape` replaces SHAPE (tests: a tiny one)."""
    torch.set_num_threads(threads)
    shape = shape or SHAPE
    bert = bert_shaped(shape=shape)
    notes: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="textserve-bench-bert-") as tmp:
        raw, fused, int8 = (Path(tmp) / f"{n}.onnx" for n in ("fp32", "optimized", "int8"))
        notes["optimizer"] = exported(bert, raw, fused)
        notes["int8"] = transforms.quantize_int8(fused, int8)
        engines: dict[str, Predict] = {"pytorch fp32": _torch_predict(bert.model)}
        for name, path in zip(BERT_ENGINES[1:], (raw, fused, int8), strict=True):
            engines[name] = _ort_predict(path, threads)
        parity = _parity(engines, random_texts(64, 8, seed=2, vocab=shape["vocab_size"]))
        measured: list[Measurement] = []
        for b in batch_sizes:
            data = random_texts(n_texts if b > 1 else n_texts // 4, b, vocab=shape["vocab_size"])
            labels = [0] * sum(len(feed["input_ids"]) for feed in data)  # random weights: speed
            measured += _measure(engines, data, labels, b, rounds, min_seconds, _say)
    params = sum(p.numel() for p in bert.model.parameters())
    model = {**shape, "parameters": params, "lengths": "16-128 tokens"}
    return BertBench(threads, n_texts, model, measured), {**notes, "max_abs_logit_diff": parity}


def _parity(engines: dict[str, Predict], data: list[Feed]) -> dict[str, float]:
    """max |Δlogit| of each ONNX engine against PyTorch on the same batches."""
    ref = [engines["pytorch fp32"](feed) for feed in data]
    return {
        name: float(
            max(np.abs(engines[name](feed) - r).max() for feed, r in zip(data, ref, strict=True))
        )
        for name in BERT_ENGINES[1:]
    }


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def format_report(result: BenchResult) -> str:
    m = result.model
    lines = [
        f"{result.n_texts} test texts, {result.threads} thread(s) per engine, model d_model="
        f"{m['d_model']} n_layers={m['n_layers']} max_length={m['max_length']} "
        f"({m['parameters']:,} parameters)",
        f"{'batch':>5}  {'engine':<17} {'texts/s':>9}  {'vs pytorch fp32':>15}  accuracy",
    ]
    for x in result.measurements:
        base = result.get("pytorch fp32", x.batch_size)
        ratio = x.texts_per_second / base.texts_per_second if base else float("nan")
        lines.append(
            f"{x.batch_size:>5}  {x.engine:<17} {x.texts_per_second:9.1f}  {ratio:14.2f}x  "
            f"{x.accuracy:.2%}"
        )
    lines.append(
        "ratios (of the median rounds; in brackets min / median / max of the ratio round by round):"
    )
    spread = result.round_ratios()
    for k, v in result.ratios().items():
        if "points" in k:
            lines.append(f"  {k}: {v:+.2f}")
            continue
        low, mid, high = spread.get(k, (v, v, v))
        lines.append(f"  {k}: {v:.2f}x  [{low:.2f} / {mid:.2f} / {high:.2f}]")
    return "\n".join(lines)


def format_bert_report(result: BertBench, notes: dict[str, Any]) -> str:
    m = result.model
    lines = [
        f"BERT-shaped classifier ({m['num_hidden_layers']} layers, d={m['hidden_size']}, "
        f"{m['parameters']:,} parameters), {m['lengths']}, {result.threads} thread(s) per engine",
        f"{'batch':>5}  {'engine':<22} {'texts/s':>9}  vs pytorch fp32",
    ]
    for x in result.measurements:
        lines.append(
            f"{x.batch_size:>5}  {x.engine:<22} {x.texts_per_second:9.1f}  "
            f"{result.ratio(x.engine, x.batch_size):6.2f}x"
        )
    diffs = ", ".join(f"{k} {v:.2g}" for k, v in notes["max_abs_logit_diff"].items())
    lines.append(f"max |Δlogit| vs PyTorch: {diffs}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m textserve.export.bench", description=__doc__)
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", nargs="?", help="a training run")
    parser.add_argument(
        "--bert-shaped", action="store_true", help="the BERT-shaped classifier (no RUN_DIR)"
    )
    parser.add_argument("--repository", type=Path, help="take the graphs from this repository")
    parser.add_argument("--name", default="default", help="model name in --repository (default)")
    parser.add_argument("--batch-sizes", default="1,32", help="comma-separated (1,32)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per engine (1)")
    parser.add_argument(
        "--rounds", type=int, help="timed rounds; the median counts (9; --bert-shaped: 5)"
    )
    parser.add_argument("--min-seconds", type=float, default=0.3, help="per engine per round")
    parser.add_argument("--max-texts", type=int, help="use only the first N test texts")
    parser.add_argument("--texts", type=int, default=256, help="--bert-shaped: texts per pass")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    try:
        sizes = [int(s) for s in args.batch_sizes.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--batch-sizes must be integers, got {args.batch_sizes!r}")
    if (args.run_dir is None) == (not args.bert_shaped):
        parser.error("give RUN_DIR or --bert-shaped")
    args.rounds = args.rounds or (5 if args.bert_shaped else 9)
    if not sizes or min(sizes) < 1 or args.threads < 1 or args.rounds < 1 or args.texts < 4:
        parser.error("batch sizes, --threads and --rounds must be >= 1, --texts >= 4")
    run = _bert_main if args.bert_shaped else _run_main
    return run(args, sizes)


def _run_main(args: argparse.Namespace, sizes: list[int]) -> int:
    try:
        result = run_benchmark(
            args.run_dir,
            repository=args.repository,
            name=args.name,
            batch_sizes=sizes,
            threads=args.threads,
            rounds=args.rounds,
            min_seconds=args.min_seconds,
            max_texts=args.max_texts,
            progress=_say,
        )
    except ExportError as exc:
        print(f"textserve.export.bench: error: {exc}", file=sys.stderr)
        return 2
    print(format_report(result))
    if args.json:
        args.json.write_text(json.dumps(result.to_dict(), indent=2) + "\n", encoding="utf-8")
    return 0


def _bert_main(args: argparse.Namespace, sizes: list[int]) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result, notes = bert_benchmark(
            threads=args.threads,
            batch_sizes=sizes,
            n_texts=args.texts,
            rounds=args.rounds,
            min_seconds=args.min_seconds,
        )
    print(format_bert_report(result, notes))
    if args.json:
        data = {**asdict(result), "notes": notes}
        args.json.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
