"""Tests for oncelog.storage: segments, PartitionLog, catalog, LogManager, config."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oncelog.protocol.records import (
    Record,
    decode_records,
    encode_control_batch,
    encode_record_batch,
    iter_batch_headers,
    parse_batch_header,
    read_control_marker,
)
from oncelog.storage.catalog import TopicCatalog, TopicExistsError, UnknownTopicError
from oncelog.storage.config import LogConfig
from oncelog.storage.engine import PARTITION_METADATA, LogManager, read_partition_topic_id
from oncelog.storage.fileutil import atomic_write
from oncelog.storage.log import (
    CLEAN_SHUTDOWN_FILE,
    LOG_START_FILE,
    OffsetOutOfRangeError,
    PartitionLog,
)
from tests.unit.held_sync import HeldSync, open_fds

T0 = 1_700_000_000_000


def mk(values: list[bytes], ts: int = T0, deltas: list[int] | None = None) -> bytes:
    deltas = deltas or [0] * len(values)
    return encode_record_batch([Record(b"k", v, [], d) for v, d in zip(values, deltas)], base_timestamp=ts)


def small_cfg(**kw: object) -> LogConfig:
    base = {"segment_bytes": 400, "index_interval_bytes": 100}
    base.update(kw)
    return LogConfig(**base)  # type: ignore[arg-type]


def fill(log: PartitionLog, n: int, now: int = T0, records_per_batch: int = 2) -> list[bytes]:
    """Append n batches whose values name their batch number; returns the values in offset order."""
    out = []
    for i in range(n):
        vals = [b"b%03d-r%d" % (i, j) for j in range(records_per_batch)]
        log.append(mk(vals, ts=now + i), now + i)
        out += vals
    return out


def values_of(data: bytes) -> list[bytes | None]:
    out: list[bytes | None] = []
    for _h, s, e in iter_batch_headers(data):
        out += [r.value for r in decode_records(data[s:e])]
    return out


def offsets_of(data: bytes) -> list[tuple[int, int]]:
    return [(h.base_offset, h.last_offset) for h, _s, _e in iter_batch_headers(data)]


def crash(log: PartitionLog) -> None:
    """Drop the log without a clean shutdown (files stay as the OS has them)."""
    for seg in log.segments:
        seg.close()


def seg_files(d: Path, suffix: str) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.endswith(suffix))


# --- appends, rolls and reads ---------------------------------------------------------


def test_append_assigns_offsets_and_read_back(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(), T0)
    assert (log.log_start_offset, log.log_end_offset, log.size_bytes) == (0, 0, 0)
    a = log.append(mk([b"a", b"b", b"c"]), T0)
    b = log.append(mk([b"d"]), T0)
    assert (a.base_offset, a.last_offset, b.base_offset, b.last_offset) == (0, 2, 3, 3)
    assert a.log_append_time_ms == -1 and a.max_timestamp == T0
    assert (a.position, b.position) == (0, a.size)
    assert log.log_end_offset == 4
    assert log.size_bytes == a.size + b.size
    r = log.read(0, 1 << 20)
    assert values_of(r.data) == [b"a", b"b", b"c", b"d"]
    assert (r.first_offset, r.next_offset, r.log_end_offset) == (0, 4, 4)
    assert offsets_of(r.data) == [(0, 2), (3, 3)]
    for h, s, e in iter_batch_headers(r.data):  # stored batches keep valid CRCs
        assert crc32c(r.data[s + 21 : e]) == h.crc


def test_append_accepts_memoryview_and_rejects_bad_length(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(), T0)
    b = mk([b"x"])
    assert log.append(memoryview(b), T0).base_offset == 0
    with pytest.raises(ValueError):
        log.append(b + b"\0", T0)
    assert log.log_end_offset == 1


def test_roll_by_size(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    log = PartitionLog.open(d, small_cfg(), T0)
    size = len(mk([b"b000-r0", b"b000-r1"]))
    expected = fill(log, 20)
    per_seg = 400 // size
    assert len(log.segments) == -(-20 // per_seg)
    for prev, seg in zip(log.segments, log.segments[1:]):
        assert seg.base_offset == prev.next_offset
        assert prev.size <= 400
    assert seg_files(d, ".log") == [f"{s.base_offset:020d}.log" for s in log.segments]
    assert seg_files(d, ".index") == [f"{s.base_offset:020d}.index" for s in log.segments]
    assert log.size_bytes == sum(os.path.getsize(s.log_path) for s in log.segments) == 20 * size
    r = log.read(0, 1 << 20)  # crosses every segment
    assert values_of(r.data) == expected
    assert r.next_offset == 40


def test_oversized_batch_gets_its_own_segment(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", small_cfg(), T0)
    log.append(mk([b"x"]), T0)
    big = log.append(mk([b"y" * 1000]), T0)
    assert big.segment_base_offset == 1 and big.position == 0
    after = log.append(mk([b"z"]), T0)
    assert after.segment_base_offset == 2
    assert values_of(log.read(0, 1 << 20).data) == [b"x", b"y" * 1000, b"z"]


def test_roll_by_time(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_ms=1000), 0)
    log.append(mk([b"a"], ts=5), 0)
    log.append(mk([b"b"], ts=5), 1000)  # exactly segment.ms old: no roll yet
    assert len(log.segments) == 1
    info = log.append(mk([b"c"], ts=5), 1001)
    assert len(log.segments) == 2 and info.segment_base_offset == 2 and info.position == 0
    assert log.maybe_roll(1500) is False
    assert log.maybe_roll(2002) is True
    assert [s.base_offset for s in log.segments] == [0, 2, 3]
    assert log.maybe_roll(10**9) is False  # empty active segment never rolls
    assert values_of(log.read(0, 1 << 20).data) == [b"a", b"b", b"c"]


def test_read_from_middle_uses_sparse_index(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(index_interval_bytes=150), T0)
    fill(log, 40, records_per_batch=3)
    seg = log.segments[0]
    assert os.path.getsize(seg.index_path) > 0 and len(seg._idx_off) >= 10
    for offset in range(0, 120):
        r = log.read(offset, 1)  # min_one: exactly the batch holding offset
        ((base, last),) = offsets_of(r.data)
        assert base <= offset <= last and base == offset - offset % 3
        assert r.first_offset == base and r.next_offset == last + 1


def test_read_respects_max_bytes_and_min_one(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", small_cfg(segment_bytes=10_000), T0)
    fill(log, 10)
    size = log.read(0, 1).data.__len__()
    r = log.read(0, size * 3 + size // 2)
    assert offsets_of(r.data) == [(0, 1), (2, 3), (4, 5)] and len(r.data) == 3 * size
    assert offsets_of(log.read(0, 10).data) == [(0, 1)]  # larger than max_bytes, still whole
    r = log.read(0, 10, min_one=False)
    assert r.data == b"" and r.next_offset == 0
    assert log.read(5, 0, min_one=False).data == b""


def test_read_continues_into_next_segment_within_budget(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", small_cfg(), T0)
    fill(log, 12)
    size = len(log.read(0, 1).data)
    first_seg_batches = log.segments[0].size // size
    r = log.read(0, size * (first_seg_batches + 2))
    assert len(offsets_of(r.data)) == first_seg_batches + 2


def test_read_max_offset(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", small_cfg(), T0)
    fill(log, 10)  # batches (0,1),(2,3),...
    assert offsets_of(log.read(0, 1 << 20, max_offset=6).data) == [(0, 1), (2, 3), (4, 5)]
    assert offsets_of(log.read(0, 1 << 20, max_offset=5).data) == [(0, 1), (2, 3)]
    r = log.read(6, 1 << 20, max_offset=6)
    assert r.data == b"" and r.next_offset == 6
    assert log.read(4, 1 << 20, max_offset=5).data == b""  # min_one never crosses max_offset


def test_offset_out_of_range(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(), T0)
    fill(log, 2)
    with pytest.raises(OffsetOutOfRangeError) as ei:
        log.read(5, 100)
    assert (ei.value.error_code, ei.value.log_end_offset) == (1, 4)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1, 100)
    r = log.read(4, 100)  # exactly the log end: empty, not an error
    assert (r.data, r.first_offset, r.next_offset) == (b"", 4, 4)


def test_log_append_time(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(message_timestamp_type="LogAppendTime"), T0)
    log.append(mk([b"x"], ts=5), T0 + 1)
    info = log.append(mk([b"y", b"z"], ts=5), T0 + 99)
    assert info.log_append_time_ms == T0 + 99 and info.max_timestamp == T0 + 99
    data = log.read(0, 1 << 20).data
    hdrs = [h for h, _s, _e in iter_batch_headers(data)]
    assert [(h.timestamp_type, h.max_timestamp, h.base_offset) for h in hdrs] == [(1, T0 + 1, 0), (1, T0 + 99, 1)]
    for h, s, e in iter_batch_headers(data):
        assert crc32c(data[s + 21 : e]) == h.crc
    assert log.offset_for_timestamp(T0 + 50) == (1, T0 + 99)


def test_control_batch_append(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(), T0)
    fill(log, 1)
    info = log.append_control(encode_control_batch(7, 1, True, 3, timestamp_ms=T0), T0)
    assert info.base_offset == 2
    data = log.read(2, 1000).data
    h = parse_batch_header(data)
    assert h.is_control and h.base_offset == 2
    assert read_control_marker(data).commit is True


def test_scan_batches(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", small_cfg(), T0)
    fill(log, 9)
    got = [(h.base_offset, bytes(b)) for h, b in log.scan_batches()]
    assert [o for o, _ in got] == list(range(0, 18, 2))
    assert b"".join(b for _, b in got) == log.read(0, 1 << 20).data
    assert [h.base_offset for h, _ in log.scan_batches(7)] == list(range(6, 18, 2))


# --- durability -----------------------------------------------------------------------


def test_sync_tracks_durable_offset(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", small_cfg(), T0)
    assert log.durable_end_offset == 0 and not log.has_unsynced
    fill(log, 3)
    assert log.durable_end_offset == 0 and log.has_unsynced
    assert log.sync() == 6
    assert log.durable_end_offset == 6 and not log.has_unsynced


def test_sync_concurrent_with_appends(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", small_cfg(segment_bytes=2000), T0)
    stop = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []

    def syncer() -> None:
        try:
            while not stop.is_set():
                seen.append(log.sync())
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    th = threading.Thread(target=syncer)
    th.start()
    expected = fill(log, 300)
    stop.set()
    th.join()
    assert not errors
    assert seen == sorted(seen) and seen[-1] <= 600
    assert log.sync() == 600 and log.durable_end_offset == 600
    log.close()
    log = PartitionLog.open(tmp_path / "t-0", small_cfg(segment_bytes=2000), T0)
    assert values_of(log.read(0, 1 << 30).data) == expected


# --- recovery -----------------------------------------------------------------------


def test_clean_reopen_keeps_everything(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    log = PartitionLog.open(d, small_cfg(), T0)
    expected = fill(log, 15)
    idx_before = [s.index_path.read_bytes() for s in log.segments]
    log.close()
    assert (d / CLEAN_SHUTDOWN_FILE).exists()
    log = PartitionLog.open(d, small_cfg(), T0)
    assert not (d / CLEAN_SHUTDOWN_FILE).exists()
    assert log.log_end_offset == 30
    assert [s.index_path.read_bytes() for s in log.segments] == idx_before
    assert values_of(log.read(0, 1 << 20).data) == expected
    assert log.append(mk([b"more"]), T0).base_offset == 30


def _reopen_after_damage(tmp_path: Path, damage: str, clean: bool) -> tuple[PartitionLog, list[bytes], int]:
    d = tmp_path / "t-0"
    log = PartitionLog.open(d, small_cfg(), T0)
    expected = fill(log, 10)  # 20 offsets over several segments
    active = log.segments[-1]
    good_size = active.size
    last_size = len(mk([b"b009-r0", b"b009-r1"]))
    if clean:
        log.close()
    else:
        crash(log)
    with open(active.log_path, "r+b") as f:
        if damage == "garbage":
            f.seek(0, 2)
            f.write(b"\x07garbage-after-the-last-batch" * 3)
        elif damage == "torn":
            f.seek(0, 2)
            f.write(mk([b"b010-r0", b"b010-r1"])[:50])
        elif damage == "flip":
            f.seek(good_size - 3)
            byte = f.read(1)
            f.seek(good_size - 3)
            f.write(bytes([byte[0] ^ 0xFF]))
        elif damage == "zeros":
            f.seek(0, 2)
            f.write(b"\0" * 300)
    log = PartitionLog.open(d, small_cfg(), T0)
    if damage == "flip":
        return log, expected[:-2], good_size - last_size
    return log, expected, good_size


@pytest.mark.parametrize("damage", ["garbage", "torn", "flip", "zeros"])
@pytest.mark.parametrize("clean", [False, True])
def test_recovery_truncates_bad_tail(tmp_path: Path, damage: str, clean: bool) -> None:
    log, expected, size = _reopen_after_damage(tmp_path, damage, clean)
    n = len(expected)
    assert log.log_end_offset == n
    assert log.segments[-1].size == size
    assert os.path.getsize(log.segments[-1].log_path) == size
    assert values_of(log.read(0, 1 << 20).data) == expected
    info = log.append(mk([b"after"]), T0)
    assert info.base_offset == n
    log.close()
    log = PartitionLog.open(tmp_path / "t-0", small_cfg(), T0)
    assert values_of(log.read(0, 1 << 20).data) == expected + [b"after"]


def test_recovery_of_unsynced_sealed_segment(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A rolled segment that was never synced is fully checked after a crash; cutting it
    short deletes every segment after it (Kafka's LogLoader), with a warning naming them."""
    d = tmp_path / "t-0"
    log = PartitionLog.open(d, small_cfg(), T0)
    fill(log, 10)
    first = log.segments[0]
    later = [s.log_path.name for s in log.segments[1:]]
    assert later
    batch_size = len(log.read(0, 1).data)
    assert first._idx_pos[-1] >= 2 * batch_size  # damage lies before the last index entry
    crash(log)
    with open(first.log_path, "r+b") as f:  # corrupt a record inside the second batch
        f.seek(batch_size + 70)
        f.write(b"\xff\xff\xff\xff")
    with caplog.at_level("WARNING", logger="oncelog.storage.log"):
        log = PartitionLog.open(d, small_cfg(), T0)
    assert len(log.segments) == 1
    seg = log.segments[0]
    assert (seg.size, seg.next_offset) == (batch_size, 2) and log.log_end_offset == 2
    assert seg_files(d, ".log") == [first.log_path.name]
    assert seg_files(d, ".index") == [first.index_path.name]
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and all(name in warnings[0].getMessage() for name in later)
    data = log.read(0, 1 << 20).data
    assert [o for b, l in offsets_of(data) for o in range(b, l + 1)] == [0, 1]
    with pytest.raises(OffsetOutOfRangeError):
        log.read(5, 100)
    assert log.append(mk([b"next"]), T0).base_offset == 2  # the log goes on from the cut, contiguous
    log.sync()
    crash(log)
    log = PartitionLog.open(d, small_cfg(), T0)
    assert values_of(log.read(0, 1 << 20).data)[-1] == b"next" and log.log_end_offset == 3


def test_recovery_deletes_segments_after_a_middle_segment_cut_short(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Corrupt a middle segment: after an unclean reopen the segments after it are gone, the
    log ends at the truncation point, offsets are contiguous, and one warning names them."""
    d = tmp_path / "t-0"
    log = PartitionLog.open(d, small_cfg(), T0)
    fill(log, 20)
    assert len(log.segments) >= 4
    middle = log.segments[1]
    after = [s.base_offset for s in log.segments[2:]]
    cut_at = middle.base_offset + 2  # keep its first batch (2 records)
    crash(log)
    batch_size = len(mk([b"b000-r0", b"b000-r1"]))
    with open(middle.log_path, "r+b") as f:  # flip a byte inside its second batch
        f.seek(batch_size + 70)
        f.write(b"\x00\x01\x02\x03")
    with caplog.at_level("WARNING", logger="oncelog.storage.log"):
        log = PartitionLog.open(d, small_cfg(), T0)
    assert [s.base_offset for s in log.segments] == [0, middle.base_offset]
    assert log.log_end_offset == cut_at
    for base in after:
        assert not any(d.glob(f"{base:020d}.*")), f"segment {base} was kept"
    data = log.read(0, 1 << 20).data
    assert [o for b, l in offsets_of(data) for o in range(b, l + 1)] == list(range(cut_at))
    (warning,) = [r for r in caplog.records if r.levelname == "WARNING"]
    assert all(f"{base:020d}.log" in warning.getMessage() for base in after)
    # a crash again before anything new: the same log, no second warning
    crash(log)
    caplog.clear()
    with caplog.at_level("WARNING", logger="oncelog.storage.log"):
        log = PartitionLog.open(d, small_cfg(), T0)
    assert log.log_end_offset == cut_at and not [r for r in caplog.records if r.levelname == "WARNING"]


def test_recovery_removes_a_hole_left_by_an_interrupted_recovery(tmp_path: Path) -> None:
    """A segment that does not start where the previous one ends (an earlier recovery cut the
    previous one and crashed before deleting the rest) is deleted with those after it."""
    d = tmp_path / "t-0"
    log = PartitionLog.open(d, small_cfg(), T0)
    fill(log, 20)
    log.sync()
    first = log.segments[0]
    assert int((d / "recovery-point").read_text()) == log.segments[-1].base_offset > 0
    crash(log)
    os.truncate(first.log_path, len(mk([b"b000-r0", b"b000-r1"])))  # cut cleanly after one batch
    log = PartitionLog.open(d, small_cfg(), T0)
    assert [s.base_offset for s in log.segments] == [0] and log.log_end_offset == 2
    # the recovery point comes back down: segment 0 is being written again
    assert int((d / "recovery-point").read_text()) == 0


def test_synced_sealed_segments_skip_full_scan(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    log = PartitionLog.open(d, small_cfg(), T0)
    fill(log, 10)
    log.sync()
    assert int((d / "recovery-point").read_text()) == log.segments[-1].base_offset
    crash(log)
    log = PartitionLog.open(d, small_cfg(), T0)
    assert log.log_end_offset == 20


@pytest.mark.parametrize("clean", [False, True])
def test_missing_index_files_are_rebuilt(tmp_path: Path, clean: bool) -> None:
    d = tmp_path / "t-0"
    cfg = small_cfg(segment_bytes=2000)
    log = PartitionLog.open(d, cfg, T0)
    expected = fill(log, 60)
    assert len(log.segments) >= 3
    before = [(s.index_path.read_bytes(), s.timeindex_path.read_bytes()) for s in log.segments]
    log.close() if clean else crash(log)
    for p in list(d.iterdir()):
        if p.suffix in (".index", ".timeindex"):
            p.unlink()
    log = PartitionLog.open(d, cfg, T0)
    after = [(s.index_path.read_bytes(), s.timeindex_path.read_bytes()) for s in log.segments]
    assert after == before and all(i for i, _t in after[:-1])
    assert values_of(log.read(0, 1 << 20).data) == expected
    for offset in range(0, 120, 7):
        ((base, last),) = offsets_of(log.read(offset, 1).data)
        assert base <= offset <= last


def test_garbage_index_is_rebuilt(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    cfg = small_cfg(segment_bytes=3000)
    log = PartitionLog.open(d, cfg, T0)
    fill(log, 60)
    log.close()
    first = log.segments[0]
    good = first.index_path.read_bytes()
    first.index_path.write_bytes(good[:8] + b"\xff" * 8 + good[16:])
    first.timeindex_path.write_bytes(b"\x00" * 36)
    log = PartitionLog.open(d, cfg, T0)
    assert log.segments[0].index_path.read_bytes() == good
    assert log.offset_for_timestamp(T0 + 10) == (20, T0 + 10)


def test_orphan_index_files_removed(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    log = PartitionLog.open(d, LogConfig(), T0)
    fill(log, 1)
    log.close()
    (d / f"{500:020d}.index").write_bytes(b"\0" * 8)
    PartitionLog.open(d, LogConfig(), T0)
    assert not (d / f"{500:020d}.index").exists()


# --- offsets by timestamp ----------------------------------------------------------------


def test_offset_for_timestamp(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", small_cfg(), T0)
    for i in range(20):  # batch i: offsets 3i..3i+2 with timestamps T0+10i, +1, +2
        log.append(mk([b"a", b"b", b"c"], ts=T0 + 10 * i, deltas=[0, 1, 2]), T0)
    assert len(log.segments) > 2
    assert log.offset_for_timestamp(0) == (0, T0)
    assert log.offset_for_timestamp(T0 + 51) == (16, T0 + 51)
    assert log.offset_for_timestamp(T0 + 53) == (18, T0 + 60)
    assert log.offset_for_timestamp(T0 + 192) == (59, T0 + 192)
    assert log.offset_for_timestamp(T0 + 193) is None
    for ts in range(T0, T0 + 193, 5):
        off, found = log.offset_for_timestamp(ts)  # type: ignore[misc]
        i, j = divmod(off, 3)
        assert found == T0 + 10 * i + j and found >= ts
        assert off == 0 or log.offset_for_timestamp(ts)[0] == min(  # type: ignore[index]
            o for o in range(60) if T0 + 10 * (o // 3) + o % 3 >= ts
        )
    assert (log.earliest_offset(), log.latest_offset()) == (0, 60)


def _gzip_batch(raw: bytes) -> bytes:
    """``raw`` (an uncompressed batch) with its records gzip-compressed, as a producer sends it."""
    import gzip
    import struct

    from oncelog.protocol.records import ATTRIBUTES_OFFSET, BATCH_LENGTH_OFFSET, HEADER_SIZE, LOG_OVERHEAD, update_crc

    body = gzip.compress(raw[HEADER_SIZE:])
    buf = bytearray(raw[:HEADER_SIZE] + body)
    (attrs,) = struct.unpack_from(">h", buf, ATTRIBUTES_OFFSET)
    struct.pack_into(">h", buf, ATTRIBUTES_OFFSET, attrs | 1)
    struct.pack_into(">i", buf, BATCH_LENGTH_OFFSET, HEADER_SIZE - LOG_OVERHEAD + len(body))
    update_crc(buf)
    return bytes(buf)


def test_offset_for_timestamp_inside_compressed_batch(tmp_path: Path) -> None:
    """Kafka's FileRecords.searchForTimestamp: the exact record inside a compressed batch."""
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(), T0)
    for i in range(3):  # batch i: offsets 10i..10i+9 with timestamps T0+100i+2j
        log.append(_gzip_batch(mk([b"v%d" % j for j in range(10)], ts=T0 + 100 * i, deltas=[2 * j for j in range(10)])), T0)
    assert parse_batch_header(log.read(0, 1).data).compression == 1
    assert log.offset_for_timestamp(T0) == (0, T0)
    assert log.offset_for_timestamp(T0 + 7) == (4, T0 + 8)
    assert log.offset_for_timestamp(T0 + 118) == (19, T0 + 118)
    assert log.offset_for_timestamp(T0 + 119) == (20, T0 + 200)
    assert log.offset_for_timestamp(T0 + 219) is None
    assert log.max_timestamp_offset() == (29, T0 + 218)
    log.delete_records_before(25)
    assert log.offset_for_timestamp(T0 + 201) == (25, T0 + 210)  # not below the log start


def test_offset_for_timestamp_non_monotonic(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(index_interval_bytes=0), T0)
    for ts in [100, 500, 200, 300, 600]:
        log.append(mk([b"x"], ts=ts), T0)
    assert log.offset_for_timestamp(150) == (1, 500)
    assert log.offset_for_timestamp(550) == (4, 600)
    assert log.offset_for_timestamp(601) is None


# --- retention -------------------------------------------------------------------------


def test_retention_by_time_persists_log_start(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    cfg = small_cfg(retention_ms=1000)
    log = PartitionLog.open(d, cfg, T0)
    for i in range(20):  # batch i has timestamp T0 + 100*i
        log.append(mk([b"v%d" % i], ts=T0 + 100 * i), T0 + 100 * i)
    log.sync()
    segs = [(s.base_offset, s.max_timestamp) for s in log.segments]
    now = T0 + 2500
    expired = [b for b, ts in segs if now - ts > 1000]
    assert 0 < len(expired) < len(segs)
    assert log.apply_retention(now) == len(expired)
    assert log.log_start_offset == segs[len(expired)][0] == log.segments[0].base_offset
    assert not (d / f"{0:020d}.log").exists()
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0, 100)
    assert log.read(log.log_start_offset, 100).first_offset == log.log_start_offset
    assert log.apply_retention(now) == 0
    start = log.log_start_offset
    log.close()
    assert int((d / LOG_START_FILE).read_text()) == start
    log = PartitionLog.open(d, cfg, now)
    assert log.log_start_offset == start and log.log_end_offset == 20


def test_retention_by_size(tmp_path: Path) -> None:
    cfg = small_cfg(retention_bytes=1000)
    log = PartitionLog.open(tmp_path / "t-0", cfg, T0)
    fill(log, 30)
    log.sync()
    total = log.size_bytes
    sizes = [s.size for s in log.segments]
    n = log.apply_retention(T0)
    assert n > 0
    assert sum(sizes[:n]) <= total - 1000 < sum(sizes[: n + 1])
    assert log.size_bytes == total - sum(sizes[:n]) >= 1000
    assert log.log_start_offset == log.segments[0].base_offset > 0


def test_retention_can_expire_active_segment(tmp_path: Path) -> None:
    cfg = LogConfig(retention_ms=1000)
    log = PartitionLog.open(tmp_path / "t-0", cfg, T0)
    fill(log, 3)
    log.sync()
    assert log.apply_retention(T0 + 500) == 0
    assert log.apply_retention(T0 + 5000) == 1
    assert (log.log_start_offset, log.log_end_offset, log.size_bytes) == (6, 6, 0)
    assert log.append(mk([b"new"]), T0 + 5000).base_offset == 6


def test_retention_keeps_unsynced_data(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", small_cfg(retention_ms=0), T0)
    fill(log, 10)
    assert log.apply_retention(T0 + 10_000) == 0  # nothing durable yet
    log.sync()
    assert log.apply_retention(T0 + 10_000) > 0


def test_infinite_retention(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", small_cfg(retention_ms=-1, retention_bytes=-1), T0)
    fill(log, 20)
    log.sync()
    assert log.apply_retention(T0 + 10**12) == 0 and log.log_start_offset == 0


def test_delete_records_before(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    log = PartitionLog.open(d, small_cfg(), T0)
    fill(log, 20)
    second = log.segments[1].base_offset
    assert log.delete_records_before(second + 1) == second + 1
    assert log.segments[0].base_offset == second
    with pytest.raises(OffsetOutOfRangeError):
        log.read(second, 10)
    assert log.read(second + 1, 1).first_offset == second  # whole batch holding it
    log.close()
    assert PartitionLog.open(d, small_cfg(), T0).log_start_offset == second + 1


# --- property: any read equals the model ------------------------------------------------


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sizes=st.lists(st.tuples(st.integers(1, 4), st.integers(0, 200)), min_size=1, max_size=40),
    segment_bytes=st.integers(100, 2000),
    interval=st.integers(0, 600),
    data=st.data(),
)
def test_reads_match_model(tmp_path_factory: pytest.TempPathFactory, sizes: list[tuple[int, int]],
                           segment_bytes: int, interval: int, data: st.DataObject) -> None:  # fmt: skip
    d = tmp_path_factory.mktemp("prop") / "t-0"
    cfg = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=interval)
    log = PartitionLog.open(d, cfg, T0)
    model: list[tuple[int, int, bytes]] = []  # (base, last, stored bytes)
    for i, (n, vsize) in enumerate(sizes):
        b = mk([bytes([i % 256]) * vsize] * n)
        info = log.append(b, T0)
        stored = info.base_offset.to_bytes(8, "big") + b[8:]
        model.append((info.base_offset, info.last_offset, stored))
    if data.draw(st.booleans()):
        log.close()
        log = PartitionLog.open(d, cfg, T0)
    end = model[-1][1] + 1
    offset = data.draw(st.integers(0, end))
    max_bytes = data.draw(st.integers(0, 3000))
    want = [m for m in model if m[1] >= offset]
    got = log.read(offset, max_bytes).data
    exp = b""
    for _b, _l, raw in want:
        if exp and len(exp) + len(raw) > max_bytes:
            break
        if not exp and len(raw) > max_bytes:
            exp = raw  # min_one
            break
        exp += raw
    assert got == exp
    log.close()


# --- catalog ----------------------------------------------------------------------------


def test_catalog_persistence(tmp_path: Path) -> None:
    cat = TopicCatalog.load(tmp_path)
    assert not cat.existed and cat.topics() == []
    m = cat.create_topic("orders", 3, {"retention.ms": "1000", "x": None})  # type: ignore[dict-item]
    assert m.num_partitions == 3 and m.configs == {"retention.ms": "1000"}
    cat.create_topic("logs", 1)
    with pytest.raises(TopicExistsError):
        cat.create_topic("orders", 1)
    cat.add_partitions("orders", 5)
    cat.set_configs("logs", {"segment.bytes": "2048"})
    cat.delete_topic("logs")
    with pytest.raises(UnknownTopicError):
        cat.delete_topic("logs")
    doc = json.loads((tmp_path / "meta" / "topics.json").read_text())
    assert [t["name"] for t in doc["topics"]] == ["orders"]
    again = TopicCatalog.load(tmp_path)
    assert again.existed
    (o,) = again.topics()
    assert (o.name, o.topic_id, o.num_partitions, o.configs) == ("orders", m.topic_id, 5, {"retention.ms": "1000"})
    assert again.by_id(m.topic_id) is again.get("orders")
    assert "orders" in again and "logs" not in again
    assert not list((tmp_path / "meta").glob("*.tmp"))


def test_atomic_write_replaces(tmp_path: Path) -> None:
    p = tmp_path / "f"
    atomic_write(p, b"one")
    atomic_write(p, b"two")
    assert p.read_bytes() == b"two" and os.listdir(tmp_path) == ["f"]


# --- config -----------------------------------------------------------------------------


def test_config_defaults_and_broker_names() -> None:
    c = LogConfig()
    assert (c.segment_bytes, c.retention_bytes, c.max_message_bytes) == (1073741824, -1, 1048588)
    assert c.segment_ms == c.retention_ms == 7 * 24 * 3600 * 1000
    b = LogConfig.from_properties(
        {"log.retention.hours": "2", "log.roll.hours": "1", "log.segment.bytes": "1000", "unrelated": "x"}
    )
    assert (b.retention_ms, b.segment_ms, b.segment_bytes) == (7_200_000, 3_600_000, 1000)
    assert LogConfig.from_properties({"log.retention.ms": "5", "log.retention.hours": "9"}).retention_ms == 5
    assert LogConfig.from_properties({"log.retention.minutes": "3"}).retention_ms == 180_000
    assert LogConfig.from_properties({"log.retention.hours": "-1"}).retention_ms == -1
    assert LogConfig.from_properties({"message.max.bytes": "77"}).max_message_bytes == 77


def test_config_topic_overlay_and_round_trip() -> None:
    broker = LogConfig.from_properties({"log.retention.ms": "100"})
    t = LogConfig.from_properties({"segment.ms": "50", "message.timestamp.type": "LogAppendTime"}, broker)
    assert (t.retention_ms, t.segment_ms, t.log_append_time) == (100, 50, True)
    assert broker.segment_ms == 7 * 24 * 3600 * 1000  # base untouched
    topic = t.to_topic_configs()
    assert topic["segment.ms"] == "50" and topic["retention.ms"] == "100"
    assert LogConfig.from_properties(topic) == t


@pytest.mark.parametrize(
    "props",
    [{"segment.bytes": "10"}, {"retention.ms": "abc"}, {"message.timestamp.type": "Whenever"}, {"segment.ms": "0"}],
)
def test_config_invalid(props: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        LogConfig.from_properties(props)


# --- LogManager -------------------------------------------------------------------------


def test_log_manager_lifecycle(tmp_path: Path) -> None:
    cat = TopicCatalog.load(tmp_path)
    mgr = LogManager(tmp_path, LogConfig(retention_ms=1000))
    mgr.open_all(cat, T0)
    meta = cat.create_topic("orders", 2, {"segment.bytes": "300"})
    mgr.create_partitions("orders", 0, 2, T0)
    assert (tmp_path / "orders-0").is_dir() and (tmp_path / "orders-1").is_dir()
    assert read_partition_topic_id(tmp_path / "orders-1") == meta.topic_id
    cfg = mgr.effective_config("orders")
    assert (cfg.segment_bytes, cfg.retention_ms) == (300, 1000)
    plog = mgr.get("orders", 0)
    assert plog.config.segment_bytes == 300
    fill(plog, 10)
    cat.add_partitions("orders", 3)
    mgr.create_partitions("orders", 2, 3, T0)
    cat.set_configs("orders", {"segment.bytes": "5000"})
    mgr.reconfigure("orders")
    assert mgr.get("orders", 2).config.segment_bytes == 5000
    mgr.close()

    mgr = LogManager(tmp_path, LogConfig(retention_ms=1000))
    mgr.open_all(TopicCatalog.load(tmp_path), T0)
    assert mgr.get("orders", 0).log_end_offset == 20
    assert mgr.get("orders", 0).config.segment_bytes == 5000
    deleted = mgr.retention_pass(T0 + 10_000)
    assert deleted >= 1 and mgr.get("orders", 0).log_start_offset == 20
    cat = TopicCatalog.load(tmp_path)
    cat.delete_topic("orders")
    assert mgr.delete_topic("orders") == 3
    assert not any(p.name.startswith("orders") for p in tmp_path.iterdir())
    with pytest.raises(KeyError):
        mgr.get("orders", 0)
    mgr.close()


def test_log_manager_removes_stale_and_leftover_dirs(tmp_path: Path) -> None:
    cat = TopicCatalog.load(tmp_path)
    old = cat.create_topic("t", 1)
    mgr = LogManager(tmp_path, LogConfig())
    mgr.open_all(cat, T0)
    fill(mgr.get("t", 0), 3)
    mgr.close()
    # crash between catalog delete and log delete, then re-create with a new id
    cat.delete_topic("t")
    new = cat.create_topic("t", 1)
    assert new.topic_id != old.topic_id
    (tmp_path / "gone-0").mkdir()
    (tmp_path / "gone-0" / PARTITION_METADATA).write_text("version: 0\ntopic_id: x\n")
    (tmp_path / "x-0.abc-delete").mkdir()
    (tmp_path / "unrelated").mkdir()
    mgr = LogManager(tmp_path, LogConfig())
    mgr.open_all(TopicCatalog.load(tmp_path), T0)
    assert mgr.get("t", 0).log_end_offset == 0  # old data not resurrected
    assert read_partition_topic_id(tmp_path / "t-0") == new.topic_id
    assert not (tmp_path / "gone-0").exists() and not (tmp_path / "x-0.abc-delete").exists()
    assert (tmp_path / "unrelated").exists()
    mgr.close()


def test_append_with_parsed_header_and_fd_usage(tmp_path: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    log = PartitionLog.open(tmp_path / "t-0", small_cfg(), T0)
    b = mk([b"x", b"y"])
    hdr = parse_batch_header(b)
    for _ in range(20):
        log.append(b, T0, header=hdr)
    assert hdr.base_offset == 0  # caller's header untouched
    assert log.log_end_offset == 40 and len(log.segments) > 3
    # sealed segments keep only the .log open; the active one also its two indexes
    assert len(os.listdir("/proc/self/fd")) - before == len(log.segments) + 2
    assert log.sync() == 40
    log.close()
    assert len(os.listdir("/proc/self/fd")) == before


def test_recovery_emptying_the_first_segment_empties_the_log(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    log = PartitionLog.open(d, small_cfg(retention_ms=1000), T0)
    fill(log, 10)
    first = log.segments[0]
    crash(log)
    with open(first.log_path, "r+b") as f:  # destroy the first batch: segment 0 recovers empty
        f.seek(30)
        f.write(b"\xff" * 8)
    log = PartitionLog.open(d, small_cfg(retention_ms=1000), T0 + 10)
    assert [(s.base_offset, s.size) for s in log.segments] == [(0, 0)]
    assert (log.log_start_offset, log.log_end_offset) == (0, 0)
    assert log.apply_retention(T0 + 100_000) == 0  # an empty active segment stays
    assert log.append(mk([b"x"]), T0 + 10).base_offset == 0


def test_concurrent_syncs_do_not_report_early(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(), T0)
    fill(log, 2)
    events: list[str] = []
    started = threading.Event()
    real = os.fdatasync

    def slow_fdatasync(fd: int) -> None:
        events.append("start")
        started.set()
        time.sleep(0.2)
        real(fd)
        events.append("end")

    monkeypatch.setattr(os, "fdatasync", slow_fdatasync)
    th = threading.Thread(target=log.sync)
    th.start()
    assert started.wait(5)
    assert log.sync() == 4  # must not claim durability while the first sync is in flight
    assert events[:2] == ["start", "end"]
    th.join()


def test_max_timestamp_offset(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", small_cfg(), T0)
    assert log.max_timestamp_offset() is None
    for ts in [100, 900, 300, 900, 200, 50, 60]:  # batch of 2: second record is ts+5
        log.append(mk([b"a", b"b"], ts=ts, deltas=[0, 5]), T0)
    assert len(log.segments) > 1
    assert log.max_timestamp_offset() == (3, 905)


def test_every_roll_and_segment_deletion_is_reported(tmp_path: Path) -> None:
    """The partition snapshots producer state on every roll (append, segment.ms, retention,
    forced) and deletes the snapshots of deleted segments (retention, DeleteRecords)."""
    log = PartitionLog.open(tmp_path / "t-0", small_cfg(segment_ms=1000, retention_ms=1000), T0)
    rolls: list[int] = []
    deleted: list[list[int]] = []
    log.on_roll = rolls.append
    log.on_segments_deleted = deleted.append
    fill(log, 10)  # size rolls
    assert rolls == [s.base_offset for s in log.segments[1:]] and rolls
    rolls.clear()
    assert log.maybe_roll(T0 + 5000)
    assert rolls == [20] == [log.active_segment.base_offset]
    log.append(mk([b"a"], ts=T0 + 5000), T0 + 5000)
    log.roll()
    assert rolls == [20, 21]
    log.append(mk([b"b"], ts=T0 + 5000), T0 + 5000)
    bases = [s.base_offset for s in log.segments]
    log.delete_records_before(bases[2])
    assert deleted == [bases[:2]]
    log.sync()
    rolls.clear()
    assert log.apply_retention(T0 + 100_000) == len(bases) - 2  # all expired: a roll first
    assert rolls == [22] and deleted[-1] == bases[2:]


def test_recovery_below_the_log_start_offset_restarts_the_log_there(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Kafka's deleteSegmentsIfLogStartGreaterThanLogEnd: when recovery leaves the log end
    below the log start offset, every segment goes and the log goes on from the log start."""
    d = tmp_path / "t-0"
    log = PartitionLog.open(d, small_cfg(), T0)
    fill(log, 20)
    start = log.segments[2].base_offset + 1
    log.delete_records_before(start)
    first = log.segments[0]
    crash(log)
    with open(first.log_path, "r+b") as f:  # corrupt its first batch: the log would end below start
        f.seek(30)
        f.write(b"\xff" * 8)
    with caplog.at_level("WARNING", logger="oncelog.storage.log"):
        log = PartitionLog.open(d, small_cfg(), T0)
    assert [(s.base_offset, s.size) for s in log.segments] == [(start, 0)]
    assert (log.log_start_offset, log.log_end_offset) == (start, start)
    assert any("below the log start offset" in r.getMessage() for r in caplog.records)
    assert log.append(mk([b"x"]), T0).base_offset == start  # no offset below it is handed out again
    log.sync()
    crash(log)
    log = PartitionLog.open(d, small_cfg(), T0)
    assert (log.log_start_offset, log.log_end_offset) == (start, start + 1)


def test_segments_dropped_during_a_running_fdatasync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DeleteRecords (and retention, which shares _drop_segment) drops segments while a
    worker is inside fdatasync for them, and new files then take whatever descriptor
    numbers are free: the sync finishes without EBADF, never fdatasyncs a number another
    file took meanwhile, leaks no descriptor, and the partition goes on as before."""
    fds_before = open_fds()
    log = PartitionLog.open(tmp_path / "t-0", small_cfg(), T0)
    fill(log, 20)
    assert len(log.segments) > 2
    dropped = log.segments[:-1]
    held = HeldSync(log, monkeypatch)
    assert log.delete_records_before(log.segments[-1].base_offset) == log.segments[0].base_offset
    assert not any(seg.log_path.exists() for seg in dropped)
    held.release(40)
    assert all(seg.fd < 0 for seg in dropped)  # closed once the sync was done with them
    fill(log, 3)
    assert log.sync() == 46 and log.durable_end_offset == 46
    log.close()
    assert open_fds() == fds_before  # no descriptor leaked


def test_sync_of_a_deleted_log_does_nothing(tmp_path: Path) -> None:
    """A deleted log (DeleteTopics) still listed in a group-commit round: its sync has
    nothing to make durable and must not fail (it tried the removed directory: a
    FileNotFoundError that failed the whole round, live partitions included)."""
    log = PartitionLog.open(tmp_path / "t-0", small_cfg(), T0)
    fill(log, 20)  # rolls: the directory and the sealed segments are dirty
    assert log.has_unsynced
    log.delete()
    assert not (tmp_path / "t-0").exists()
    assert log.sync() == 0
    assert not log.has_unsynced
