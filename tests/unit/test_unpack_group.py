"""``reader.unpack_group``: a decode group's compressed batches decompressed into one reused buffer.

Every codec (snappy raw, as librdkafka writes it, and in the xerial framing Java writes), a scratch
buffer too small for the group (it grows and the result is the same), and a damaged batch (nothing
changes; the per-batch path raises the precise error).
"""

from __future__ import annotations

import os

import pytest

from oncelog.client import reader
from oncelog.client.reader import fetched_batches, group_sections, unpack_group
from oncelog.protocol import compression
from oncelog.protocol.records import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    HEADER_SIZE,
    Record,
    encode_record_batch,
    update_crc,
)
from tests.unit.test_client_fetch_decode import compressed


def batch(offset: int, n: int, size: int) -> bytes:
    return encode_record_batch([Record(None, os.urandom(8) * (size // 8)) for _ in range(n)], base_offset=offset)


def raw_snappy(raw: bytes) -> bytes:
    """``raw``'s records compressed as plain snappy (librdkafka), CRC fixed."""
    body = bytes(compression.codec_library().snappy.compress_raw(raw[HEADER_SIZE:]))
    return compression.compressed_batch(raw, COMPRESSION_SNAPPY, body)


@pytest.fixture(autouse=True)
def _restore_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests set the thread's scratch buffer and use the worker threads' pool: both put back after."""
    monkeypatch.setattr(reader._scratch, "buf", getattr(reader._scratch, "buf", None), raising=False)
    monkeypatch.setattr(reader, "_spare", [])


CODECS = {"gzip": lambda r: compressed(COMPRESSION_GZIP, r), "snappy-xerial": lambda r: compressed(COMPRESSION_SNAPPY, r),
          "snappy-raw": raw_snappy, "lz4": lambda r: compressed(COMPRESSION_LZ4, r),
          "zstd": lambda r: compressed(COMPRESSION_ZSTD, r)}


@pytest.mark.parametrize("codec", list(CODECS))
@pytest.mark.parametrize("scratch", [None, 16, 1 << 20])
def test_a_groups_batches_decompress_into_one_bytes(codec: str, scratch: int | None) -> None:
    raws = [batch(0, 5, 300), batch(5, 40, 1000), batch(45, 1, 10), batch(46, 100, 2000)]
    data = b"".join(CODECS[codec](r) for r in raws)
    reader._scratch.buf = None if scratch is None else bytearray(scratch)
    kept = fetched_batches(memoryview(data), 0, 0, 0, [], defer=True)[0]
    assert all(b.packed is not None and b.section is None for b in kept)
    assert unpack_group(kept)
    bufs = {id(b.section[0]) for b in kept}  # type: ignore[index]
    assert len(bufs) == 1 and all(b.packed is None for b in kept)
    for b, raw in zip(kept, raws):
        buf, s, e = b.section  # type: ignore[misc]
        assert type(buf) is bytes and buf[s:e] == raw[HEADER_SIZE:]
    got = group_sections(kept, 0)
    want = group_sections(fetched_batches(b"".join(raws), 0, 0, 0, [])[0], 0)
    assert got is not None and want is not None and got == want
    assert unpack_group(kept)  # nothing left to do


def test_a_damaged_batch_keeps_those_before_it_and_leaves_itself_for_the_precise_error() -> None:
    good = compressed(COMPRESSION_GZIP, batch(0, 3, 100))
    bad = bytearray(compressed(COMPRESSION_GZIP, batch(3, 3, 100)))
    bad[HEADER_SIZE + 12] ^= 0xFF
    update_crc(bad)
    kept = fetched_batches(good + bytes(bad), 0, 0, 0, [], defer=True)[0]
    assert not unpack_group(kept)
    # the good batch before it keeps its section (not decompressed again by batch_section)
    assert kept[0].packed is None and kept[0].section is not None
    assert kept[1].packed is not None and kept[1].section is None
    assert group_sections(kept, 0) is None
    assert reader.batch_section(kept[0], 0, 0)[0] == [0, 1, 2]
    with pytest.raises(reader.ReaderError, match="batch at offset 3"):
        reader.batch_section(kept[1], 0, 0)


def test_size_hints() -> None:
    cj = compression.codec_library()
    data = os.urandom(1000) * 300
    assert compression.size_hint(COMPRESSION_GZIP, bytes(cj.gzip.compress(data))) == len(data)
    assert compression.size_hint(COMPRESSION_SNAPPY, bytes(cj.snappy.compress_raw(data))) == len(data)
    assert compression.size_hint(COMPRESSION_SNAPPY, compression.compress(COMPRESSION_SNAPPY, data)) is None  # xerial
    assert compression.size_hint(COMPRESSION_LZ4, compression.compress(COMPRESSION_LZ4, data)) is None
    damaged = bytes(cj.gzip.compress(data))[:-4] + b"\xff\xff\xff\x7f"  # ISIZE 2 GiB from 1 KB: not trusted
    assert compression.size_hint(COMPRESSION_GZIP, damaged) is None


def test_a_gzip_group_larger_than_the_scratch_is_decompressed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """gzip says its size (ISIZE): the scratch buffer grows first, no decompression a second time."""
    raws = [batch(0, 300, 1000), batch(300, 300, 1000)]
    kept = fetched_batches(b"".join(compressed(COMPRESSION_GZIP, r) for r in raws), 0, 0, 0, [], defer=True)[0]
    reader._scratch.buf = bytearray(1000)
    calls: list[str] = []
    for name in ("decompress_into", "decompress_buffer"):
        real = getattr(compression, name)
        monkeypatch.setattr(compression, name, lambda *a, _r=real, _n=name: calls.append(_n) or _r(*a))
    assert unpack_group(kept)
    assert calls == ["decompress_into", "decompress_into"]
    assert b"".join(b.section[0][b.section[1]:b.section[2]] for b in kept) == b"".join(  # type: ignore[index]
        r[HEADER_SIZE:] for r in raws)


def forged_isize(claim: int) -> bytes:
    """A gzip batch of one 20,000-byte random value (~20 KB compressed) whose trailer claims ``claim`` bytes."""
    raw = encode_record_batch([Record(None, os.urandom(20000))], base_offset=0)
    body = bytearray(compression.codec_library().gzip.compress(raw[HEADER_SIZE:]))
    body[-4:] = claim.to_bytes(4, "little")
    return compression.compressed_batch(raw, COMPRESSION_GZIP, bytes(body))


@pytest.mark.parametrize("claim", [20_000_000, 1_200_000])
def test_a_forged_gzip_size_allocates_little(claim: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trailer's ISIZE is the sender's word: a 20 KB batch claiming 20 MB (within deflate's 1032:1) made
    each decoding thread allocate and zero 30 MB before the batch was rejected. Trusted up to HINT_RATIO
    times the compressed size now (1.2 MB: within it, grown to at most 1.5 times that)."""
    sizes: list[int] = []
    real = compression.decompress_into
    monkeypatch.setattr(compression, "decompress_into", lambda c, d, o: sizes.append(len(o)) or real(c, d, o))
    kept = fetched_batches(forged_isize(claim), 0, 0, 0, [], defer=True)[0]
    assert compression.size_hint(COMPRESSION_GZIP, memoryview(kept[0].packed[0])[kept[0].packed[1]:kept[0].packed[2]]) == claim  # type: ignore[index]
    got = reader.unpack_into(kept, bytearray(1 << 20))
    assert got[2] == [] and len(got[1]) == 1  # damaged: the precise error comes later
    assert sizes and max(sizes) <= max(1 << 20, claim * 3 // 2) and max(sizes) < 2 << 20, sizes


def test_a_large_buffer_is_not_kept_after_its_group() -> None:
    """A group of large records (~6 MiB decompressed) grows the buffer past SCRATCH_KEEP (4 MiB): it is
    dropped after the group, in the thread's scratch and in the worker threads' pool, so that a thread
    that once decoded such a group does not keep it (was: up to 32 MiB a thread, and 2 x 32 MiB pooled)."""
    raws = [batch(0, 20, 100_000), batch(20, 20, 100_000), batch(40, 20, 100_000)]
    data = b"".join(compressed(COMPRESSION_ZSTD, r) for r in raws)
    reader._scratch.buf = bytearray(1 << 20)
    assert unpack_group(fetched_batches(data, 0, 0, 0, [], defer=True)[0])
    assert reader._scratch.buf is None
    got = reader.unpack_into(fetched_batches(data, 0, 0, 0, [], defer=True)[0], reader.borrow_buffer())
    assert got is not None and len(got[0]) > reader.SCRATCH_KEEP
    reader.unpacked(got)
    reader.return_buffer(got[0])
    assert reader._spare == []
    small = fetched_batches(compressed(COMPRESSION_ZSTD, batch(0, 5, 300)), 0, 0, 0, [], defer=True)[0]
    assert unpack_group(small)  # a small group: its buffer (1 MiB) is kept
    assert reader._scratch.buf is not None and len(reader._scratch.buf) <= reader.SCRATCH_KEEP
