from textserve.v1 import classifier_pb2 as _classifier_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LoadModelRequest(_message.Message):
    __slots__ = ("name", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class LoadModelResponse(_message.Message):
    __slots__ = ("model", "events")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    model: _classifier_pb2.ModelSummary
    events: _containers.RepeatedCompositeFieldContainer[VersionEvent]
    def __init__(self, model: _Optional[_Union[_classifier_pb2.ModelSummary, _Mapping]] = ..., events: _Optional[_Iterable[_Union[VersionEvent, _Mapping]]] = ...) -> None: ...

class UnloadModelRequest(_message.Message):
    __slots__ = ("name", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class UnloadModelResponse(_message.Message):
    __slots__ = ("model", "events")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    model: _classifier_pb2.ModelSummary
    events: _containers.RepeatedCompositeFieldContainer[VersionEvent]
    def __init__(self, model: _Optional[_Union[_classifier_pb2.ModelSummary, _Mapping]] = ..., events: _Optional[_Iterable[_Union[VersionEvent, _Mapping]]] = ...) -> None: ...

class ReloadRepositoryRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReloadRepositoryResponse(_message.Message):
    __slots__ = ("events", "models")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[VersionEvent]
    models: _containers.RepeatedCompositeFieldContainer[_classifier_pb2.ModelSummary]
    def __init__(self, events: _Optional[_Iterable[_Union[VersionEvent, _Mapping]]] = ..., models: _Optional[_Iterable[_Union[_classifier_pb2.ModelSummary, _Mapping]]] = ...) -> None: ...

class VersionEvent(_message.Message):
    __slots__ = ("model", "version", "action", "reason")
    class Action(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ACTION_UNSPECIFIED: _ClassVar[VersionEvent.Action]
        ACTION_LOADED: _ClassVar[VersionEvent.Action]
        ACTION_UNLOADED: _ClassVar[VersionEvent.Action]
        ACTION_REFUSED: _ClassVar[VersionEvent.Action]
    ACTION_UNSPECIFIED: VersionEvent.Action
    ACTION_LOADED: VersionEvent.Action
    ACTION_UNLOADED: VersionEvent.Action
    ACTION_REFUSED: VersionEvent.Action
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    action: VersionEvent.Action
    reason: str
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., action: _Optional[_Union[VersionEvent.Action, str]] = ..., reason: _Optional[str] = ...) -> None: ...
