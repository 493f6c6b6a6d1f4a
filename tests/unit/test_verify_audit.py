"""``oncelog verify``'s pure core and the reader's pure parts, over synthetic records and batches."""

from __future__ import annotations

import argparse
import gzip
import json
import socket
import struct

import pytest

from oncelog.client.reader import (
    Batch,
    ReaderError,
    decode_batches,
    decompress,
    filter_read_committed,
)
from oncelog.protocol.records import (
    ATTRIBUTES_OFFSET,
    BATCH_LENGTH_OFFSET,
    HEADER_SIZE,
    LOG_OVERHEAD,
    Record,
    encode_control_batch,
    encode_record_batch,
    update_crc,
)
from oncelog.verify import (
    ANOMALIES,
    Mark,
    Rec,
    Txn,
    UsageError,
    add_arguments,
    audit,
    id_extractor,
    main,
    transactions,
)

# -- helpers ---------------------------------------------------------------------------


def copy_of(ids: list[str], partition: int = 0) -> list[Rec]:
    return [Rec(partition, i, id_) for i, id_ in enumerate(ids)]


def ids(n: int, prefix: str = "r") -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def only(report, **expected: int) -> None:  # type: ignore[no-untyped-def]
    want = dict.fromkeys(ANOMALIES, 0) | expected
    assert report.counts == want, report.examples


# -- id extraction ----------------------------------------------------------------------


class R:
    def __init__(self, key=None, value=None, headers=()):  # type: ignore[no-untyped-def]
        self.key, self.value, self.headers = key, value, list(headers)


def test_id_key_value_header_json() -> None:
    r = R(b"k1", b'{"id": 7, "n": {"x": "deep"}, "s": "str", "a.b": 1}', [("h", b"one"), ("h", b"two")])
    assert id_extractor("key")(r) == "k1"
    assert id_extractor("value")(r) == r.value.decode()
    assert id_extractor("header:h")(r) == "two"  # the last header of that name, like lastHeader()
    assert id_extractor("header:missing")(r) is None
    assert id_extractor("json:id")(r) == "7"
    assert id_extractor("json:s")(r) == "str"
    assert id_extractor("json:n.x")(r) == "deep"
    assert id_extractor("json:a.b")(r) == "1"  # a field literally named "a.b" wins over the path
    assert id_extractor("json:nope")(r) is None
    assert id_extractor("json:id")(R(value=b"not json")) is None
    assert id_extractor("key")(R()) is None
    assert id_extractor("key")(R(b"\xff")) == "\\xff"


@pytest.mark.parametrize("spec", ["", "keys", "header:", "json:", "xml:id", "header"])
def test_bad_id_spec(spec: str) -> None:
    with pytest.raises(UsageError):
        id_extractor(spec)


# -- lost, duplicated, unexpected ------------------------------------------------------------


def test_clean_copy() -> None:
    src = copy_of(ids(10)) + copy_of(ids(5, "q"), 1)
    dst = copy_of(ids(10)[::2], 0) + copy_of(ids(10)[1::2], 1) + copy_of(ids(5, "q"), 2)
    rep = audit(src, dst, dst, [], {0: 10, 1: 5}, {0: 10, 1: 5})
    only(rep)
    assert rep.clean and rep.input_records == 15 and rep.output_records == 15
    assert rep.to_json()["clean"] is True


def test_lost() -> None:
    rep = audit(copy_of(ids(10)), copy_of([i for i in ids(10) if i not in ("r3", "r7")]))
    only(rep, lost=2)
    assert [e["id"] for e in rep.examples["lost"]] == ["r3", "r7"]
    assert rep.examples["lost"][0] == {"id": "r3", "input_partition": 0, "input_offset": 3}
    assert not rep.clean


def test_duplicated() -> None:
    out = ids(10)
    out.insert(5, "r4")  # r4 twice, adjacent: no order violation
    out += ["r9", "r9"]
    rep = audit(copy_of(ids(10)), copy_of(out))
    only(rep, duplicated=3)
    assert {e["id"]: e["count"] for e in rep.examples["duplicated"]} == {"r4": 2, "r9": 3}
    assert rep.examples["duplicated"][0]["output"] == [[0, 4], [0, 5]]


def test_duplicates_in_input_are_expected_in_output() -> None:
    src = copy_of(["a", "b", "a"])
    only(audit(src, copy_of(["a", "b", "a"])))
    only(audit(src, copy_of(["a", "b"])), lost=1)
    only(audit(src, copy_of(["a", "b", "a", "a"])), duplicated=1)


def test_unexpected() -> None:
    rep = audit(copy_of(ids(3)), copy_of(ids(3) + ["ghost"]))
    only(rep, unexpected=1)
    assert rep.examples["unexpected"] == [{"id": "ghost", "partition": 0, "offset": 3}]


def test_unidentified_records_are_counted_not_audited() -> None:
    rep = audit(copy_of(["a", None, "b"]), copy_of(["a", "b", None, None]))  # type: ignore[list-item]
    only(rep)
    assert rep.unidentified == {"input": 1, "output": 2}


def test_examples_capped() -> None:
    rep = audit(copy_of(ids(50)), [], max_examples=3)
    only(rep, lost=50)
    assert len(rep.examples["lost"]) == 3


# -- aborted_visible ----------------------------------------------------------------------------


def txn_partition() -> tuple[list[Rec], list[Mark]]:
    """Partition 0 read_uncommitted: pid 7 aborts offsets 0-2 (marker 3), pid 8 commits 4-5 (marker 6),
    pid 7 again commits 7 (marker 8), a non-transactional record at 9, pid 9 open at 10-11."""
    recs = [Rec(0, 0, "x0", producer_id=7, transactional=True),
            Rec(0, 1, "x1", producer_id=7, transactional=True),
            Rec(0, 2, "x2", producer_id=7, transactional=True),
            Rec(0, 4, "c0", producer_id=8, transactional=True),
            Rec(0, 5, "c1", producer_id=8, transactional=True),
            Rec(0, 7, "c2", producer_id=7, transactional=True),
            Rec(0, 9, "c3", producer_id=5),
            Rec(0, 10, "o0", producer_id=9, transactional=True),
            Rec(0, 11, "o1", producer_id=9, transactional=True)]
    marks = [Mark(0, 3, 7, False), Mark(0, 6, 8, True), Mark(0, 8, 7, True)]
    return recs, marks


def test_transactions_from_markers() -> None:
    recs, marks = txn_partition()
    assert transactions(recs, marks + [Mark(0, 12, 4, False)]) == [
        Txn(0, 7, 0, 3, False), Txn(0, 8, 4, 6, True), Txn(0, 7, 7, 8, True), Txn(0, 9, 10, None, None),
        Txn(0, 4, 12, 12, False),  # a marker with no data on this partition
    ]


def test_aborted_records_hidden_are_seen_not_counted() -> None:
    recs, marks = txn_partition()
    committed = [r for r in recs if r.id and r.id[0] == "c"]  # a correct read_committed view (up to the LSO 10)
    rep = audit(copy_of(["c0", "c1", "c2", "c3"], 5), committed, recs, marks, order="none")
    only(rep)
    assert rep.aborted_seen == 3 and rep.undecided_seen == 2


def test_aborted_visible() -> None:
    recs, marks = txn_partition()
    leaky = [r for r in recs if r.offset < 10]  # aborted x0..x2 leak into read_committed
    src = copy_of(["x0", "x1", "x2", "c0", "c1", "c2", "c3"], 5)
    rep = audit(src, leaky, recs, marks, order="none")
    only(rep, aborted_visible=3)
    assert rep.examples["aborted_visible"][0] == {
        "id": "x0", "partition": 0, "offset": 0, "producer_id": 7, "txn_first_offset": 0, "abort_marker_offset": 3}
    # the same offsets in another partition, or from another producer, are not in that transaction
    # nor is a record of that producer after the ABORT marker
    other = [Rec(1, 1, "x1", producer_id=7, transactional=True), Rec(0, 1, "x1", producer_id=6, transactional=True),
             Rec(0, 6, "x1", producer_id=7)]
    only(audit(copy_of(["x1", "x1", "x1"]), other, recs, marks, order="none"))


def test_no_uncommitted_pass_skips_the_check() -> None:
    recs, _marks = txn_partition()
    rep = audit(copy_of([r.id for r in recs]), recs, None, None, order="none")  # type: ignore[misc]
    only(rep)
    assert rep.aborted_seen == 0


# -- out_of_order ---------------------------------------------------------------------------------


def test_out_of_order_swap() -> None:
    rep = audit(copy_of(ids(6)), copy_of(["r0", "r1", "r3", "r2", "r4", "r5"]))
    only(rep, out_of_order=1)
    (ex,) = rep.examples["out_of_order"]
    assert ex["input_partition"] == 0 and ex["output_partition"] == 0 and ex["id"] in ("r2", "r3")


def test_out_of_order_counts_fewest_records_to_remove() -> None:
    # one record moved to the front: only it is out of order, not the four that follow it
    only(audit(copy_of(ids(5)), copy_of(["r4", "r0", "r1", "r2", "r3"])), out_of_order=1)
    only(audit(copy_of(ids(5)), copy_of(["r4", "r3", "r2", "r1", "r0"])), out_of_order=4)


def test_order_is_per_input_partition_and_output_partition() -> None:
    src = copy_of(ids(4, "a"), 0) + copy_of(ids(4, "b"), 1)
    # interleaving two input partitions in one output partition is fine
    only(audit(src, copy_of(["b0", "a0", "a1", "b1", "b2", "a2", "a3", "b3"])))
    # records of one input partition spread over two output partitions: no order across them
    only(audit(src, copy_of(["a2", "a3", "b0", "b1", "b2", "b3"], 0) + copy_of(["a0", "a1"], 1)))
    # but within one output partition they must keep input order
    only(audit(src, copy_of(["a1", "a0", "b0", "b1", "b2", "b3", "a2", "a3"])), out_of_order=1)


def test_order_per_key() -> None:
    keys = [b"k1", b"k2", b"k1", b"k2"]
    src = [Rec(0, i, f"r{i}", keys[i]) for i in range(4)]
    out = copy_of(["r1", "r3", "r0", "r2"])  # k2 before k1: fine per key, wrong per partition
    only(audit(src, out, order="key"))
    only(audit(src, out, order="partition"), out_of_order=2)
    only(audit(src, copy_of(["r2", "r0", "r1", "r3"]), order="key"), out_of_order=1)
    only(audit(src, copy_of(["r2", "r0", "r1", "r3"]), order="none"))


def test_duplicates_are_not_also_out_of_order() -> None:
    # a copier that re-emits r1..r2 after a crash: duplicates, not order violations
    rep = audit(copy_of(ids(4)), copy_of(["r0", "r1", "r2", "r1", "r2", "r3"]))
    only(rep, duplicated=2)


def test_bad_order() -> None:
    with pytest.raises(UsageError):
        audit([], [], order="time")


# -- offsets_ahead ------------------------------------------------------------------------------------


def test_offsets_ahead() -> None:
    src = copy_of(ids(10))
    out = copy_of([i for i in ids(10) if i != "r3"])
    rep = audit(src, out, committed_offsets={0: 5}, input_ends={0: 10})
    only(rep, lost=1, offsets_ahead=1)
    assert rep.examples["offsets_ahead"] == [{"partition": 0, "committed_offset": 5, "input_offset": 3, "id": "r3"}]
    # a record past the committed offset that is missing is lost, but the group did not claim it
    only(audit(src, out, committed_offsets={0: 3}, input_ends={0: 10}), lost=1)
    # committed past the end of the input
    rep = audit(src, src, committed_offsets={0: 12}, input_ends={0: 10})
    only(rep, offsets_ahead=1)
    assert rep.examples["offsets_ahead"] == [{"partition": 0, "committed_offset": 12, "input_end": 10}]
    only(audit(src, src, committed_offsets={0: 10}, input_ends={0: 10}))


def test_json_shape() -> None:
    doc = audit(copy_of(ids(3)), copy_of(["r0", "r0"])).to_json()
    assert set(doc) >= {"lost", "duplicated", "aborted_visible", "out_of_order", "offsets_ahead", "examples",
                        "input_records", "output_records", "aborted_seen"}
    assert (doc["lost"], doc["duplicated"], doc["input_records"], doc["output_records"]) == (2, 1, 3, 2)
    json.dumps(doc)


# -- the reader's decoding and read_committed filter -----------------------------------------------


def compressed(codec: int, raw: bytes, packer) -> bytes:  # type: ignore[no-untyped-def]
    body = packer(raw[HEADER_SIZE:])
    buf = bytearray(raw[:HEADER_SIZE] + body)
    (attrs,) = struct.unpack_from(">h", buf, ATTRIBUTES_OFFSET)
    struct.pack_into(">h", buf, ATTRIBUTES_OFFSET, attrs | codec)
    struct.pack_into(">i", buf, BATCH_LENGTH_OFFSET, HEADER_SIZE - LOG_OVERHEAD + len(body))
    update_crc(buf)
    return bytes(buf)


def _xerial(data: bytes) -> bytes:
    import cramjam

    block = bytes(cramjam.snappy.compress_raw(data))
    return b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + struct.pack(">i", len(block)) + block


def _packers():  # type: ignore[no-untyped-def]
    import cramjam
    import lz4.frame
    import zstandard

    return {
        "gzip": (1, gzip.compress),
        "snappy-raw": (2, lambda d: bytes(cramjam.snappy.compress_raw(d))),
        "snappy-xerial": (2, _xerial),
        "lz4": (3, lz4.frame.compress),
        "zstd": (4, zstandard.ZstdCompressor().compress),
    }


@pytest.mark.parametrize("name", ["gzip", "snappy-raw", "snappy-xerial", "lz4", "zstd"])
def test_decode_compressed(name: str) -> None:
    codec, packer = _packers()[name]
    recs = [Record(f"k{i}".encode(), b"v" * 50, [("h", b"x")]) for i in range(20)]
    raw = encode_record_batch(recs, base_offset=100, producer_id=3, producer_epoch=1, base_sequence=0)
    data = compressed(codec, raw, packer) + encode_record_batch([Record(b"plain", None)], base_offset=120)
    (b1, b2) = decode_batches(data, partition=4)
    assert b1.header.compression == codec
    assert [(r.offset, r.key, r.headers) for r in b1.records] == [(100 + i, f"k{i}".encode(), [("h", b"x")])
                                                                 for i in range(20)]
    assert all(r.partition == 4 and r.producer_id == 3 for r in b1.records)
    assert [(r.offset, r.key, r.value) for r in b2.records] == [(120, b"plain", None)]


def test_decode_checks_crc_and_ignores_partial_tail() -> None:
    good = encode_record_batch([Record(b"a", b"b")])
    assert len(decode_batches(good + good[:30])) == 1
    bad = bytearray(good)
    bad[-1] ^= 1
    with pytest.raises(ReaderError, match="CRC"):
        decode_batches(bytes(bad))
    assert decompress(0, b"xyz") == b"xyz"
    with pytest.raises(ReaderError):
        decompress(6, b"")


def fetched(*batches: bytes) -> list[Batch]:
    return decode_batches(b"".join(batches))


def data(offset: int, pid: int, n: int = 2, txn: bool = True) -> bytes:
    return encode_record_batch([Record(f"{pid}-{offset + i}".encode(), b"") for i in range(n)],
                               base_offset=offset, producer_id=pid, producer_epoch=0, base_sequence=offset,
                               is_transactional=txn)


def marker(offset: int, pid: int, commit: bool) -> bytes:
    return encode_control_batch(pid, 0, commit, 0, base_offset=offset)


def keys(kept: list[Batch]) -> list[bytes]:
    return [r.key for b in kept for r in b.records]  # type: ignore[misc]


def test_read_committed_filter_like_java() -> None:
    batches = fetched(
        data(0, 1), data(2, 2),  # pid 1 aborts [0..4], pid 2 commits
        marker(4, 1, False), marker(5, 2, True),
        data(6, 1),  # pid 1's next transaction, committed
        data(8, 3, txn=False),  # an idempotent producer: never filtered
        marker(10, 1, True),
        data(11, 4), marker(13, 4, False),
    )
    kept, skipped = filter_read_committed(batches, [(1, 0), (4, 11)])
    assert keys(kept) == [b"2-2", b"2-3", b"1-6", b"1-7", b"3-8", b"3-9"]
    assert skipped == 2
    # read_uncommitted keeps all data, never markers; an empty aborted list filters nothing
    assert len(keys(filter_read_committed(batches, [])[0])) == 10
    assert all(not b.header.is_control for b in filter_read_committed(batches, [])[0])
    assert [b.marker.commit for b in batches if b.marker] == [False, True, True, False]


def test_read_committed_aborted_entry_only_applies_from_its_first_offset() -> None:
    # pid 1 committed a transaction at 0..1, then aborted one starting at 3
    batches = fetched(data(0, 1), marker(2, 1, True), data(3, 1), marker(5, 1, False), data(6, 1), marker(8, 1, True))
    kept, skipped = filter_read_committed(batches, [(1, 3)])
    assert keys(kept) == [b"1-0", b"1-1", b"1-6", b"1-7"] and skipped == 1


# -- the CLI shell -------------------------------------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def test_cli_usage_and_connection_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(parse("--input", "a", "--output", "b", "--id", "bogus")) == 2
    assert "--id" in capsys.readouterr().err
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(parse("--bootstrap", f"127.0.0.1:{port}", "--input", "a", "--output", "b", "--timeout", "2")) == 2
    assert capsys.readouterr().err.startswith("error:")


def test_cli_registers_verify() -> None:
    from oncelog.cli import build_parser

    args = build_parser().parse_args(["verify", "--input", "i", "--output", "o", "--id", "json:n", "--json"])
    assert (args.input, args.output, args.id_spec, args.json, args.order) == ("i", "o", "json:n", True, "partition")
