"""oncelog's client against a second, independent Kafka implementation: librdkafka's mock cluster.

The mock (``bench/common.py``'s ``MockCluster``, the librdkafka inside the
confluent-kafka wheel, driven through ctypes) runs three brokers, so the
partitions' leaders are spread over several nodes: this checks per-leader
routing, which a single-node oncelog cannot, and that nothing in the client
depends on oncelog's own behaviour. Its read_committed is wrong, so only
produce and read_uncommitted consume run here.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oncelog.client import Consumer, Producer, TopicPartition
from oncelog.client.partitioner import partition_for_key

pytestmark = [pytest.mark.timeout(120)]

PARTITIONS = 6


def _mock_cluster_class() -> Any:
    path = Path(__file__).resolve().parents[2] / "bench" / "common.py"
    spec = importlib.util.spec_from_file_location("oncelog_bench_common", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("oncelog_bench_common", module)
    spec.loader.exec_module(module)
    return module.MockCluster


@pytest.fixture
def mock() -> Iterator[Any]:
    with _mock_cluster_class()(3) as m:
        yield m


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_produce_and_consume_against_librdkafka_mock(mock: Any, codec: str) -> None:
    mock.create_topic("t", PARTITIONS)
    n = 6000
    keys = [b"key-%d" % (i % 97) for i in range(n)]
    with Producer({"bootstrap.servers": mock.bootstrap, "compression.type": codec}) as p:
        futs = [p.produce("t", b"v%06d" % i, key=keys[i]) for i in range(n)]
        assert p.flush(30) == 0
        md = [f.result() for f in futs]
        pid, epoch = p.producer_id
        nodes = {p._core.cluster.leader("t", q) for q in range(PARTITIONS)}
    assert pid >= 0 and epoch == 0  # the mock issued a producer id: idempotence is on
    assert len(nodes) > 1, "all leaders on one broker: the test would not check routing"
    assert [m.partition for m in md] == [partition_for_key(k, PARTITIONS) for k in keys]
    sent = {q: [i for i in range(n) if md[i].partition == q] for q in range(PARTITIONS)}
    for q, ids in sent.items():
        assert [md[i].offset for i in ids] == list(range(len(ids))), f"partition {q}: offsets not in produce order"
    with Consumer({"bootstrap.servers": mock.bootstrap, "auto.offset.reset": "earliest"}) as c:
        c.assign([TopicPartition("t", q) for q in range(PARTITIONS)])
        assert [c.get_watermark_offsets(("t", q)) for q in range(PARTITIONS)] == \
            [(0, len(sent[q])) for q in range(PARTITIONS)]
        got: list[Any] = []
        while any(c.position(("t", q)) < len(sent[q]) for q in range(PARTITIONS)):
            batch = c.consume(2000, 5)
            assert batch, f"no progress after {len(got)} records"
            got.extend(batch)
    assert len(got) == n
    for q, ids in sent.items():
        assert [(m.offset, m.key, m.value) for m in got if m.partition == q] == \
            [(k, keys[i], b"v%06d" % i) for k, i in enumerate(ids)]


def test_leader_move_refreshes_metadata_and_keeps_order(mock: Any) -> None:
    """The mock moves the partition's leader mid-stream: the producer gets NOT_LEADER_OR_FOLLOWER,
    refreshes metadata, resends to the new leader, and every record lands once, in order."""
    import ctypes

    set_leader = mock.lib.rd_kafka_mock_partition_set_leader
    set_leader.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32, ctypes.c_int32]
    set_leader.restype = ctypes.c_int
    mock.create_topic("moving", 1)
    with Producer({"bootstrap.servers": mock.bootstrap, "delivery.timeout.ms": 40000}) as p:
        first = [p.produce("moving", b"a%d" % i, partition=0) for i in range(1000)]
        assert p.flush(20) == 0
        old = p._core.cluster.leader("moving", 0)
        new = 1 + (old % 3)
        assert set_leader(mock.mcluster, b"moving", 0, new) == 0
        second = [p.produce("moving", b"b%d" % i, partition=0) for i in range(1000)]
        assert p.flush(30) == 0
        assert p._core.cluster.leader("moving", 0) == new
        assert p._core.stats["retries"] >= 1  # the first send went to the old leader and was refused
        assert [f.result().offset for f in first + second] == list(range(2000))
    with Consumer({"bootstrap.servers": mock.bootstrap, "auto.offset.reset": "earliest"}) as c:
        c.assign([TopicPartition("moving", 0)])
        got: list[Any] = []
        while c.position(("moving", 0)) < 2000:
            batch = c.consume(2000, 5)
            assert batch, f"no progress after {len(got)} records"
            got.extend(batch)
    assert [m.value for m in got] == [b"a%d" % i for i in range(1000)] + [b"b%d" % i for i in range(1000)]


def _push_produce_errors(mock: Any, *codes: int) -> None:
    """The mock answers the next Produce requests (one per code) with these error codes."""
    import ctypes

    fn = mock.lib.rd_kafka_mock_push_request_errors_array
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int16, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int)]
    fn.restype = None
    fn(mock.mcluster, 0, len(codes), (ctypes.c_int * len(codes))(*codes))  # 0: Produce


@pytest.mark.parametrize("code,bumped", [(45, True), (59, False)], ids=["OUT_OF_ORDER_SEQUENCE_NUMBER",
                                                                         "UNKNOWN_PRODUCER_ID"])
def test_idempotent_producer_recovers_from_sequence_errors(code: int, bumped: bool) -> None:
    """KIP-360 as Java's idempotent producer (TransactionManager.canRetry, bumpIdempotentProducerEpoch):
    a batch answered OUT_OF_ORDER_SEQUENCE_NUMBER is retried after a client-side epoch bump (same
    producer id, epoch + 1, sequences from 0, no InitProducerId: the mock answers one for a known
    idempotent id with INVALID_PRODUCER_ID_MAPPING, which made the producer fatal); one answered
    UNKNOWN_PRODUCER_ID is retried, with a bump only when the answer has a log start offset (the mock's
    error answers say -1, so as in Java the batch is retried as is). Every record lands once, in order,
    and the producer stays usable.

    One request in flight: the mock accepts a batch whose sequence leaves a gap after an injected
    error (a real broker answers it OUT_OF_ORDER_SEQUENCE_NUMBER), which would reorder pipelined batches
    whatever the client does."""
    with _mock_cluster_class()(1) as mock:
        mock.create_topic("seq", 1)
        with Producer({"bootstrap.servers": mock.bootstrap, "linger.ms": 0,
                       "max.in.flight.requests.per.connection": 1}) as p:
            first = [p.produce("seq", b"a%d" % i, partition=0) for i in range(10)]
            assert p.flush(10) == 0
            pid, epoch = p.producer_id
            _push_produce_errors(mock, code)
            second = [p.produce("seq", b"b%d" % i, partition=0) for i in range(10)]
            assert p.flush(20) == 0
            third = [p.produce("seq", b"c%d" % i, partition=0) for i in range(10)]
            assert p.flush(20) == 0
            assert [f.result().offset for f in first + second + third] == list(range(30))
            assert p.producer_id == (pid, epoch + 1 if bumped else epoch)
            assert p._core.stats["epoch_bumps"] == (1 if bumped else 0)
            assert p._core.stats["retries"] >= 1
        with Consumer({"bootstrap.servers": mock.bootstrap, "auto.offset.reset": "earliest"}) as c:
            c.assign([TopicPartition("seq", 0)])
            got: list[Any] = []
            while c.position(("seq", 0)) < 30:
                batch = c.consume(100, 5)
                assert batch, f"no progress after {len(got)} records"
                got.extend(batch)
        assert [m.value for m in got] == [b"%s%d" % (x, i) for x in (b"a", b"b", b"c") for i in range(10)]
