"""onnxruntime sessions: execution-provider choice and options, threads, I/O binding, warm-up.
The only serving module importing onnxruntime (session options: textserve/onnx_contract.py).

`--device auto` takes the CUDA execution provider when onnxruntime offers it and the CPU one
otherwise; `--device cuda` without CUDA is a startup error, never a silent fallback. After the
session exists we check which providers it really got, because onnxruntime itself falls back to
CPU (with a log line) when the CUDA libraries fail to load. The CUDA provider gets its options
from RuntimeConfig.cuda (device id, arena limit and growth, cuDNN search); runs go through an
IOBinding where RuntimeConfig.io_binding says so (with CUDA by default).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from textserve.artifact import INPUT_NAMES, OUTPUT_NAME
from textserve.onnx_contract import (
    TOKEN_TYPE_IDS,
    GraphContractError,
    check_graph,
    inference_session,
)
from textserve.service.config import RuntimeConfig

logger = logging.getLogger(__name__)

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"

_preload_lock = threading.Lock()
_preloaded = False


class RuntimeLoadError(RuntimeError):
    """A session could not be created (model file, graph contract)."""


class ContractError(RuntimeLoadError):
    """model.onnx loads but breaks the graph contract (input/output names, types, ranks)."""


class DeviceUnavailableError(RuntimeLoadError):
    """The device asked for is not there: a startup error for every model, not just one."""


def _onnxruntime(preload_cuda: bool) -> Any:
    """Import onnxruntime; before the first CUDA use, let it preload the CUDA/cuDNN libraries
    that pip installed as Python packages (onnxruntime.preload_dlls, onnxruntime >= 1.21)."""
    global _preloaded
    import onnxruntime

    if preload_cuda:
        with _preload_lock:
            if not _preloaded:
                _preloaded = True
                preload = getattr(onnxruntime, "preload_dlls", None)
                if preload is not None:
                    try:
                        preload()
                    except Exception as exc:  # a failed preload shows up as a missing provider
                        logger.warning("onnxruntime.preload_dlls() failed: %s", exc)
    return onnxruntime


def available_providers(device: str = "auto") -> list[str]:
    """The execution providers this onnxruntime build offers."""
    return list(_onnxruntime(preload_cuda=device != "cpu").get_available_providers())


def select_providers(device: str, available: Sequence[str]) -> list[str]:
    """The providers to ask for, best first: pure, so it is unit-tested without a GPU.

    >>> select_providers("auto", ["CUDAExecutionProvider", "CPUExecutionProvider"])
    ['CUDAExecutionProvider', 'CPUExecutionProvider']
    >>> select_providers("auto", ["CPUExecutionProvider"])
    ['CPUExecutionProvider']
    """
    if device == "cpu":
        return [CPU]
    if device == "cuda":
        if CUDA not in available:
            raise DeviceUnavailableError(
                "--device cuda: this onnxruntime offers no CUDA execution provider "
                f"(it offers {', '.join(available) or 'none'}). Install onnxruntime-gpu in place "
                "of onnxruntime (pip install 'textserve[gpu]') on a machine with an NVIDIA GPU, "
                "or run with --device auto or --device cpu."
            )
        return [CUDA, CPU]
    if device == "auto":
        return [CUDA, CPU] if CUDA in available else [CPU]
    raise DeviceUnavailableError(f"unknown device {device!r}; use auto, cpu or cuda")


def check_granted(device: str, requested: Sequence[str], granted: Sequence[str]) -> str:
    """The provider the session really runs on; an error if --device cuda did not get CUDA."""
    if requested[0] == CUDA and CUDA not in granted:
        message = (
            "onnxruntime offers the CUDA execution provider but could not start it (CUDA or cuDNN "
            "libraries missing or not matching this onnxruntime-gpu build; see its log above)"
        )
        if device == "cuda":
            raise DeviceUnavailableError(
                f"--device cuda: {message}. Fix the CUDA install or use --device cpu."
            )
        logger.warning("--device auto: %s; running on CPU", message)
    return granted[0] if granted else CPU


def check_contract(
    model_path: Path, session: Any, inputs: Sequence[str] = INPUT_NAMES, per_token: bool = False
) -> None:
    """ContractError unless the session's graph takes `inputs` as int64 (B, T) and gives logits
    as float32/float16 (B, num_labels), or a token classifier's (B, T, num_labels)
    (textserve.onnx_contract.check_graph)."""
    try:
        check_graph(session, inputs, per_token=per_token)
    except GraphContractError as exc:
        message = str(exc)
        # "<file> has inputs [...] and outputs [...]" or "<file>: input_ids is tensor(int32)..."
        joint = " has " if message.startswith("inputs ") else ": "
        raise ContractError(f"{model_path}{joint}{message}") from None


class Session:
    """One onnxruntime InferenceSession following the artifact contract:
    input_ids, attention_mask int64 (B, T) -> logits float32 (B, num_labels)."""

    def __init__(
        self,
        model: Path | bytes,
        config: RuntimeConfig,
        *,
        source: Path | None = None,
        inputs: Sequence[str] = INPUT_NAMES,
        per_token: bool = False,
    ) -> None:
        """`model`: model.onnx's path, or its bytes (the repository passes the bytes it
        verified, so no other file can be loaded in their place); `source` names them in
        messages; `inputs`: the graph's inputs as the manifest lists them; `per_token`: a
        token classifier's graph (logits per token)."""
        model_path = source or (Path("<model.onnx bytes>") if isinstance(model, bytes) else model)
        ort = _onnxruntime(preload_cuda=config.device != "cpu")
        requested = select_providers(config.device, ort.get_available_providers())
        # Only the CUDA provider has options of ours; the CPU provider's stay onnxruntime's.
        self.provider_options = config.cuda.provider_options() if CUDA in requested else {}
        try:
            self._session = inference_session(
                model if isinstance(model, bytes) else str(model),
                requested,
                intra_op_threads=config.resolved_intra_op_threads(),
                inter_op_threads=config.inter_op_threads or 1,
                provider_options={CUDA: self.provider_options} if self.provider_options else None,
            )
        except Exception as exc:
            raise RuntimeLoadError(f"onnxruntime cannot load {model_path}: {exc}") from exc
        self.provider = check_granted(config.device, requested, self._session.get_providers())
        self.providers = list(self._session.get_providers())
        check_contract(model_path, self._session, inputs, per_token)
        self._outputs = [OUTPUT_NAME]
        self.takes_token_type_ids = TOKEN_TYPE_IDS in inputs
        self._ort = ort
        self.io_binding = config.io_binding == "on" or (
            config.io_binding == "auto" and self.provider == CUDA
        )
        if self.provider != CUDA:
            self.provider_options = {}

    def close(self) -> None:
        """Release the onnxruntime session (weights, memory arena) now rather than whenever the
        garbage collector reaches the objects that refer to it; run() fails afterwards."""
        self._session = None

    def run(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        token_type_ids: np.ndarray | None = None,
    ) -> np.ndarray:
        """Logits as float32 (B, num_labels) (an fp16 model's output is widened).
        `token_type_ids` go to a graph that takes them (zeros when not given: a single text's
        type ids, as the probes and warm-up send); a graph without the input never sees them."""
        feeds = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self.takes_token_type_ids:
            feeds[TOKEN_TYPE_IDS] = (
                np.zeros_like(input_ids) if token_type_ids is None else token_type_ids
            )
        if self.io_binding:
            return self._run_bound(feeds)
        (logits,) = self._session.run(self._outputs, feeds)
        return np.asarray(logits, dtype=np.float32)

    def _run_bound(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """One run through an IOBinding: each feed as a host OrtValue over the array's own
        memory (no copy on our side), the logits bound to host memory, so that with CUDA the
        provider copies each input to the device once and writes the logits straight back."""
        binding = self._session.io_binding()
        for name, array in feeds.items():
            value = self._ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array))
            binding.bind_ortvalue_input(name, value)
        binding.bind_output(OUTPUT_NAME, "cpu")
        self._session.run_with_iobinding(binding)
        (logits,) = binding.copy_outputs_to_cpu()
        return np.asarray(logits, dtype=np.float32)

    def warmup(self, max_length: int, max_batch_size: int, token_id: int = 1) -> np.ndarray:
        """Run the shapes serving will meet first (one short text; a full batch; the longest
        text) so that allocations and kernel choices happen before SERVING. Returns the logits
        of the last run."""
        logits = np.empty((0, 0), np.float32)
        for batch, length in ((1, min(8, max_length)), (max_batch_size, 16), (1, max_length)):
            length = min(length, max_length)
            ids = np.full((batch, length), token_id, dtype=np.int64)
            logits = self.run(ids, np.ones_like(ids))
        return logits
