"""Protobuf messages as the JSON the HTTP routes answer: field names as in the .proto, every
scalar present (zeros included), 64-bit integers as JSON numbers (protobuf's own JSON mapping
writes them as strings, which KServe v2 clients and perf_analyzer do not read as shapes)."""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

_MESSAGE = FieldDescriptor.TYPE_MESSAGE
_ENUM = FieldDescriptor.TYPE_ENUM
_BYTES = FieldDescriptor.TYPE_BYTES
_REPEATED = FieldDescriptor.LABEL_REPEATED


def _value(field: Any, value: Any) -> Any:
    if field.type == _MESSAGE:
        return to_json(value)
    if field.type == _ENUM:
        return field.enum_type.values_by_number[value].name
    if field.type == _BYTES:
        return value.decode("utf-8", "replace")
    return value


def to_json(message: Message) -> dict[str, Any]:
    """`message` as a JSON-ready dict: scalars always, singular messages when set, maps as
    objects, repeated fields as lists, enums by name, bytes as UTF-8 text."""
    out: dict[str, Any] = {}
    field: Any  # a FieldDescriptor (pure-Python or upb: the stubs know two types)
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {k: _value(value_field, v) for k, v in value.items()}
        elif field.label == _REPEATED:
            out[field.name] = [_value(field, v) for v in value]
        elif field.type == _MESSAGE:
            if message.HasField(field.name):
                out[field.name] = to_json(value)
        elif field.containing_oneof is not None:
            if message.HasField(field.name):
                out[field.name] = _value(field, value)
        else:
            out[field.name] = _value(field, value)
    return out
