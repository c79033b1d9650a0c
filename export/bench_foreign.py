"""The export bench for foreign graphs: a BERT-shaped Hugging Face classifier built here (4
layers, d=256, 4 heads, random weights) as PyTorch eager, the exported ONNX graph, onnxruntime's
transformer optimizer's graph and its dynamic int8, on the CPU.

    .venv/bin/python -m textserve.export.bench_foreign [--threads 1 --batch-sizes 1,32]

Batches are random token ids of 16-128 tokens (padded to the longest in each batch), the same
for every engine; engines take turns slice by slice and the median round counts, as in
export/bench.py. Figures only: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from textserve.export import transforms, validate
from textserve.export.bench import Measurement, Predict, _measure
from textserve.export.foreign_export import export_graph, optimize
from textserve.export.sources import Foreign

SHAPE = {
    "num_hidden_layers": 4,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "intermediate_size": 1024,
    "max_position_embeddings": 512,
    "vocab_size": 30522,
}
ENGINES = ("pytorch fp32", "onnxruntime fp32", "onnxruntime optimized", "onnxruntime int8")


@dataclass
class ForeignBench:
    threads: int
    n_texts: int
    model: dict[str, Any]
    measurements: list[Measurement]

    def ratio(self, engine: str, batch_size: int) -> float:
        get = {(m.engine, m.batch_size): m.texts_per_second for m in self.measurements}
        return get[(engine, batch_size)] / get[("pytorch fp32", batch_size)]


def bert_shaped(seed: int = 0, shape: dict[str, int] | None = None) -> Foreign:
    """The benchmarked model: BertForSequenceClassification with SHAPE (or `shape`), 2 labels."""
    shape = shape or SHAPE
    import transformers

    transformers.utils.logging.set_verbosity_error()
    from textserve.export.huggingface import _Logits

    torch.manual_seed(seed)
    settings: dict[str, Any] = {"num_labels": 2, "attn_implementation": "eager", **shape}
    config = transformers.BertConfig(**settings)
    model = transformers.BertForSequenceClassification(config).eval()
    return Foreign(
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


def batches(
    n_texts: int, batch_size: int, seed: int = 0, vocab: int = SHAPE["vocab_size"]
) -> list[validate.Batch]:
    """Random (ids, mask) batches of texts 16-128 tokens long, padded to each batch's longest."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(16, 129, size=n_texts)
    out = []
    for i in range(0, n_texts, batch_size):
        part = lengths[i : i + batch_size]
        t = int(part.max())
        mask = (np.arange(t)[None, :] < part[:, None]).astype(np.int64)
        ids = rng.integers(vocab // 30, vocab, size=mask.shape, dtype=np.int64) * mask
        out.append((ids, mask))
    return out


def run(
    *,
    threads: int = 1,
    batch_sizes: Sequence[int] = (1, 32),
    n_texts: int = 256,
    rounds: int = 5,
    min_seconds: float = 0.3,
    shape: dict[str, int] | None = None,
) -> tuple[ForeignBench, dict[str, Any]]:
    """Measure every engine at every batch size; `shape` replaces SHAPE (tests: a tiny one)."""
    torch.set_num_threads(threads)
    shape = shape or SHAPE
    foreign = bert_shaped(shape=shape)
    notes: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="textserve-bench-bert-") as tmp:
        raw, fused, int8 = (Path(tmp) / f"{n}.onnx" for n in ("fp32", "optimized", "int8"))
        export_graph(foreign, raw, opset=18)
        notes["optimizer"] = optimize(raw, fused, "bert", foreign.shape)
        notes["int8"] = transforms.quantize_int8(fused, int8)
        engines: dict[str, Predict] = {"pytorch fp32": _torch(foreign.model)}
        for name, path in zip(ENGINES[1:], (raw, fused, int8), strict=True):
            engines[name] = _ort(validate.make_session(path, threads=threads))
        parity = _parity(engines, batches(64, 8, seed=2, vocab=shape["vocab_size"]))
        measured: list[Measurement] = []
        for b in batch_sizes:
            data = batches(n_texts if b > 1 else n_texts // 4, b, vocab=shape["vocab_size"])
            labels = [0] * sum(len(ids) for ids, _ in data)  # random weights: speed only
            measured += _measure(engines, data, labels, b, rounds, min_seconds, _say)
    params = sum(p.numel() for p in foreign.model.parameters())
    model = {**shape, "parameters": params, "lengths": "16-128 tokens"}
    return ForeignBench(threads, n_texts, model, measured), {**notes, "max_abs_logit_diff": parity}


def _parity(engines: dict[str, Predict], data: list[validate.Batch]) -> dict[str, float]:
    """max |Δlogit| of each ONNX engine against PyTorch on the same batches."""
    ref = [engines["pytorch fp32"](ids, mask) for ids, mask in data]
    return {
        name: float(
            max(
                np.abs(engines[name](ids, mask) - r).max()
                for (ids, mask), r in zip(data, ref, strict=True)
            )
        )
        for name in ENGINES[1:]
    }


def _torch(model: torch.nn.Module) -> Predict:
    def predict(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            out = model(
                input_ids=torch.from_numpy(ids),
                attention_mask=torch.from_numpy(mask),
                token_type_ids=torch.zeros_like(torch.from_numpy(ids)),
            )
        return np.asarray(out.numpy())

    return predict


def _ort(session: Any) -> Predict:
    def predict(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        return np.asarray(session.run(["logits"], feed)[0])

    return predict


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def format_report(result: ForeignBench, notes: dict[str, Any]) -> str:
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
    parser = argparse.ArgumentParser(
        prog="python -m textserve.export.bench_foreign", description=__doc__
    )
    parser.add_argument("--batch-sizes", default="1,32", help="comma-separated (1,32)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per engine (1)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds; the median counts")
    parser.add_argument("--texts", type=int, default=256, help="texts per pass (256)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    try:
        sizes = [int(s) for s in args.batch_sizes.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--batch-sizes must be integers, got {args.batch_sizes!r}")
    if not sizes or min(sizes) < 1 or args.threads < 1 or args.rounds < 1 or args.texts < 4:
        parser.error("batch sizes, --threads and --rounds must be >= 1, --texts >= 4")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result, notes = run(
            threads=args.threads, batch_sizes=sizes, n_texts=args.texts, rounds=args.rounds
        )
    print(format_report(result, notes))
    if args.json:
        data = {**asdict(result), "notes": notes}
        args.json.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
