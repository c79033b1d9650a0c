"""One export pipeline: our own training run and a Hugging Face folder are two sources of one
`export_source`, through the same check functions, the same optimizer gate, the same int8 rule
and the same manifest build (export/pipeline.py). Switching one check off, or making it fail,
does so for every source at once."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

from tests import foreign
from textserve import cli
from textserve.artifact import Manifest
from textserve.export import checks, gates, pipeline
from textserve.export.errors import CheckFailed
from textserve.export.sources import ExportSource, HuggingFaceSource, RunSource

# The steps every source must pass through, by module: the checks, the gates, the manifest.
STEPS = {
    checks: ("check_model", "assert_parity", "compare_on_texts", "check_agreement",
             "check_accuracy_drop"),
    gates: ("checked", "optimized", "measured_speedup", "int8", "accuracy_held"),
    pipeline: ("build", "manifest"),
}  # fmt: skip
# Only a Hugging Face folder has transformers' own tokenizer and pipeline to compare with.
TRANSFORMERS_CHECKS = ("tokenization_parity", "served_parity")


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return foreign.build("bert", tmp_path_factory.mktemp("hf") / "bert", num_labels=2)


@pytest.fixture
def test_data(tmp_path: Path) -> Path:
    """A labelled split for the Hugging Face folder, so both sources have one to score."""
    texts = [t for t in checks.CHECK_TEXTS if t.strip()]
    path = tmp_path / "test.jsonl"
    rows = [{"text": t, "label": f"LABEL_{i % 2}"} for i, t in enumerate(texts)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def spy(monkeypatch: pytest.MonkeyPatch, names: dict[Any, tuple[str, ...]]) -> list[str]:
    """Every call of the named module functions, in order, by name."""
    calls: list[str] = []

    def wrap(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return real(*args, **kwargs)

        return recorded

    for module, functions in names.items():
        for name in functions:
            monkeypatch.setattr(module, name, wrap(name, getattr(module, name)))
    return calls


def test_a_failing_parity_check_fails_both_sources_through_the_cli(
    tiny_run: Path,
    bert: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """There is one graph parity check: making it fail fails a run's export and a Hugging Face
    folder's alike, exit 1, nothing published; both went through export_source."""
    sources: list[ExportSource] = []
    real_export = pipeline.export_source

    def export_source(source: ExportSource, *args: Any, **kwargs: Any) -> Path:
        sources.append(source)
        return real_export(source, *args, **kwargs)

    def parity(*args: Any, label: str = "fp32", **kwargs: Any) -> Any:
        raise CheckFailed(f"parity ({label})", "the one parity check, made to fail")

    monkeypatch.setattr(pipeline, "export_source", export_source)
    monkeypatch.setattr(checks, "assert_parity", parity)
    repository = tmp_path / "models"
    for name, folder in (("run", tiny_run), ("bert", bert)):
        argv = ["export", str(folder), "--repository", str(repository), "--name", name]
        assert cli.main([*argv, "--threads", "1"]) == 1
        err = capsys.readouterr().err
        assert "parity (fp32) check failed: the one parity check, made to fail" in err, err
        assert "nothing was published" in err
        assert list((repository / name).iterdir()) == []
    assert [type(s).__name__ for s in sources] == ["PathSource", "PathSource"]


def test_a_run_and_a_folder_take_the_same_steps_gates_and_manifest_build(
    tiny_run: Path,
    bert: Path,
    test_data: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both sources, int8 asked: the same checks, the optimizer's gate (made to refuse here:
    the exporter's graph is published for both), int8's accuracy rule on each one's test split,
    and manifests of one build."""
    monkeypatch.setattr(gates, "MIN_SPEEDUP", float("inf"))  # no optimizer's graph is kept
    calls = spy(monkeypatch, {**STEPS, checks: (*STEPS[checks], *TRANSFORMERS_CHECKS)})
    sources: dict[str, tuple[ExportSource, dict[str, Any]]] = {
        "run": (RunSource(tiny_run), {}),
        "bert": (HuggingFaceSource(bert), {"test_data": test_data, "max_accuracy_drop": 100.0}),
    }
    taken: dict[str, set[str]] = {}
    manifests: dict[str, Manifest] = {}
    for name, (source, options) in sources.items():
        calls.clear()
        version_dir = pipeline.export_source(
            source, tmp_path, name, quantize="int8", threads=1, **options
        )
        taken[name] = set(calls)
        manifests[name] = Manifest.read(version_dir)
        manifests[name].verify_files(version_dir)
    every_step = {name for functions in STEPS.values() for name in functions}
    assert every_step <= taken["run"] and every_step <= taken["bert"]
    assert taken["bert"] - taken["run"] == set(TRANSFORMERS_CHECKS)  # and nothing else differs
    run, hf = manifests["run"], manifests["bert"]
    for manifest in (run, hf):
        optimization = manifest.extra["optimization"]
        assert optimization["kept"] is False and optimization["speedup"] > 0
        assert manifest.precision == "int8" and manifest.test_accuracy is not None
        assert manifest.extra["quantization"]["int8_test_accuracy"] == manifest.test_accuracy
        assert "tolerance" not in manifest.parity  # int8's check is accuracy, for both
    assert set(run.extra["quantization"]) == set(hf.extra["quantization"])
    assert set(run.extra["optimization"]) <= set(hf.extra["optimization"]) | {
        "onnxruntime_offline_level"  # the run's graph is optimized at onnxruntime's level
    }
    assert run.extra["quantization"]["checked_on"] == "the run's test split"
    assert hf.extra["quantization"]["checked_on"] == "--test-data"
    assert set(hf.parity) - set(run.parity) == {
        "tokenization_texts", "tokenization_pairs",
        "served_max_abs_score_diff", "served_pairs_max_abs_score_diff",
    }  # fmt: skip
    assert (run.source.kind, hf.source.kind) == ("textserve", "huggingface")
