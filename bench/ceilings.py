"""Ceilings measured next to the server, on the same texts: in-process onnxruntime (through
textserve.service.engine.runtime, so with the server's session settings) and PyTorch eager.

    onnxruntime_ceiling(Path("models/default/1"), texts, batch_size=32, intra_op_threads=0)
    torch_ceiling(Path("runs/default"), texts, batch_size=32, threads=2)   # needs textserve[train]

Both tokenize and run in batches of `batch_size`, in the order the texts come (as a caller of
a library would), timing wall clock and this process's CPU (time.process_time, every thread).
torch is imported only inside torch_ceiling and only when installed: serving never needs it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from textserve.artifact import MODEL_FILE, TOKENIZER_FILE, Manifest, sha256_file
from textserve.service.config import RuntimeConfig
from textserve.service.engine.subbatches import softmax
from textserve.tokenization import Tokenization, load_tokenizer


def _measure(
    texts: Sequence[str],
    batch_size: int,
    tokenization: Tokenization,
    infer: Callable[[np.ndarray, np.ndarray], np.ndarray],
    min_seconds: float,
    min_texts: int,
) -> dict[str, Any]:
    """Run batches (warm-up first) until both minimums are met; figures per text."""
    if batch_size < 1 or not texts:
        raise ValueError("a ceiling needs texts and a batch size of at least 1")
    batches = [list(texts[i : i + batch_size]) for i in range(0, len(texts), batch_size)]
    batches = [b for b in batches if len(b) == batch_size] or batches  # full batches only
    for batch in batches[:3]:
        infer(*tokenization.batch(batch))
    n_texts = 0
    tokens = padded = 0
    tokenize_wall = 0.0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    i = 0
    while True:
        batch = batches[i % len(batches)]
        i += 1
        t = time.perf_counter()
        ids, mask = tokenization.batch(batch)
        tokenize_wall += time.perf_counter() - t
        softmax(infer(ids, mask))
        n_texts += len(batch)
        tokens += int(mask.sum())
        padded += mask.size
        wall = time.perf_counter() - wall0
        if wall >= min_seconds and n_texts >= min_texts:
            break
    cpu = time.process_time() - cpu0
    return {
        "batch_size": batch_size,
        "texts": n_texts,
        "seconds": wall,
        "texts_per_s": n_texts / wall,
        "cpu_seconds": cpu,
        "cpu_per_text_ms": cpu / n_texts * 1e3,
        "wall_per_text_ms": wall / n_texts * 1e3,
        "tokenize_share": tokenize_wall / wall,
        "padding_ratio": 1 - tokens / padded if padded else 0.0,
    }


def onnxruntime_ceiling(
    version_dir: Path,
    texts: Sequence[str],
    batch_size: int,
    *,
    intra_op_threads: int = 0,
    min_seconds: float = 1.5,
    min_texts: int = 256,
    order: str = "arrival",
) -> dict[str, Any]:
    """Tokenize + onnxruntime + softmax in this process, with the server's session options.

    order "arrival": batches of the texts as they come (what a library caller does); "length":
    batches of texts sorted by token count (least padding: the best case)."""
    from textserve.service.engine.runtime import Session

    manifest = Manifest.read(version_dir)
    # the server's defaults: its device choice and thread count resolve the same way here
    config = RuntimeConfig(intra_op_threads=intra_op_threads)
    session = Session(version_dir / MODEL_FILE, config, inputs=manifest.inputs)
    tokenizer = load_tokenizer(version_dir / TOKENIZER_FILE)
    tokenization = Tokenization.for_manifest(tokenizer, manifest)
    if order == "length":
        lengths = [len(ids) for ids in tokenization.encode(texts)]
        texts = [texts[i] for i in sorted(range(len(texts)), key=lengths.__getitem__)]
    elif order != "arrival":
        raise ValueError(f"order must be 'arrival' or 'length', got {order!r}")
    result = _measure(
        texts,
        batch_size,
        tokenization,
        session.run,
        min_seconds,
        min_texts,
    )
    result.update(
        threads=config.resolved_intra_op_threads(), provider=session.provider, order=order
    )
    return result


def torch_ceiling(
    run_dir: Path | None,
    version_dir: Path,
    texts: Sequence[str],
    batch_size: int,
    *,
    threads: int,
    min_seconds: float = 1.5,
    min_texts: int = 256,
) -> dict[str, Any]:
    """The trained model in PyTorch eager mode (inference_mode, `threads` torch threads), or
    {"skipped": why} when torch or the run directory is not there."""
    try:
        import torch
    except ImportError:
        return {"skipped": "PyTorch is not installed (pip install 'textserve[train]')"}
    if run_dir is None or not (run_dir / "model.safetensors").is_file():
        return {"skipped": f"no training run at {run_dir} (pass --run-dir)"}
    from textserve.model.checkpoint import load_run

    run = load_run(run_dir)
    note = None
    if sha256_file(run.weights_path) != Manifest.read(version_dir).source_checkpoint_sha256:
        # same shape is what matters for speed; say so rather than refuse
        note = f"{run_dir} is not the checkpoint {version_dir} was exported from"
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    model = run.model.eval()

    def infer(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return model(torch.from_numpy(ids), torch.from_numpy(mask)).float().numpy()

    try:
        result = _measure(
            texts,
            batch_size,
            Tokenization(run.tokenizer, run.config.max_length, run.pad_token_id),
            infer,
            min_seconds,
            min_texts,
        )
    finally:
        torch.set_num_threads(previous)
    result.update(threads=threads, torch_version=torch.__version__)
    if note:
        result["note"] = note
    return result
