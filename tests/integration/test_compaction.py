"""Log compaction against a real broker with real clients (docs/compaction.md).

A dictionary model is the oracle: after every cleaner pass a full read of the
topic gives the last value of every key, with offsets increasing and gaps
where records were removed; aborted transactional writes never appear and
committed ones never go missing; tombstones disappear once
``delete.retention.ms`` has passed after the pass that first kept them.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from pathlib import Path
from typing import Any

import pytest

from oncelog.storage.log import CRASH_ENV, SWAP_STEPS
from oncelog.testing import EmbeddedBroker



def start_broker(tmp_path: Path, config: dict[str, str] | None = None) -> EmbeddedBroker:
    return EmbeddedBroker(data_dir=tmp_path / "data", config=config, log_path=tmp_path / "broker.log").start()

TOPIC = "kv"
CLEANER = {"log.cleaner.backoff.ms": "100", "log.retention.check.interval.ms": "100"}
COMPACT = {
    "cleanup.policy": "compact",
    "segment.bytes": "16384",
    "min.cleanable.dirty.ratio": "0.01",
    "delete.retention.ms": "1500",
}


def _create(b: EmbeddedBroker, name: str = TOPIC, **extra: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(name, 1, 1, config={**COMPACT, **extra})])[name].result(timeout=20)


def _passes(b: EmbeddedBroker) -> list[str]:
    return re.findall(r"kv-0: compaction pass done: .*", b.log_path.read_text())


def _wait_passes(b: EmbeddedBroker, more_than: int, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        n = len(_passes(b))
        if n > more_than:
            return n
        time.sleep(0.05)
    raise AssertionError(f"no compaction pass after {more_than} within {timeout} s; log: {b.log_path}")


def read_all(b: EmbeddedBroker, topic: str = TOPIC, committed: bool = True,
             partition: int = 0) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record, offset 0 to the end, with confluent-kafka."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer({
        "bootstrap.servers": b.bootstrap, "group.id": "readback", "enable.auto.commit": False,
        "isolation.level": "read_committed" if committed else "read_uncommitted",
        "enable.partition.eof": True, "auto.offset.reset": "earliest", "fetch.wait.max.ms": 50,
    })
    out = []
    try:
        c.assign([TopicPartition(topic, partition, 0)])
        deadline = time.monotonic() + 30
        while True:
            assert time.monotonic() < deadline, "read timed out"
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                break
            out.append((m.offset(), m.key(), m.value()))
    finally:
        c.close()
    return out


def last_values(records: list[tuple[int, bytes | None, bytes | None]]) -> dict[bytes, bytes]:
    state: dict[bytes, bytes] = {}
    for _off, key, value in records:
        assert key is not None
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    return state


def check_against(records: list[tuple[int, Any, Any]], model: dict[bytes, bytes | None], written: set[bytes]) -> None:
    offsets = [o for o, _k, _v in records]
    assert offsets == sorted(set(offsets)), "offsets must increase"
    live = {k: v for k, v in model.items() if v is not None}
    assert last_values(records) == live
    for _o, _k, v in records:
        assert v is None or v in written, f"{v!r} was never committed"


class Writer:
    """Random updates and deletes over a small key space: plain (idempotent) writes and
    transactions, some aborted. ``model`` holds what a reader must see."""

    def __init__(self, bootstrap: str, keys: int = 60, seed: int = 7) -> None:
        from confluent_kafka import Producer

        self.rng = random.Random(seed)
        self.keys = [f"key-{i:03d}".encode() for i in range(keys)]
        self.plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2, "batch.size": 4000,
                               "enable.idempotence": True})
        self.txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": "compaction-writer",
                             "linger.ms": 2, "batch.size": 4000})
        self.txn.init_transactions(30)
        self.model: dict[bytes, bytes | None] = {}
        self.written: set[bytes] = set()  # every committed value
        self.aborted: set[bytes] = set()
        self.n = 0

    def _value(self, tag: str) -> bytes:
        self.n += 1
        return f"{tag}-{self.n}-".encode() + b"x" * self.rng.randrange(10, 120)

    def plain_round(self, count: int) -> None:
        for _ in range(count):
            key = self.rng.choice(self.keys)
            value = None if self.rng.random() < 0.15 else self._value("p")
            self.plain.produce(TOPIC, key=key, value=value)
            self.model[key] = value
            if value is not None:
                self.written.add(value)
        assert self.plain.flush(30) == 0

    def txn_round(self, count: int, commit: bool) -> None:
        self.txn.begin_transaction()
        staged: dict[bytes, bytes | None] = {}
        values: set[bytes] = set()
        for _ in range(count):
            key = self.rng.choice(self.keys)
            value = None if self.rng.random() < 0.1 else self._value("c" if commit else "a")
            self.txn.produce(TOPIC, key=key, value=value)
            staged[key] = value
            if value is not None:
                values.add(value)
        if commit:
            self.txn.commit_transaction(30)
            self.model.update(staged)
            self.written |= values
        else:
            self.txn.abort_transaction(30)
            self.aborted |= values

    def round(self) -> None:
        self.plain_round(self.rng.randrange(100, 300))
        self.txn_round(self.rng.randrange(5, 40), commit=self.rng.random() < 0.6)
        self.plain_round(self.rng.randrange(20, 80))

    def close(self) -> None:
        self.plain.flush(10)


def _segment_bases(b: EmbeddedBroker, topic: str = TOPIC) -> list[int]:
    return sorted(int(p.stem) for p in (b.data_dir / f"{topic}-0").glob("*.log") if p.stem.isdigit())


def test_random_updates_and_deletes_equal_the_model_after_every_pass(tmp_path: Path) -> None:
    b = start_broker(tmp_path, config=CLEANER)
    try:
        _create(b, **{"segment.ms": "1000"})
        w = Writer(b.bootstrap)
        produced = 0
        passes = 0
        checked = 0
        for _round in range(8):
            # produce while the cleaner runs (backoff 100 ms: several passes per round)
            w.round()
            produced = w.n
            passes = _wait_passes(b, passes)
            records = read_all(b)
            check_against(records, w.model, w.written)
            assert not {v for _o, _k, v in records} & w.aborted, "an aborted write reappeared"
            checked += 1
        assert checked == 8
        records = read_all(b)
        assert len(records) < produced / 2, "compaction removed almost nothing"
        # aborted records are gone from the cleaned part of the log, not just filtered by readers
        first_dirty = int((b.data_dir / f"{TOPIC}-0" / "cleaner-offset-checkpoint").read_text())
        uncommitted = read_all(b, committed=False)
        assert [o for o, _k, v in uncommitted if v in w.aborted and o < first_dirty] == []
        assert any(v in w.aborted for _o, _k, v in uncommitted) or not w.aborted or first_dirty > 0
        offsets = [o for o, _k, _v in records]
        assert any(b2 - a > 1 for a, b2 in zip(offsets, offsets[1:])), "no gaps: nothing was compacted"
        # tombstones go once delete.retention.ms has passed after the pass that stamped them:
        # every tombstone written so far must vanish while other keys are written (their
        # segments roll, so the ones holding the tombstones become cleanable)
        end_before = _end_offset(b)
        tombstones = [o for o, _k, v in records if v is None]
        assert tombstones, "the writer wrote no tombstone that survived a pass"
        start = len(_passes(b))
        deadline = time.monotonic() + 60
        filler = 0
        while True:
            for _ in range(100):
                filler += 1
                key, value = f"filler-{filler % 20}".encode(), w._value("f")
                w.plain.produce(TOPIC, key=key, value=value)
                w.model[key] = value
                w.written.add(value)
            assert w.plain.flush(30) == 0
            n = _wait_passes(b, len(_passes(b)))
            records = read_all(b)
            check_against(records, w.model, w.written)
            old_tombstones = [o for o, _k, v in records if v is None and o < end_before]
            if n - start >= 2 and not old_tombstones:
                break
            assert time.monotonic() < deadline, f"tombstones older than delete.retention.ms remain: {old_tombstones[:5]}"
        w.close()
    finally:
        b.close()


def test_keyless_records_are_refused_per_record_on_a_compacted_topic(tmp_path: Path) -> None:
    from confluent_kafka import KafkaError, Producer

    from oncelog.client.connection import Connection
    from oncelog.protocol.records import Record, encode_record_batch

    b = start_broker(tmp_path, config=CLEANER)
    try:
        _create(b)
        _create(b, "plain", **{"cleanup.policy": "delete"})
        p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0})
        errors: dict[str, Any] = {}

        def delivered(err: Any, msg: Any) -> None:
            errors[msg.topic()] = err

        p.produce(TOPIC, value=b"no key", on_delivery=delivered)
        p.produce("plain", value=b"no key is fine here", on_delivery=delivered)
        assert p.flush(20) == 0
        assert errors[TOPIC] is not None and errors[TOPIC].code() == KafkaError.INVALID_RECORD, errors
        assert errors["plain"] is None
        # raw protocol: the record errors name each keyless record of the batch
        batch = encode_record_batch([Record(b"k", b"v"), Record(None, b"v"), Record(b"k2", b"v"), Record(None, None)])
        with Connection(b.bootstrap) as c:
            resp = c.request(0, 9, {
                "transactional_id": None, "acks": -1, "timeout": 10000,
                "topic_data": [{"name": TOPIC, "partition_data": [{"index": 0, "records": batch}]}],
            })
        part = resp.responses[0].partition_responses[0]
        assert part.error_code == 87
        assert [e.batch_index for e in part.record_errors] == [1, 3]
        assert "Compacted topic cannot accept message without key" in part.record_errors[0].batch_index_error_message
        assert read_all(b) == []  # nothing of the batch was written
    finally:
        b.close()


def _fill(b: EmbeddedBroker, keys: int = 40, rounds: int = 12) -> tuple[dict[bytes, bytes | None], set[bytes]]:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 2, "batch.size": 3000, "compression.type": "lz4"})
    model: dict[bytes, bytes | None] = {}
    written: set[bytes] = set()
    rng = random.Random(3)
    for i in range(rounds * 100):
        key = f"k{rng.randrange(keys)}".encode()
        value = None if rng.random() < 0.1 else f"v{i}-{rng.getrandbits(160):040x}".encode()
        p.produce(TOPIC, key=key, value=value)
        model[key] = value
        if value is not None:
            written.add(value)
    assert p.flush(30) == 0
    return model, written


_PASS_LINE = re.compile(r"^(\S+ \S+) INFO oncelog\.cleaner: kv-(\d): compaction pass done: offsets \[\d+, \d+\) "
                        r"(?:by cleaner (\d+), )?.* ([\d.]+) s$", re.M)


def test_two_cleaner_threads_clean_two_partitions_at_once(tmp_path: Path) -> None:
    """log.cleaner.threads=2: both partitions of a topic are cleaned at the same time, each by
    one cleaner (the passes' spans, from their log lines, overlap), and each ends equal to
    its model."""
    from datetime import datetime

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    # the cleaner is off while both partitions fill up, so both are dirty when it starts
    b = start_broker(tmp_path, config={**CLEANER, "log.cleaner.enable": "false"})
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic(TOPIC, 2, 1, config=COMPACT)])[TOPIC].result(timeout=20)
        p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 2, "batch.size": 3000})
        rng = random.Random(11)
        models: list[dict[bytes, bytes | None]] = [{}, {}]
        written: set[bytes] = set()
        for i in range(3000):
            part = i % 2
            key = f"k{rng.randrange(50)}".encode()
            value = None if rng.random() < 0.1 else f"v{i}-{rng.getrandbits(400):0100x}".encode()
            p.produce(TOPIC, key=key, value=value, partition=part)
            models[part][key] = value
            if value is not None:
                written.add(value)
        assert p.flush(30) == 0
        b.stop()
        # ~220 KB a partition, read twice (map and copy) at 200 KB/s a cleaner: passes of ~2 s
        b.config.update({"log.cleaner.enable": "true", "log.cleaner.threads": "2",
                         "log.cleaner.io.max.bytes.per.second": "400000"})
        b.start()
        deadline = time.monotonic() + 60
        while True:
            lines = _PASS_LINE.findall(b.log_path.read_text())
            if {part for _t, part, _c, _s in lines} == {"0", "1"}:
                break
            assert time.monotonic() < deadline, f"not both partitions cleaned; log: {b.log_path}"
            time.sleep(0.1)
        spans = {}
        for stamp, part, cleaner, secs in lines:
            end = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
            spans.setdefault(part, (end - float(secs), end, cleaner))
        (s0, e0, c0), (s1, e1, c1) = spans["0"], spans["1"]
        assert min(e0 - s0, e1 - s1) > 0.5, spans  # long enough for an overlap to mean something
        assert s0 < e1 and s1 < e0, f"the passes did not overlap: {spans}"  # at the same time ...
        assert {c0, c1} == {"0", "1"}, lines  # ... by two cleaners
        for part in (0, 1):
            records = read_all(b, partition=part)
            check_against(records, models[part], written)
            assert len(records) < 1500 / 2, "compaction removed almost nothing"
    finally:
        b.close()


def test_log_cleaner_threads_reconfiguration_is_checked_and_applied_as_kafka_does(tmp_path: Path) -> None:
    """A dynamic log.cleaner.threads is checked against the running count, and applied at
    once: the cleaners are restarted with it (Kafka's LogCleaner.reconfigure), so the next
    change is checked against the new count, the restarted cleaner cleans, and the stored
    value is what the next start runs."""
    from oncelog.client.connection import Connection

    b = start_broker(tmp_path, config={**CLEANER, "log.cleaner.threads": "2"})
    try:
        def alter(value: str) -> tuple[int, str | None]:
            with Connection(b.bootstrap) as c:
                r = c.request(44, 0, {"resources": [{"resource_type": 4, "resource_name": "", "configs": [
                    {"name": "log.cleaner.threads", "config_operation": 0, "value": value}]}],
                    "validate_only": False})
            res = r.responses[0]
            return int(res.error_code), res.error_message

        assert alter("0") == (42, "Log cleaner threads should be at least 1")  # INVALID_REQUEST
        assert alter("-1")[0] == 42
        assert alter("5") == (42, "Log cleaner threads cannot be increased to more than double the current value 2")
        assert alter("4") == (0, None)
        # running with 4 now, without a restart
        assert alter("1") == (42, "Log cleaner threads cannot be reduced to less than half the current value 4")
        assert alter("2") == (0, None)
        assert alter("1") == (0, None)
        deadline = time.monotonic() + 30
        while "log cleaner restarted with 1 thread(s)" not in b.log_path.read_text():
            assert time.monotonic() < deadline, f"the cleaner was not restarted; log: {b.log_path}"
            time.sleep(0.05)
        # the restarted cleaner cleans
        _create(b)
        model, written = _fill(b)
        _wait_passes(b, 0)
        check_against(read_all(b), model, written)
        # stored, and used from the next start
        b.restart()
        assert alter("3") == (42, "Log cleaner threads cannot be increased to more than double the current value 1")
    finally:
        b.close()


@pytest.mark.parametrize("step", SWAP_STEPS)
def test_kill_at_every_step_of_the_swap_then_the_log_equals_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    b = start_broker(tmp_path, config={**CLEANER, "log.cleaner.enable": "false"})
    try:
        _create(b)
        model, written = _fill(b)
        b.stop()
        # restart with the cleaner on and the hook armed (the broker reads it at each swap step)
        b.config["log.cleaner.enable"] = "true"
        monkeypatch.setenv(CRASH_ENV, step)
        try:
            b.start()
        except RuntimeError as exc:  # it may crash before it says it is ready
            assert "exited with 137" in str(exc), exc
        if b.proc is not None:
            try:
                code = b.proc.wait(30)
            except Exception:
                raise AssertionError(f"the broker did not crash at step {step!r}; log: {b.log_path}") from None
            assert code == 137
            b._close_proc()
        names = [p.name for p in (b.data_dir / f"{TOPIC}-0").iterdir()]
        expected_leftover = {
            "cleaned": ".cleaned", "swapend": "cleaner-swap", "swap": ".swap",
            "install-deleted": ".deleted", "install": ".deleted", "finish": ".deleted",
        }[step]
        assert any(n.endswith(expected_leftover) for n in names), (step, sorted(names))
        monkeypatch.delenv(CRASH_ENV)
        b.config["log.cleaner.enable"] = "false"  # look at what recovery left, with no cleaner running
        b.start()
        names = [p.name for p in (b.data_dir / f"{TOPIC}-0").iterdir()]
        assert not [n for n in names if n.endswith((".cleaned", ".swap", ".deleted", "cleaner-swap"))], names
        check_against(read_all(b), model, written)
        # and the cleaner goes on from there
        b.stop()
        b.config["log.cleaner.enable"] = "true"
        b.start()
        _wait_passes(b, len(_passes(b)))
        check_against(read_all(b), model, written)
    finally:
        b.close()


def test_three_python_clients_read_a_compacted_topic_with_gaps(tmp_path: Path) -> None:
    b = start_broker(tmp_path, config=CLEANER)
    try:
        _create(b)
        w = Writer(b.bootstrap, keys=30)
        for _ in range(3):
            w.round()
        w.txn_round(10, commit=False)  # an aborted transaction, then a committed one
        w.txn_round(10, commit=True)
        _wait_passes(b, len(_passes(b)))
        expected = read_all(b)
        offsets = [o for o, _k, _v in expected]
        assert any(y - x > 1 for x, y in zip(offsets, offsets[1:])), "no gaps"
        end = _end_offset(b)
        assert offsets[-1] < end
        assert _kafka_python(b, end) == expected
        assert asyncio.run(_aiokafka(b, end)) == expected
        w.close()
    finally:
        b.close()


def _end_offset(b: EmbeddedBroker) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "x"})
    try:
        return c.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=10)[1]
    finally:
        c.close()


def _kafka_python(b: EmbeddedBroker, end: int) -> list[tuple[int, Any, Any]]:
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=b.bootstrap, isolation_level="read_committed", enable_auto_commit=False,
                      auto_offset_reset="earliest", consumer_timeout_ms=10000)
    tp = TopicPartition(TOPIC, 0)
    c.assign([tp])
    c.seek_to_beginning(tp)
    out = []
    try:
        deadline = time.monotonic() + 30
        while c.position(tp) < end and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=500).values():
                out += [(r.offset, r.key, r.value) for r in recs]
    finally:
        c.close()
    return out


async def _aiokafka(b: EmbeddedBroker, end: int) -> list[tuple[int, Any, Any]]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    c = AIOKafkaConsumer(bootstrap_servers=b.bootstrap, isolation_level="read_committed",
                         enable_auto_commit=False, auto_offset_reset="earliest")
    await c.start()
    tp = TopicPartition(TOPIC, 0)
    c.assign([tp])
    await c.seek_to_beginning(tp)
    out = []
    try:
        deadline = time.monotonic() + 30
        while await c.position(tp) < end and time.monotonic() < deadline:
            for recs in (await c.getmany(timeout_ms=500)).values():
                out += [(r.offset, r.key, r.value) for r in recs]
    finally:
        await c.stop()
    return out


def test_describe_configs_shows_the_cleaner_settings(tmp_path: Path) -> None:
    from confluent_kafka.admin import AdminClient, ConfigResource

    b = start_broker(tmp_path, config={**CLEANER, "log.cleaner.dedupe.buffer.size": "1048576",
                                       "log.cleaner.io.max.bytes.per.second": "5000000.0"})
    try:
        _create(b)
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        broker_res = ConfigResource(ConfigResource.Type.BROKER, "1")
        got = admin.describe_configs([broker_res])[broker_res].result(timeout=20)
        assert got["log.cleaner.enable"].value == "true"
        assert got["log.cleaner.threads"].value == "1"
        assert got["log.cleaner.dedupe.buffer.size"].value == "1048576"
        assert got["log.cleaner.io.max.bytes.per.second"].value == "5000000.0"
        assert got["log.cleaner.backoff.ms"].value == "100"
        assert got["log.cleaner.min.cleanable.ratio"].value == "0.5"
        assert got["log.cleaner.delete.retention.ms"].value == "86400000"
        topic_res = ConfigResource(ConfigResource.Type.TOPIC, TOPIC)
        got = admin.describe_configs([topic_res])[topic_res].result(timeout=20)
        assert got["cleanup.policy"].value == "compact"
        assert got["min.cleanable.dirty.ratio"].value == "0.01"
        assert got["delete.retention.ms"].value == "1500"
        assert got["min.compaction.lag.ms"].value == "0"
        assert got["max.compaction.lag.ms"].value == str(2**63 - 1)
    finally:
        b.close()


def test_a_pass_is_logged_with_its_numbers(tmp_path: Path) -> None:
    b = start_broker(tmp_path, config=CLEANER)
    try:
        _create(b)
        _fill(b, rounds=5)
        _wait_passes(b, 0)
        line = _passes(b)[0]
        m = re.search(r"dirty ratio ([\d.]+).*read (\d+) bytes \((\d+) records.*MB/s\), wrote (\d+) bytes, "
                      r"kept (\d+) records, removed (\d+).* ([\d.]+) s$", line)
        assert m, line
        ratio, read, records, wrote, kept, removed, _secs = m.groups()
        assert float(ratio) > 0.01 and int(read) > int(wrote) > 0
        assert int(kept) + int(removed) == int(records) and int(removed) > 0
    finally:
        b.close()



def _children(pid: int) -> set[int]:
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out |= {int(c) for c in (task / "children").read_text().split()}
        except OSError:
            pass
    return out


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_the_cleaner_process_dies_with_a_killed_broker(tmp_path: Path) -> None:
    # a throttled cleaner is mid-pass when the broker is killed: its process must not go on
    # writing into the data directory that the next broker start recovers
    b = start_broker(tmp_path, config={**CLEANER, "log.cleaner.io.max.bytes.per.second": "5000"})
    try:
        _create(b)
        _fill(b)
        assert b.proc is not None
        time.sleep(2.0)  # the pass is under way (at 5 kB/s it takes most of a minute)
        kids = _children(b.proc.pid)  # the cleaner process (and multiprocessing's resource tracker)
        assert len(kids) >= 1, "no cleaner process"
        assert not _passes(b)
        b.kill()
        deadline = time.monotonic() + 2
        while any(Path(f"/proc/{k}").exists() and "zombie" not in _state(k) for k in kids):
            assert time.monotonic() < deadline, f"cleaner process(es) {kids} outlived the broker"
            time.sleep(0.1)
    finally:
        b.close()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0].lower()
    except (OSError, IndexError):
        return "zombie"


NO_MAIN_GUARD = """
import time
print("TOP-LEVEL RAN", flush=True)
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from oncelog.testing import EmbeddedBroker
b = EmbeddedBroker(mode="thread", config={"log.cleaner.backoff.ms": "100"}).start()
admin = AdminClient({"bootstrap.servers": b.bootstrap})
admin.create_topics([NewTopic("kv", 1, 1, config={
    "cleanup.policy": "compact", "segment.bytes": "2000", "min.cleanable.dirty.ratio": "0.01"})])["kv"].result(10)
p = Producer({"bootstrap.servers": b.bootstrap, "batch.size": 500})
for i in range(300):
    p.produce("kv", key=b"k%d" % (i % 5), value=b"v" * 50)
p.flush(10)
deadline = time.monotonic() + 20
while not (b.data_dir / "kv-0" / "cleaner-offset-checkpoint").exists() and time.monotonic() < deadline:
    time.sleep(0.1)
print("CLEANED" if (b.data_dir / "kv-0" / "cleaner-offset-checkpoint").exists() else "NOT CLEANED", flush=True)
b.stop()
"""


def test_a_script_without_a_main_guard_is_not_run_again_by_the_cleaner_process(tmp_path: Path) -> None:
    # multiprocessing's spawn re-imports __main__ in the child; the cleaner process must not
    # re-run an embedding script (EmbeddedBroker in thread mode, no __name__ guard)
    import subprocess
    import sys

    import os

    import oncelog

    script = tmp_path / "embed.py"
    script.write_text(NO_MAIN_GUARD)
    env = {**os.environ, "PYTHONPATH": str(Path(oncelog.__file__).resolve().parents[1])}  # this tree's oncelog
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                         env=env)
    assert "CLEANED" in out.stdout.split(), out.stdout + out.stderr[-2000:]
    assert out.stdout.count("TOP-LEVEL RAN") == 1, out.stdout
