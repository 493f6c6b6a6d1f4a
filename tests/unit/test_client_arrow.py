"""The batch API's Arrow path (oncelog.client.arrow): the same batches and bytes as the list path."""

from __future__ import annotations

import random

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("numpy")

from oncelog.client.aio.producer import _values_list  # noqa: E402
from oncelog.client.arrow import arrow_bounds, arrow_sections, as_binary, is_arrow  # noqa: E402
from oncelog.client.batch import batch_bounds, encode_sections  # noqa: E402
from oncelog.client.reader import decode_batches  # noqa: E402


def _random_column(rng: random.Random, n: int, p_null: float, longest: int) -> list[bytes | None]:
    return [None if rng.random() < p_null else rng.randbytes(rng.choice([0, 1, rng.randrange(longest + 1)]))
            for _ in range(n)]


def test_arrow_sections_equal_the_list_path_byte_for_byte() -> None:
    """Random binary/large_binary arrays (empty values, nulls, null and present keys, sliced, chunked,
    values longer than the varint table, batches of more than 64 and 8192 records): the same batch
    bounds and the same records sections as encode_sections of the values as a list of bytes."""
    rng = random.Random(11)
    seen = set()
    for trial in range(150):
        n = rng.choice([0, 1, 2, 5, 100, 3000, 20000])
        values = _random_column(rng, n, rng.choice([0.0, 0.0, 0.1]), rng.choice([10, 200, 20000]))
        keys = None if rng.random() < 0.4 else _random_column(rng, n, rng.choice([0.0, 0.2]), rng.choice([5, 100]))
        varr = pa.array(values, rng.choice([pa.binary(), pa.large_binary()]))
        karr = None if keys is None else pa.array(keys, rng.choice([pa.binary(), pa.large_binary()]))
        if n > 4 and rng.random() < 0.5:  # a slice: offsets and validity start mid-buffer
            a, b = sorted(rng.sample(range(n), 2))
            values, varr = values[a:b], varr.slice(a, b - a)
            if keys is not None:
                keys, karr = keys[a:b], karr.slice(a, b - a)
            seen.add("sliced")
        if len(values) > 2 and rng.random() < 0.3:
            m = len(values) // 2
            varr = pa.chunked_array([varr.slice(0, m), varr.slice(m)])
            seen.add("chunked")
        room = rng.choice([16384, 1000, 1 << 20]) - 61
        bounds = batch_bounds(values, keys, room)  # the list path's split (append_many)
        vb, kb = as_binary(varr), None if karr is None else as_binary(karr)
        assert arrow_bounds(vb, kb, room) == bounds, trial
        want = encode_sections(values, keys, bounds) if values else []
        got = [bytes(s) for s in arrow_sections(vb, kb, bounds)]
        assert got == want, trial
        if None in values:
            seen.add("null values")
        if keys is not None and None in keys:
            seen.add("null keys")
        if max((j - i for i, j in bounds), default=0) > 8192:
            seen.add("3-byte offset deltas")
    assert seen == {"sliced", "chunked", "null values", "null keys", "3-byte offset deltas"}, seen


@pytest.mark.parametrize("typ", ["string", "large_string"])
def test_string_arrays_encode_as_their_utf8_bytes(typ: str) -> None:
    texts = ["", "héllo", None, "x" * 70, "ünï" * 3000]
    arr = pa.array(texts, getattr(pa, typ)())
    vb = as_binary(arr.slice(1))
    bounds = [(0, 4)]
    section = bytes(arrow_sections(vb, None, bounds)[0])
    want = [None if t is None else t.encode() for t in texts[1:]]
    assert section == encode_sections(want, None, bounds)[0]


def test_produce_batch_keeps_arrow_arrays_as_arrow() -> None:
    """produce_batch's input conversion leaves a binary/string Arrow array (or chunked array) as one
    Arrow array (no to_pylist: a Python bytes per value); other Arrow types still become lists."""
    arr = pa.array([b"a", None, b"ccc"])
    for given in (arr, arr.cast(pa.string()), pa.chunked_array([arr, arr]), arr.cast(pa.large_binary())):
        got = _values_list(given)
        assert is_arrow(got) and got.type in (pa.binary(), pa.large_binary()), given.type
        assert len(got) == len(given)
    with pytest.raises(TypeError):
        _values_list(pa.array([1, 2]))


def test_a_record_batch_or_table_gets_the_clear_type_error() -> None:
    """review5 A2: not an array of values: the list path's TypeError (it was an AttributeError)."""
    rb = pa.record_batch([pa.array([b"a", b"b"])], names=["v"])
    for given in (rb, pa.Table.from_batches([rb])):
        assert not is_arrow(given)
        with pytest.raises(TypeError, match="value must be bytes, str or None, not dict"):
            _values_list(given)


@pytest.mark.parametrize("typ", ["binary", "string", "large_binary"])
def test_a_zero_length_array_without_offsets_is_empty(typ: str) -> None:
    """review5 A4: a length-0 array may come without an offsets buffer (valid for pyarrow): no batch."""
    arr = pa.Array.from_buffers(getattr(pa, typ)(), 0, [None, None, pa.py_buffer(b"")])
    arr.validate()
    got = _values_list(arr)
    assert is_arrow(got) and len(got) == 0
    assert arrow_bounds(got, None, 1000) == [] and arrow_bounds(got, got, 1000) == []
    assert list(arrow_sections(got, None, [])) == []


def test_sections_decode_to_the_records() -> None:
    """A section from the Arrow path, wrapped in a batch, decodes to the original keys and values."""
    from oncelog.client.batch import BatchBuilder

    values = [b"", None, b"v" * 300, b"x"]
    keys = [b"k0", None, b"", b"k3" * 50]
    vb, kb = as_binary(pa.array(values)), as_binary(pa.array(keys))
    builder = BatchBuilder(1 << 20)
    builder.append_encoded(arrow_sections(vb, kb, [(0, 4)])[0], 4, 1_700_000_000_000)  # type: ignore[arg-type]
    (batch,) = decode_batches(builder.to_bytes())
    assert [(r.key, r.value) for r in batch.records] == list(zip(keys, values))
