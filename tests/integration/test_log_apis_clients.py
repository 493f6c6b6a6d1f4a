"""Log APIs with real clients.

- confluent-kafka's consumer validates positions that carry a leader epoch with
  OffsetForLeaderEpoch (seen in librdkafka's "protocol" debug log) and acts on
  our answers: a valid position is consumed, one beyond the end of its epoch is
  reported as log truncation (or reset to that end), and a consumer that keeps
  running across a broker restart (a new leader epoch) goes on without a gap
  or a duplicate; and still detects truncation after the leader-epoch checkpoint
  was lost (the cache is rebuilt from the batches).
- confluent-kafka's AdminClient.list_offsets with OffsetSpec.max_timestamp().
- kafka-python's KafkaAdminClient.describe_log_dirs.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from oncelog.client.admin import Admin
from oncelog.testing import EmbeddedBroker

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore:read_text is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:open_text is deprecated:DeprecationWarning"),
]

T0 = 1_700_000_000_000
LOG_TRUNCATION = -140  # librdkafka's RD_KAFKA_RESP_ERR__LOG_TRUNCATION


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    b = EmbeddedBroker(data_dir=tmp_path / "data", log_path=tmp_path / "broker.log")
    b.start()
    try:
        yield b
    finally:
        b.close()


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def produce(bootstrap: str, topic: str, values: list[bytes], timestamps: list[int] | None = None) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i, v in enumerate(values):
        p.produce(topic, value=v, partition=0, **({"timestamp": timestamps[i]} if timestamps else {}))
    assert p.flush(20) == 0


def consumer(bootstrap: str, reset: str, name: str) -> tuple[Consumer, _Lines]:
    lines = _Lines()
    logger = logging.getLogger(f"rdkafka.{name}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    logger.addHandler(lines)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False,
                  "auto.offset.reset": reset, "debug": "fetch,protocol", "logger": logger,
                  "topic.metadata.refresh.interval.ms": 1000})
    return c, lines


def first_event(c: Consumer, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            return ("error", m.error().code(), m.error().str())
        return (m.offset(), m.leader_epoch(), m.value())
    raise AssertionError("no message or error")


def o4le_round_trips(lines: _Lines) -> tuple[int, int]:
    sent = sum("Sent OffsetForLeaderEpochRequest" in line for line in lines.lines)
    got = sum("Received OffsetForLeaderEpochResponse" in line for line in lines.lines)
    return sent, got


@pytest.fixture
def two_epochs(broker: EmbeddedBroker) -> EmbeddedBroker:
    """Topic ``t``: offsets 0-2 written in leader epoch 0, 3-7 in epoch 1 (after a restart)."""
    assert Admin(broker.bootstrap).create_topic("t", partitions=1) is None
    produce(broker.bootstrap, "t", [b"a0", b"a1", b"a2"])
    broker.restart()
    produce(broker.bootstrap, "t", [b"b0", b"b1", b"b2", b"b3", b"b4"])
    return broker


@pytest.mark.parametrize("offset,epoch,reset,want", [
    (2, 0, "error", (2, 0, b"a2")),  # inside epoch 0 (which ends at 3): valid
    (6, 1, "error", (6, 1, b"b3")),  # inside epoch 1, the current one: valid
    (6, 0, "error", "truncation"),  # epoch 0 ended at 3 < 6: truncation detected
    (6, 0, "earliest", (3, 1, b"b0")),  # ... and with a reset policy, resumed at epoch 0's end
    (6, 9, "error", "truncation"),  # an epoch the broker never had: undefined answer
])
def test_confluent_validates_positions_with_offset_for_leader_epoch(
        two_epochs: EmbeddedBroker, offset: int, epoch: int, reset: str, want: Any) -> None:
    c, lines = consumer(two_epochs.bootstrap, reset, f"{offset}-{epoch}-{reset}")
    try:
        c.assign([TopicPartition("t", 0, offset, leader_epoch=epoch)])
        got = first_event(c)
    finally:
        c.close()
    sent, received = o4le_round_trips(lines)
    assert sent >= 1 and received >= 1, "librdkafka did not validate the position"
    if want == "truncation":
        assert got[:2] == ("error", LOG_TRUNCATION), got
    else:
        assert got == want


def test_confluent_validation_survives_a_lost_epoch_checkpoint(two_epochs: EmbeddedBroker) -> None:
    """The leader-epoch checkpoint deleted while the broker is down: the cache is rebuilt
    from the batches, so a position past the end of epoch 0 is still seen as truncated."""
    two_epochs.stop()
    (two_epochs.data_dir / "t-0" / "leader-epoch-checkpoint").unlink()
    two_epochs.start()
    for offset, epoch, want in ((6, 0, "truncation"), (6, 1, (6, 1, b"b3"))):
        c, lines = consumer(two_epochs.bootstrap, "error", f"lost-{offset}-{epoch}")
        try:
            c.assign([TopicPartition("t", 0, offset, leader_epoch=epoch)])
            got = first_event(c)
        finally:
            c.close()
        assert o4le_round_trips(lines)[1] >= 1, "librdkafka did not validate the position"
        if want == "truncation":
            assert got[:2] == ("error", LOG_TRUNCATION), got
        else:
            assert got == want


def test_confluent_consumer_carries_on_across_a_restart(broker: EmbeddedBroker) -> None:
    assert Admin(broker.bootstrap).create_topic("r", partitions=1) is None
    produce(broker.bootstrap, "r", [b"%d" % i for i in range(5)])
    c, lines = consumer(broker.bootstrap, "error", "restart")
    seen: list[tuple[int, int]] = []
    try:
        c.assign([TopicPartition("r", 0, 0)])
        while len(seen) < 5:
            m = c.poll(1.0)
            assert m is None or not m.error(), m.error() if m else None
            if m is not None:
                seen.append((m.offset(), m.leader_epoch()))
        before = o4le_round_trips(lines)[0]
        broker.restart()  # leader epoch 0 -> 1
        produce(broker.bootstrap, "r", [b"%d" % i for i in range(5, 10)])
        deadline = time.monotonic() + 60
        while len(seen) < 10 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error():
                assert m.error().code() not in (LOG_TRUNCATION,), m.error()
                continue
            if m is not None:
                seen.append((m.offset(), m.leader_epoch()))
    finally:
        c.close()
    assert seen == [(i, 0) for i in range(5)] + [(i, 1) for i in range(5, 10)]
    # the new epoch made librdkafka validate its position against our epoch cache
    assert o4le_round_trips(lines)[0] > before


def test_confluent_list_offsets_max_timestamp(broker: EmbeddedBroker) -> None:
    assert Admin(broker.bootstrap).create_topic("m", partitions=1) is None
    stamps = [T0 + 3, T0 + 50, T0 + 7, T0 + 50, T0 + 1]
    for i, ts in enumerate(stamps):  # one batch each
        produce(broker.bootstrap, "m", [b"%d" % i], timestamps=[ts])
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    tp = TopicPartition("m", 0)
    res = admin.list_offsets({tp: OffsetSpec.max_timestamp()}, request_timeout=10)[tp].result(timeout=20)
    assert (res.offset, res.timestamp) == (1, T0 + 50)  # the first record with the largest timestamp
    res = admin.list_offsets({tp: OffsetSpec.latest()}, request_timeout=10)[tp].result(timeout=20)
    assert (res.offset, res.leader_epoch) == (5, 0)
    res = admin.list_offsets({tp: OffsetSpec.for_timestamp(T0 + 5)}, request_timeout=10)[tp].result(timeout=20)
    assert (res.offset, res.timestamp) == (1, T0 + 50)


def test_kafka_python_describe_log_dirs(broker: EmbeddedBroker) -> None:
    from kafka import KafkaAdminClient

    admin_ = Admin(broker.bootstrap)
    assert admin_.create_topic("x", partitions=2) is None
    produce(broker.bootstrap, "x", [b"v" * 100] * 7)
    kp = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        out = kp.describe_log_dirs()
        some = kp.describe_log_dirs({"x": [1]})
    finally:
        kp.close()
    assert [o["broker"] for o in out] == [1]
    (d,) = out[0]["log_dirs"]
    assert d["log_dir"] == str(broker.data_dir.resolve())
    sizes = {(t["name"], p["partition_index"]): p["partition_size"] for t in d["topics"] for p in t["partitions"]}
    on_disk = {("x", i): sum(f.stat().st_size for f in (broker.data_dir / f"x-{i}").glob("*.log")) for i in (0, 1)}
    assert sizes == on_disk and on_disk[("x", 0)] > 700 and on_disk[("x", 1)] == 0
    (d,) = some[0]["log_dirs"]
    assert {t["name"]: [p["partition_index"] for p in t["partitions"]] for t in d["topics"]} == {"x": [1]}
