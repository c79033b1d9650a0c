from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ModelState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODEL_STATE_UNSPECIFIED: _ClassVar[ModelState]
    MODEL_STATE_AVAILABLE: _ClassVar[ModelState]
    MODEL_STATE_LOADING: _ClassVar[ModelState]
    MODEL_STATE_READY: _ClassVar[ModelState]
    MODEL_STATE_UNLOADING: _ClassVar[ModelState]
    MODEL_STATE_FAILED: _ClassVar[ModelState]
MODEL_STATE_UNSPECIFIED: ModelState
MODEL_STATE_AVAILABLE: ModelState
MODEL_STATE_LOADING: ModelState
MODEL_STATE_READY: ModelState
MODEL_STATE_UNLOADING: ModelState
MODEL_STATE_FAILED: ModelState

class ClassifyRequest(_message.Message):
    __slots__ = ("id", "texts", "model", "version", "truncate", "top_k", "all_scores", "text_pairs", "threshold", "windows")
    ID_FIELD_NUMBER: _ClassVar[int]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    ALL_SCORES_FIELD_NUMBER: _ClassVar[int]
    TEXT_PAIRS_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    id: str
    texts: _containers.RepeatedScalarFieldContainer[str]
    model: str
    version: int
    truncate: bool
    top_k: int
    all_scores: bool
    text_pairs: _containers.RepeatedScalarFieldContainer[str]
    threshold: float
    windows: Windows
    def __init__(self, id: _Optional[str] = ..., texts: _Optional[_Iterable[str]] = ..., model: _Optional[str] = ..., version: _Optional[int] = ..., truncate: _Optional[bool] = ..., top_k: _Optional[int] = ..., all_scores: _Optional[bool] = ..., text_pairs: _Optional[_Iterable[str]] = ..., threshold: _Optional[float] = ..., windows: _Optional[_Union[Windows, _Mapping]] = ...) -> None: ...

class Windows(_message.Message):
    __slots__ = ("aggregate", "stride")
    AGGREGATE_FIELD_NUMBER: _ClassVar[int]
    STRIDE_FIELD_NUMBER: _ClassVar[int]
    aggregate: str
    stride: int
    def __init__(self, aggregate: _Optional[str] = ..., stride: _Optional[int] = ...) -> None: ...

class LabelScore(_message.Message):
    __slots__ = ("label", "score")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    label: str
    score: float
    def __init__(self, label: _Optional[str] = ..., score: _Optional[float] = ...) -> None: ...

class TextResult(_message.Message):
    __slots__ = ("label", "score", "top", "scores", "num_tokens", "truncated", "labels_over_threshold", "cached", "windows")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    LABELS_OVER_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    label: str
    score: float
    top: _containers.RepeatedCompositeFieldContainer[LabelScore]
    scores: _containers.RepeatedScalarFieldContainer[float]
    num_tokens: int
    truncated: bool
    labels_over_threshold: _containers.RepeatedScalarFieldContainer[str]
    cached: bool
    windows: int
    def __init__(self, label: _Optional[str] = ..., score: _Optional[float] = ..., top: _Optional[_Iterable[_Union[LabelScore, _Mapping]]] = ..., scores: _Optional[_Iterable[float]] = ..., num_tokens: _Optional[int] = ..., truncated: _Optional[bool] = ..., labels_over_threshold: _Optional[_Iterable[str]] = ..., cached: _Optional[bool] = ..., windows: _Optional[int] = ...) -> None: ...

class Timing(_message.Message):
    __slots__ = ("queue_seconds", "tokenize_seconds", "inference_seconds", "total_seconds")
    QUEUE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TOKENIZE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    queue_seconds: float
    tokenize_seconds: float
    inference_seconds: float
    total_seconds: float
    def __init__(self, queue_seconds: _Optional[float] = ..., tokenize_seconds: _Optional[float] = ..., inference_seconds: _Optional[float] = ..., total_seconds: _Optional[float] = ...) -> None: ...

class Status(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class ClassifyResponse(_message.Message):
    __slots__ = ("id", "model", "model_version", "results", "labels", "timing", "error")
    ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    id: str
    model: str
    model_version: int
    results: _containers.RepeatedCompositeFieldContainer[TextResult]
    labels: _containers.RepeatedScalarFieldContainer[str]
    timing: Timing
    error: Status
    def __init__(self, id: _Optional[str] = ..., model: _Optional[str] = ..., model_version: _Optional[int] = ..., results: _Optional[_Iterable[_Union[TextResult, _Mapping]]] = ..., labels: _Optional[_Iterable[str]] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ..., error: _Optional[_Union[Status, _Mapping]] = ...) -> None: ...

class RerankRequest(_message.Message):
    __slots__ = ("id", "query", "documents", "model", "version", "truncate", "top_n", "raw_scores", "return_documents", "windows")
    ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    TOP_N_FIELD_NUMBER: _ClassVar[int]
    RAW_SCORES_FIELD_NUMBER: _ClassVar[int]
    RETURN_DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    id: str
    query: str
    documents: _containers.RepeatedScalarFieldContainer[str]
    model: str
    version: int
    truncate: bool
    top_n: int
    raw_scores: bool
    return_documents: bool
    windows: Windows
    def __init__(self, id: _Optional[str] = ..., query: _Optional[str] = ..., documents: _Optional[_Iterable[str]] = ..., model: _Optional[str] = ..., version: _Optional[int] = ..., truncate: _Optional[bool] = ..., top_n: _Optional[int] = ..., raw_scores: _Optional[bool] = ..., return_documents: _Optional[bool] = ..., windows: _Optional[_Union[Windows, _Mapping]] = ...) -> None: ...

class RankedDocument(_message.Message):
    __slots__ = ("index", "score", "document", "num_tokens", "windows")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    index: int
    score: float
    document: str
    num_tokens: int
    windows: int
    def __init__(self, index: _Optional[int] = ..., score: _Optional[float] = ..., document: _Optional[str] = ..., num_tokens: _Optional[int] = ..., windows: _Optional[int] = ...) -> None: ...

class RerankResponse(_message.Message):
    __slots__ = ("id", "model", "model_version", "results", "timing")
    ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    id: str
    model: str
    model_version: int
    results: _containers.RepeatedCompositeFieldContainer[RankedDocument]
    timing: Timing
    def __init__(self, id: _Optional[str] = ..., model: _Optional[str] = ..., model_version: _Optional[int] = ..., results: _Optional[_Iterable[_Union[RankedDocument, _Mapping]]] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ...) -> None: ...

class ZeroShotRequest(_message.Message):
    __slots__ = ("id", "texts", "candidate_labels", "hypothesis_template", "multi_label", "model", "version", "truncate")
    ID_FIELD_NUMBER: _ClassVar[int]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_LABELS_FIELD_NUMBER: _ClassVar[int]
    HYPOTHESIS_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    MULTI_LABEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    id: str
    texts: _containers.RepeatedScalarFieldContainer[str]
    candidate_labels: _containers.RepeatedScalarFieldContainer[str]
    hypothesis_template: str
    multi_label: bool
    model: str
    version: int
    truncate: bool
    def __init__(self, id: _Optional[str] = ..., texts: _Optional[_Iterable[str]] = ..., candidate_labels: _Optional[_Iterable[str]] = ..., hypothesis_template: _Optional[str] = ..., multi_label: _Optional[bool] = ..., model: _Optional[str] = ..., version: _Optional[int] = ..., truncate: _Optional[bool] = ...) -> None: ...

class ZeroShotResult(_message.Message):
    __slots__ = ("labels",)
    LABELS_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.RepeatedCompositeFieldContainer[LabelScore]
    def __init__(self, labels: _Optional[_Iterable[_Union[LabelScore, _Mapping]]] = ...) -> None: ...

class ZeroShotResponse(_message.Message):
    __slots__ = ("id", "model", "model_version", "results", "timing")
    ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    id: str
    model: str
    model_version: int
    results: _containers.RepeatedCompositeFieldContainer[ZeroShotResult]
    timing: Timing
    def __init__(self, id: _Optional[str] = ..., model: _Optional[str] = ..., model_version: _Optional[int] = ..., results: _Optional[_Iterable[_Union[ZeroShotResult, _Mapping]]] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ...) -> None: ...

class TagRequest(_message.Message):
    __slots__ = ("id", "texts", "model", "version", "aggregation", "ignore_labels", "threshold", "windows", "stride", "truncate")
    ID_FIELD_NUMBER: _ClassVar[int]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    AGGREGATION_FIELD_NUMBER: _ClassVar[int]
    IGNORE_LABELS_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    STRIDE_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    id: str
    texts: _containers.RepeatedScalarFieldContainer[str]
    model: str
    version: int
    aggregation: str
    ignore_labels: IgnoreLabels
    threshold: float
    windows: bool
    stride: int
    truncate: bool
    def __init__(self, id: _Optional[str] = ..., texts: _Optional[_Iterable[str]] = ..., model: _Optional[str] = ..., version: _Optional[int] = ..., aggregation: _Optional[str] = ..., ignore_labels: _Optional[_Union[IgnoreLabels, _Mapping]] = ..., threshold: _Optional[float] = ..., windows: _Optional[bool] = ..., stride: _Optional[int] = ..., truncate: _Optional[bool] = ...) -> None: ...

class IgnoreLabels(_message.Message):
    __slots__ = ("labels",)
    LABELS_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, labels: _Optional[_Iterable[str]] = ...) -> None: ...

class Entity(_message.Message):
    __slots__ = ("label", "score", "word", "start", "end", "index")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    WORD_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    label: str
    score: float
    word: str
    start: int
    end: int
    index: int
    def __init__(self, label: _Optional[str] = ..., score: _Optional[float] = ..., word: _Optional[str] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., index: _Optional[int] = ...) -> None: ...

class TaggedText(_message.Message):
    __slots__ = ("entities", "num_tokens", "truncated", "windows")
    ENTITIES_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    entities: _containers.RepeatedCompositeFieldContainer[Entity]
    num_tokens: int
    truncated: bool
    windows: int
    def __init__(self, entities: _Optional[_Iterable[_Union[Entity, _Mapping]]] = ..., num_tokens: _Optional[int] = ..., truncated: _Optional[bool] = ..., windows: _Optional[int] = ...) -> None: ...

class TagResponse(_message.Message):
    __slots__ = ("id", "model", "model_version", "results", "timing", "error")
    ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    id: str
    model: str
    model_version: int
    results: _containers.RepeatedCompositeFieldContainer[TaggedText]
    timing: Timing
    error: Status
    def __init__(self, id: _Optional[str] = ..., model: _Optional[str] = ..., model_version: _Optional[int] = ..., results: _Optional[_Iterable[_Union[TaggedText, _Mapping]]] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ..., error: _Optional[_Union[Status, _Mapping]] = ...) -> None: ...

class VersionStatus(_message.Message):
    __slots__ = ("version", "state", "reason")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    version: int
    state: ModelState
    reason: str
    def __init__(self, version: _Optional[int] = ..., state: _Optional[_Union[ModelState, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class ModelSummary(_message.Message):
    __slots__ = ("name", "versions", "ready_version", "is_default")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    READY_VERSION_FIELD_NUMBER: _ClassVar[int]
    IS_DEFAULT_FIELD_NUMBER: _ClassVar[int]
    name: str
    versions: _containers.RepeatedCompositeFieldContainer[VersionStatus]
    ready_version: int
    is_default: bool
    def __init__(self, name: _Optional[str] = ..., versions: _Optional[_Iterable[_Union[VersionStatus, _Mapping]]] = ..., ready_version: _Optional[int] = ..., is_default: _Optional[bool] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models", "default_model")
    MODELS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_MODEL_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelSummary]
    default_model: str
    def __init__(self, models: _Optional[_Iterable[_Union[ModelSummary, _Mapping]]] = ..., default_model: _Optional[str] = ...) -> None: ...

class GetModelRequest(_message.Message):
    __slots__ = ("name", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class BatchingStats(_message.Message):
    __slots__ = ("batches", "items", "mean_batch_size", "max_batch_size_seen", "dropped_deadline", "dropped_cancelled", "rejected_overloaded", "queue_depth", "max_batch_size", "max_batch_tokens", "max_queue_delay_seconds", "max_queue_size", "padded_tokens", "padding_tokens")
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    MEAN_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_SEEN_FIELD_NUMBER: _ClassVar[int]
    DROPPED_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    DROPPED_CANCELLED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_OVERLOADED_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_DELAY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PADDED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PADDING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    batches: int
    items: int
    mean_batch_size: float
    max_batch_size_seen: int
    dropped_deadline: int
    dropped_cancelled: int
    rejected_overloaded: int
    queue_depth: int
    max_batch_size: int
    max_batch_tokens: int
    max_queue_delay_seconds: float
    max_queue_size: int
    padded_tokens: int
    padding_tokens: int
    def __init__(self, batches: _Optional[int] = ..., items: _Optional[int] = ..., mean_batch_size: _Optional[float] = ..., max_batch_size_seen: _Optional[int] = ..., dropped_deadline: _Optional[int] = ..., dropped_cancelled: _Optional[int] = ..., rejected_overloaded: _Optional[int] = ..., queue_depth: _Optional[int] = ..., max_batch_size: _Optional[int] = ..., max_batch_tokens: _Optional[int] = ..., max_queue_delay_seconds: _Optional[float] = ..., max_queue_size: _Optional[int] = ..., padded_tokens: _Optional[int] = ..., padding_tokens: _Optional[int] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("name", "version", "state", "labels", "max_length", "execution_provider", "precision", "versions", "batching", "is_default", "test_accuracy", "created_at", "source_kind", "architecture", "model_type", "activation", "inputs", "threshold", "truncation_side", "task", "label_scheme", "aggregation", "ignore_labels", "stride", "entailment_label", "contradiction_label")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    MAX_LENGTH_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_PROVIDER_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    BATCHING_FIELD_NUMBER: _ClassVar[int]
    IS_DEFAULT_FIELD_NUMBER: _ClassVar[int]
    TEST_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_KIND_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    MODEL_TYPE_FIELD_NUMBER: _ClassVar[int]
    ACTIVATION_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    TRUNCATION_SIDE_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    LABEL_SCHEME_FIELD_NUMBER: _ClassVar[int]
    AGGREGATION_FIELD_NUMBER: _ClassVar[int]
    IGNORE_LABELS_FIELD_NUMBER: _ClassVar[int]
    STRIDE_FIELD_NUMBER: _ClassVar[int]
    ENTAILMENT_LABEL_FIELD_NUMBER: _ClassVar[int]
    CONTRADICTION_LABEL_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    state: ModelState
    labels: _containers.RepeatedScalarFieldContainer[str]
    max_length: int
    execution_provider: str
    precision: str
    versions: _containers.RepeatedCompositeFieldContainer[VersionStatus]
    batching: BatchingStats
    is_default: bool
    test_accuracy: float
    created_at: str
    source_kind: str
    architecture: str
    model_type: str
    activation: str
    inputs: _containers.RepeatedScalarFieldContainer[str]
    threshold: float
    truncation_side: str
    task: str
    label_scheme: str
    aggregation: str
    ignore_labels: _containers.RepeatedScalarFieldContainer[str]
    stride: int
    entailment_label: int
    contradiction_label: int
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ..., state: _Optional[_Union[ModelState, str]] = ..., labels: _Optional[_Iterable[str]] = ..., max_length: _Optional[int] = ..., execution_provider: _Optional[str] = ..., precision: _Optional[str] = ..., versions: _Optional[_Iterable[_Union[VersionStatus, _Mapping]]] = ..., batching: _Optional[_Union[BatchingStats, _Mapping]] = ..., is_default: _Optional[bool] = ..., test_accuracy: _Optional[float] = ..., created_at: _Optional[str] = ..., source_kind: _Optional[str] = ..., architecture: _Optional[str] = ..., model_type: _Optional[str] = ..., activation: _Optional[str] = ..., inputs: _Optional[_Iterable[str]] = ..., threshold: _Optional[float] = ..., truncation_side: _Optional[str] = ..., task: _Optional[str] = ..., label_scheme: _Optional[str] = ..., aggregation: _Optional[str] = ..., ignore_labels: _Optional[_Iterable[str]] = ..., stride: _Optional[int] = ..., entailment_label: _Optional[int] = ..., contradiction_label: _Optional[int] = ...) -> None: ...
