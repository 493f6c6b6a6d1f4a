"""Conditional produce (KIP-27): the wire form, shared by broker and client.

A Produce request of a flexible version (v9+) may carry, in the tag block of
a partition's entry (``PartitionProduceData``), the tagged field
:data:`EXPECTED_OFFSET_TAG` whose value is an int64 (8 bytes, big-endian, as
Kafka encodes an int64 tagged field): the offset the partition's batch must
get as its base offset. The broker appends nothing of the request unless every
such partition's next offset (log end offset) equals its expected offset.

On refusal the partition's response entry (``PartitionProduceResponse``)
carries the same tag number with the partition's actual next offset (int64).

Support is advertised in ApiVersions v3+ as the supported feature
:data:`FEATURE_NAME` with ``min_version`` <= :data:`FEATURE_VERSION` <=
``max_version``; a broker that does not advertise it (Apache Kafka, an older
oncelog) ignores the tag, so a client must check the feature before sending.

This module knows only bytes (no broker or client imports), so the client's
hand-written Produce encoder and the broker both use it. See
docs/conditional-publish.md.
"""

from __future__ import annotations

import struct

__all__ = [
    "EXPECTED_OFFSET_TAG",
    "FEATURE_NAME",
    "FEATURE_VERSION",
    "NEXT_OFFSET_TAG",
    "NO_EXPECTED_OFFSET",
    "ConditionError",
    "feature_supported",
    "next_offset_tag_block",
    "parse_offset_tag",
    "partition_tag_block",
]

# Kafka numbers a struct's tagged fields from 0 upward and has used single
# digits so far; 10000 is far from anything it will assign, and still a
# 2-byte unsigned varint (0x90 0x4E).
EXPECTED_OFFSET_TAG = 10_000
NEXT_OFFSET_TAG = 10_000  # on PartitionProduceResponse: the partition's actual next offset

FEATURE_NAME = "oncelog.conditional.produce"
FEATURE_VERSION = 1

NO_EXPECTED_OFFSET = -1  # KIP-27's sigil: the same as no tag at all

_I64 = struct.Struct(">q")
# count 1, tag 10000 (uvarint 0x90 0x4E), size 8
_BLOCK_PREFIX = b"\x01\x90\x4e\x08"


class ConditionError(ValueError):
    """A malformed expected-offset tag (wrong size, negative offset other than -1, repeated)."""


def partition_tag_block(expected_offset: int) -> bytes:
    """The tag block of one ``PartitionProduceData`` (replacing its empty ``b"\\x00"``)."""
    if expected_offset < 0:
        raise ValueError(f"expected offset {expected_offset} must be >= 0")
    return _BLOCK_PREFIX + _I64.pack(expected_offset)


def next_offset_tag_block(next_offset: int) -> bytes:
    """The tag block of one ``PartitionProduceResponse`` carrying the actual next offset."""
    return _BLOCK_PREFIX + _I64.pack(next_offset)


def parse_offset_tag(values: list[bytes]) -> int:
    """The offset carried by the raw value(s) of the tag; -1 means "no condition".

    ``values`` holds every occurrence of the tag in one tag block (a valid
    block has exactly one). Raises :class:`ConditionError` otherwise."""
    if len(values) != 1:
        raise ConditionError(f"tag {EXPECTED_OFFSET_TAG} appears {len(values)} times in one tag block")
    raw = values[0]
    if len(raw) != 8:
        raise ConditionError(f"tag {EXPECTED_OFFSET_TAG} must be an int64 (8 bytes), got {len(raw)} bytes")
    (offset,) = _I64.unpack(raw)
    if offset < NO_EXPECTED_OFFSET:
        raise ConditionError(f"expected offset {offset} is negative")
    return offset


def feature_supported(supported_features: object) -> bool:
    """Whether an ApiVersions (v3+) response's ``supported_features`` advertise this wire form.

    Accepts kio entities or dicts with ``name``/``min_version``/``max_version``;
    None or empty (ApiVersions v0-v2, Apache Kafka, an older oncelog) is False."""
    for f in supported_features or ():  # type: ignore[attr-defined]
        get = f.get if isinstance(f, dict) else lambda k, f=f: getattr(f, k)
        if get("name") == FEATURE_NAME and int(get("min_version")) <= FEATURE_VERSION <= int(get("max_version")):
            return True
    return False
