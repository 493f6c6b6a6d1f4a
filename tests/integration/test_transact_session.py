"""``TransactSession`` (issue 12, seed 003) against the real broker.

Sessions copy a keyed multi-partition input topic to an output topic
(same key, same partition) and ``oncelog verify`` checks the copy: nothing
lost, nothing twice, nothing aborted visible, order kept, the group's offsets
at the end of the input.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from oncelog.client.aio import TransactSession
from oncelog.client.aio.offsets import fetch_offsets
from oncelog.client.config import ConfigError
from oncelog.testing import EmbeddedBroker

pytestmark = pytest.mark.timeout(300)

PARTS = 6
CLEAN = {"lost": 0, "duplicated": 0, "aborted_visible": 0, "out_of_order": 0, "offsets_ahead": 0, "unexpected": 0}


@pytest.fixture(scope="module")
def sbroker(tmp_path_factory: Any) -> Iterator[EmbeddedBroker]:
    d = tmp_path_factory.mktemp("session")
    b = EmbeddedBroker(data_dir=d / "data", log_path=d / "broker.log",
                       config={"group.initial.rebalance.delay.ms": "0"})
    b.start()
    try:
        yield b
    finally:
        b.close()


_names = iter(range(10_000))


def make_topics(bs: str, kit: Any, tag: str, parts: int = PARTS) -> tuple[str, str]:
    base = f"s{next(_names)}-{tag}"
    kit.create_topic(bs, f"{base}-in", parts)
    kit.create_topic(bs, f"{base}-out", parts)
    return f"{base}-in", f"{base}-out"


def seed(bs: str, topic: str, n: int, parts: int = PARTS) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bs, "enable.idempotence": True, "linger.ms": 5})
    for i in range(n):
        p.produce(topic, key=f"id-{i:06d}".encode(), value=json.dumps({"n": i}).encode(), partition=i % parts)
    assert p.flush(30) == 0


def verify(bs: str, inp: str, out: str, group: str) -> dict[str, Any]:
    p = subprocess.run([sys.executable, "-m", "oncelog.cli", "verify", "--bootstrap", bs, "--input", inp,
                        "--output", out, "--group", group, "--json"], capture_output=True, text=True, timeout=120)
    assert p.returncode in (0, 1), p.stderr
    doc = json.loads(p.stdout)
    doc["_counts"] = {k: doc[k] for k in CLEAN}
    return doc


def conf(bs: str, group: str, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": bs, "group.id": group, "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000, "heartbeat.interval.ms": 500, "max.poll.interval.ms": 30000, **extra}


async def copier(s: TransactSession, out: str, stop: asyncio.Event, batch: int = 50,
                 slow: float = 0.0) -> None:
    """poll -> produce to the same partition with the same key -> end(commit=True), until ``stop``."""
    while not stop.is_set():
        msgs = await s.poll(0.2, batch)
        for m in msgs:
            s.produce(out, m.value, key=m.key, partition=m.partition)
        if slow and msgs:
            await asyncio.sleep(slow)
        await s.end(commit=True)


async def group_offsets(bs: str, group: str, inp: str, parts: int) -> dict[int, int]:
    s = TransactSession(conf(bs, group + "-probe"), [inp])  # only for its cluster
    await s._consumer.start()
    try:
        got = await fetch_offsets(s._consumer.cluster, group, [(inp, p) for p in range(parts)], require_stable=True)
        return {tp[1]: (om.offset if om else -1) for tp, om in got.items()}
    finally:
        await s._consumer.close()
        await s._producer.close(1)


async def copy_with_churn(bs: str, inp: str, out: str, group: str, n: int, extra: dict[str, Any]) -> list[dict]:
    """Three sessions: A throughout, B leaves half-way, C joins later; stop once the group committed all."""
    stop = asyncio.Event()
    sessions: list[TransactSession] = []

    async def one(delay: float, life: float | None) -> None:
        await asyncio.sleep(delay)
        s = TransactSession(conf(bs, group, **extra), [inp])
        sessions.append(s)
        await s.start()
        local = asyncio.Event()

        async def until() -> None:
            if life is not None:
                await asyncio.sleep(life)
            else:
                await stop.wait()
            local.set()
        t = asyncio.ensure_future(until())
        await copier(s, out, local, slow=0.02)
        await t
        await s.close()

    tasks = [asyncio.ensure_future(one(0, None)), asyncio.ensure_future(one(0.3, 2.5)),
             asyncio.ensure_future(one(1.5, None))]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        for t in tasks:
            if t.done() and t.exception():
                raise t.exception()  # type: ignore[misc]
        if tasks[1].done() and sum((await group_offsets(bs, group, inp, PARTS)).values()) >= n:
            break
    stop.set()
    await asyncio.gather(*tasks)
    return [s.counters for s in sessions]


@pytest.mark.parametrize("assignor", ["range", "cooperative-sticky"])
def test_copy_loop_with_members_joining_and_leaving(sbroker: EmbeddedBroker, kit: Any, assignor: str) -> None:
    bs = sbroker.bootstrap
    inp, out = make_topics(bs, kit, f"copy-{assignor}")
    n = 3000
    seed(bs, inp, n)
    group = f"g-{inp}"
    counters = asyncio.run(copy_with_churn(bs, inp, out, group, n, {"partition.assignment.strategy": assignor}))
    doc = verify(bs, inp, out, group)
    assert doc["_counts"] == CLEAN, doc["examples"]
    assert doc["input_records"] == doc["output_records"] == n
    offs = asyncio.run(group_offsets(bs, group, inp, PARTS))
    assert offs == {p: n // PARTS for p in range(PARTS)}  # group offsets equal to the output's end
    assert sum(c["committed"] for c in counters) > 0
    assert all(c["records_out"] >= 0 for c in counters) and len(counters) == 3


def test_transaction_timeout_must_be_below_session_timeout() -> None:
    with pytest.raises(ConfigError, match="must be less than session.timeout.ms"):
        TransactSession({"bootstrap.servers": "127.0.0.1:1", "group.id": "g", "session.timeout.ms": 10000,
                         "transaction.timeout.ms": 10000}, ["t"])
    s = TransactSession({"bootstrap.servers": "127.0.0.1:1", "group.id": "g", "session.timeout.ms": 10000}, ["t"])
    assert s.transaction_timeout_ms < 10000


def test_batch_size_default_fits_a_transaction() -> None:
    """A session's records are flushed together by end(): its producer batches up to ~1 MB per partition
    (Kafka's 16 KiB made a 500-record transaction 17 requests per partition); an explicit value is kept."""
    base = {"bootstrap.servers": "127.0.0.1:1", "group.id": "g"}
    assert TransactSession(base, ["t"])._producer.config["batch.size"] == 1_000_000
    assert TransactSession({**base, "batch.size": 4096}, ["t"])._producer.config["batch.size"] == 4096
    assert TransactSession({**base, "max.request.size": 200_000}, ["t"])._producer.config["batch.size"] == 200_000
    with pytest.raises(ConfigError, match="max.request.size"):
        TransactSession({**base, "max.request.size": "lots"}, ["t"])


async def drain(bs: str, sessions: list[TransactSession], out: str, group: str, inp: str, n: int,
                parts: int) -> None:
    """Run ``copier`` on every session until the group committed all ``n`` input records."""
    stop = asyncio.Event()
    tasks = [asyncio.ensure_future(copier(s, out, stop)) for s in sessions]
    deadline = time.monotonic() + 60
    try:
        while sum((await group_offsets(bs, group, inp, parts)).values()) < n:
            assert time.monotonic() < deadline, "the copy did not finish"
            for t in tasks:
                if t.done():
                    t.result()
            await asyncio.sleep(0.3)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    for t in tasks:
        t.result()


def test_abort_on_revoke(sbroker: EmbeddedBroker, kit: Any) -> None:
    """A rebalance during an open transaction: end(commit=True) aborts, returns False, no duplicates."""
    bs = sbroker.bootstrap
    inp, out = make_topics(bs, kit, "revoke", parts=2)
    n = 40
    seed(bs, inp, n, parts=2)
    group = f"g-{inp}"

    async def main() -> tuple[bool, dict[str, Any], list[tuple[str, int]]]:
        a = TransactSession(conf(bs, group), [inp])
        b = TransactSession(conf(bs, group), [inp])
        await a.start()
        assert len(await a.wait_assigned(30)) == 2
        got = []
        while len(got) < 10:
            got += await a.poll(1.0, 10)
        for m in got:
            a.produce(out, m.value, key=m.key, partition=m.partition)
        await b.start()  # B joins: the group rebalances while A's transaction is open
        b_parts = await b.wait_assigned(30)
        await a.wait_assigned(30)
        ok = await a.end(commit=True)
        counters = dict(a.counters)
        await drain(bs, [a, b], out, group, inp, n, 2)
        await a.close()
        await b.close()
        return ok, counters, b_parts

    ok, counters, b_parts = asyncio.run(main())
    assert b_parts, "B got no partition, so nothing moved"
    assert ok is False
    assert counters["aborted"] == 1 and counters["aborts_by_cause"] == {"revoked": 1}
    doc = verify(bs, inp, out, group)
    assert doc["_counts"] == CLEAN, doc["examples"]
    assert doc["output_records"] == n


# -- the seed's KIP-447 scenario ------------------------------------------------------------------------

END_TXN = 26


@pytest.fixture
def proxied(tmp_path: Any) -> Iterator[tuple[EmbeddedBroker, Any]]:
    """A broker that advertises a fault proxy in front of it: every client goes through the proxy."""
    from oncelog.testing.embedded import free_port
    from oncelog.testing.fault_proxy import FaultProxy

    port = free_port()
    proxy = FaultProxy(("127.0.0.1", port), seed=1)
    broker = EmbeddedBroker(data_dir=tmp_path / "data", port=port, log_path=tmp_path / "broker.log",
                            config={"group.initial.rebalance.delay.ms": "0",
                                    "advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy.port}"})
    proxy.start()
    try:
        broker.start()
        yield broker, proxy
    finally:
        broker.close()
        proxy.stop()


async def poll_exactly(s: TransactSession, k: int) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + 20
    while len(got) < k:
        assert time.monotonic() < deadline
        got += await s.poll(0.5, k - len(got))
    return got


def kip447_scenario(proxy: Any, kit: Any, extra: dict[str, Any]) -> tuple[list[tuple[float, int, int]], float]:
    """C1/P1 and C2/P2 on tp-0/tp-1; P2 commits 5, processes to 10, its EndTxn is held; C2 leaves.

    Returns C1's polled records as (time, partition, offset) and the time the held EndTxn was released.
    """
    bs = proxy.bootstrap
    inp, out = make_topics(bs, kit, "kip447", parts=2)
    n = 40
    seed(bs, inp, n, parts=2)
    group = f"g-{inp}"

    async def main() -> tuple[list[tuple[float, int, int]], float]:
        s1 = TransactSession(conf(bs, group, **extra), [inp])
        s2 = TransactSession(conf(bs, group, **extra), [inp])
        await s1.start()
        await s1.wait_assigned(30)
        await s2.start()
        await s2.wait_assigned(30)
        await s1.wait_assigned(30)
        if s2.assignment != [(inp, 1)]:
            s1, s2 = s2, s1
        assert s2.assignment == [(inp, 1)] and s1.assignment == [(inp, 0)]
        # P2 commits one transaction: tp-1's offset is 5
        for m in await poll_exactly(s2, 5):
            s2.produce(out, m.value, key=m.key, partition=m.partition)
        assert await s2.end(commit=True)
        # P2 processes 5..9 and begins committing; its EndTxn stalls in the network
        batch = await poll_exactly(s2, 5)
        assert [m.offset for m in batch] == [5, 6, 7, 8, 9]
        for m in batch:
            s2.produce(out, m.value, key=m.key, partition=m.partition)
        proxy.hold(END_TXN)
        ending = asyncio.ensure_future(s2.end(commit=True))
        deadline = time.monotonic() + 20
        while proxy.held() < 1:
            assert time.monotonic() < deadline, "P2's EndTxn never reached the proxy"
            await asyncio.sleep(0.02)
        # P2 "crashes": its tasks stop, it leaves the group, the group gives tp-1 to C1
        ending.cancel()
        for t in (s2.member._task, s2.member._hb_task):
            if t is not None:
                t.cancel()
        await s2.member._leave("crashed")
        seen: list[tuple[float, int, int]] = []
        stop = asyncio.Event()

        async def c1() -> None:
            while not stop.is_set():
                msgs = await s1.poll(0.2, 50)
                for m in msgs:
                    seen.append((time.monotonic(), m.partition, m.offset))
                    s1.produce(out, m.value, key=m.key, partition=m.partition)
                await s1.end(commit=True)

        task = asyncio.ensure_future(c1())
        await asyncio.sleep(3.0)  # the group rebalances meanwhile; P2's transaction is still open
        released = time.monotonic()
        answers = await asyncio.to_thread(proxy.release_held)
        assert [a.error_codes for a in answers] == [(0,)], answers  # P2's commit lands now
        deadline = time.monotonic() + 60
        while sum((await group_offsets(bs, group, inp, 2)).values()) < n:
            assert time.monotonic() < deadline, "C1 did not finish the copy"
            assert not task.done(), task
            await asyncio.sleep(0.3)
        stop.set()
        await task
        await s1.close()
        await asyncio.gather(s2._consumer.close(), s2._producer.close(1), return_exceptions=True)
        return seen, released

    seen, released = asyncio.run(main())
    doc = verify(bs, inp, out, group)
    assert doc["_counts"] == CLEAN, doc["examples"]
    assert doc["output_records"] == n
    return seen, released


def test_kip447_new_owner_waits_for_the_pending_commit(proxied: tuple[EmbeddedBroker, Any], kit: Any) -> None:
    _, proxy = proxied
    seen, released = kip447_scenario(proxy, kit, {})
    tp1 = [(t, o) for t, p, o in seen if p == 1]
    assert tp1, "C1 never read tp-1"
    assert all(t >= released for t, _ in tp1), "C1 read tp-1 before P2's transaction was resolved"
    assert tp1[0][1] == 10  # from P2's committed offset, not the stale 5


# -- a zombie ---------------------------------------------------------------------------------------------

ZOMBIE = r"""
import json, sys
from oncelog.client import TransactSession
bs, group, inp, out = sys.argv[1:5]
s = TransactSession({"bootstrap.servers": bs, "group.id": group, "auto.offset.reset": "earliest",
                     "session.timeout.ms": 6000, "heartbeat.interval.ms": 500}, [inp])
s.wait_assigned(30)
got = []
while len(got) < 10:
    got += s.poll(0.5, 10 - len(got))
for m in got:
    s.produce(out, m.value, key=m.key, partition=m.partition)
print("READY", flush=True)
sys.stdin.readline()
try:
    res = {"committed": s.end(commit=True)}
except Exception as exc:
    res = {"error": getattr(exc, "name", type(exc).__name__)}
print(json.dumps(res), flush=True)
try:
    s.close()
except Exception:
    pass
"""


def test_zombie_paused_past_its_session_timeout_commits_nothing(sbroker: EmbeddedBroker, kit: Any,
                                                                 tmp_path: Any) -> None:
    import os
    import signal

    bs = sbroker.bootstrap
    inp, out = make_topics(bs, kit, "zombie", parts=2)
    n = 40
    seed(bs, inp, n, parts=2)
    group = f"g-{inp}"
    z = subprocess.Popen([sys.executable, "-c", ZOMBIE, bs, group, inp, out], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=open(tmp_path / "zombie.err", "w"), text=True)
    try:
        assert z.stdout is not None and z.stdin is not None
        assert z.stdout.readline().strip() == "READY", (tmp_path / "zombie.err").read_text()
        os.kill(z.pid, signal.SIGSTOP)  # paused with an open transaction of 10 records
        stopped = time.monotonic()

        async def other() -> None:
            s = TransactSession(conf(bs, group), [inp])
            await s.start()
            await s.wait_assigned(60)  # only after the zombie's session timed out
            assert time.monotonic() - stopped > 5.0, "the group rebalanced before the zombie's session expired"
            await drain(bs, [s], out, group, inp, n, 2)
            await s.close()

        asyncio.run(other())
        os.kill(z.pid, signal.SIGCONT)
        z.stdin.write("GO\n")
        z.stdin.flush()
        res = json.loads(z.stdout.readline())
        assert res.get("committed") is False or res.get("error") in ("PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH",
                                                                      "ILLEGAL_GENERATION", "UNKNOWN_MEMBER_ID"), res
        z.wait(30)
    finally:
        if z.poll() is None:
            os.kill(z.pid, signal.SIGCONT)
            z.kill()
    doc = verify(bs, inp, out, group)
    assert doc["_counts"] == CLEAN, doc["examples"]
    assert doc["output_records"] == n


# -- without KIP-447: the 200 ms heuristic -----------------------------------------------------------------


def test_pre_kip447_heuristic(sbroker: EmbeddedBroker, kit: Any, monkeypatch: Any,
                              caplog: pytest.LogCaptureFixture) -> None:
    """OffsetFetch capped below v7: the session says so once, holds rebalances 200 ms after a commit
    (without blocking the next transaction), and the copy loop stays clean."""
    from oncelog.client.aio import offsets
    from oncelog.client.aio.session import HEURISTIC_SLEEP

    monkeypatch.setattr(offsets, "OFFSET_FETCH_VERSIONS", (1, 6))
    caplog.set_level(logging.INFO, logger="oncelog.client.session")
    bs = sbroker.bootstrap
    inp, out = make_topics(bs, kit, "pre447")
    n = 1200
    seed(bs, inp, n)
    group = f"g-{inp}"

    async def lock_hold() -> tuple[float, float, bool | None]:
        s = TransactSession(conf(bs, group + "-hold"), [inp])
        await s.start()
        await s.wait_assigned(30)
        msgs = await poll_exactly(s, 3)
        for m in msgs:
            s.produce(out + "-scratch", m.value, key=m.key)
        assert await s.end(commit=True)
        t0 = time.monotonic()
        more = await s.poll(1.0, 3)  # a new transaction starts at once
        started = time.monotonic() - t0
        await s._on_revoke([])      # nothing revoked: no wait
        await s._on_revoke([s.assignment[0]])  # a revoke waits for the lock held after the commit
        waited = time.monotonic() - t0
        assert more
        mode = s.stable_offsets
        await s.end(commit=False)
        await s.close()
        return started, waited, mode

    kit.create_topic(bs, out + "-scratch", PARTS)
    started, waited, mode = asyncio.run(lock_hold())
    assert mode is False
    assert started < HEURISTIC_SLEEP / 2, "the heuristic sleep blocked the next transaction"
    assert waited >= HEURISTIC_SLEEP * 0.9, "a revoke did not wait for the heuristic sleep"
    counters = asyncio.run(copy_with_churn(bs, inp, out, group, n, {}))
    assert len(counters) == 3
    doc = verify(bs, inp, out, group)
    assert doc["_counts"] == CLEAN, doc["examples"]
    assert doc["input_records"] == doc["output_records"] == n
    modes = [r.getMessage() for r in caplog.records if "200 ms heuristic" in r.getMessage()]
    assert len(modes) == 4, modes  # once per session (one to measure, three to copy)
    assert not any("stable offsets with require_stable" in r.getMessage() for r in caplog.records)


# -- the blocking API ---------------------------------------------------------------------------------------


def test_blocking_session_run(sbroker: EmbeddedBroker, kit: Any) -> None:
    from oncelog.client import TransactSession as BlockingSession

    bs = sbroker.bootstrap
    inp, out = make_topics(bs, kit, "blocking", parts=3)
    n = 300
    seed(bs, inp, n, parts=3)
    group = f"g-{inp}"
    with BlockingSession(conf(bs, group), [inp]) as s:
        assert len(s.wait_assigned(30)) == 3
        # one transaction by hand, aborted: its records come again
        got = s.poll(5.0, 7)
        assert got
        s.produce(out, got[0].value, key=got[0].key, partition=got[0].partition)
        assert s.end(commit=False) is False
        counters = s.run(lambda m: [(out, m.key, m.value)], poll_timeout=0.5,
                         stop=lambda: s.counters["records_in"] >= n + len(got))
        assert s.stable_offsets is True
    assert counters["aborts_by_cause"] == {"requested": 1} and counters["committed"] >= 1
    assert counters["records_out"] == n + 1
    doc = verify(bs, inp, out, group)
    # keyed copies go to the key's partition: order is checked per (output, input) partition
    assert doc["_counts"] == CLEAN, doc["examples"]
    assert doc["output_records"] == n


def test_revocation_waits_for_an_in_flight_end_txn(proxied: tuple[EmbeddedBroker, Any], kit: Any) -> None:
    """A's EndTxn is held in the network while B joins: A's partitions do not move until it completes."""
    _, proxy = proxied
    bs = proxy.bootstrap
    inp, out = make_topics(bs, kit, "endtxn", parts=2)
    n = 40
    seed(bs, inp, n, parts=2)
    group = f"g-{inp}"

    async def main() -> tuple[bool, float, float, float]:
        a = TransactSession(conf(bs, group, **{"request.timeout.ms": 4000}), [inp])
        b = TransactSession(conf(bs, group), [inp])
        await a.start()
        await a.wait_assigned(30)
        for m in await poll_exactly(a, 10):
            a.produce(out, m.value, key=m.key, partition=m.partition)
        proxy.hold(END_TXN)
        ending = asyncio.ensure_future(a.end(commit=True))
        deadline = time.monotonic() + 20
        while proxy.held() < 1:
            assert time.monotonic() < deadline, "A's EndTxn never reached the proxy"
            await asyncio.sleep(0.02)
        gen1 = a.member.generation_id
        moved: list[float] = []

        async def watch() -> None:  # when A's member gives up its generation (after its revoke callback)
            while a.member.generation_id == gen1:
                await asyncio.sleep(0.01)
            moved.append(time.monotonic())
        watcher = asyncio.ensure_future(watch())
        await b.start()
        b_assigned = asyncio.ensure_future(b.wait_assigned(60))
        await asyncio.sleep(2.0)
        released = time.monotonic()
        await asyncio.to_thread(proxy.release_held)
        ok = await ending
        ended = time.monotonic()
        await b_assigned
        await watcher
        assigned = moved[0]
        await drain(bs, [a, b], out, group, inp, n, 2)
        await a.close()
        await b.close()
        return ok, released, ended, assigned

    ok, released, ended, assigned = asyncio.run(main())
    assert ok is True  # the heartbeat before EndTxn succeeded before B joined: the commit stands
    assert assigned >= ended > released, "A's partitions moved while its EndTxn was still in flight"
    doc = verify(bs, inp, out, group)
    assert doc["_counts"] == CLEAN, doc["examples"]
    assert doc["output_records"] == n


def test_connectivity_blip_kicked_member_aborts(proxied: tuple[EmbeddedBroker, Any], kit: Any) -> None:
    """The seed's blip: A's heartbeats hang, the coordinator removes A; A's pending commit aborts."""
    from oncelog.client.groups import GroupAdmin

    HEARTBEAT = 12
    _, proxy = proxied
    bs = proxy.bootstrap
    inp, out = make_topics(bs, kit, "blip", parts=2)
    n = 40
    seed(bs, inp, n, parts=2)
    group = f"g-{inp}"

    async def main() -> tuple[bool, dict[str, Any]]:
        a = TransactSession(conf(bs, group, **{"request.timeout.ms": 2000}), [inp])
        await a.start()
        await a.wait_assigned(30)
        for m in await poll_exactly(a, 10):
            a.produce(out, m.value, key=m.key, partition=m.partition)
        proxy.hold(HEARTBEAT, 10**6)  # heartbeats hang from now on

        def expired() -> bool:
            with GroupAdmin(bs) as admin:
                return not admin.describe(group).members

        deadline = time.monotonic() + 40
        while not await asyncio.to_thread(expired):
            assert time.monotonic() < deadline, "the coordinator never removed A"
            await asyncio.sleep(0.2)
        await asyncio.to_thread(proxy.release_held)
        ok = await a.end(commit=True)
        counters = dict(a.counters)
        b = TransactSession(conf(bs, group), [inp])
        await b.start()
        await drain(bs, [a, b], out, group, inp, n, 2)
        await a.close()
        await b.close()
        return ok, counters

    ok, counters = asyncio.run(main())
    assert ok is False, "a member removed from the group committed"
    assert counters["aborted"] == 1 and set(counters["aborts_by_cause"]) <= {"heartbeat", "lost", "offset_commit"}
    doc = verify(bs, inp, out, group)
    assert doc["_counts"] == CLEAN, doc["examples"]
    assert doc["output_records"] == n


def test_offset_fetch_does_not_queue_behind_a_held_join_group(sbroker: EmbeddedBroker, kit: Any) -> None:
    """OffsetFetch (a rewind after an abort, committed()) while the member's JoinGroup is held by the broker.

    A kafka-python member that stops polling does not rejoin until its rebalance timeout (15 s), so the
    broker holds the session's JoinGroup that long. On the group's connection the OffsetFetch would wait
    behind it (a broker answers in request order per connection), time out after request.timeout.ms and
    close the connection under the JoinGroup (found by test 3 with cooperative-sticky). It must be answered
    at once."""
    from kafka import KafkaConsumer

    inp, _ = make_topics(sbroker.bootstrap, kit, "heldjoin", parts=2)
    group = "heldjoin"
    other = KafkaConsumer(bootstrap_servers=sbroker.bootstrap, group_id=group, session_timeout_ms=10000,
                          max_poll_interval_ms=15000, heartbeat_interval_ms=1000, auto_offset_reset="earliest",
                          enable_auto_commit=False)
    other.subscribe([inp])
    deadline = time.monotonic() + 30
    while not other.assignment():
        assert time.monotonic() < deadline, "kafka-python member never got an assignment"
        other.poll(200)

    async def go() -> float:
        s = TransactSession({"bootstrap.servers": sbroker.bootstrap, "group.id": group,
                             "session.timeout.ms": 10000, "request.timeout.ms": 3000}, [inp])
        await s.start()
        try:
            # the session's JoinGroup is held until the idle member's rebalance timeout
            t = time.monotonic() + 10
            while s.member._state != "joining" and time.monotonic() < t:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            assert not s.member.in_group
            t0 = time.monotonic()
            await s.committed([(inp, 0), (inp, 1)], timeout=10)
            took = time.monotonic() - t0
            assert not s.member.in_group, "the join ended before the check: the test proves nothing"
            return took
        finally:
            await s.close()

    try:
        took = asyncio.run(go())
    finally:
        other.close(autocommit=False)
    assert took < 1.0, f"OffsetFetch took {took:.1f}s: it waited behind the held JoinGroup"


def test_blocking_produce_many_in_bulk_per_partition(sbroker: EmbeddedBroker, kit: Any) -> None:
    """``produce_many`` of (topic, key, value, partition) dicts goes in bulk per partition (no future per
    record); an aborted bulk transaction stays invisible, the committed copy is exact and in order."""
    from oncelog.client import TransactSession as BlockingSession

    bs = sbroker.bootstrap
    inp, out = make_topics(bs, kit, "bulk", parts=3)
    n = 600
    seed(bs, inp, n, parts=3)
    group = f"g-{inp}"
    with BlockingSession(conf(bs, group), [inp]) as s:
        assert len(s.wait_assigned(30)) == 3
        aborted = s.poll(5.0, 50)
        s.produce_many({"topic": out, "key": m.key, "value": m.value, "partition": m.partition} for m in aborted)
        assert s.counters["records_out"] == len(aborted)
        assert s.end(commit=False) is False
        while s.counters["records_in"] < n + len(aborted):
            recs = s.poll(2.0, 200)
            s.produce_many({"topic": out, "key": m.key, "value": m.value, "partition": m.partition} for m in recs)
            assert s.end(commit=True) is True
    doc = verify(bs, inp, out, group)
    assert doc["_counts"] == CLEAN, doc["examples"]
    assert doc["output_records"] == n and doc["aborted_seen"] == len(aborted)


def test_ctrl_c_during_blocking_end_then_end_again_commits_once(broker: EmbeddedBroker, kit: Any,
                                                                 monkeypatch: Any) -> None:
    """Ctrl-C while a blocking ``TransactSession.end()`` waits for EndTxn: the commit runs on, and ``end()``
    called again (as Java's commitTransaction may be after an interrupt) returns its outcome. Before, the
    commit was cancelled half-way (state COMMITTING) and the second end() raised IllegalStateError (the session
    was over); with the coroutine left running but no re-check of the transaction after the lock, the second
    end() re-ran the finished transaction and raised ``cannot abort in state READY``."""
    import signal
    import threading

    from oncelog.client import TransactSession as BlockingSession
    from oncelog.client.aio import transactions as txn_mod
    from oncelog.client.aio.transactions import TxnState

    bs = broker.bootstrap
    kit.create_topic(bs, "rin", 1)
    kit.create_topic(bs, "rout", 1)
    from confluent_kafka import Consumer as CkConsumer
    from confluent_kafka import Producer as CkProducer
    p = CkProducer({"bootstrap.servers": bs})
    for i in range(10):
        p.produce("rin", value=b"v%d" % i, partition=0)
    assert p.flush(30) == 0

    s = BlockingSession({"bootstrap.servers": bs, "group.id": "rg", "auto.offset.reset": "earliest",
                         "session.timeout.ms": 6000, "heartbeat.interval.ms": 500}, ["rin"])
    try:
        s.wait_assigned(30)
        got: list[Any] = []
        t0 = time.monotonic()
        while not got and time.monotonic() < t0 + 20:
            got = s.poll(1.0)
        assert got
        for m in got:
            s.produce("rout", m.value, partition=0)

        real_end = txn_mod.TransactionManager._end
        slow = {"on": True}

        async def slow_end(self: Any, commit: bool, deadline: float) -> None:
            if slow["on"]:
                await asyncio.sleep(1.0)  # EndTxn on the wire
            await real_end(self, commit, deadline)

        monkeypatch.setattr(txn_mod.TransactionManager, "_end", slow_end)
        main = threading.main_thread().ident
        timer = threading.Timer(0.5, signal.pthread_kill, (main, signal.SIGINT))
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            s.end(True)
        timer.join()
        assert s.end(True) is True  # waits for the first end() on the loop, and reports its commit
        slow["on"] = False
        assert s._s._producer._core.txn.state is TxnState.READY
        assert s.counters["committed"] == 1
    finally:
        s.close()
    c = CkConsumer({"bootstrap.servers": bs, "group.id": "rcheck", "auto.offset.reset": "earliest",
                    "isolation.level": "read_committed"})
    try:
        c.assign([__import__("confluent_kafka").TopicPartition("rout", 0)])
        seen: list[bytes] = []
        t0 = time.monotonic()
        while len(seen) < len(got) and time.monotonic() < t0 + 20:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                seen.append(m.value())
        assert seen == [m.value for m in got]
    finally:
        c.close()
