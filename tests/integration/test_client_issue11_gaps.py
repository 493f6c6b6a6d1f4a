"""Issue 11 (oncelog.client) behaviour the audit found untested through the public classes:
a CRC mismatch seen through the Consumer, the plural Admin methods checked against the broker's
state, static membership through ``Consumer`` (``group.instance.id``), and a consumer process
killed with SIGKILL whose partitions move on after ``session.timeout.ms``.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from oncelog.client import Admin, Consumer, Producer, TopicPartition
from oncelog.client import aio
from oncelog.client.errors import CorruptMessageError, KafkaError

pytestmark = pytest.mark.timeout(120)


class _RewritingProxy:
    """A loopback proxy forwarding whole Kafka frames, replacing ``old`` by ``new`` (same length,
    so the framing stays valid) in every response frame: a fake broker answer whose batch CRC no
    longer matches its bytes (the broker itself refuses to keep a damaged batch: its recovery
    truncates the log at a CRC mismatch)."""

    def __init__(self, upstream: tuple[str, int], old: bytes, new: bytes) -> None:
        assert len(old) == len(new)
        self.upstream, self.old, self.new = upstream, old, new
        self.rewritten = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            u = socket.create_connection(self.upstream)
            self.conns += [c, u]
            threading.Thread(target=self._pump, args=(c, u, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(u, c, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, rewrite: bool) -> None:
        def read(n: int) -> bytes:
            buf = b""
            while len(buf) < n:
                chunk = src.recv(n - len(buf))
                if not chunk:
                    raise EOFError
                buf += chunk
            return buf
        try:
            while True:
                head = read(4)
                body = read(struct.unpack(">i", head)[0])
                if rewrite and self.old in body:
                    body = body.replace(self.old, self.new)
                    self.rewritten += 1
                dst.sendall(head + body)
        except (OSError, EOFError):
            for s in (src, dst):
                s.close()

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.mark.parametrize("flavour", ["blocking", "asyncio"])
def test_a_crc_mismatch_reaches_the_consumer_as_corrupt_message(flavour: str, tmp_path: Path, kit: Any) -> None:
    """A Fetch answer whose middle batch has one value byte changed (CRC left as it was): the
    Consumer hands out the records of the batch before it, then raises CORRUPT_MESSAGE (code 2)
    for the damaged batch; with ``check.crcs=false`` the same answer hands the (damaged) records
    out, which shows the error came from the CRC check."""
    proxy = _RewritingProxy(("127.0.0.1", 0), b"value-1-2", b"value-0-2")  # upstream set below
    b = kit.start_broker(tmp_path, config={"advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy.port}"})
    proxy.upstream = ("127.0.0.1", b.port)
    try:
        kit.create_topic(b.bootstrap, "crc", 1)
        with Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 1000}) as p:
            for n in range(3):  # three batches of 4 records (flush between them)
                for i in range(4):
                    p.produce("crc", b"value-%d-%d" % (n, i), partition=0)
                assert p.flush(10) == 0
        bootstrap = f"127.0.0.1:{proxy.port}"

        def read(check: bool) -> tuple[list[Any], BaseException | None, list[Any]]:
            conf = {"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest", "check.crcs": check}
            got: list[Any] = []
            err: BaseException | None = None
            after: list[Any] = []  # position after record 0, position after the error, the error again, records after a seek past it
            if flavour == "blocking":
                with Consumer(conf) as c:
                    c.assign([TopicPartition("crc", 0, 0)])
                    deadline = time.monotonic() + 15
                    try:
                        got.extend(c.consume(1, 10))
                        after.append(c.position(TopicPartition("crc", 0)))  # bad batch buffered, not reached
                        while len(got) < 12 and time.monotonic() < deadline:
                            got.extend(c.consume(100, 0.5))
                    except KafkaError as exc:
                        err = exc
                        after.append(c.position(TopicPartition("crc", 0)))
                        with pytest.raises(CorruptMessageError):
                            c.consume(100, 5)
                        c.seek(TopicPartition("crc", 0, 8))
                        after.append([m.offset for m in c.consume(100, 5)])
            else:
                async def run() -> None:
                    nonlocal err
                    async with aio.Consumer(conf) as c:
                        c.assign([TopicPartition("crc", 0, 0)])
                        deadline = time.monotonic() + 15
                        try:
                            got.extend(await c.consume(1, 10))
                            after.append(await c.position(TopicPartition("crc", 0)))  # bad batch buffered
                            while len(got) < 12 and time.monotonic() < deadline:
                                got.extend(await c.consume(100, 0.5))
                        except KafkaError as exc:
                            err = exc
                            after.append(await c.position(TopicPartition("crc", 0)))
                            with pytest.raises(CorruptMessageError):
                                await c.consume(100, 5)
                            c.seek(TopicPartition("crc", 0, 8))
                            after.append([m.offset for m in await c.consume(100, 5)])
                asyncio.run(asyncio.wait_for(run(), 30))
            return got, err, after

        got, err, after = read(True)
        # as Java's consumer: the good batch before the damaged one first (it came in the same answer),
        # then the error; the position stays at the damaged batch (the error again) until a seek past it
        assert [m.offset for m in got] == [0, 1, 2, 3]
        assert isinstance(err, CorruptMessageError), err
        assert (err.code, err.name) == (2, "CORRUPT_MESSAGE") and "CRC mismatch in batch at offset 4" in str(err)
        # position() after the first record is 1 (the good records are still buffered), not the error
        assert after == [1, 4, [8, 9, 10, 11]]

        got, err, _after = read(False)
        assert err is None
        assert [m.offset for m in got] == list(range(12))
        assert got[6].value == b"value-0-2"  # the damaged byte, handed out unchecked
        assert proxy.rewritten >= 2
    finally:
        proxy.close()
        b.close()


# -- Admin: the plural methods, checked against the broker's state ----------------------------------


GROUP_BROKER_CONFIG = {"group.initial.rebalance.delay.ms": "0", "oncelog.group.coordinator.tick.ms": "50",
                       "group.min.session.timeout.ms": "1000"}


@pytest.fixture
def broker(tmp_path: Path, kit: Any) -> Any:
    b = kit.start_broker(tmp_path, config=GROUP_BROKER_CONFIG)
    try:
        yield b
    finally:
        b.close()


def _confluent_topics(bootstrap: str) -> set[str]:
    from confluent_kafka.admin import AdminClient

    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics)


def test_admin_delete_topics_describe_groups_delete_groups_describe_transactions(broker: Any, kit: Any) -> None:
    from oncelog.client.errors import (GroupIdNotFoundError, NonEmptyGroupError, TransactionalIdNotFoundError,
                                       UnknownTopicOrPartitionError)

    bs = broker.bootstrap
    for t in ("del-a", "del-b", "keep", "grp"):
        kit.create_topic(bs, t, 2)
    with Admin({"bootstrap.servers": bs}) as admin:
        # delete_topics: per-topic results; the broker no longer has them (asked with librdkafka too)
        res = admin.delete_topics(["del-a", "del-b", "no-such-topic"])
        assert res.succeeded == {"del-a": None, "del-b": None}
        assert set(res.errors) == {"no-such-topic"}
        assert isinstance(res.errors["no-such-topic"], UnknownTopicOrPartitionError)
        deadline = time.monotonic() + 10
        while {"del-a", "del-b"} & (set(admin.list_topics()) | _confluent_topics(bs)):
            assert time.monotonic() < deadline, "deleted topics still listed"
            time.sleep(0.1)
        assert "keep" in admin.list_topics() and "keep" in _confluent_topics(bs)

        # groups: one with a live member, one with only committed offsets, one unknown
        with Consumer({"bootstrap.servers": bs, "group.id": "g-empty", "enable.auto.commit": False}) as c:
            c.commit(offsets=[TopicPartition("grp", 0, 7)])
        live = Consumer({"bootstrap.servers": bs, "group.id": "g-live", "client.id": "live-client",
                         "group.instance.id": "inst-live"})
        try:
            live.subscribe(["grp"])
            deadline = time.monotonic() + 20
            while len(live.assignment()) < 2:
                assert time.monotonic() < deadline, "the live member was never assigned"
                live.poll(0.1)
            d = admin.describe_groups(["g-live", "g-empty", "g-unknown"])
            assert not d.errors
            assert (d["g-live"].state, d["g-live"].protocol_type) == ("Stable", "consumer")
            assert d["g-live"].protocol in ("range", "cooperative-sticky")
            [m] = d["g-live"].members
            assert (m.client_id, m.group_instance_id, m.assignment) == ("live-client", "inst-live", {"grp": [0, 1]})
            assert m.member_id == live.group_metadata().member_id
            assert (d["g-empty"].state, d["g-empty"].members) == ("Empty", [])
            assert d["g-unknown"].state == "Dead"

            r = admin.delete_groups(["g-empty", "g-live", "g-unknown"])
            assert r.succeeded == {"g-empty": None}
            assert isinstance(r.errors["g-live"], NonEmptyGroupError)
            assert isinstance(r.errors["g-unknown"], GroupIdNotFoundError)
            listed = {g.group_id for g in admin.list_groups()}
            assert "g-empty" not in listed and "g-live" in listed
            assert admin.list_group_offsets("g-empty") == {}
        finally:
            live.close()

        # describe_transactions: an open transaction, then its commit, and an unknown id
        with Producer({"bootstrap.servers": bs, "transactional.id": "tx-desc"}) as p:
            p.init_transactions(10)
            p.begin_transaction()
            p.produce("keep", b"v", partition=1)
            assert p.flush(10) == 0
            t = admin.describe_transactions(["tx-desc", "tx-unknown"])
            assert isinstance(t.errors["tx-unknown"], TransactionalIdNotFoundError)
            ongoing = t["tx-desc"]
            assert ongoing.state == "Ongoing" and ("keep", 1) in [tuple(x) for x in ongoing.partitions]
            assert ongoing.producer_id >= 0 and ongoing.timeout_ms == 60000
            p.commit_transaction(10)
            deadline = time.monotonic() + 10
            while (done := admin.describe_transactions(["tx-desc"])["tx-desc"]).state == "PrepareCommit":
                assert time.monotonic() < deadline, "the commit's markers were never written"
                time.sleep(0.05)
            assert done.state == "CompleteCommit" and done.partitions == ()
            assert done.producer_id == ongoing.producer_id


def test_asyncio_admin_delete_topics_and_describe_groups(broker: Any, kit: Any) -> None:
    from oncelog.client.errors import UnknownTopicOrPartitionError

    bs = broker.bootstrap
    kit.create_topic(bs, "adel", 1)
    kit.create_topic(bs, "akeep", 1)  # not "adel": deleting a topic deletes the groups' offsets of it
    with Consumer({"bootstrap.servers": bs, "group.id": "ag", "enable.auto.commit": False}) as c:
        c.commit(offsets=[TopicPartition("akeep", 0, 3)])

    async def run() -> None:
        async with aio.Admin({"bootstrap.servers": bs}) as admin:
            res = await admin.delete_topics(["adel", "nope"])
            assert res.succeeded == {"adel": None}
            assert isinstance(res.errors["nope"], UnknownTopicOrPartitionError)
            d = await admin.describe_groups(["ag", "nobody"])
            assert (d["ag"].state, d["ag"].members, d["nobody"].state) == ("Empty", [], "Dead")
            r = await admin.delete_groups(["ag"])
            assert r.succeeded == {"ag": None} and not r.errors
            assert (await admin.describe_groups(["ag"]))["ag"].state == "Dead"
            t = await admin.describe_transactions(["nobody"])
            assert set(t.errors) == {"nobody"} and t.errors["nobody"].name == "TRANSACTIONAL_ID_NOT_FOUND"

    asyncio.run(asyncio.wait_for(run(), 30))
    assert "adel" not in _confluent_topics(bs)


# -- static membership through Consumer ------------------------------------------------------------


def _wait_assigned(consumers: list[Any], want: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        gens = {c.group_metadata().generation_id for c in consumers}
        if all(len(c.assignment()) == want for c in consumers) and len(gens) == 1 and -1 not in gens:
            return
        assert time.monotonic() < deadline, [(c.assignment(), c.group_metadata()) for c in consumers]
        for c in consumers:
            c.poll(0.05)


STATIC_INSTANCE_A = "inst-a"  # the restarted consumer's group.instance.id (see the docstring)


def test_static_member_restart_through_consumer_keeps_its_assignment_without_a_rebalance(broker: Any,
                                                                                           kit: Any) -> None:
    """Two Consumers with group.instance.id share 4 partitions; A closes (a static member sends no
    LeaveGroup) and a new Consumer with A's instance id comes back within session.timeout.ms: it gets
    A's partitions at the same generation, and B sees no rebalance (same generation, no callbacks).
    Made to fail by giving the restarted consumer no instance id (STATIC_INSTANCE_A = None): the
    group rebalances to generation + 1."""
    bs = broker.bootstrap
    kit.create_topic(bs, "static", 4)
    events: dict[str, list[tuple[str, list[int]]]] = {"A": [], "B": [], "A2": []}

    def make(name: str, instance: str | None) -> Any:
        conf = {"bootstrap.servers": bs, "group.id": "g-static", "session.timeout.ms": 10000,
                "heartbeat.interval.ms": 500, "partition.assignment.strategy": "range"}
        if instance is not None:
            conf["group.instance.id"] = instance
        c = Consumer(conf)
        c.subscribe(["static"],
                    on_assign=lambda parts: events[name].append(("assign", sorted(p.partition for p in parts))),
                    on_revoke=lambda parts: events[name].append(("revoke", sorted(p.partition for p in parts))))
        return c

    a, b = make("A", "inst-a"), make("B", "inst-b")
    a2 = None
    try:
        _wait_assigned([a, b], 2)
        gen = b.group_metadata().generation_id
        a_parts = sorted(p.partition for p in a.assignment())
        a_member = a.group_metadata().member_id
        b_events = list(events["B"])
        a.close()
        t0 = time.monotonic()
        a2 = make("A2", STATIC_INSTANCE_A)
        _wait_assigned([a2, b], 2)
        assert time.monotonic() - t0 < 10, "not within session.timeout.ms"
        assert sorted(p.partition for p in a2.assignment()) == a_parts
        assert events["A2"] == [("assign", a_parts)]
        assert a2.group_metadata().generation_id == b.group_metadata().generation_id == gen
        assert a2.group_metadata().member_id != a_member  # the coordinator gave the instance a new member id
        for _ in range(10):  # a rebalance would show up at B within a few heartbeats
            b.poll(0.1)
        assert events["B"] == b_events and b.group_metadata().generation_id == gen
        with Admin({"bootstrap.servers": bs}) as admin:
            g = admin.describe_groups(["g-static"])["g-static"]
        assert g.state == "Stable"
        assert sorted((m.group_instance_id, tuple(m.assignment["static"])) for m in g.members) == sorted(
            [("inst-a", tuple(a_parts)), ("inst-b", tuple(sorted(p.partition for p in b.assignment())))])
    finally:
        for c in (a, b, a2):
            if c is not None:
                c.close()


# -- a consumer process killed with SIGKILL ------------------------------------------------------------

_CHILD = r"""
import json, sys, time
from oncelog.client import Consumer
bootstrap, topic = sys.argv[1], sys.argv[2]
c = Consumer({"bootstrap.servers": bootstrap, "group.id": "g-kill", "session.timeout.ms": 3000,
              "heartbeat.interval.ms": 300, "enable.auto.commit": False, "auto.offset.reset": "earliest",
              "partition.assignment.strategy": "range", "client.id": "doomed"})
c.subscribe([topic])
while True:
    msgs = c.consume(5, 0.2)
    if msgs:
        c.commit(asynchronous=False)
    print(json.dumps({"assignment": sorted(p.partition for p in c.assignment()),
                      "committed": {m.partition: m.offset + 1 for m in msgs}}), flush=True)
    time.sleep(0.05)  # slow: most records are still unread when the process is killed
"""


def test_a_consumer_process_killed_with_sigkill_loses_its_partitions_after_the_session_timeout(
        broker: Any, kit: Any) -> None:
    """A consumer subprocess (group member, commits after each batch) is killed with SIGKILL: it sends
    no LeaveGroup, so its partitions move to the surviving member only once session.timeout.ms (3 s)
    has passed, and the survivor resumes them exactly at the offsets the dead process committed,
    then reads every remaining record."""
    import json
    import os
    import signal
    import subprocess
    import sys

    bs, topic, per_part = broker.bootstrap, "killed", 300
    kit.create_topic(bs, topic, 4)
    with Producer({"bootstrap.servers": bs}) as p:
        for part in range(4):
            for i in range(per_part):
                p.produce(topic, b"%d-%d" % (part, i), partition=part)
        assert p.flush(20) == 0

    child = subprocess.Popen([sys.executable, "-c", _CHILD, bs, topic], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    lines: list[dict[str, Any]] = []
    reader = threading.Thread(target=lambda: [lines.append(json.loads(x)) for x in child.stdout], daemon=True)
    reader.start()
    survivor = Consumer({"bootstrap.servers": bs, "group.id": "g-kill", "session.timeout.ms": 3000,
                         "heartbeat.interval.ms": 300, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "partition.assignment.strategy": "range"})
    seen: dict[int, list[int]] = {q: [] for q in range(4)}
    try:
        survivor.subscribe([topic])

        def pump(seconds: float) -> None:
            for m in survivor.consume(500, seconds):
                seen[m.partition].append(m.offset)

        # both members own two partitions, and the child has committed some of its own
        deadline = time.monotonic() + 30
        while True:
            pump(0.1)
            child_parts = lines[-1]["assignment"] if lines else []
            committed = {int(q): o for ln in lines for q, o in ln["committed"].items()}
            if (len(child_parts) == 2 and len(survivor.assignment()) == 2
                    and any(committed.get(q, 0) >= 20 for q in child_parts)):
                break
            assert child.poll() is None, child.stderr.read()
            assert time.monotonic() < deadline, (lines[-1:], survivor.assignment())
        mine = sorted(tp.partition for tp in survivor.assignment())
        assert sorted(mine + child_parts) == [0, 1, 2, 3]
        os.kill(child.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        before = {q: set(v) for q, v in seen.items()}  # read while it owned everything, or its own two
        seen = {q: [] for q in range(4)}
        child.wait(10)
        reader.join(5)
        committed = {int(q): o for ln in lines for q, o in ln["committed"].items()}
        with Admin({"bootstrap.servers": bs}) as admin:
            stored = admin.list_group_offsets("g-kill")
        start = {q: stored.get((topic, q), 0) for q in child_parts}  # none committed: earliest
        for q in child_parts:  # the dead process's commits survive (at least its last reported one)
            assert start[q] >= committed.get(q, 0)
        assert any(0 < start[q] < per_part for q in child_parts), start  # it was killed mid-partition

        # the partitions move only after the session timeout (no LeaveGroup from a killed process)
        while len(survivor.assignment()) < 4:
            pump(0.1)
            assert time.monotonic() - killed_at < 20, "the dead member's partitions never moved"
        moved_after = time.monotonic() - killed_at
        assert moved_after >= 3.0 - 0.3 - 0.2, moved_after  # session.timeout.ms - heartbeat interval - slack
        # the survivor resumes each taken-over partition exactly at the dead process's committed offset
        deadline = time.monotonic() + 20
        while any(len(seen[q]) < per_part - start[q] for q in child_parts) or any(
                len(before[q] | set(seen[q])) < per_part for q in mine):
            pump(0.2)
            assert time.monotonic() < deadline, {q: len(v) for q, v in seen.items()}
        for q in child_parts:
            assert seen[q] == list(range(start[q], per_part)), (q, seen[q][:3], start[q])
        for q in mine:  # and its own partitions: every record read
            assert before[q] | set(seen[q]) == set(range(per_part))
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        survivor.close()
