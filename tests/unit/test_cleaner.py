"""The log cleaner's pure parts (storage/cleaner.py): which records survive, the offset
map's bound, the cleanable range, grouping, the I/O throttle; and the log's swap with its
crash recovery (storage/log.py), on real files. Time is a parameter (a fake clock)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from oncelog.broker.recompress import recompress
from oncelog.protocol.compression import decompressed_batch
from oncelog.protocol.records import (
    COMPRESSION_LZ4,
    DELETE_HORIZON_BIT,
    Record,
    encode_control_batch,
    encode_record_batch,
    iter_records,
    parse_batch_header,
)
from oncelog.storage.cleaner import (
    SLOT_SIZE,
    BatchFilter,
    CleanerStats,
    LastRecord,
    OffsetMap,
    SegmentInfo,
    Throttler,
    TxnTracker,
    build_offset_map,
    cleanable_range,
    group_segments,
)
from oncelog.storage.config import LogConfig
from oncelog.storage.log import CLEANED_END_FILE, LOG_START_FILE, PartitionLog
from oncelog.storage.txn_index import AbortedTxn
from tests.unit.held_sync import HeldSync, open_fds

NOW = 1_700_000_000_000
RETENTION = 1000


def batch(base: int, *recs: tuple[bytes | None, bytes | None], **kw: object) -> bytes:
    return encode_record_batch([Record(k, v, timestamp_delta=i) for i, (k, v) in enumerate(recs)],
                               base_offset=base, base_timestamp=NOW - 10_000, **kw)  # type: ignore[arg-type]


def decode(data: bytes) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(off, r.key, r.value) for off, _ts, r in iter_records(decompressed_batch(data))]


def run_pass(batches: list[bytes], now: int = NOW, last: dict[int, LastRecord] | None = None,
             aborted: list[AbortedTxn] = (), upper: int | None = None) -> list[bytes]:  # type: ignore[assignment]
    """One cleaning pass over ``batches`` as a whole log: map, then filter."""
    stats = CleanerStats()
    m = OffsetMap(1 << 20)
    m.clear()
    hdrs = [parse_batch_header(b) for b in batches]
    end = hdrs[-1].next_offset if upper is None else upper
    build_offset_map([(hdrs[0].base_offset, end, lambda: iter(zip(hdrs, batches)))], 0, m, aborted, stats)
    txns = TxnTracker()
    txns.add_aborted(aborted)
    f = BatchFilter(m, now, RETENTION, last or {}, end, txns, stats)
    out = [f.filter(h, b) for h, b in zip(hdrs, batches)]
    return [bytes(o) for o in out if o is not None]


def records_of(batches: list[bytes]) -> list[tuple[int, bytes | None, bytes | None]]:
    return [r for b in batches for r in decode(b)]


# -- the offset map ---------------------------------------------------------------------------


def test_offset_map_keeps_the_latest_offset_per_key_within_its_memory() -> None:
    m = OffsetMap(24 * 100, load_factor=0.9)
    m.clear()
    assert m.slots == 100 and m.capacity == 90 and m.memory == 100 * SLOT_SIZE
    for i in range(90):
        m.put(b"k%d" % i, i)
    m.put(b"k3", 500)  # an update needs no new slot
    assert m.full and m.get(b"k3") == 500 and m.get(b"k89") == 89 and m.get(b"nope") == -1
    assert m.latest_offset == 500
    with pytest.raises(OverflowError):
        m.put(b"one more", 501)
    m.clear(expected_entries=10)  # a pass that can see at most 10 records takes a small table
    assert m.slots < 100 and m.memory <= 24 * 100 and m.size == 0 and m.get(b"k3") == -1


def test_a_full_map_stops_the_pass_where_it_filled() -> None:
    m = OffsetMap(24 * 10, load_factor=0.5)  # 5 keys at most
    m.clear()
    b1 = batch(0, *[(b"k%d" % i, b"v") for i in range(4)])
    b2 = batch(4, *[(b"k%d" % i, b"v") for i in range(4, 8)])
    hdrs = [parse_batch_header(b1), parse_batch_header(b2)]
    full = build_offset_map([(0, 8, lambda: iter(zip(hdrs, [b1, b2])))], 0, m, [], CleanerStats())
    assert full and m.size == 5 and m.latest_offset == 4  # the next pass starts at offset 5


# -- what survives -----------------------------------------------------------------------------


def test_latest_value_per_key_survives_with_its_offset_and_keyless_records_go() -> None:
    out = run_pass([
        batch(0, (b"a", b"1"), (b"b", b"1"), (None, b"x")),
        batch(3, (b"a", b"2"), (b"c", b"1")),
        batch(5, (b"b", b"2")),
    ])
    assert records_of(out) == [(3, b"a", b"2"), (4, b"c", b"1"), (5, b"b", b"2")]
    hdrs = [parse_batch_header(b) for b in out]
    assert [(h.base_offset, h.last_offset_delta) for h in hdrs] == [(3, 1), (5, 0)]  # first batch: nothing left


def test_a_partly_kept_batch_keeps_base_offset_last_offset_codec_and_producer_fields() -> None:
    raw = batch(0, (b"a", b"1"), (b"b", b"1"), (b"c", b"1"), producer_id=7, producer_epoch=2, base_sequence=40)
    lz4 = bytearray(recompress(raw, parse_batch_header(raw), COMPRESSION_LZ4)[0])
    lz4[0:8] = (10).to_bytes(8, "big")  # as the log stores it (the base offset is outside the CRC)
    lz4 = bytes(lz4)
    out = run_pass([lz4, batch(13, (b"b", b"2"))])
    first = parse_batch_header(out[0])
    assert first.compression == COMPRESSION_LZ4
    assert (first.base_offset, first.last_offset_delta, first.records_count) == (10, 2, 2)
    assert (first.producer_id, first.producer_epoch, first.base_sequence) == (7, 2, 40)
    assert decode(out[0]) == [(10, b"a", b"1"), (12, b"c", b"1")]
    # record timestamps are kept (the second record had delta 1, the third delta 2)
    assert [ts for _o, ts, _r in iter_records(decompressed_batch(out[0]))] == [NOW - 10_000, NOW - 10_000 + 2]


def test_tombstones_are_stamped_then_removed_after_delete_retention() -> None:
    log = [batch(0, (b"a", b"1")), batch(1, (b"a", None), (b"b", b"1")), batch(3, (b"c", b"1"))]
    first = run_pass(log, now=NOW)
    assert records_of(first) == [(1, b"a", None), (2, b"b", b"1"), (3, b"c", b"1")]
    stamped = parse_batch_header(first[0])
    assert stamped.attributes & DELETE_HORIZON_BIT and stamped.base_timestamp == NOW + RETENTION
    # the records keep their timestamps under the new base timestamp
    assert [ts for _o, ts, _r in iter_records(decompressed_batch(first[0]))] == [NOW - 10_000, NOW - 9_999]
    assert records_of(run_pass(first, now=NOW + RETENTION - 1)) == records_of(first)  # not yet
    later = run_pass(first, now=NOW + RETENTION)
    assert records_of(later) == [(2, b"b", b"1"), (3, b"c", b"1")]


def test_aborted_transactions_are_removed_and_their_marker_only_after_a_later_pass() -> None:
    pid = 5
    log = [
        batch(0, (b"a", b"committed"), producer_id=9, producer_epoch=0, base_sequence=0),
        batch(1, (b"a", b"aborted"), (b"z", b"aborted"), producer_id=pid, producer_epoch=0, base_sequence=0,
              is_transactional=True),
        encode_control_batch(pid, 0, False, 0, base_offset=3, timestamp_ms=NOW),
        batch(4, (b"q", b"1")),
    ]
    aborted = [AbortedTxn(pid, 1, 3, 4)]
    first = run_pass(log, aborted=aborted)
    assert records_of(first) == [(0, b"a", b"committed"), (3, b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x00"),
                                 (4, b"q", b"1")]
    # next pass: no batch of the transaction is left, so the marker may go once its horizon passed
    second = run_pass(first, aborted=aborted)
    marker = [parse_batch_header(b) for b in second if parse_batch_header(b).is_control]
    assert marker and marker[0].attributes & DELETE_HORIZON_BIT  # stamped, still there
    third = run_pass(second, now=NOW + RETENTION + 1, aborted=aborted)
    assert not [b for b in third if parse_batch_header(b).is_control]
    assert records_of(third) == [(0, b"a", b"committed"), (4, b"q", b"1")]


def test_a_commit_marker_stays_while_its_transaction_has_batches() -> None:
    pid = 6
    log = [
        batch(0, (b"a", b"1"), producer_id=pid, producer_epoch=0, base_sequence=0, is_transactional=True),
        encode_control_batch(pid, 0, True, 0, base_offset=1, timestamp_ms=NOW),
        batch(2, (b"b", b"1")),
    ]
    out = run_pass(run_pass(log), now=NOW + 10 * RETENTION)
    assert [parse_batch_header(b).is_control for b in out] == [False, True, False]
    # once the record is superseded, its batch goes, then the marker (after its horizon)
    log2 = out + [batch(3, (b"a", b"2"))]
    out2 = run_pass(log2)  # the batch goes; the marker stays (this pass saw the batch)
    assert [parse_batch_header(b).is_control for b in out2] == [True, False, False]
    out2 = run_pass(out2)  # no batch left: the marker gets its delete horizon
    assert parse_batch_header(out2[0]).attributes & DELETE_HORIZON_BIT
    out2 = run_pass(out2, now=NOW + RETENTION)  # and goes once it has passed
    assert not [b for b in out2 if parse_batch_header(b).is_control]
    assert records_of(out2) == [(2, b"b", b"1"), (3, b"a", b"2")]


def test_a_producers_last_batch_stays_as_an_empty_header() -> None:
    log = [
        batch(0, (b"a", b"1"), producer_id=3, producer_epoch=1, base_sequence=7),
        batch(1, (b"a", b"2")),
        batch(2, (b"b", b"1")),
    ]
    out = run_pass(log, last={3: LastRecord(0, 1)})
    hdr = parse_batch_header(out[0])
    assert (hdr.base_offset, hdr.records_count, hdr.producer_id, hdr.base_sequence, hdr.last_sequence) == (0, 0, 3, 7, 7)
    assert records_of(out) == [(1, b"a", b"2"), (2, b"b", b"1")]
    # without the producer entry the batch goes
    assert [parse_batch_header(b).base_offset for b in run_pass(log)] == [1, 2]


def test_the_last_batch_of_the_pass_stays_even_if_emptied() -> None:
    log = [batch(0, (b"a", b"1")), batch(1, (b"b", b"1")), batch(2, (b"a", b"2"))]
    # the pass ends at offset 1 (e.g. the next segment starts there): its last batch keeps the end known
    out = run_pass(log[:1], upper=1)
    assert [parse_batch_header(b).base_offset for b in out] == [0]


# -- the cleanable range (LogCleanerManager.cleanableOffsets) ---------------------------------------


def segs(*spec: tuple[int, int, int]) -> list[SegmentInfo]:
    return [SegmentInfo(base, size, ts, ts) for base, size, ts in spec]


def test_the_range_stops_at_the_active_segment_and_rounds_the_lso_down_to_a_segment() -> None:
    s = segs((0, 100, NOW - 5000), (10, 100, NOW - 4000), (20, 100, NOW - 3000), (30, 0, -1))
    r = cleanable_range(s, 0, None, 30, NOW, 0, 2**63 - 1)
    assert (r.first_dirty, r.first_uncleanable, r.cleanable_bytes, r.ratio) == (0, 30, 300, 1.0)
    r = cleanable_range(s, 0, None, 25, NOW, 0, 2**63 - 1)  # an open transaction from offset 25
    assert r.first_uncleanable == 20 and r.cleanable_bytes == 200
    r = cleanable_range(s, 0, 10, 30, NOW, 0, 2**63 - 1)  # checkpoint: 0-9 clean
    assert (r.first_dirty, r.clean_bytes, r.cleanable_bytes) == (10, 100, 200)
    assert r.should_clean(0.5) and not r.should_clean(0.7)
    r = cleanable_range(s, 12, 5, 30, NOW, 0, 2**63 - 1)  # a checkpoint below the log start
    assert r.first_dirty == 12


def test_min_and_max_compaction_lag() -> None:
    s = segs((0, 100, NOW - 5000), (10, 100, NOW - 1000), (20, 0, -1))
    r = cleanable_range(s, 0, None, 20, NOW, 2000, 2**63 - 1)  # segment 10 is too young
    assert r.first_uncleanable == 10
    r = cleanable_range(s, 0, 10, 20, NOW, 0, 2**63 - 1)
    assert not r.needs_compaction_now
    r = cleanable_range(s, 0, 10, 20, NOW, 0, 500)  # the dirty data is older than the max lag
    assert r.needs_compaction_now and r.should_clean(0.99)


def test_group_segments_by_size() -> None:
    assert group_segments([(0, 10, 40), (10, 20, 40), (20, 30, 40), (30, 40, 10)], 100, 40) == [[0, 1], [2, 3]]
    assert group_segments([(0, 10, 200)], 100, 10) == [[0]]


def test_throttler_sleeps_off_the_excess() -> None:
    t = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        t[0] += s

    th = Throttler(1000.0, clock=lambda: t[0], sleep=sleep, window_s=0.1)
    th.maybe_throttle(100)
    t[0] = 0.1
    th.maybe_throttle(400)  # 500 bytes in 0.1 s at 1000 B/s: 0.4 s more
    assert slept == [pytest.approx(0.4)]
    th.maybe_throttle(50_000)  # a burst far ahead of the rate is paused at once, within a window
    assert slept[-1] == pytest.approx(50.0)
    unlimited = Throttler(1.7976931348623157e308, clock=lambda: t[0], sleep=sleep)
    unlimited.maybe_throttle(10**9)
    assert len(slept) == 2


# -- the swap on disk -----------------------------------------------------------------------------


def _log(tmp_path: Path, n: int = 30, seg_bytes: int = 400) -> PartitionLog:
    cfg = LogConfig(segment_bytes=seg_bytes, cleanup_policy=["compact"])
    plog = PartitionLog.open(tmp_path / "t-0", cfg, NOW)
    for i in range(n):
        plog.append(batch(0, (b"k%d" % (i % 3), b"v%d" % i)), NOW)
    plog.sync()
    return plog


def _read_all(plog: PartitionLog) -> list[tuple[int, bytes | None, bytes | None]]:
    out, off = [], plog.log_start_offset
    while off < plog.log_end_offset:
        res = plog.read(off, 1 << 20)
        if not res.data:
            break
        pos = 0
        while pos < len(res.data):
            h = parse_batch_header(res.data, pos)
            if h.records_count:
                out += decode(res.data[pos : pos + h.size])
            pos += h.size
        off = res.next_offset
    return out


def _clean_all(plog: PartitionLog, group_bytes: int) -> None:
    """One pass over every inactive segment, in groups, driven as the broker's cleaner drives it."""
    pinned = plog.pin_segments(plog.active_segment.base_offset)
    stats = CleanerStats()
    m = OffsetMap(1 << 20)
    m.clear()
    build_offset_map([(p.base_offset, p.next_base, p.batches) for p in pinned], 0, m, [], stats)
    f = BatchFilter(m, NOW, RETENTION, {}, pinned[-1].next_base, TxnTracker(), stats)
    for idx in group_segments([(p.base_offset, p.next_base, p.size) for p in pinned], group_bytes, pinned[-1].next_base):
        group = [pinned[i] for i in idx]
        seg = plog.new_cleaned_segment(group[0].base_offset)
        for p in group:
            for h, b in p.batches():
                out = f.filter(h, b)
                if out is not None:
                    seg.append([out], len(out), h.base_offset, h.next_offset, h.max_timestamp, NOW)
        plog.commit_cleaned([seg], [(seg.base_offset, group[-1].next_base)])
        assert plog.install_cleaned(group, seg)
        plog.finish_swaps([(seg.base_offset, group[-1].next_base)], [])
    for p in pinned:
        p.close()


def test_a_swap_replaces_the_group_and_reads_cross_the_gaps(tmp_path: Path) -> None:
    plog = _log(tmp_path)
    before = _read_all(plog)
    n_segments = len(plog.segments)
    assert n_segments > 3
    active = plog.active_segment.base_offset
    _clean_all(plog, 1 << 20)  # one group
    after = _read_all(plog)
    assert len(plog.segments) == 2 and plog.segments[0].base_offset == 0
    latest = {k: (o, v) for o, k, v in before if o < active}  # the active segment is not cleaned
    assert {(o, k, v) for o, k, v in after if o < active} == {(o, k, v) for k, (o, v) in latest.items()}
    assert [(o, k, v) for o, k, v in after if o >= active] == [r for r in before if r[0] >= active]
    plog.close()
    again = PartitionLog.open(tmp_path / "t-0", plog.config, NOW)  # the gap before the active segment is no hole
    assert _read_all(again) == after
    again.close()


def test_recovery_keeps_a_compaction_gap_but_not_an_unexplained_one(tmp_path: Path) -> None:
    plog = _log(tmp_path)
    _clean_all(plog, 1)  # one group per segment: gaps between the cleaned segments
    after = _read_all(plog)
    assert any(a.next_offset < b.base_offset for a, b in zip(plog.segments, plog.segments[1:]))
    plog.close()
    d = tmp_path / "t-0"
    (d / ".clean_shutdown").unlink()  # an unclean restart: everything is checked
    again = PartitionLog.open(d, plog.config, NOW)
    assert _read_all(again) == after
    again.close()
    (d / CLEANED_END_FILE).unlink()  # without the record of the cleaning, the gap looks like a cut
    third = PartitionLog.open(d, plog.config, NOW)
    assert third.log_end_offset < 30  # recovery cut the log at the first gap
    third.close()


def test_a_swap_below_the_log_start_is_rolled_back_not_forward(tmp_path: Path) -> None:
    plog = _log(tmp_path)
    pinned = plog.pin_segments(plog.active_segment.base_offset)
    seg = plog.new_cleaned_segment(pinned[0].base_offset)
    for h, b in pinned[0].batches():
        seg.append([b], len(b), h.base_offset, h.next_offset, h.max_timestamp, NOW)
    plog.commit_cleaned([seg], [(seg.base_offset, pinned[0].next_base)])  # committed: .swap files, cleaner-swap
    d = plog.directory
    assert (d / "00000000000000000000.log.swap").exists()
    for p in pinned:
        p.close()
    end = plog.log_end_offset
    plog.close()
    (d / LOG_START_FILE).write_text(f"{pinned[0].next_base}\n")  # retention moved past the group
    again = PartitionLog.open(d, plog.config, NOW)
    assert not [p for p in os.listdir(d) if p.endswith((".swap", "cleaner-swap"))]
    assert again.log_end_offset == end and again.log_start_offset == pinned[0].next_base
    again.close()


def test_a_whole_pass_in_the_cleaner_thread_when_no_process_can_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import multiprocessing

    from oncelog.broker.log_cleaner import CleanerConfig, LogCleaner
    from oncelog.storage.cleaner import CleanJob

    def no_processes(_method: str) -> None:
        raise OSError("no semaphores here")

    monkeypatch.setattr(multiprocessing, "get_context", no_processes)
    plog = _log(tmp_path)
    before = _read_all(plog)
    active = plog.active_segment.base_offset
    pinned = plog.pin_segments(active)
    for p in pinned:
        p.close()
    job = CleanJob(str(plog.directory), [(p.base_offset, p.next_base, p.size) for p in pinned], 0, active, [], {},
                   NOW, RETENTION, 1 << 20, 4096, 1 << 20)
    cleaner = LogCleaner(None, CleanerConfig())  # type: ignore[arg-type]
    result = cleaner._run_job(job)
    assert cleaner._pool is False and result.end_offset == active and len(result.groups) == 1
    base, end = result.groups[0]
    seg = plog.open_cleaned_segment(base, NOW)
    plog.commit_cleaned([seg], [(base, end)])
    assert plog.install_cleaned(pinned, seg)
    plog.finish_swaps([(base, end)], [])
    latest = {k: (o, v) for o, k, v in before if o < active}
    assert [r for r in _read_all(plog) if r[0] < active] == sorted((o, k, v) for k, (o, v) in latest.items())
    assert [r for r in _read_all(plog) if r[0] >= active] == [r for r in before if r[0] >= active]
    plog.close()


def test_replaced_files_are_removed_a_chunk_at_a_time(tmp_path: Path) -> None:
    from oncelog.storage.fileutil import remove_gradually

    path = tmp_path / "00000000000000000000.log.deleted"
    path.write_bytes(b"x" * 5000)
    sizes: list[int] = []
    assert remove_gradually(path, 2048, lambda: sizes.append(path.stat().st_size if path.exists() else -1)) == 5000
    assert sizes == [2952, 904, -1]  # cut from the end, a pause after every cut and after the unlink
    assert not path.exists()
    assert remove_gradually(path, 2048, lambda: None) == 0  # already gone


def test_a_swap_installed_while_a_sync_fdatasyncs_the_old_segments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cleaner installs a group while a group-commit worker is inside fdatasync of the
    group's old segments (through their own descriptors): the old descriptors are closed
    only when that sync is done, so no file opened meanwhile takes a number the worker
    still uses; the sync succeeds and nothing leaks."""
    fds_before = open_fds()
    cfg = LogConfig(segment_bytes=400, cleanup_policy=["compact"])
    plog = PartitionLog.open(tmp_path / "t-0", cfg, NOW)
    for i in range(30):
        plog.append(batch(0, (b"k%d" % (i % 3), b"v%d" % i)), NOW)
    olds = plog.segments[:-1]
    assert len(olds) > 2
    held = HeldSync(plog, monkeypatch)
    pinned = plog.pin_segments(plog.active_segment.base_offset)
    seg = plog.new_cleaned_segment(pinned[0].base_offset)
    for p in pinned:
        for h, b in p.batches():
            seg.append([b], len(b), h.base_offset, h.next_offset, h.max_timestamp, NOW)
    end = pinned[-1].next_base
    plog.commit_cleaned([seg], [(seg.base_offset, end)])
    assert plog.install_cleaned(pinned, seg)
    for p in pinned:
        p.close()
    plog.finish_swaps([(seg.base_offset, end)], [])
    held.release(30)
    assert all(old.fd < 0 for old in olds)
    plog.close()
    assert open_fds() == fds_before
