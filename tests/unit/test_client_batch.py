"""Producer-side encoding, sans-IO: murmur2, record batches, the Produce request."""

from __future__ import annotations

import io

import pytest

from oncelog.client.aio.producer import encode_produce_request
from oncelog.client.batch import CODECS, BatchBuilder, encode_record, encode_records
from oncelog.client.partitioner import StickyPartitioner, murmur2, partition_for_key
from oncelog.client.reader import decode_batches
from oncelog.protocol.build import materialize
from oncelog.protocol.codec import decode_request, request_type
from oncelog.protocol.records import parse_batch_header, validate_produce_records
from tests.unit.murmur2_vectors import MURMUR2_JAVA


# Java's Utils.murmur2: Kafka's UtilsTest vectors and high-byte ones (tests/unit/murmur2_vectors.py)
@pytest.mark.parametrize("key, expected", MURMUR2_JAVA)
def test_murmur2_matches_java(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


def test_partition_for_key_is_positive_modulo() -> None:
    assert partition_for_key(b"21", 7) == (-973932308 & 0x7FFFFFFF) % 7
    assert all(0 <= partition_for_key(b"k%d" % i, 5) < 5 for i in range(200))


def test_sticky_partitioner_moves_on_after_a_batch() -> None:
    s = StickyPartitioner()
    first = s.partition("t", 4)
    assert s.partition("t", 4) == first
    s.next("t", 4, first)
    assert s.partition("t", 4) != first


def test_sticky_partitioner_moves_once_when_two_threads_finish_the_same_batch() -> None:
    """The blocking producer moves the sticky partition from its callers' threads and from its loop
    thread: two threads finishing the batch of the same partition at once must move it once (the second
    sees it moved), not twice. A slow random source widens the window between the read and the move."""
    import random
    import threading
    import time

    class SlowRandom(random.Random):
        calls = 0

        def randrange(self, *args: int) -> int:  # type: ignore[override]
            SlowRandom.calls += 1
            time.sleep(0.05)
            return super().randrange(*args)

    s = StickyPartitioner(SlowRandom(1))
    first = s.partition("t", 8)
    SlowRandom.calls = 0
    ts = [threading.Thread(target=s.next, args=("t", 8, first)) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(10)
    assert SlowRandom.calls == 1
    assert s.partition("t", 8) != first


@pytest.mark.parametrize("codec", list(CODECS))
def test_batch_round_trips_through_reader_and_validation(codec: str) -> None:
    b = BatchBuilder(1 << 20, CODECS[codec])
    recs = [(1000 + i, None if i % 3 == 0 else b"k%d" % i, None if i == 5 else b"value-%d" % i * (i % 7 + 1),
             [("h", b"x%d" % i), ("n", None)] if i % 4 == 0 else None) for i in range(300)]
    for ts, k, v, h in recs:
        assert b.append(ts, k, v, h)
    data = b.to_bytes(producer_id=7, producer_epoch=2, base_sequence=41, transactional=False)
    (hdr,) = validate_produce_records(data, 10 << 20)
    assert (hdr.records_count, hdr.producer_id, hdr.producer_epoch, hdr.base_sequence) == (300, 7, 2, 41)
    assert hdr.compression == CODECS[codec]
    assert (hdr.base_timestamp, hdr.max_timestamp) == (1000, 1299)
    (batch,) = decode_batches(data)
    got = [(r.timestamp, r.key, r.value, r.headers or None) for r in batch.records]
    assert got == [(ts, k, v, h) for ts, k, v, h in recs]
    # a resend under a new epoch rebuilds only the header; the CRC still checks
    again = b.to_bytes(producer_id=7, producer_epoch=3, base_sequence=0)
    assert validate_produce_records(again, 10 << 20)[0].producer_epoch == 3
    assert again[61:] == data[61:]


def test_builder_refuses_a_record_past_max_bytes_but_takes_a_first_one() -> None:
    b = BatchBuilder(200)
    assert b.append(0, None, b"x" * 500)  # alone in its batch
    assert not b.append(0, None, b"y")
    assert b.count == 1


@pytest.mark.parametrize("n, first", [(1, 0), (1000, 0), (50, 16380)])
def test_bulk_encoding_equals_per_record_encoding(n: int, first: int) -> None:
    values = [None if i % 11 == 0 else b"v" * (i % 300) for i in range(n)]
    keys = [None if i % 5 == 0 else b"key-%d" % i for i in range(n)]
    bulk = encode_records(values, keys, first_offset_delta=first)
    one_by_one = b"".join(encode_record(first + i, 0, k, v) for i, (k, v) in enumerate(zip(keys, values)))
    assert bulk == one_by_one
    assert encode_records(values) == b"".join(encode_record(i, 0, None, v) for i, v in enumerate(values))


@pytest.mark.parametrize("codec", list(CODECS))
@pytest.mark.parametrize("transactional", [False, True])
def test_builder_header_is_batch_header(codec: str, transactional: bool) -> None:
    """BatchBuilder.header() (the producer's per-batch header, built inline) is byte for byte
    batch_header() of the same body and fields, the transactional bit and the codec included, and
    the whole batch passes the broker's validation (CRC)."""
    from oncelog.client.batch import batch_header

    b = BatchBuilder(1 << 20, CODECS[codec])
    for i in range(20):
        b.append(1_700_000_000_000 + (i * 7) % 13, None if i % 2 else b"k%d" % i, b"value-%d" % i * 9)
    head = b.header(42, 3, 1000, transactional)
    assert head == batch_header(b.body, codec=CODECS[codec], count=20, base_timestamp=b.base_timestamp,
                                max_timestamp=b.max_timestamp, producer_id=42, producer_epoch=3,
                                base_sequence=1000, transactional=transactional)
    h = parse_batch_header(bytes(head) + b.body)
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.is_transactional, h.records_count) == \
        (42, 3, 1000, transactional, 20)
    validate_produce_records(bytes(head) + b.body, 1 << 20)


@pytest.mark.parametrize("version", [3, 7, 8, 9, 11, 12])
@pytest.mark.parametrize("txn", [None, "tx-1"])
def test_produce_request_encoding_matches_kio(version: int, txn: str | None) -> None:
    b1 = BatchBuilder(1 << 20)
    b1.append(5, b"k", b"v")
    b2 = BatchBuilder(1 << 20, CODECS["zstd"])
    b2.append(6, None, b"w" * 100)
    r1, r2 = b1.to_bytes(), b2.to_bytes(1, 0, 0)
    assert bytes(b2.header(1, 0, 0)) + b2.body == r2  # the producer sends (header, body) as parts
    topics = {"t": [(0, r1), (3, (b2.header(1, 0, 0), b2.body))], "u": [(1, r1)]}
    ours = b"".join(encode_produce_request(version, txn, -1, 30000, topics))
    entity = materialize(request_type(0, version), {
        "transactional_id": txn, "acks": -1, "timeout": 30000,
        "topic_data": [{"name": name, "partition_data": [{"index": i, "records": r if isinstance(r, bytes) else
                                                          bytes(r[0]) + r[1]} for i, r in parts]}
                       for name, parts in topics.items()]})
    from kio.serial import entity_writer
    out = io.BytesIO()
    entity_writer(type(entity))(out, entity)
    assert ours == out.getvalue()
    decoded = decode_request(0, version, ours, 0)
    assert [t.name for t in decoded.topic_data] == ["t", "u"]
    assert parse_batch_header(decoded.topic_data[0].partition_data[1].records).records_count == 1


@pytest.mark.parametrize("size, keyed", [(1024, False), (1024, True), (100, False), (20_000, False)])
def test_bulk_append_keeps_batches_within_batch_size(size: int, keyed: bool) -> None:
    """produce_batch's records are cut into batches of at most batch.size bytes (one record alone may be
    larger), as the per-record path and Java do; they were cut after the record that crossed it."""
    import asyncio
    import types

    from oncelog.client.aio.producer import ProducerCore
    from oncelog.client.config import parse_config

    core = ProducerCore(parse_config({"bootstrap.servers": "127.0.0.1:9"}, "producer"))
    core._idle = asyncio.Event()
    known = types.SimpleNamespace(partitions=1)
    core.cluster.topic = lambda name: known  # type: ignore[method-assign]  # a known topic
    n = 100
    values = [bytes([i % 256]) * size for i in range(n)]
    keys = [b"key-%d" % i for i in range(n)] if keyed else None
    core.append_many("t", values, keys, 0, 1_700_000_000_000, [None] * n)
    batches = list(core.partitions[("t", 0)].ready)
    assert sum(b.count for b in batches) == n
    for b in batches:
        assert b.count == 1 or b.builder.size <= core.batch_size, (b.count, b.builder.size)
    # and full: the next record would not have fitted
    per = 16384 if size < 16384 else 1
    assert max(b.count for b in batches) == max(1, min(n, (per - 61) // (size + (7 if keyed else 0) + 10)))
    decoded = decode_batches(b"".join(b.builder.to_bytes() for b in batches))
    assert [r.value for d in decoded for r in d.records] == values


def test_encode_sections_is_encode_records_per_batch() -> None:
    """produce_batch encodes all the batches of a call in one pass (encode_sections): each batch's
    records section is byte for byte what encode_records makes for that batch alone (offset deltas
    from 0 in each batch), with or without keys, with null keys and values, over the chunks it works
    in, and for a batch of more than 16,384 records (offset deltas past the varint table)."""
    import random

    from oncelog.client.batch import encode_sections

    rng = random.Random(5)
    for trial in range(30):
        n = rng.choice([1, 2, 15, 300, 9000, 20000])
        values = [None if rng.random() < 0.05 else rng.randbytes(rng.choice([0, 3, 60, 64, 200, 1024, 9000]))
                  for _ in range(n)] if n <= 300 else [b"v%d" % i for i in range(n)]
        keys = None if trial % 2 else [None if rng.random() < 0.3 else b"k%d" % i for i in range(n)]
        cuts = sorted(set(rng.sample(range(1, n), min(n - 1, rng.choice([0, 1, 5, 40]))))) if n > 1 else []
        if n == 20000:
            cuts = [19000]  # one batch of 19,000 records
        edges = [0, *cuts, n]
        bounds = list(zip(edges, edges[1:]))
        got = encode_sections(values, keys, bounds)
        want = [encode_records(values[i:j], None if keys is None else keys[i:j]) for i, j in bounds]
        assert got == want, (trial, n)
