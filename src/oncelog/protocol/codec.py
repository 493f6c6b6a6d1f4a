"""Request/response bodies: kio's generated schemas, plus a tolerant fallback.

kio (Kafka 4.x schemas) decodes with a native reader and encodes with Python
writers. Its native reader raises ``KeyError`` on a tagged field it does not
know; Kafka requires receivers to skip unknown tags, so on that error we decode
the same bytes again with :func:`_tolerant_reader`, a small walker over kio's
dataclass fields that skips unknown tags at every nesting level.
"""

from __future__ import annotations

import io
from dataclasses import MISSING, Field, fields
from functools import cache
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.index import api_key_map
from kio.serial import entity_reader, entity_writer
from kio.serial._implicit_defaults import get_tagged_field_default
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    classify_field,
    get_field_tag,
    is_optional,
)
from kio.serial.readers import (
    read_compact_array_length,
    read_int8,
    read_legacy_array_length,
    read_unsigned_varint,
)
from kio._kio_native import get_field_reader

__all__ = [
    "DecodeError",
    "api_name",
    "decode_request",
    "encode_response",
    "is_flexible",
    "request_type",
    "response_type",
]


class DecodeError(Exception):
    """The body does not parse as the schema of its API key and version."""


def api_name(api_key: int) -> str:
    return api_key_map.get(api_key, f"api_{api_key}")


@cache
def request_type(api_key: int, version: int) -> type:
    return load_request_schema(api_key, version)


@cache
def response_type(api_key: int, version: int) -> type:
    return load_response_schema(api_key, version)


@cache
def is_flexible(api_key: int, version: int) -> bool:
    return bool(request_type(api_key, version).__flexible__)


def decode_request(api_key: int, version: int, buf: bytes | memoryview, offset: int) -> Any:
    """Decode a request body starting at ``offset`` of ``buf``."""
    cls = request_type(api_key, version)
    try:
        entity, _ = entity_reader(cls)(buf, offset)
        return entity
    except KeyError:
        pass  # an unknown tagged field: decode again, skipping unknown tags
    except Exception as exc:  # kio raises several types for short/garbled input
        raise DecodeError(f"{api_name(api_key)} v{version}: {exc}") from exc
    try:
        entity, _ = _tolerant_reader(cls)(buf, offset)
        return entity
    except Exception as exc:
        raise DecodeError(f"{api_name(api_key)} v{version}: {exc}") from exc


def encode_response(entity: Any) -> bytes:
    out = io.BytesIO()
    entity_writer(type(entity))(out, entity)
    return out.getvalue()


def encode_request(entity: Any) -> bytes:
    """Encode a request body (used by our own admin CLI and tests)."""
    out = io.BytesIO()
    entity_writer(type(entity))(out, entity)
    return out.getvalue()


def decode_response(api_key: int, version: int, buf: bytes | memoryview, offset: int = 0) -> Any:
    cls = response_type(api_key, version)
    try:
        return entity_reader(cls)(buf, offset)[0]
    except KeyError:
        return _tolerant_reader(cls)(buf, offset)[0]


# -- tolerant walker --------------------------------------------------------
# kio readers return (value, bytes consumed); so do ours.


@cache
def _tolerant_reader(cls: type) -> Any:
    flexible = bool(cls.__flexible__)
    plain: list[tuple[str, Any]] = []
    tagged: dict[int, tuple[str, Any]] = {}
    defaults: dict[str, Any] = {}
    for field in fields(cls):
        tag = get_field_tag(field)
        reader = _field_reader(cls, field, flexible, tag is not None)
        if tag is None:
            plain.append((field.name, reader))
        else:
            tagged[int(tag)] = (field.name, reader)
            defaults[field.name] = _tag_default(field)

    def read(buf: Any, start: int) -> tuple[Any, int]:
        values: dict[str, Any] = {}
        pos = start
        for name, reader in plain:
            values[name], size = reader(buf, pos)
            pos += size
        if flexible:
            values.update(defaults)
            count, size = read_unsigned_varint(buf, pos)
            pos += size
            for _ in range(count):
                tag, size = read_unsigned_varint(buf, pos)
                pos += size
                length, size = read_unsigned_varint(buf, pos)
                pos += size
                known = tagged.get(tag)
                if known is not None:
                    name, reader = known
                    values[name], _ = reader(bytes(buf[pos : pos + length]), 0)
                pos += length
        return cls(**values), pos - start

    return read


def _tag_default(field: Field) -> Any:
    if field.default is not MISSING:
        return field.default
    if field.default_factory is not MISSING:
        return field.default_factory()
    return get_tagged_field_default(field)


def _field_reader(cls: type, field: Field, flexible: bool, is_tag: bool) -> Any:
    kind = classify_field(field)
    if isinstance(kind, EntityField):
        inner = _tolerant_reader(kind.type_)
        if not is_optional(field):
            return inner

        def read_optional(buf: Any, pos: int) -> tuple[Any, int]:
            marker, size = read_int8(buf, pos)
            if marker < 0:
                return None, size
            value, inner_size = inner(buf, pos + size)
            return value, size + inner_size

        return read_optional
    if isinstance(kind, EntityTupleField):
        inner = _tolerant_reader(kind.type_)
        read_len = read_compact_array_length if flexible else read_legacy_array_length

        def read_array(buf: Any, start: int) -> tuple[Any, int]:
            n, pos = read_len(buf, start)
            pos += start
            if n < 0:
                return None, pos - start
            items = []
            for _ in range(n):
                item, size = inner(buf, pos)
                pos += size
                items.append(item)
            return tuple(items), pos - start

        return read_array
    return get_field_reader(cls, field, False, is_tag)
