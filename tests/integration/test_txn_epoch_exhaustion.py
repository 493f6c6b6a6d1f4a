"""Epoch exhaustion end to end: a transactional id whose producer epoch reaches
Short.MAX_VALUE - 1 moves to a new producer id (Kafka's rotation), against the
real broker with oncelog's client.

Reaching the edge by InitProducerId alone takes ~32k durable round trips, so
the test lets the broker allocate the producer id (one real transaction),
stops the broker, rewrites that id's record in the broker's own transaction
log (``FileTxnLog``, the code the broker loads it with) with the epoch a few
bumps below the edge, restarts the broker, and drives the last bumps and the
rotation with real requests.

Checked across the edge:

* plain commit/abort from one producer (TV2: every EndTxn bumps; the one at
  the edge answers a new producer id), read_committed shows the committed
  records once and no aborted one; a zombie holding the old id is fenced;
* the Spark sink's pattern (KIP-939), with the sink's own ``resolve`` and
  ``resolve_id``: a task prepares, another producer instance runs
  ``init_transactions(keep_prepared_txn=True)`` and
  ``complete_transaction(state)`` (commit when the decided state matches,
  abort otherwise, e.g. a stale state of the id's old producer id). The seeds make the prepare land at every phase below the edge,
  including a prepare at the last usable epoch (32766), which a kept
  transaction must still complete: the new client gets a new producer id
  while the transaction keeps its own id and epoch for its markers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from oncelog.broker.txn.log import FileTxnLog
from oncelog.broker.txn.state import MAX_EPOCH
from oncelog.client import Consumer, PreparedTxnState, Producer, TopicPartition
from oncelog.client.errors import KafkaError
from oncelog.spark.sink import SinkOptions, resolve, resolve_id
from oncelog.testing import EmbeddedBroker

LAST = MAX_EPOCH - 1  # 32766: the last epoch a client may hold


def _conf(b: EmbeddedBroker, tid: str) -> dict[str, Any]:
    return {"bootstrap.servers": b.bootstrap, "transactional.id": tid, "transaction.two.phase.commit.enable": True}


def _ids(p: Producer) -> tuple[int, int]:
    core = p._core
    return core.producer_id, core.producer_epoch


def _seed_epoch(b: EmbeddedBroker, tids: dict[str, int]) -> None:
    """With the broker stopped: set each id's epoch in its transaction log record (test setup)."""
    b.stop()

    async def rewrite() -> None:
        store = FileTxnLog.open(b.data_dir, None, lambda: int(time.time() * 1000))
        try:
            loaded = store.load()
            for tid, epoch in tids.items():
                md = loaded[tid]
                assert md.state.display_name in ("CompleteCommit", "CompleteAbort", "Empty"), md
                assert md.producer_epoch < epoch
                await store.write(tid, md.replace(producer_epoch=epoch, last_producer_epoch=-1))
        finally:
            store.close()

    asyncio.run(rewrite())
    b.start()


def _read_committed(b: EmbeddedBroker, topic: str) -> list[bytes]:
    with Consumer({"bootstrap.servers": b.bootstrap, "isolation.level": "read_committed"}) as c:
        deadline = time.monotonic() + 30
        while True:  # every marker written: the LSO reaches the high watermark
            lso = c.get_watermark_offsets((topic, 0))[1]
            with Consumer({"bootstrap.servers": b.bootstrap}) as raw:
                hw = raw.get_watermark_offsets((topic, 0))[1]
            if lso == hw:
                break
            assert time.monotonic() < deadline, (lso, hw)
            time.sleep(0.05)
    out: list[bytes] = []
    with Consumer({"bootstrap.servers": b.bootstrap, "auto.offset.reset": "earliest",
                   "isolation.level": "read_committed"}) as c:
        c.assign([TopicPartition(topic, 0)])
        deadline = time.monotonic() + 30
        while c.position((topic, 0)) < hw:
            assert time.monotonic() < deadline
            out.extend(m.value for m in c.consume(1000, 0.2))
    return out


@pytest.fixture
def broker(broker_factory: Callable[..., EmbeddedBroker], kit: Any) -> EmbeddedBroker:
    b = broker_factory(config={"oncelog.transaction.version": "2", "transaction.two.phase.commit.enable": "true"},
                       name="epoch")
    return b


def _first_txn(b: EmbeddedBroker, tid: str, topic: str) -> int:
    with Producer(_conf(b, tid)) as p:
        p.init_transactions()
        p.begin_transaction()
        p.produce(topic, f"{tid}-first".encode(), partition=0)
        p.commit_transaction()
        return _ids(p)[0]


def test_commit_abort_and_zombie_across_rotation(broker: EmbeddedBroker, kit: Any) -> None:
    b = broker
    kit.create_topic(b.bootstrap, "ex", 1)
    pid0 = _first_txn(b, "plain", "ex")
    _seed_epoch(b, {"plain": LAST - 6})
    want = [b"plain-first"]
    with Producer(_conf(b, "plain")) as p:
        p.init_transactions()
        assert _ids(p) == (pid0, LAST - 5)
        seen = [_ids(p)]
        for i in range(8):  # each EndTxn bumps once: the rotation comes at the 5th
            p.begin_transaction()
            p.produce("ex", b"plain-%d" % i, partition=0)
            if i % 3 == 1:
                p.flush()  # the record is written (in the transaction) before the abort
                p.abort_transaction()
            else:
                p.commit_transaction()
                want.append(b"plain-%d" % i)
            seen.append(_ids(p))
    pids = [pid for pid, _ in seen]
    assert pids[0] == pid0 and pids[-1] != pid0, seen
    assert all(e2 == e1 + 1 for (p1, e1), (p2, e2) in zip(seen, seen[1:]) if p1 == p2), seen
    rot = pids.index(pids[-1])
    assert seen[rot - 1] == (pid0, LAST) and seen[rot] == (pids[-1], 0), seen
    assert sorted(_read_committed(b, "ex")) == sorted(want)

    # a zombie: a second instance left holding the old producer id, fenced by a new one
    z = Producer(_conf(b, "zombie"))
    try:
        _first_txn(b, "zombie", "ex")
        _seed_epoch(b, {"zombie": LAST - 2})
        z.init_transactions()
        zpid, zepoch = _ids(z)
        assert zepoch == LAST - 1
        with Producer(_conf(b, "zombie")) as fresh:  # fences z: LAST, then rotates on its EndTxn
            fresh.init_transactions()
            assert _ids(fresh) == (zpid, LAST)
            fresh.begin_transaction()
            fresh.produce("ex", b"fresh", partition=0)
            fresh.commit_transaction()
            assert _ids(fresh)[0] != zpid
            want += [b"zombie-first", b"fresh"]
            z.begin_transaction()
            z.produce("ex", b"zombie-late", partition=0)
            with pytest.raises(KafkaError):
                z.commit_transaction()
    finally:
        z.close(5)
    got = _read_committed(b, "ex")
    assert sorted(got) == sorted(want) and b"zombie-late" not in got


@pytest.mark.parametrize("seed", [LAST - 9, LAST - 8, LAST - 7])
def test_prepared_transactions_across_rotation(broker: EmbeddedBroker, kit: Any, seed: int) -> None:
    """The sink's decision/completion path over the edge, at each phase of the 3-bump cycle."""
    b = broker
    kit.create_topic(b.bootstrap, "sink", 1)
    tid = "task-0"
    pid0 = _first_txn(b, tid, "sink")
    _seed_epoch(b, {tid: seed})
    want = [b"task-0-first"]
    states: list[PreparedTxnState] = []
    prepare_epochs = []
    stale = None
    zombie: Producer | None = None
    opts = SinkOptions(bootstrap=b.bootstrap, topic="sink", guarantee="exactly_once", producer={},
                       txn_prefix="task", decision_topic="decisions")
    for batch in range(6):
        task = Producer(_conf(b, tid))  # the executor's task: settle what is kept, then write, prepare
        task.init_transactions(keep_prepared_txn=True)
        assert resolve(task, "") == "none"  # the driver completed the previous batch
        task.begin_transaction()
        for k in range(3):
            task.produce("sink", b"b%d-%d" % (batch, k), partition=0)
        state = task.prepare_transaction()
        if zombie is None and state.epoch >= LAST - 2:
            zombie = task  # left holding the last transaction before the edge
        else:
            task.close(5)
        states.append(state)
        prepare_epochs.append(state.epoch)
        commit = batch % 2 == 0
        decided = state if commit else (stale or PreparedTxnState(state.producer_id, max(0, state.epoch - 3)))
        # the driver: a new producer instance completes with the decided state (the sink's own code)
        assert resolve_id(opts, tid, str(decided)) == "completed"
        if commit:
            want += [b"b%d-%d" % (batch, k) for k in range(3)]
            stale = state
    # the zombie task (its transaction since completed by the driver) cannot end it again
    assert zombie is not None
    try:
        with pytest.raises(KafkaError):
            zombie.commit_transaction()
    finally:
        zombie.close(5)
    assert states[0].producer_id == pid0 and states[-1].producer_id != pid0, states
    assert max(prepare_epochs) >= LAST - 2, prepare_epochs
    got = _read_committed(b, "sink")
    assert sorted(got) == sorted(want), (got, want)
    assert len(got) == len(set(got))
    # the id goes on normally after the rotation
    with Producer(_conf(b, tid)) as p:
        p.init_transactions(keep_prepared_txn=True)
        p.begin_transaction()
        p.produce("sink", b"after", partition=0)
        p.commit_transaction()
    assert sorted(_read_committed(b, "sink")) == sorted(want + [b"after"])


def test_init_producer_id_walks_the_last_epochs_one_by_one(broker: EmbeddedBroker, kit: Any) -> None:
    """The last ~2,800 epochs by real InitProducerId requests (each fences: +1), then the rotation,
    which survives a restart. (The whole space by requests: ~1,400 a second here, ~24 s unloaded.)"""
    from oncelog.client.connection import Connection

    b = broker
    kit.create_topic(b.bootstrap, "walk", 1)
    pid0 = _first_txn(b, "walk", "walk")
    start = 30_000
    _seed_epoch(b, {"walk": start})
    answers = []
    with Connection(b.bootstrap) as c:
        for _ in range(LAST - start + 1):
            r = c.request(22, 5, {"transactional_id": "walk", "transaction_timeout": 60_000,
                                  "producer_id": -1, "producer_epoch": -1})
            assert r.error_code == 0
            answers.append((r.producer_id, r.producer_epoch))
    assert answers[:-1] == [(pid0, e) for e in range(start + 1, LAST + 1)]
    new_pid, epoch = answers[-1]
    assert new_pid != pid0 and epoch == 0
    b.stop()
    b.start()
    with Producer(_conf(b, "walk")) as p:
        p.init_transactions()
        assert _ids(p) == (new_pid, 1)
        p.begin_transaction()
        p.produce("walk", b"after", partition=0)
        p.commit_transaction()
    assert sorted(_read_committed(b, "walk")) == [b"after", b"walk-first"]
