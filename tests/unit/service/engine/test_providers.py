"""Unit tests of the GPU path as far as a CPU machine can take it: the CUDA provider's options
from flags and TEXTSERVE_* variables (validated: one line, exit 2), the device's batching
defaults, runs through an IOBinding with CPU OrtValues, and where a version says it runs.
The CUDA runs themselves are in the GPU-marked tests, skipped where onnxruntime has no CUDA."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from tests.handmade import make_version
from textserve.artifact import MODEL_FILE
from textserve.cli import main
from textserve.service import cli as serve_cli
from textserve.service.config import (
    BatcherConfig,
    ConfigError,
    CudaConfig,
    RuntimeConfig,
    ServerConfig,
    batcher_defaults,
    parse_bytes,
)
from textserve.service.engine.runtime import CUDA, Session, available_providers
from textserve.service.metrics import Metrics
from textserve.service.repository.loader import load_version_dir

requires_cuda = pytest.mark.skipif(
    CUDA not in available_providers(), reason="onnxruntime offers no CUDA execution provider"
)


def serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_cuda_options_come_from_flags_and_reach_onnxruntime_by_its_names() -> None:
    flags = ["--cuda-device-id", "1", "--cuda-memory-limit", "8GiB"]
    flags += ["--cuda-arena-strategy", "next-power-of-two", "--cudnn-conv-algo-search", "heuristic"]
    config = serve_cli.build_config(serve_args(*flags)).runtime.cuda
    assert config == CudaConfig(1, 8 * 2**30, "next-power-of-two", "heuristic")
    assert config.provider_options() == {
        "device_id": "1",
        "gpu_mem_limit": str(8 * 2**30),
        "arena_extend_strategy": "kNextPowerOfTwo",
        "cudnn_conv_algo_search": "HEURISTIC",
    }
    # the defaults: GPU 0, no limit, an arena that grows by what is asked, no cuDNN search
    assert CudaConfig().provider_options() == {
        "device_id": "0",
        "arena_extend_strategy": "kSameAsRequested",
        "cudnn_conv_algo_search": "DEFAULT",
    }


def test_cuda_options_fall_back_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEXTSERVE_CUDA_DEVICE_ID", "2")
    monkeypatch.setenv("TEXTSERVE_CUDA_MEMORY_LIMIT", "512MiB")
    monkeypatch.setenv("TEXTSERVE_IO_BINDING", "on")
    runtime = serve_cli.build_config(serve_args()).runtime
    assert (runtime.cuda.device_id, runtime.cuda.memory_limit) == (2, 512 * 2**20)
    assert runtime.io_binding == "on"


@pytest.mark.parametrize(
    ("env", "value", "message"),
    [
        (
            "TEXTSERVE_CUDA_MEMORY_LIMIT",
            "8XB",
            "TEXTSERVE_CUDA_MEMORY_LIMIT='8XB': expected a size",
        ),
        ("TEXTSERVE_CUDA_ARENA_STRATEGY", "greedy", "TEXTSERVE_CUDA_ARENA_STRATEGY='greedy'"),
        ("TEXTSERVE_CUDA_DEVICE_ID", "-1", "--cuda-device-id must be 0 or more, got -1"),
        ("TEXTSERVE_IO_BINDING", "maybe", "TEXTSERVE_IO_BINDING='maybe'"),
    ],
)
def test_a_bad_value_is_one_line_and_exit_2(
    env: str,
    value: str,
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(env, value)
    assert main(["serve", "--repository", "nowhere", "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_config_refuses_what_onnxruntime_would_misread() -> None:
    with pytest.raises(ConfigError, match="--cuda-memory-limit must be 0"):
        CudaConfig(memory_limit=-1)
    with pytest.raises(ConfigError, match="--cudnn-conv-algo-search must be one of"):
        CudaConfig(conv_algo_search="fast")
    with pytest.raises(ConfigError, match="--io-binding must be one of auto, on, off"):
        RuntimeConfig(io_binding="yes")
    assert [parse_bytes(v) for v in ("0", "1048576", "2GB", "1.5KiB", " 3 mib ")] == [
        0, 2**20, 2 * 10**9, 1536, 3 * 2**20,
    ]  # fmt: skip
    for bad in ("", "-1GiB", "GiB", "1 PB", "nan", "inf"):
        with pytest.raises(ValueError, match="expected a size"):
            parse_bytes(bad)


def test_batching_defaults_follow_the_device_and_flags_win() -> None:
    cpu, gpu = batcher_defaults(cuda=False), batcher_defaults(cuda=True)
    assert cpu == BatcherConfig()
    assert (gpu.max_batch_size, gpu.max_batch_tokens) == (512, 65536)
    on_cpu = serve_cli.build_config(serve_args("--device", "cpu")).batcher
    on_cuda = serve_cli.build_config(serve_args("--device", "cuda")).batcher
    assert (on_cpu.max_batch_size, on_cpu.max_batch_tokens) == (64, 8192)
    assert (on_cuda.max_batch_size, on_cuda.max_batch_tokens) == (512, 65536)
    auto = serve_cli.build_config(serve_args()).batcher  # auto: what this onnxruntime offers
    assert auto == (gpu if CUDA in available_providers() else cpu)
    given = serve_cli.build_config(serve_args("--device", "cuda", "--max-batch-size", "7")).batcher
    assert (given.max_batch_size, given.max_batch_tokens) == (7, 65536)


def test_runs_through_an_io_binding_give_the_same_logits(tmp_path: Path) -> None:
    path = make_version(tmp_path, "m", 1, max_length=8) / MODEL_FILE
    plain = Session(path, RuntimeConfig(device="cpu", intra_op_threads=1))
    bound = Session(path, RuntimeConfig(device="cpu", intra_op_threads=1, io_binding="on"))
    assert (plain.io_binding, bound.io_binding) == (False, True)  # auto: off on CPU
    rng = np.random.default_rng(0)
    ids = rng.integers(2, 12, size=(5, 7)).astype(np.int64)
    mask = (np.arange(7) < rng.integers(1, 8, size=5)[:, None]).astype(np.int64)
    # a non-contiguous slice, as the runner passes sub-batches: bound as its own copy
    for feeds in ((ids, mask), (ids[:, :4], mask[:, :4])):
        got, want = bound.run(*feeds), plain.run(*feeds)
        assert got.dtype == np.float32 and got.shape == (5, 2)
        np.testing.assert_array_equal(got, want)
    assert bound.provider_options == {}  # no CUDA: none of its options


def test_an_io_binding_feeds_token_type_ids_to_a_graph_that_takes_them(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    from tests.handmade import make_onnx

    model = make_onnx(12, 2)
    model.graph.input.append(
        helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, ["batch", "sequence"])
    )
    # logits + the number of type-1 tokens: the types must reach the graph to be seen
    model.graph.node[-1].output[0] = "mean"
    model.graph.node.extend(
        [
            helper.make_node("Cast", ["token_type_ids"], ["typesf"], to=TensorProto.FLOAT),
            helper.make_node("ReduceSum", ["typesf", "axis1"], ["ones"], keepdims=1),
            helper.make_node("Add", ["mean", "ones"], ["logits"]),
        ]
    )
    path = tmp_path / "typed.onnx"
    onnx.save(model, str(path))
    inputs = ("input_ids", "attention_mask", "token_type_ids")
    plain = Session(path, RuntimeConfig(device="cpu", intra_op_threads=1), inputs=inputs)
    bound = Session(
        path, RuntimeConfig(device="cpu", intra_op_threads=1, io_binding="on"), inputs=inputs
    )
    ids = np.arange(2, 10, dtype=np.int64).reshape(2, 4)
    types = np.array([[0, 0, 1, 1], [0, 1, 1, 1]], dtype=np.int64)
    typed = bound.run(ids, np.ones_like(ids), types)
    np.testing.assert_array_equal(typed, plain.run(ids, np.ones_like(ids), types))
    untyped = bound.run(ids, np.ones_like(ids))  # zeros: a single text's types
    np.testing.assert_allclose(typed - untyped, [[2, 2], [3, 3]], atol=1e-6)
    np.testing.assert_array_equal(
        bound.run(ids, np.ones_like(ids)), plain.run(ids, np.ones_like(ids))
    )


def test_a_version_says_where_it_runs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = make_version(tmp_path, "m", 1, max_length=8)
    config = ServerConfig(
        repository=tmp_path, metrics_port=None, runtime=RuntimeConfig(device="cpu")
    )
    with caplog.at_level(logging.INFO, "textserve.service.engine.handle"):
        handle = load_version_dir(path, config, metrics=Metrics(CollectorRegistry()))
    assert (handle.provider, handle.precision) == ("CPUExecutionProvider", "fp32")
    assert "model m version 1 runs on CPUExecutionProvider, fp32 weights, I/O binding off" in (
        caplog.text
    )


def test_model_info_has_the_precision() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.set_model_info("m", 3, "CUDAExecutionProvider", "fp16")
    labels = {"model": "m", "version": "3", "provider": "CUDAExecutionProvider"}
    get = metrics.registry.get_sample_value
    assert get("textserve_model_info", {**labels, "precision": "fp16"}) == 1
    metrics.set_model_info("m", 3, "CUDAExecutionProvider", "fp32")  # same version re-exported
    assert get("textserve_model_info", {**labels, "precision": "fp16"}) is None
    assert get("textserve_model_info", {**labels, "precision": "fp32"}) == 1


@pytest.mark.gpu
@requires_cuda
def test_a_cuda_session_gets_its_options_and_matches_the_cpu(tmp_path: Path) -> None:
    path = make_version(tmp_path, "m", 1, max_length=8) / MODEL_FILE
    cuda = Session(path, RuntimeConfig(device="cuda", cuda=CudaConfig(memory_limit=2**30)))
    cpu = Session(path, RuntimeConfig(device="cpu", intra_op_threads=1))
    assert cuda.provider == CUDA and cuda.io_binding
    assert cuda.provider_options["gpu_mem_limit"] == str(2**30)
    ids = np.arange(2, 10, dtype=np.int64).reshape(2, 4)
    np.testing.assert_allclose(cuda.run(ids, np.ones_like(ids)), cpu.run(ids, np.ones_like(ids)),
                               atol=1e-5)  # fmt: skip
