"""Build version-specific kio entities from plain data.

kio generates one dataclass per API version, nested types included, and the
field sets differ between versions. Handlers describe a response once, as
dicts and lists with Kafka's field names (snake_case) and plain ints for
error codes, milliseconds and timestamps; :func:`materialize` turns that into
the entity of the negotiated version, dropping fields the version lacks and
filling absent ones with their schema default.
"""

from __future__ import annotations

import datetime
from dataclasses import MISSING, fields
from functools import cache
from typing import Any, Callable

from kio.schema.errors import ErrorCode
from kio.serial._implicit_defaults import get_tagged_field_default
from kio.serial._introspect import EntityField, EntityTupleField, classify_field, get_field_tag

__all__ = ["error_body", "materialize", "to_ms"]

_UTC = datetime.timezone.utc


def to_ms(value: Any) -> int:
    """Milliseconds from a kio timedelta/datetime field or a plain int."""
    if isinstance(value, datetime.timedelta):
        return round(value.total_seconds() * 1000)
    if isinstance(value, datetime.datetime):
        return round(value.timestamp() * 1000)
    return int(value)


def _conv_error(v: Any) -> Any:
    return v if isinstance(v, ErrorCode) else ErrorCode(int(v))


def _conv_timedelta(v: Any) -> Any:
    return v if isinstance(v, datetime.timedelta) else datetime.timedelta(milliseconds=int(v))


def _conv_datetime(v: Any) -> Any:
    if v is None or isinstance(v, datetime.datetime):
        return v
    if int(v) < 0:
        return None
    return datetime.datetime.fromtimestamp(int(v) / 1000, tz=_UTC)


_CONVERTERS: dict[str, Callable[[Any], Any]] = {
    "error_code": _conv_error,
    "timedelta_i32": _conv_timedelta,
    "timedelta_i64": _conv_timedelta,
    "datetime_i64": _conv_datetime,
}


@cache
def _plan(cls: type) -> tuple[tuple[str, Any, Any, bool], ...]:
    plan = []
    for field in fields(cls):
        kind = classify_field(field)
        if isinstance(kind, (EntityField, EntityTupleField)):
            conv: Any = ("entity", kind.type_, isinstance(kind, EntityTupleField))
        else:
            conv = _CONVERTERS.get(field.metadata.get("kafka_type", ""))
        if field.default is not MISSING:
            default: Any = field.default
        elif field.default_factory is not MISSING:
            default = field.default_factory()
        elif get_field_tag(field) is not None:
            default = get_tagged_field_default(field)
        else:
            default = MISSING
        plan.append((field.name, conv, default, True))
    return tuple(plan)


def materialize(cls: type, data: Any) -> Any:
    """Build ``cls`` (a kio entity) from ``data`` (a dict, or already an entity)."""
    if data is None or not isinstance(data, dict):
        return data
    kwargs: dict[str, Any] = {}
    for name, conv, default, _ in _plan(cls):
        if name in data:
            value = data[name]
        elif default is not MISSING:
            kwargs[name] = default
            continue
        else:
            raise KeyError(f"{cls.__qualname__}.{name} is required")
        if conv is None or value is None and not isinstance(conv, tuple):
            kwargs[name] = value
        elif isinstance(conv, tuple):
            _, inner, is_array = conv
            if is_array:
                kwargs[name] = None if value is None else tuple(materialize(inner, v) for v in value)
            else:
                kwargs[name] = materialize(inner, value)
        else:
            kwargs[name] = conv(value)
    return cls(**kwargs)


_NEGATIVE_ONE = ("_id", "epoch", "port")  # "unknown" in Kafka's error responses: ids, epochs, ports


def error_body(cls: type, error_code: int, message: str | None = None) -> dict[str, Any] | None:
    """The top-level error response ``cls`` for a request refused as a whole: ``error_code``
    (and ``error_message`` where the version has one), every array empty, ids, epochs and ports
    -1, other numbers 0, strings empty (null where nullable). None when ``cls`` has no
    top-level ``error_code`` (its errors are per entity)."""
    names = {f.name for f in fields(cls)}
    if "error_code" not in names:
        return None
    body: dict[str, Any] = {"error_code": error_code}
    if "error_message" in names:
        body["error_message"] = message
    for field in fields(cls):
        if field.name in body or field.default is not MISSING or field.default_factory is not MISSING:
            continue
        if get_field_tag(field) is not None:
            continue
        kind = classify_field(field)
        ktype = field.metadata.get("kafka_type", "")
        if isinstance(kind, EntityTupleField) or str(field.type).startswith("tuple"):
            body[field.name] = ()
        elif isinstance(kind, EntityField):
            continue  # a nested struct: left to materialize (required ones raise there)
        elif ktype.startswith(("int", "uint", "float")):
            body[field.name] = -1 if field.name.endswith(_NEGATIVE_ONE) else 0
        elif ktype.startswith("timedelta") or ktype.startswith("datetime"):
            body[field.name] = 0
        elif ktype == "bool":
            body[field.name] = False
        elif ktype in ("string", "bytes", "records"):
            nullable = "None" in str(field.type)
            body[field.name] = None if nullable else ("" if ktype == "string" else b"")
    return body
