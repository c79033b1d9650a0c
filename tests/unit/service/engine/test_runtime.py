"""Unit tests of execution-provider selection (fake provider lists) and the onnxruntime session."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.handmade import make_version
from textserve.artifact import MODEL_FILE
from textserve.onnx_contract import disabled_optimizers
from textserve.service.config import RuntimeConfig
from textserve.service.engine.runtime import (
    CPU,
    CUDA,
    DeviceUnavailableError,
    RuntimeLoadError,
    Session,
    check_granted,
    select_providers,
)

GPU_BUILD = ["TensorrtExecutionProvider", CUDA, CPU]
CPU_BUILD = ["AzureExecutionProvider", CPU]


@pytest.mark.parametrize(
    ("device", "available", "expected"),
    [
        ("auto", GPU_BUILD, [CUDA, CPU]),
        ("auto", CPU_BUILD, [CPU]),
        ("cpu", GPU_BUILD, [CPU]),
        ("cpu", CPU_BUILD, [CPU]),
        ("cuda", GPU_BUILD, [CUDA, CPU]),
    ],
)
def test_select_providers(device: str, available: list[str], expected: list[str]) -> None:
    assert select_providers(device, available) == expected


def test_skip_layer_norm_fusion_is_left_out_on_cpu_only() -> None:
    # Its CPU kernel is slower than the two ops it fuses; CUDA's is not.
    assert disabled_optimizers([CPU]) == ["SkipLayerNormFusion"]
    assert disabled_optimizers([CUDA, CPU]) == []


def test_cuda_without_cuda_is_a_clear_startup_error() -> None:
    with pytest.raises(DeviceUnavailableError, match=r"--device cuda: .*no CUDA"):
        select_providers("cuda", CPU_BUILD)


def test_unknown_device_is_refused() -> None:
    with pytest.raises(DeviceUnavailableError, match="unknown device 'tpu'"):
        select_providers("tpu", GPU_BUILD)


def test_cuda_that_fails_to_start_is_an_error_for_device_cuda() -> None:
    # onnxruntime offered CUDA but the session fell back to CPU (libraries missing)
    with pytest.raises(DeviceUnavailableError, match="could not start it"):
        check_granted("cuda", [CUDA, CPU], [CPU])


def test_cuda_that_fails_to_start_falls_back_loudly_for_auto(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert check_granted("auto", [CUDA, CPU], [CPU]) == CPU
    assert "running on CPU" in caplog.text


def test_granted_provider_is_reported() -> None:
    assert check_granted("auto", [CUDA, CPU], [CUDA, CPU]) == CUDA
    assert check_granted("cpu", [CPU], [CPU]) == CPU


def test_session_runs_the_contract(tmp_path: Path) -> None:
    version = make_version(tmp_path, labels=("a", "b", "c"))
    session = Session(version / MODEL_FILE, RuntimeConfig(device="cpu", intra_op_threads=1))
    assert session.provider == CPU
    ids = np.array([[2, 3, 0], [4, 0, 0]], dtype=np.int64)
    logits = session.run(ids, (ids > 0).astype(np.int64))
    assert logits.shape == (2, 3) and logits.dtype == np.float32
    assert session.warmup(max_length=8, max_batch_size=4).shape == (1, 3)


def test_session_refuses_a_graph_outside_the_contract(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "other",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "m.onnx"))
    with pytest.raises(RuntimeLoadError, match="the contract is inputs"):
        Session(tmp_path / "m.onnx", RuntimeConfig(device="cpu"))


def test_session_reports_an_unreadable_model(tmp_path: Path) -> None:
    (tmp_path / "m.onnx").write_bytes(b"not onnx")
    with pytest.raises(RuntimeLoadError, match="cannot load"):
        Session(tmp_path / "m.onnx", RuntimeConfig(device="cpu"))


def test_thread_defaults_do_not_oversubscribe() -> None:
    from textserve.service.config import usable_cpus

    config = RuntimeConfig()
    assert config.resolved_intra_op_threads() == max(1, usable_cpus() - 1)
    assert config.inter_op_threads == 1 and config.inference_threads == 1
    assert RuntimeConfig(intra_op_threads=3).resolved_intra_op_threads() == 3
