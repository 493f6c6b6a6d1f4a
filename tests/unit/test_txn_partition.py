"""Transactions on one partition (sans-IO): open transactions, markers, the last
stable offset, the aborted-transaction index, recovery after a crash, and what
Fetch / ListOffsets make of them."""

from __future__ import annotations

import asyncio
import itertools
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import oncelog.broker.partition as partition_mod
from oncelog.broker.handlers import fetch as fetch_handler
from oncelog.broker.handlers import list_offsets as list_offsets_handler
from oncelog.broker.partition import Partition
from oncelog.broker.producer_ids import ProducerIdManager
from oncelog.protocol.errors import ErrorCode, KafkaError
from oncelog.protocol.records import (
    Record,
    encode_record_batch,
    iter_batch_headers,
    parse_batch_header,
    read_control_marker,
)
from oncelog.storage.config import LogConfig
from oncelog.storage.log import PartitionLog

T0 = 1_700_000_000_000


class Env:
    """A partition in a temp dir with an id manager; ``seq`` tracks each producer's next sequence."""

    def __init__(self, root: Path, cfg: LogConfig | None = None) -> None:
        self.root = root
        self.cfg = cfg or LogConfig()
        self.ids = ProducerIdManager(root / "meta")
        self.part = Partition("t", 0, None, PartitionLog.open(root / "t-0", self.cfg, T0))
        self.seq: dict[tuple[int, int], int] = {}

    @property
    def log(self) -> PartitionLog:
        return self.part.log

    def pid(self) -> int:
        return self.ids.generate()

    def send(self, pid: int, n: int = 2, *, epoch: int = 0, txn: bool = True, verify: Any = None, ts: int = T0) -> int:
        seq = self.seq.get((pid, epoch), 0)
        raw = encode_record_batch(
            [Record(b"k", b"p%d-s%d" % (pid, seq + i)) for i in range(n)],
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=seq,
            is_transactional=txn,
            base_timestamp=ts,
        )
        base, _ = self.part.append_batch(raw, parse_batch_header(raw), T0, self.ids, verify_txn=verify)
        self.seq[(pid, epoch)] = seq + n
        return base

    def marker(self, pid: int, commit: bool, *, epoch: int = 0, coordinator_epoch: int = 0, tv: int = 0) -> int:
        return self.part.write_marker(pid, epoch, coordinator_epoch, commit, T0, transaction_version=tv)

    def durable(self) -> None:
        self.log.sync()
        self.part.advance_high_watermark(self.log.log_end_offset)

    def crash_and_reopen(self) -> Partition:
        for seg in self.log.segments:  # no clean shutdown: files stay as the OS has them
            seg.close()
        self.part = Partition("t", 0, None, PartitionLog.open(self.root / "t-0", self.cfg, T0))
        return self.part


def _state(p: Partition) -> tuple[Any, ...]:
    return (
        p.log.log_end_offset,
        p.open_transactions(),
        p.last_stable_offset,
        p.aborted_transactions(0, 1 << 60),
        [(e.producer_id, e.epoch, e.coordinator_epoch, e.current_txn_first_offset, e.batches) for e in p.producers],
    )


# --- open transactions and the last stable offset ---------------------------------------


def test_lso_with_interleaved_producers(tmp_path: Path) -> None:
    env = Env(tmp_path)
    a, b, c = env.pid(), env.pid(), env.pid()
    assert env.send(a) == 0
    assert env.send(b) == 2
    assert env.send(c, txn=False) == 4  # idempotent, not transactional: does not hold the LSO
    assert env.send(a) == 6
    env.durable()
    assert env.part.high_watermark == 8
    assert env.part.open_transactions() == [(a, 0), (b, 2)]
    assert env.part.last_stable_offset == 0
    assert env.marker(a, commit=False) == 8
    env.durable()
    assert env.part.open_transactions() == [(b, 2)]
    assert env.part.last_stable_offset == 2
    assert env.marker(b, commit=True) == 9
    env.durable()
    assert env.part.open_transactions() == []
    assert env.part.last_stable_offset == env.part.high_watermark == 10


def test_lso_waits_for_the_marker_to_be_below_the_high_watermark(tmp_path: Path) -> None:
    env = Env(tmp_path)
    a = env.pid()
    env.send(a)
    env.durable()
    m = env.marker(a, commit=True)
    assert env.part.open_transactions() == []
    assert env.part.last_stable_offset == 0, "the marker is not durable yet"

    async def scenario() -> None:
        assert env.part.high_watermark == m  # at the marker, not past it
        fut = asyncio.get_running_loop().create_future()
        env.part.add_waiter(fut)
        env.part.advance_high_watermark(m + 1)
        assert fut.done(), "the high watermark passing the marker wakes read_committed waiters"
        assert env.part.last_stable_offset == m + 1

    asyncio.run(scenario())


def test_lso_never_exceeds_high_watermark(tmp_path: Path) -> None:
    env = Env(tmp_path)
    env.durable()
    a = env.pid()
    env.send(a, txn=False)
    assert env.part.last_stable_offset == env.part.high_watermark == 0
    env.durable()
    assert env.part.last_stable_offset == 2


# --- appends --------------------------------------------------------------------------


def test_non_transactional_batch_during_txn_is_rejected_and_writes_nothing(tmp_path: Path) -> None:
    env = Env(tmp_path)
    a = env.pid()
    env.send(a)
    before = _state(env.part)
    with pytest.raises(KafkaError) as exc:
        env.send(a, txn=False)
    assert exc.value.code == ErrorCode.invalid_txn_state
    assert _state(env.part) == before


def test_verify_txn_only_when_no_txn_is_open_at_that_epoch(tmp_path: Path) -> None:
    env = Env(tmp_path)
    a = env.pid()
    calls: list[tuple[int, int]] = []

    def refuse(pid: int, epoch: int) -> None:
        calls.append((pid, epoch))
        raise KafkaError(ErrorCode.invalid_txn_state, "partition not in the transaction")

    before = _state(env.part)
    with pytest.raises(KafkaError) as exc:
        env.send(a, verify=refuse)
    assert exc.value.code == ErrorCode.invalid_txn_state and calls == [(a, 0)]
    assert _state(env.part) == before, "a refused verification writes nothing and opens nothing"
    env.seq.clear()

    def accept(pid: int, epoch: int) -> None:
        calls.append((pid, epoch))

    calls.clear()
    first = env.send(a, verify=accept)
    env.send(a, verify=accept)  # the transaction is open here now: no second check
    assert calls == [(a, 0)]
    # a retried (duplicate) first batch is answered from the cache without verification
    raw = encode_record_batch(
        [Record(b"k", b"p%d-s%d" % (a, i)) for i in range(2)], producer_id=a, producer_epoch=0, base_sequence=0,
        is_transactional=True, base_timestamp=T0,
    )  # fmt: skip
    assert env.part.append_batch(raw, parse_batch_header(raw), T0, env.ids, verify_txn=refuse)[0] == first
    env.marker(a, commit=True)
    env.send(a, verify=accept)  # a new transaction: verified again
    assert calls == [(a, 0), (a, 0)]


def test_unissued_producer_id_is_accepted_for_transactional_batches(tmp_path: Path) -> None:
    # as Kafka: no UNKNOWN_PRODUCER_ID; the coordinator's verification still applies
    env = Env(tmp_path)
    calls: list[tuple[int, int]] = []
    assert env.send(987654, verify=lambda pid, epoch: calls.append((pid, epoch))) == 0
    assert calls == [(987654, 0)]
    assert env.log.log_end_offset == 2


# --- markers -----------------------------------------------------------------------------


def test_marker_is_a_control_batch_clients_can_read(tmp_path: Path) -> None:
    env = Env(tmp_path)
    a = env.pid()
    env.send(a, epoch=2)
    m = env.marker(a, commit=True, epoch=2, coordinator_epoch=7)
    data = env.log.read(m, 1 << 20).data
    (hdr, start, end), = list(iter_batch_headers(data))
    assert hdr.is_control and hdr.is_transactional and hdr.base_offset == m
    assert (hdr.producer_id, hdr.producer_epoch) == (a, 2)
    marker = read_control_marker(data[start:end])
    assert marker.commit and marker.coordinator_epoch == 7


@pytest.mark.parametrize(
    "epoch, coordinator_epoch, tv, code",
    [
        (2, 5, 0, ErrorCode.invalid_producer_epoch),  # TV<2: older epoch
        (2, 5, 1, ErrorCode.invalid_producer_epoch),
        (3, 5, 2, ErrorCode.invalid_producer_epoch),  # TV2: same epoch while the txn is open
        (2, 5, 2, ErrorCode.invalid_producer_epoch),
        (3, 4, 0, ErrorCode.transaction_coordinator_fenced),  # zombie coordinator
        (4, 4, 2, ErrorCode.transaction_coordinator_fenced),
    ],
)
def test_rejected_marker_changes_nothing(tmp_path: Path, epoch: int, coordinator_epoch: int, tv: int, code: int) -> None:
    env = Env(tmp_path)
    a = env.pid()
    env.send(a, epoch=3)
    env.marker(a, commit=False, epoch=3, coordinator_epoch=5)  # coordinator epoch 5 is now known
    env.send(a, epoch=3)
    env.durable()
    before = _state(env.part)
    with pytest.raises(KafkaError) as exc:
        env.marker(a, commit=False, epoch=epoch, coordinator_epoch=coordinator_epoch, tv=tv)
    assert exc.value.code == code
    assert _state(env.part) == before


def test_tv2_marker_bumps_epoch_and_a_retry_is_written_again(tmp_path: Path) -> None:
    env = Env(tmp_path)
    a = env.pid()
    env.send(a, epoch=0)
    m = env.marker(a, commit=False, epoch=1, tv=2)
    entry = env.part.producers.get(a)
    assert entry is not None and entry.epoch == 1 and entry.current_txn_first_offset == -1
    retry = env.marker(a, commit=False, epoch=1, tv=2)  # lost response, coordinator retries
    assert retry == m + 1
    assert env.part.aborted_transactions(0, 1 << 60) == [(a, 0)], "a retry closes nothing: no second entry"
    with pytest.raises(KafkaError):
        env.send(a, epoch=0)  # the old epoch is fenced
    assert env.send(a, epoch=1) == m + 2  # next transaction at the bumped epoch, sequence 0


def test_marker_without_open_txn_writes_no_index_entry(tmp_path: Path) -> None:
    env = Env(tmp_path)
    a = env.pid()
    env.marker(a, commit=False)  # e.g. a partition added to the transaction but never written
    assert env.part.aborted_transactions(0, 1 << 60) == []
    env.durable()
    assert env.part.last_stable_offset == 1


def test_abort_entry_records_the_next_open_txn_as_its_lso(tmp_path: Path) -> None:
    env = Env(tmp_path)
    a, b = env.pid(), env.pid()
    env.send(a)
    env.send(b)  # 2
    m = env.marker(a, commit=False)
    (entry,) = env.log.collect_aborted_txns(0, 1 << 60)
    assert (entry.producer_id, entry.first_offset, entry.last_offset, entry.last_stable_offset) == (a, 0, m, 2)
    m2 = env.marker(b, commit=False)
    assert env.log.collect_aborted_txns(0, 1 << 60)[1].last_stable_offset == m2 + 1


def test_aborted_list_is_exact_for_every_range(tmp_path: Path) -> None:
    env = Env(tmp_path, LogConfig(segment_bytes=450))  # many segments: the search crosses them
    pids = [env.pid() for _ in range(4)]
    aborted: list[tuple[int, int, int]] = []  # (pid, first, marker)
    first: dict[int, int] = {}
    script = [0, 1, 0, 2, "a0", 1, 3, "c1", 2, "a2", 0, 3, "a3", 1, "a1", 0, "a0"]
    for step in script:
        if isinstance(step, int):
            off = env.send(pids[step], n=1)
            first.setdefault(step, off)
        else:
            i = int(step[1])
            m = env.marker(pids[i], commit=step[0] == "c")
            if step[0] == "a" and i in first:
                aborted.append((pids[i], first[i], m))
            first.pop(i, None)
    env.durable()
    assert len(env.log.segments) > 3
    end = env.log.log_end_offset
    for f, u in itertools.combinations_with_replacement(range(end + 1), 2):
        want = [(p, fo) for p, fo, last in aborted if last >= f and fo < u]
        assert env.part.aborted_transactions(f, u) == want, (f, u)


# --- recovery -------------------------------------------------------------------------------


def _busy_log(env: Env) -> dict[str, int]:
    """A aborted across a roll, C committed, B still open; rolls write snapshots."""
    a, b, c = env.pid(), env.pid(), env.pid()
    for _ in range(3):
        env.send(a)
        env.send(c)
    env.marker(c, commit=True)
    env.send(b)
    for _ in range(3):
        env.send(a)
    env.marker(a, commit=False)
    env.send(b)
    env.durable()
    return {"a": a, "b": b, "c": c}


def test_recovery_rebuilds_open_txns_lso_and_aborted_index(tmp_path: Path) -> None:
    env = Env(tmp_path, LogConfig(segment_bytes=600))
    pids = _busy_log(env)
    before = _state(env.part)
    assert before[1] == [(pids["b"], env.part.open_transactions()[0][1])] and before[3] == [(pids["a"], 0)]
    snaps = sorted((tmp_path / "t-0").glob("*.snapshot"))
    assert snaps, "rolls wrote producer snapshots"
    # the index entries at or above the newest snapshot were never synced: lose them
    newest = int(snaps[-1].name.split(".")[0])
    for seg in env.log.segments:
        if seg.next_offset > newest and seg.txn_index.path.exists():
            seg.txn_index.path.unlink()
    part = env.crash_and_reopen()
    assert _state(part) == before
    assert part.last_stable_offset == part.open_transactions()[0][1]


def test_recovery_without_snapshot_replays_the_whole_log(tmp_path: Path) -> None:
    env = Env(tmp_path, LogConfig(segment_bytes=600))
    _busy_log(env)
    before = _state(env.part)
    for snap in (tmp_path / "t-0").glob("*.snapshot"):
        snap.unlink()
    for idx in (tmp_path / "t-0").glob("*.txnindex"):
        idx.unlink()
    assert _state(env.crash_and_reopen()) == before


def test_lost_marker_reopens_its_transaction(tmp_path: Path) -> None:
    env = Env(tmp_path)
    a = env.pid()
    env.send(a)
    env.durable()
    m = env.marker(a, commit=False)
    assert env.part.aborted_transactions(0, 1 << 60) == [(a, 0)]
    active = env.log.active_segment
    marker_size = active.size - active.find(m)  # type: ignore[operator]
    os.truncate(active.log_path, active.size - marker_size)  # the crash took the unsynced marker
    part = env.crash_and_reopen()
    assert part.log.log_end_offset == m
    assert part.open_transactions() == [(a, 0)]
    assert part.last_stable_offset == 0
    assert part.aborted_transactions(0, 1 << 60) == []


def test_index_entries_survive_when_their_txn_start_is_gone(tmp_path: Path) -> None:
    """No usable snapshot and the transaction's first batches deleted: keep the durable entry."""
    env = Env(tmp_path)
    a = env.pid()
    env.send(a)
    env.log.roll()
    env.send(a)
    m = env.marker(a, commit=False)
    env.durable()
    env.log.sync_txn_indexes()
    env.log.delete_records_before(env.log.segments[1].base_offset)
    for snap in (tmp_path / "t-0").glob("*.snapshot"):
        snap.unlink()
    part = env.crash_and_reopen()
    assert part.log.log_start_offset == 2
    assert part.aborted_transactions(2, m + 1) == [(a, 0)]


def test_txn_indexes_are_synced_before_a_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = Env(tmp_path)
    events: list[str] = []
    real_sync = env.log.sync_txn_indexes
    real_write = partition_mod.write_offset_named

    def sync() -> None:
        events.append("sync")
        real_sync()

    def write(*args: Any) -> Any:
        events.append("snapshot")
        return real_write(*args)

    monkeypatch.setattr(env.log, "sync_txn_indexes", sync)
    monkeypatch.setattr(partition_mod, "write_offset_named", write)
    env.part.snapshot_producer_state()
    assert events == ["sync", "snapshot"]


def test_clean_restart_keeps_everything(tmp_path: Path) -> None:
    env = Env(tmp_path, LogConfig(segment_bytes=600))
    _busy_log(env)
    before = _state(env.part)
    env.part.snapshot_producer_state()
    env.log.close()
    env.part = Partition("t", 0, None, PartitionLog.open(tmp_path / "t-0", env.cfg, T0))
    assert _state(env.part) == before


# --- Fetch and ListOffsets ---------------------------------------------------------------------


def _ctx(part: Partition, version: int = 12) -> Any:
    broker = SimpleNamespace(
        topics={"t": SimpleNamespace(partitions=[part])}, topics_by_id={}, partition=lambda _t, _i: part,
        log_dir=SimpleNamespace(offline=False),
    )
    return SimpleNamespace(broker=broker, version=version, applied=lambda: None)


def _fetch(part: Partition, offset: int, isolation: int, max_bytes: int = 1 << 20) -> dict[str, Any]:
    req = SimpleNamespace(
        topics=[SimpleNamespace(topic="t", partitions=[SimpleNamespace(partition=0, fetch_offset=offset, partition_max_bytes=max_bytes)])],
        isolation_level=isolation, max_bytes=max_bytes, max_wait=0, min_bytes=0,
    )  # fmt: skip
    resp = asyncio.run(fetch_handler.handle(_ctx(part), req))
    return resp["responses"][0]["partitions"][0]


def _batches(records: bytes) -> list[tuple[int, int]]:
    return [(h.base_offset, h.last_offset) for h, _s, _e in iter_batch_headers(records)]


def test_fetch_read_committed_stops_at_lso_and_lists_aborted(tmp_path: Path) -> None:
    env = Env(tmp_path)
    a, b = env.pid(), env.pid()
    env.send(a)  # 0-1
    env.send(b)  # 2-3
    env.marker(a, commit=False)  # 4
    env.durable()
    rc = _fetch(env.part, 0, 1)
    assert rc["last_stable_offset"] == 2 and rc["high_watermark"] == 5
    assert _batches(rc["records"]) == [(0, 1)]
    assert rc["aborted_transactions"] == [{"producer_id": a, "first_offset": 0}]
    ru = _fetch(env.part, 0, 0)
    assert _batches(ru["records"]) == [(0, 1), (2, 3), (4, 4)]
    assert ru["aborted_transactions"] is None and ru["last_stable_offset"] == 2
    at_lso = _fetch(env.part, 2, 1)
    assert at_lso["records"] == b"" and at_lso["aborted_transactions"] == []
    env.marker(b, commit=True)  # 5
    env.durable()
    rc = _fetch(env.part, 2, 1)
    assert _batches(rc["records"]) == [(2, 3), (4, 4), (5, 5)]
    assert rc["aborted_transactions"] == [{"producer_id": a, "first_offset": 0}]  # marker 4 is in range
    assert _fetch(env.part, 5, 1)["aborted_transactions"] == []


def test_fetch_aborted_list_matches_the_returned_range_only(tmp_path: Path) -> None:
    env = Env(tmp_path)
    a, b = env.pid(), env.pid()
    env.send(a)  # 0-1
    env.marker(a, commit=False)  # 2
    env.send(b, n=20)  # 3-22, a big batch
    env.marker(b, commit=False)  # 23
    env.durable()
    small = _fetch(env.part, 0, 1, max_bytes=10)  # only the first batch fits (returned whole)
    assert _batches(small["records"]) == [(0, 1)]
    assert small["aborted_transactions"] == [{"producer_id": a, "first_offset": 0}]
    whole = _fetch(env.part, 0, 1)
    assert [t["producer_id"] for t in whole["aborted_transactions"]] == [a, b]


def _list_offsets(part: Partition, ts: int, isolation: int) -> dict[str, Any]:
    req = SimpleNamespace(
        topics=[SimpleNamespace(name="t", partitions=[SimpleNamespace(partition_index=0, timestamp=ts)])],
        isolation_level=isolation,
    )
    resp = asyncio.run(list_offsets_handler.handle(_ctx(part, 8), req))
    return resp["topics"][0]["partitions"][0]


def test_list_offsets_honours_isolation_level(tmp_path: Path) -> None:
    env = Env(tmp_path)
    a, b = env.pid(), env.pid()
    env.send(b, txn=False, ts=T0)  # 0-1
    env.send(a, ts=T0 + 10)  # 2-3, open
    env.send(b, txn=False, ts=T0 + 20)  # 4-5
    env.durable()
    assert _list_offsets(env.part, -1, 0)["offset"] == 6
    assert _list_offsets(env.part, -1, 1)["offset"] == 2
    assert _list_offsets(env.part, T0, 1)["offset"] == 0
    assert _list_offsets(env.part, T0 + 10, 0)["offset"] == 2
    assert _list_offsets(env.part, T0 + 10, 1)["offset"] == -1, "offset 2 is not stable yet"
    assert _list_offsets(env.part, -3, 1)["offset"] == -1
    env.marker(a, commit=True)
    env.durable()
    assert _list_offsets(env.part, -1, 1)["offset"] == 7
    assert _list_offsets(env.part, T0 + 10, 1)["offset"] == 2


def test_lso_is_clamped_to_the_log_start_offset(tmp_path: Path) -> None:
    env = Env(tmp_path)
    a, b = env.pid(), env.pid()
    env.send(a)  # 0-1, stays open
    env.log.roll()
    env.send(b, txn=False)  # 2-3
    env.durable()
    assert env.part.last_stable_offset == 0
    env.log.delete_records_before(2)
    assert env.part.open_transactions() == [(a, 0)]
    assert env.part.last_stable_offset == 2
    assert _list_offsets(env.part, -1, 1)["offset"] == 2


def test_describe_producers_reports_the_open_txn(tmp_path: Path) -> None:
    from oncelog.broker.handlers import describe_producers

    env = Env(tmp_path)
    a, b = env.pid(), env.pid()
    env.send(b, txn=False)
    env.send(a)  # 2
    req = SimpleNamespace(topics=[SimpleNamespace(name="t", partition_indexes=[0])])

    def rows() -> dict[int, dict[str, Any]]:
        resp = asyncio.run(describe_producers.handle(_ctx(env.part, 0), req))
        return {r["producer_id"]: r for r in resp["topics"][0]["partitions"][0]["active_producers"]}

    got = rows()
    assert got[a]["current_txn_start_offset"] == 2 and got[b]["current_txn_start_offset"] == -1
    assert got[a]["last_sequence"] == 1
    env.marker(a, commit=True, coordinator_epoch=4)
    got = rows()
    assert got[a]["current_txn_start_offset"] == -1 and got[a]["coordinator_epoch"] == 4
