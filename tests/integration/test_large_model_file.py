"""Loading a version with a large model.onnx costs no second copy of it: the check hashes the
file while streaming it and onnxruntime reads it once from the verified descriptor. Peak RSS
is read from /proc (VmHWM, reset first) in a fresh process around one load."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.handmade import make_version
from tests.serving import ROOT

SIZE = 200 * 2**20  # big enough that a copy shows above the interpreter's own noise

# One load through the repository's loader in a fresh interpreter: prints the peak RSS above
# what the process had before (MiB) and how the version was refused.
MEASURE = """
import json, sys
from pathlib import Path
import onnxruntime, tokenizers  # imported before the baseline: their own memory is not the load's
from textserve.service.config import RuntimeConfig, ServerConfig
from textserve.service.repository.loader import LoadError, load_version_dir

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024

config = ServerConfig(repository=Path(sys.argv[1]).parent.parent,
                      runtime=RuntimeConfig(device="cpu", intra_op_threads=1))
open("/proc/self/clear_refs", "w").write("5")  # resets VmHWM to the current RSS
base = status("VmRSS")
try:
    load_version_dir(Path(sys.argv[1]), config, metrics=None)
    refused = None
except LoadError as exc:
    refused = exc.reason
print(json.dumps({"peak_mib": status("VmHWM") - base, "refused": refused}))
"""


def big_version(root: Path, content: str) -> Path:
    """models/big/1 from a hand-made version, its model.onnx replaced by SIZE bytes (zeros:
    not a graph; or a real graph with a SIZE-byte initializer) with the manifest's sha256."""
    version = make_version(root, "big", 1)
    model = version / "model.onnx"
    if content == "zeros":
        with model.open("wb") as f:
            f.truncate(SIZE)
    else:
        onnx = pytest.importorskip("onnx")
        import numpy as np
        from onnx import TensorProto, helper, numpy_helper

        weights = np.ones((SIZE // 4000, 1000), dtype=np.float32)
        graph = helper.make_graph(
            [helper.make_node("Gather", ["W", "input_ids"], ["logits"])], "big",
            [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [None])],
            [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [None, 1000])],
            [numpy_helper.from_array(weights, "W")],
        )  # fmt: skip
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    digest = hashlib.sha256()
    with model.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    manifest = json.loads((version / "manifest.json").read_text())
    manifest["sha256"]["model.onnx"] = digest.hexdigest()
    (version / "manifest.json").write_text(json.dumps(manifest))
    return version


def measure(version: Path) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(version)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_large_file_that_is_no_graph_is_refused_without_being_held_in_memory(
    tmp_path: Path,
) -> None:
    version = big_version(tmp_path / "models", "zeros")
    result = measure(version)
    size_mib = SIZE / 2**20
    print(f"\n{size_mib:.0f} MiB model.onnx (zeros, true sha256): {result}")
    assert result["refused"] == "session_error"
    assert float(result["peak_mib"]) <= 1.2 * size_mib, result  # it was 2x and more


def test_a_large_graph_is_loaded_with_one_copy_of_its_weights(tmp_path: Path) -> None:
    version = big_version(tmp_path / "models", "graph")
    result = measure(version)
    size = (version / "model.onnx").stat().st_size / 2**20
    print(f"\n{size:.0f} MiB model.onnx (a graph): {result}")
    assert result["refused"] == "contract_mismatch"  # a Gather, not the classifier contract
    # onnxruntime's own parse (~1x) and the session's weights (~1x): nothing of the check's.
    # From bytes it was ~3x (the bytes, pybind's copy to a string, the parse).
    assert float(result["peak_mib"]) <= (1.2 + 1.0) * size, result
