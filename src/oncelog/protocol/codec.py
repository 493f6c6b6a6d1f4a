"""Request/response bodies: kio's generated schemas, plus a tolerant fallback.

kio (Kafka 4.x schemas) decodes with a native reader and encodes with Python
writers. Its native reader raises ``KeyError`` on a tagged field it does not
know; Kafka requires receivers to skip unknown tags, so on that error we decode
the same bytes again with :func:`_tolerant_reader`, a small walker over kio's
dataclass fields that skips unknown tags at every nesting level. The same
walker takes over when kio cannot build a ``timedelta`` from an int64 of
milliseconds (beyond about 2.7 million years, e.g. a SaslAuthenticate
``session_lifetime_ms`` of Long.MAX_VALUE, which Apache Kafka may send for a
session that is not bounded): it clamps the value to ``timedelta``'s range.

A caller that wants the unknown tags passes an ``unknown_tags`` dict to
:func:`decode_request` / :func:`decode_response`: it is filled with
``{id(entity): (entity, {tag: [raw value, ...]})}`` for every entity that
carried one (conditional produce's tag is read this way). A body without
unknown tags never leaves kio's native reader and leaves the dict empty, so
this costs nothing for requests that don't use it.

Before kio sees a request, :func:`_guard` walks it without building values and
checks every length against the bytes that are really there: kio's native
reader reserves memory for an array from its declared length, so a 14-byte
request claiming 2^32 elements would abort the whole process (found by the
protocol fuzzer). The guard also rejects a null where the schema has a
non-nullable array or string, which kio would otherwise hand to the handler
as ``None``.
"""

from __future__ import annotations

import datetime
import io
import struct
from contextvars import ContextVar
from dataclasses import MISSING, Field, fields
from types import NoneType, UnionType
from typing import Union, get_args, get_origin
from functools import cache
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.index import api_key_map
from kio.serial import entity_reader, entity_writer
from kio.serial._implicit_defaults import get_tagged_field_default
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)
from kio.serial.readers import (
    read_compact_array_length,
    read_int8,
    read_legacy_array_length,
    read_unsigned_varint,
)
from kio._kio_native import get_field_reader

from oncelog.protocol.errors import ErrorCode, OncelogErrorCode
from oncelog.protocol.varint import varint_readers

__all__ = [
    "DecodeError",
    "UnknownTags",
    "api_name",
    "decode_request",
    "encode_response",
    "is_flexible",
    "request_type",
    "response_type",
    "unknown_tags_of",
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


UnknownTags = dict[int, tuple[Any, dict[int, list[bytes]]]]
_SINK: ContextVar[UnknownTags | None] = ContextVar("oncelog_unknown_tags", default=None)


def unknown_tags_of(unknown_tags: UnknownTags, entity: Any) -> dict[int, list[bytes]] | None:
    """The unknown tags ``entity`` carried (``{tag: [raw value, ...]}``), None if none."""
    hit = unknown_tags.get(id(entity))
    if hit is None or hit[0] is not entity:
        return None
    return hit[1]


def _tolerant_decode(cls: type, buf: Any, offset: int, unknown_tags: UnknownTags | None) -> Any:
    token = _SINK.set(unknown_tags)
    try:
        return _tolerant_reader(cls)(buf, offset)[0]
    finally:
        _SINK.reset(token)


def decode_request(
    api_key: int, version: int, buf: bytes | memoryview, offset: int, unknown_tags: UnknownTags | None = None
) -> Any:
    """Decode a request body starting at ``offset`` of ``buf`` (``unknown_tags``: see module doc)."""
    cls = request_type(api_key, version)
    try:
        _guard(cls)(buf, offset, len(buf))
    except (GuardError, IndexError, struct.error, ValueError) as exc:
        raise DecodeError(f"{api_name(api_key)} v{version}: {exc}") from exc
    try:
        entity, _ = entity_reader(cls)(buf, offset)
        return entity
    except (KeyError, ValueError):
        pass  # an unknown tagged field or a timedelta out of range: decode again (garbled input fails there)
    except Exception as exc:  # kio raises several types for short/garbled input
        raise DecodeError(f"{api_name(api_key)} v{version}: {exc}") from exc
    try:
        return _tolerant_decode(cls, buf, offset, unknown_tags)
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


def decode_response(
    api_key: int, version: int, buf: bytes | memoryview, offset: int = 0, unknown_tags: UnknownTags | None = None
) -> Any:
    cls = response_type(api_key, version)
    try:
        return entity_reader(cls)(buf, offset)[0]
    except (KeyError, ValueError):
        # an unknown tag, or an error code kio's enum lacks (oncelog's own codes)
        return _tolerant_decode(cls, buf, offset, unknown_tags)


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
        unknown: dict[int, list[bytes]] | None = None
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
                else:
                    if unknown is None:
                        unknown = {}
                    unknown.setdefault(tag, []).append(bytes(buf[pos : pos + length]))
                pos += length
        entity = cls(**values)
        if unknown is not None:
            sink = _SINK.get()
            if sink is not None:
                sink[id(entity)] = (entity, unknown)
        return entity, pos - start

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
    schema_type = get_schema_field_type(field)
    if schema_type == "error_code":
        return _read_error_code
    if schema_type == "timedelta_i64":
        return _read_timedelta_i64
    return get_field_reader(cls, field, False, is_tag)


_I64 = struct.Struct(">q")
_TIMEDELTA_MAX_MS = (datetime.timedelta.max.days * 86400 + 86399) * 1000 + 999
_TIMEDELTA_MIN_MS = datetime.timedelta.min.days * 86400 * 1000


def _read_timedelta_i64(buf: Any, pos: int) -> tuple[datetime.timedelta, int]:
    """An int64 of milliseconds as a timedelta, clamped to timedelta's range (kio raises beyond it)."""
    (ms,) = _I64.unpack_from(buf, pos)
    return datetime.timedelta(milliseconds=min(max(ms, _TIMEDELTA_MIN_MS), _TIMEDELTA_MAX_MS)), 8


def _read_error_code(buf: Any, pos: int) -> tuple[Any, int]:
    """Kafka's code as kio's ErrorCode; oncelog's own as OncelogErrorCode; anything else as int."""
    (code,) = _I16.unpack_from(buf, pos)
    try:
        return ErrorCode(code), 2
    except ValueError:
        pass
    try:
        return OncelogErrorCode(code), 2
    except ValueError:
        return code, 2


# -- structure guard ---------------------------------------------------------


class GuardError(Exception):
    """A length or null the schema does not allow."""


_FIXED = {"bool": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 4, "timedelta_i32": 4, "int64": 8,
          "timedelta_i64": 8, "float64": 8, "uuid": 16, "error_code": 2, "datetime_i64": 8}
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


_read_uvarint, _ = varint_readers(GuardError)


def _uvarint(buf: Any, pos: int, end: int) -> tuple[int, int]:
    value, pos = _read_uvarint(buf, pos)
    if pos > end:
        raise GuardError("truncated varint")
    return value, pos


def _length(buf: Any, pos: int, end: int, flexible: bool, wide: bool) -> tuple[int, int]:
    """A string/bytes/array length: -1 for null."""
    if flexible:
        n, pos = _uvarint(buf, pos, end)
        return n - 1, pos
    size = 4 if wide else 2
    if pos + size > end:
        raise GuardError("truncated length")
    return (_I32 if wide else _I16).unpack_from(buf, pos)[0], pos + size


def _nullable_array(field: Field) -> bool:
    return get_origin(field.type) in (UnionType, Union) and NoneType in get_args(field.type)


def _skip_value(kind: str, nullable: bool, flexible: bool) -> Any:
    fixed = _FIXED.get(kind)
    if fixed is not None:
        def skip_fixed(buf: Any, pos: int, end: int) -> int:
            if pos + fixed > end:
                raise GuardError(f"truncated {kind}")
            return pos + fixed
        return skip_fixed
    if kind in ("string", "bytes", "records"):
        wide = kind != "string"

        def skip_sized(buf: Any, pos: int, end: int) -> int:
            n, pos = _length(buf, pos, end, flexible, wide)
            if n < 0:
                if n < -1 or not nullable and kind == "string":
                    raise GuardError(f"null or negative length {n} for a {kind}")
                return pos
            if pos + n > end:
                raise GuardError(f"{kind} of {n} bytes but only {end - pos} left")
            return pos + n
        return skip_sized
    raise GuardError(f"unsupported field type {kind}")


@cache
def _guard(cls: type) -> Any:
    """A checker ``(buf, pos, end) -> pos`` for one entity of ``cls`` (see module doc)."""
    flexible = bool(cls.__flexible__)
    plain: list[Any] = []
    tagged: dict[int, Any] = {}
    for field in fields(cls):
        kind = classify_field(field)
        if isinstance(kind, EntityField):
            check = _guard_optional(kind.type_) if is_optional(field) else _guard_lazy(kind.type_)
        elif isinstance(kind, (EntityTupleField, PrimitiveTupleField)):
            item = (
                _guard_lazy(kind.type_)
                if isinstance(kind, EntityTupleField)
                else _skip_value(get_schema_field_type(field), True, flexible)
            )
            check = _guard_array(item, _nullable_array(field), flexible, field.name)
        else:
            check = _skip_value(get_schema_field_type(field), is_optional(field), flexible)
        tag = get_field_tag(field)
        if tag is None:
            plain.append(check)
        else:
            tagged[int(tag)] = check

    def guard(buf: Any, pos: int, end: int) -> int:
        for check in plain:
            pos = check(buf, pos, end)
        if flexible:
            count, pos = _uvarint(buf, pos, end)
            for _ in range(count):
                tag, pos = _uvarint(buf, pos, end)
                size, pos = _uvarint(buf, pos, end)
                if pos + size > end:
                    raise GuardError(f"tagged field of {size} bytes but only {end - pos} left")
                check = tagged.get(tag)
                if check is not None:
                    check(buf, pos, pos + size)
                pos += size
        return pos

    return guard


def _guard_lazy(cls: type) -> Any:
    # nested entities are resolved on first use (schemas can be recursive in principle)
    def guard(buf: Any, pos: int, end: int) -> int:
        return _guard(cls)(buf, pos, end)

    return guard


def _guard_optional(cls: type) -> Any:
    def guard(buf: Any, pos: int, end: int) -> int:
        if pos >= end:
            raise GuardError("truncated optional struct")
        if buf[pos] >= 0x80:  # int8 -1: null
            return pos + 1
        return _guard(cls)(buf, pos + 1, end)

    return guard


def _guard_array(item: Any, nullable: bool, flexible: bool, name: str) -> Any:
    def guard(buf: Any, pos: int, end: int) -> int:
        n, pos = _length(buf, pos, end, flexible, True)
        if n < 0:
            if n < -1 or not nullable:
                raise GuardError(f"null or negative length {n} for the array {name}")
            return pos
        if n > end - pos:  # every element takes at least one byte
            raise GuardError(f"array {name} claims {n} elements but only {end - pos} bytes are left")
        for _ in range(n):
            pos = item(buf, pos, end)
        return pos

    return guard
