"""export_run (the one pipeline, a run as its source) end to end on the real tiny run: published
files, checks, atomicity, bad input."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

from tests.unprivileged import export_unprivileged, shared_dir, unprivileged_ids  # noqa: E402
from textserve.artifact import MODEL_FILE, TOKENIZER_FILE, Manifest, sha256_file  # noqa: E402
from textserve.export import checks, gates, pipeline  # noqa: E402
from textserve.export.errors import CheckFailed, ExportError  # noqa: E402
from textserve.model.checkpoint import load_run  # noqa: E402
from textserve.tokenization import encode_batch, load_tokenizer  # noqa: E402


def entries(model_dir: Path) -> list[str]:
    return sorted(p.name for p in model_dir.iterdir()) if model_dir.exists() else []


def test_tiny_repository_holds_a_complete_checked_version(
    tiny_repository: Path, tiny_run: Path
) -> None:
    version_dir = tiny_repository / "tiny" / "1"
    assert entries(tiny_repository / "tiny") == ["1"]  # no temp dir left behind
    assert entries(version_dir) == ["manifest.json", MODEL_FILE, TOKENIZER_FILE]
    manifest = Manifest.read(version_dir)
    manifest.verify_files(version_dir)
    # the checksums are those of the files, computed independently here
    assert manifest.sha256[MODEL_FILE] == sha256_file(version_dir / MODEL_FILE)
    assert manifest.sha256[TOKENIZER_FILE] == sha256_file(version_dir / TOKENIZER_FILE)
    assert manifest.source_checkpoint_sha256 == sha256_file(tiny_run / "model.safetensors")
    assert (version_dir / TOKENIZER_FILE).read_bytes() == (tiny_run / "tokenizer.json").read_bytes()
    assert (manifest.name, manifest.version, manifest.precision) == ("tiny", 1, "fp32")
    assert manifest.labels == json.loads((tiny_run / "labels.json").read_text())
    assert manifest.opset >= 17 and manifest.max_length == 64 and manifest.pad_token_id == 0
    assert manifest.parity["max_abs_logit_diff"] <= 1e-4
    assert manifest.parity["argmax_agreement"] == 1.0
    assert manifest.extra["optimization"]["onnxruntime_offline_level"] == "basic"
    assert manifest.extra["graph_form"] == "padding-free"


def test_graph_contract_with_dynamic_axes(tiny_repository: Path) -> None:
    model = onnx.load(str(tiny_repository / "tiny" / "1" / MODEL_FILE))
    io = {v.name: v.type.tensor_type for v in [*model.graph.input, *model.graph.output]}
    assert list(io) == ["input_ids", "attention_mask", "logits"]
    assert io["input_ids"].elem_type == io["attention_mask"].elem_type == onnx.TensorProto.INT64
    assert io["logits"].elem_type == onnx.TensorProto.FLOAT
    dims = {name: [d.dim_param or d.dim_value for d in t.shape.dim] for name, t in io.items()}
    assert dims["input_ids"] == dims["attention_mask"] == ["batch_size", "sequence_length"]
    assert dims["logits"] == ["batch_size", 3]


def test_published_graph_matches_pytorch_at_other_shapes(
    tiny_repository: Path, tiny_run: Path
) -> None:
    run = load_run(tiny_run)
    feeds = checks.parity_feeds(run.max_length, run.config.vocab_size, seed=123)
    path = tiny_repository / "tiny" / "1" / MODEL_FILE
    report = checks.assert_parity(path, run.model, feeds, rtol=0.0, atol=1e-4, threads=1)
    assert report.max_abs_logit_diff <= 1e-4 and report.cases == 12


def test_published_graph_matches_pytorch_on_any_mask(tiny_repository: Path, tiny_run: Path) -> None:
    # The server right-pads, but the graph contract allows any 0/1 mask: left padding, rows
    # with no real token, a whole batch of them (the padding-free graph packs real tokens).
    run = load_run(tiny_run)
    rng = np.random.default_rng(7)
    ids = rng.integers(1, run.config.vocab_size, size=(4, 12), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[0, :9] = 0  # left padding
    mask[1, 4:] = 0
    mask[2] = 0  # no real token: the model gives the head's bias
    ids[mask == 0] = run.pad_token_id
    pairs = [(ids, mask), (ids[2:3], mask[2:3]), (ids[:2, :1], np.zeros((2, 1), np.int64))]
    feeds = [{"input_ids": i, "attention_mask": m} for i, m in pairs]
    path = tiny_repository / "tiny" / "1" / MODEL_FILE
    report = checks.assert_parity(path, run.model, feeds, rtol=0.0, atol=1e-4, threads=1)
    assert report.rows == 7 and report.argmax_agreement == 1.0


def test_manifest_accuracy_is_what_the_server_would_measure(
    tiny_repository: Path, tiny_run: Path
) -> None:
    # Tokenize exactly as the contract says, run the published graph, count.
    version_dir = tiny_repository / "tiny" / "1"
    manifest = Manifest.read(version_dir)
    rows = [json.loads(line) for line in (tiny_run / "test.jsonl").read_text().splitlines()]
    tokenizer = load_tokenizer(version_dir / TOKENIZER_FILE)
    session = ort.InferenceSession(
        str(version_dir / MODEL_FILE), providers=["CPUExecutionProvider"]
    )
    ids, mask = encode_batch(tokenizer, [r["text"] for r in rows], manifest.max_length)
    (logits,) = session.run(None, {"input_ids": ids, "attention_mask": mask})
    predicted = [manifest.labels[i] for i in np.asarray(logits).argmax(axis=1)]
    accuracy = np.mean([p == r["label"] for p, r in zip(predicted, rows, strict=True)])
    assert manifest.test_accuracy == pytest.approx(accuracy)


def test_next_export_is_the_next_version(
    tiny_repository: Path, tiny_run: Path, tmp_path: Path
) -> None:
    repo = tmp_path / "models"
    shutil.copytree(tiny_repository, repo)
    version_dir = pipeline.export_run(
        tiny_run, repo, "tiny", threads=1, optimize=False, padding_free=False
    )
    assert version_dir == repo / "tiny" / "2"
    manifest = Manifest.read(version_dir)
    assert manifest.version == 2 and manifest.extra["optimization"] is None
    assert manifest.extra["graph_form"] == "dense"  # the model's own forward, checked as well
    ops = {n.op_type for n in onnx.load(str(version_dir / MODEL_FILE)).graph.node}
    assert "NonZero" not in ops
    assert entries(repo / "tiny") == ["1", "2"]


def test_int8_records_the_accuracy_change(tiny_run: Path, tmp_path: Path) -> None:
    version_dir = pipeline.export_run(tiny_run, tmp_path, "q", quantize="int8", threads=1)
    manifest = Manifest.read(version_dir)
    manifest.verify_files(version_dir)
    quant = manifest.extra["quantization"]
    assert manifest.precision == "int8"
    assert quant["int8_test_accuracy"] == manifest.test_accuracy
    expected = (quant["int8_test_accuracy"] - quant["fp32_test_accuracy"]) * 100
    assert quant["accuracy_delta_points"] == pytest.approx(expected, abs=1e-3)
    assert quant["max_accuracy_drop_points"] == 1.0
    ops = {n.op_type for n in onnx.load(str(version_dir / MODEL_FILE)).graph.node}
    assert "MatMulInteger" in ops or "DynamicQuantizeLinear" in ops


def _int8_hostile_run(tiny_run: Path, to: Path) -> Path:
    """tiny_run with fp32 logits unchanged but an activation int8 cannot carry: the last norm
    (post-norm: the last block's norm2) writes a constant 1e4 into channel 0, which the head
    ignores (weight 0). Dynamic
    quantization scales the head's input by its range, 1e4 / 255 per step, so every real
    feature (|x| ~ 1) rounds to nothing: the real int8 graph loses the model's accuracy."""
    from safetensors.torch import load_file, save_file

    run_dir = shutil.copytree(tiny_run, to)
    weights = load_file(str(run_dir / "model.safetensors"))
    last = max(int(key.split(".")[1]) for key in weights if key.startswith("blocks."))
    norm = "final_norm" if "final_norm.weight" in weights else f"blocks.{last}.norm2"
    weights[f"{norm}.weight"][0] = 0.0
    weights[f"{norm}.bias"][0] = 1e4
    weights["head.weight"][:, 0] = 0.0
    save_file(weights, str(run_dir / "model.safetensors"))
    return run_dir


def test_int8_is_refused_when_accuracy_drops_too_much(tiny_run: Path, tmp_path: Path) -> None:
    run_dir = _int8_hostile_run(tiny_run, tmp_path / "run")
    with pytest.raises(
        CheckFailed, match=r"int8 accuracy check failed: test accuracy drops"
    ) as info:
        pipeline.export_run(run_dir, tmp_path / "models", "q", quantize="int8", threads=1)
    assert info.value.figure is not None and info.value.figure > 1.0
    assert entries(tmp_path / "models" / "q") == []
    # the same run in fp32 passes every check: the drop is int8's alone
    pipeline.export_run(run_dir, tmp_path / "models", "q", threads=1)
    assert entries(tmp_path / "models" / "q") == ["1"]


def test_fp16_keeps_float32_logits_and_states_its_tolerance(tiny_run: Path, tmp_path: Path) -> None:
    version_dir = pipeline.export_run(tiny_run, tmp_path, "half", fp16=True, threads=1)
    manifest = Manifest.read(version_dir)
    assert manifest.precision == "fp16"
    assert manifest.parity["tolerance"] == gates.FP16_ATOL
    assert manifest.parity["max_abs_logit_diff"] <= gates.FP16_ATOL
    assert manifest.extra["fp16"]["rtol"] == gates.FP16_RTOL
    checks.check_model(version_dir / MODEL_FILE, num_labels=3)  # logits still float32
    weights = [i for i in onnx.load(str(version_dir / MODEL_FILE)).graph.initializer]
    assert any(w.data_type == onnx.TensorProto.FLOAT16 for w in weights)


def test_a_failed_parity_check_publishes_nothing(tiny_run: Path, tmp_path: Path) -> None:
    # No float32 graph matches PyTorch to 1e-12 everywhere: the check must fail, and say so.
    with pytest.raises(CheckFailed, match=r"parity \(fp32\) check failed: max \|Δlogit\|") as info:
        pipeline.export_run(tiny_run, tmp_path, "m", atol=1e-12, threads=1)
    assert info.value.figure is not None and info.value.figure > 1e-12
    assert entries(tmp_path / "m") == []


@pytest.mark.parametrize(
    ("target", "error"),
    [
        ("shutil.copyfile", OSError(errno.ENOSPC, "No space left on device")),
        ("textserve.export.transforms.optimize_offline", KeyboardInterrupt()),
        ("os.rename", OSError(errno.EIO, "Input/output error")),
    ],
)
def test_a_failure_mid_export_leaves_no_version(
    tiny_run: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    target: str,
    error: BaseException,
) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(target, fail)
    with pytest.raises((ExportError, KeyboardInterrupt)) as info:
        pipeline.export_run(tiny_run, tmp_path, "m", threads=1)
    if isinstance(error, OSError):
        assert error.strerror in str(info.value) and "nothing was published" in str(info.value)
    assert entries(tmp_path / "m") == []


def test_a_killed_export_leaves_no_version_and_the_next_one_cleans_up(
    tiny_run: Path, tmp_path: Path
) -> None:
    # A real crash: the exporting process is SIGKILLed halfway, so no cleanup code runs.
    code = f"""
import os, signal
from textserve.export import pipeline
from textserve.export import transforms
transforms.optimize_offline = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
pipeline.export_run({str(tiny_run)!r}, {str(tmp_path)!r}, "m", threads=1)
"""
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=240)
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()[-2000:]
    left = entries(tmp_path / "m")
    assert len(left) == 1 and left[0].startswith(".tmp-")  # a temp dir, never a version
    assert pipeline.export_run(tiny_run, tmp_path, "m", threads=1) == tmp_path / "m" / "1"
    assert entries(tmp_path / "m") == ["1"]


def test_incomplete_run_dir_names_the_missing_file(tiny_run: Path, tmp_path: Path) -> None:
    run_dir = shutil.copytree(tiny_run, tmp_path / "run")
    (run_dir / "tokenizer.json").unlink()
    with pytest.raises(ExportError, match=r"incomplete: missing tokenizer\.json"):
        pipeline.export_run(run_dir, tmp_path / "models", "m")
    assert entries(tmp_path / "models" / "m") == []


def test_weights_that_do_not_match_the_config_are_named(tiny_run: Path, tmp_path: Path) -> None:
    run_dir = shutil.copytree(tiny_run, tmp_path / "run")
    config = json.loads((run_dir / "config.json").read_text())
    config["model"]["d_ff"] *= 2
    (run_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ExportError, match=r"model\.safetensors does not match config\.json: .*ff"):
        pipeline.export_run(run_dir, tmp_path / "models", "m")


def test_unwritable_repository_is_a_clear_error(tiny_run: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "models"
    blocker.write_text("a file where the repository should be")
    with pytest.raises(ExportError, match=f"cannot write to the model repository {blocker}"):
        pipeline.export_run(tiny_run, blocker, "m")
    assert blocker.read_text() == "a file where the repository should be"


def test_read_only_repository_is_a_clear_error(tiny_run: Path) -> None:
    """Run as root too (CI): the export writes as `nobody` (tests/unprivileged.py), the
    owner of a model folder whose mode bits forbid writing."""
    with shared_dir() as shared:
        run_dir = shutil.copytree(tiny_run, shared / "run")
        repo = shared / "models"
        (repo / "m").mkdir(parents=True)
        for path in (repo, repo / "m"):
            os.chown(path, *unprivileged_ids())
        (repo / "m").chmod(0o555)
        try:
            message = export_unprivileged(run_dir, repo, "m")
        finally:
            (repo / "m").chmod(0o755)
        assert message == f"cannot write to the model repository {repo / 'm'}: Permission denied"
        assert entries(repo / "m") == []


def test_a_model_with_a_bag_of_ngrams_exports_and_matches_pytorch(tmp_path: Path) -> None:
    # The default preset's bag (hashed bigrams, per-token character tables) lives in the
    # graph: the export's parity checks pass, the graph matches PyTorch on any mask, and the
    # manifest's accuracy is the run's own.
    from textserve.model.synthetic import synthetic_rows, write_jsonl
    from textserve.model.train import TrainConfig, train

    data = write_jsonl(synthetic_rows(300, seed=2), tmp_path / "d.jsonl")
    cfg = TrainConfig(
        data=data, preset="tiny", model_overrides={"bag_buckets": 4096, "encoder_weight": 0.75},
        epochs=2, batch_size=16, seed=0, device="cpu", threads=1,
        output_dir=tmp_path / "run", progress=False,
    )  # fmt: skip
    run_dir = train(cfg)
    pipeline.export_run(run_dir, tmp_path / "models", "bag", threads=1)
    version_dir = tmp_path / "models" / "bag" / "1"
    manifest = Manifest.read(version_dir)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert manifest.test_accuracy == pytest.approx(metrics["test_accuracy"])
    run = load_run(run_dir)
    assert run.model.bag_ngram.abs().sum() > 0  # a fitted bag, not the zeros it starts as
    rng = np.random.default_rng(3)
    ids = rng.integers(1, run.config.vocab_size, size=(4, 12), dtype=np.int64)
    ids[:, 6:] = ids[:, :6]  # repeated n-grams: the bag counts each once
    mask = np.ones_like(ids)
    mask[0, :9] = 0
    mask[1, 4:] = 0
    mask[2] = 0
    ids[mask == 0] = run.pad_token_id
    feed = {"input_ids": ids, "attention_mask": mask}
    report = checks.assert_parity(
        version_dir / MODEL_FILE, run.model, [feed], rtol=0.0, atol=1e-4, threads=1
    )
    assert report.argmax_agreement == 1.0
