"""How a textserve model describes itself over the Open Inference Protocol; pure, no grpc.

ModelMetadata (OIP), and Triton's ModelConfig and ModelStatistics, built from a model handle,
the serving configuration and the shared Prometheus metrics::

    model_metadata(handle, versions=[1, 2])          -> ModelMetadataResponse
    model_config(handle, max_batch_size=1024, ...)   -> ModelConfigResponse
    model_statistics(metrics, "default", "2")        -> ModelStatistics

Shapes follow Triton's convention for a batching model: max_batch_size > 0, and each tensor's
dims leave out the leading batch dimension, so TEXT is ``[-1, 1]`` in the metadata and ``[1]``
in the config. That is what lets perf_analyzer and other Triton tools build requests without
being told a shape; textserve also accepts TEXT of shape ``[n]``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from textserve.oip import grpc_service_pb2 as pb
from textserve.oip import model_config_pb2 as mc
from textserve.service.dataplane.oip_codec import INPUT_NAME, PAIR_INPUT_NAME
from textserve.service.metrics import Metrics

__all__ = ["BACKEND", "PLATFORM", "model_config", "model_metadata", "model_statistics"]

PLATFORM = "onnxruntime_onnx"  # Triton's platform name for ONNX models run by onnxruntime
BACKEND = "onnxruntime"


class ModelLike(Protocol):
    """What is read from a model handle (textserve.service.repository.core's handle has these)."""

    @property
    def name(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def labels(self) -> Sequence[str]: ...


def _tensors(
    num_labels: int, pairs: bool = False
) -> tuple[list[tuple[str, str, int]], list[tuple[str, str, int]]]:
    """(name, OIP datatype, size of the one dimension after the batch) for inputs and outputs;
    `pairs`: the model takes sentence pairs (the optional TEXT_PAIR input)."""
    inputs = [(INPUT_NAME, "BYTES", 1)]
    if pairs:
        inputs.append((PAIR_INPUT_NAME, "BYTES", 1))
    outputs = [("LABEL", "BYTES", 1), ("SCORE", "FP32", 1), ("PROBABILITIES", "FP32", num_labels)]
    return inputs, outputs


def _outputs(handle: ModelLike) -> list[tuple[str, str, int]] | None:
    """A token classifier's outputs (ENTITIES: a JSON document per text), else None."""
    return [("ENTITIES", "BYTES", 1)] if getattr(handle, "tags_tokens", False) else None


def model_metadata(handle: ModelLike, versions: Iterable[int]) -> pb.ModelMetadataResponse:
    """The OIP metadata of ``handle``'s model; ``versions`` are the ones it can serve."""
    inputs, outputs = _tensors(len(handle.labels), _takes_pairs(handle))
    outputs = _outputs(handle) or outputs

    def describe(tensors: list[tuple[str, str, int]]) -> list[Any]:
        return [
            pb.ModelMetadataResponse.TensorMetadata(name=name, datatype=datatype, shape=[-1, size])
            for name, datatype, size in tensors
        ]

    return pb.ModelMetadataResponse(
        name=handle.name,
        versions=[str(v) for v in sorted(versions)],
        platform=PLATFORM,
        inputs=describe(inputs),
        outputs=describe(outputs),
    )


_DATA_TYPES = {"BYTES": mc.TYPE_STRING, "FP32": mc.TYPE_FP32}


def _takes_pairs(handle: ModelLike) -> bool:
    """Whether the model takes sentence pairs (a ModelHandle says; other handles: no)."""
    return bool(getattr(handle, "takes_pairs", False))


def model_config(
    handle: ModelLike, *, max_batch_size: int, batcher_max_batch_size: int, max_queue_delay: float
) -> pb.ModelConfigResponse:
    """Triton's ModelConfig of ``handle``'s model.

    ``max_batch_size`` is the most texts one request may carry; the dynamic batcher's
    preferred batch size is the size it fills batches up to, and its queue delay is the
    longest a text waits for a batch to fill (seconds).
    """
    inputs, outputs = _tensors(len(handle.labels), _takes_pairs(handle))
    outputs = _outputs(handle) or outputs
    config = mc.ModelConfig(
        name=handle.name,
        platform=PLATFORM,
        backend=BACKEND,
        max_batch_size=max_batch_size,
        input=[
            mc.ModelInput(name=n, data_type=_DATA_TYPES[t], dims=[d], optional=n == PAIR_INPUT_NAME)
            for n, t, d in inputs
        ],
        output=[mc.ModelOutput(name=n, data_type=_DATA_TYPES[t], dims=[d]) for n, t, d in outputs],
        dynamic_batching=mc.ModelDynamicBatching(
            preferred_batch_size=[batcher_max_batch_size],
            max_queue_delay_microseconds=round(max_queue_delay * 1e6),
        ),
    )
    return pb.ModelConfigResponse(config=config)


def _count_and_sum(histogram: Any, keep: Callable[[dict[str, str]], bool]) -> tuple[int, float]:
    """Observations and their sum over the series of ``histogram`` whose labels ``keep`` takes."""
    count, total = 0.0, 0.0
    for metric in histogram.collect():
        for sample in metric.samples:
            if not keep(sample.labels):
                continue
            if sample.name.endswith("_count"):
                count += sample.value
            elif sample.name.endswith("_sum"):
                total += sample.value
    return round(count), total


def _duration(histogram: Any, keep: Callable[[dict[str, str]], bool]) -> pb.StatisticDuration:
    """A seconds histogram's count and total as Triton's StatisticDuration (nanoseconds)."""
    count, seconds = _count_and_sum(histogram, keep)
    return pb.StatisticDuration(count=count, ns=round(seconds * 1e9))


def model_statistics(metrics: Metrics, model: str, version: str) -> pb.ModelStatistics:
    """Triton's cumulative statistics of ``model``, read from the shared Prometheus metrics.

    The metrics are per model, not per version, and count requests of every front end
    (textserve.v1 and OIP), because they share the batcher: success/fail are requests by
    status, queue is per text, inference_count is texts batched, execution_count batches run.
    The compute durations are totals over batches, all three counted per batch: perf_analyzer
    refuses statistics whose compute_input, compute_infer and compute_output counts differ,
    and a batch's time is what each request in it waits for (Triton charges it to each).
    compute_input is tokenization (done per request group, before batching), compute_infer
    the onnxruntime runs, compute_output nothing (the probabilities are the model's output).
    """

    def of_model(labels: dict[str, str]) -> bool:
        return labels.get("model") == model

    def ok(labels: dict[str, str]) -> bool:
        return of_model(labels) and labels.get("code") == "OK"

    def failed(labels: dict[str, str]) -> bool:
        return of_model(labels) and labels.get("code") != "OK"

    batches, texts = _count_and_sum(metrics.batch_size, of_model)
    _, tokenize_seconds = _count_and_sum(metrics.tokenize_duration, of_model)
    _, infer_seconds = _count_and_sum(metrics.inference_duration, of_model)
    return pb.ModelStatistics(
        name=model,
        version=version,
        inference_count=round(texts),
        execution_count=batches,
        inference_stats=pb.InferStatistics(
            success=_duration(metrics.request_duration, ok),
            fail=_duration(metrics.request_duration, failed),
            queue=_duration(metrics.queue_duration, of_model),
            compute_input=pb.StatisticDuration(count=batches, ns=round(tokenize_seconds * 1e9)),
            compute_infer=pb.StatisticDuration(count=batches, ns=round(infer_seconds * 1e9)),
            compute_output=pb.StatisticDuration(count=batches, ns=0),
        ),
    )
