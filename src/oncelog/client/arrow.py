"""The batch API's Arrow path: records sections of pyarrow binary/string arrays, without a Python loop.

:func:`as_binary` takes what ``produce_batch`` was given and, when it is a
pyarrow ``binary``, ``string``, ``large_binary`` or ``large_string`` array
(or a chunked one), returns it as one binary array (a string array is
reinterpreted, not copied; chunks are concatenated). :func:`arrow_bounds` splits
its records into batches exactly as the list path does (same ``batch.size``
bound per record), and :func:`arrow_sections` encodes them: the bytes before
each key and before each value (length varint, attributes, timestamp delta,
offset delta, key length, value length) are computed with numpy for all
records at once, and pyarrow's ``binary_join_element_wise`` interleaves them
with the keys and values in one C pass (null keys and values encode as
length -1). The result is byte for byte what
:func:`oncelog.client.batch.encode_sections` makes of the same values as a
list of ``bytes`` (tests/unit/test_client_arrow.py checks that); the list path
costs a ``to_pylist()`` (a Python ``bytes`` per value) first.

pyarrow and numpy are imported only when an Arrow array is passed, so
neither is a dependency of the client (without numpy an Arrow array takes the
list path).
"""

from __future__ import annotations

from typing import Any

from oncelog.client.batch import RECORD_OVERHEAD_MAX

__all__ = ["arrow_bounds", "arrow_key_buffers", "arrow_sections", "as_binary", "is_arrow"]


def is_arrow(values: Any) -> bool:
    """True for a pyarrow Array or ChunkedArray (pyarrow is imported only when ``values`` comes from it;
    a RecordBatch or Table is not one: it takes the list path and its clear TypeError)."""
    if not type(values).__module__.startswith("pyarrow"):
        return False
    import pyarrow as pa

    return isinstance(values, (pa.Array, pa.ChunkedArray))


def as_binary(values: Any) -> Any:
    """``values`` (a pyarrow array or chunked array) as one ``binary``/``large_binary`` Array, or None
    when its type is not binary or string (the caller then takes the list path)."""
    import pyarrow as pa

    try:
        import numpy  # noqa: F401  (pyarrow does not require it; without it: the list path)
        import pyarrow.compute  # noqa: F401
    except ImportError:
        return None
    t = values.type
    if pa.types.is_string(t):
        t2 = pa.binary()
    elif pa.types.is_large_string(t):
        t2 = pa.large_binary()
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
        t2 = t
    else:
        return None
    if isinstance(values, pa.ChunkedArray):
        values = values.chunk(0) if values.num_chunks == 1 else \
            pa.concat_arrays(values.chunks) if values.num_chunks else pa.array([], t)
    if t2 != t:  # string -> binary: the same buffers
        values = values.view(t2)
    return values


def _lengths(arr: Any) -> Any:
    """int64 length of each value (0 for a null), read from the offsets buffer."""
    import numpy as np
    import pyarrow as pa

    n = len(arr)
    if n == 0:  # a zero-length array may have no offsets buffer (IPC / C data producers)
        return np.zeros(0, np.int64)
    dtype = np.int64 if pa.types.is_large_binary(arr.type) else np.int32
    offsets = np.frombuffer(arr.buffers()[1], dtype=dtype, count=arr.offset + n + 1)[arr.offset:]
    lens = np.diff(offsets).astype(np.int64)
    if arr.null_count:
        lens[_nulls(arr)] = 0
    return lens


def arrow_key_buffers(arr: Any) -> tuple[Any, Any, Any, Any]:
    """The keys of an :func:`as_binary` array as :func:`oncelog.client.partitioner.murmur2_buffers` reads
    them: (uint8 data with 3 readable bytes past the last key, int64 starts, int64 lengths, bool null mask
    or None), from the offsets and data buffers (no ``bytes`` per key; copied only to add those 3 bytes,
    and then only the array's own byte range: a slice's keys, not the parent's bytes before them)."""
    import numpy as np
    import pyarrow as pa

    n = len(arr)
    if n == 0:
        return np.zeros(3, np.uint8), np.zeros(0, np.int64), np.zeros(0, np.int64), None
    dtype = np.int64 if pa.types.is_large_binary(arr.type) else np.int32
    offsets = np.frombuffer(arr.buffers()[1], dtype=dtype, count=arr.offset + n + 1)[arr.offset:].astype(np.int64)
    buf = arr.buffers()[2]
    data = np.frombuffer(buf, np.uint8) if buf is not None else np.zeros(0, np.uint8)
    first, end = int(offsets[0]), int(offsets[-1])
    starts = offsets[:-1]
    if len(data) < end + 3:
        data = np.concatenate((data[first:end], np.zeros(3, np.uint8)))
        starts = starts - first
    nulls = _nulls(arr) if arr.null_count else None
    return data, starts, np.diff(offsets), nulls


def _nulls(arr: Any) -> Any:
    import numpy as np

    return np.asarray(arr.is_null())  # bool, the array's slice


def arrow_bounds(values: Any, keys: Any, room: int) -> list[tuple[int, int]]:
    """The list path's split of records into batches (``producer.append_many``): at most ``room`` bytes
    per batch by :func:`~oncelog.client.batch.record_sizes`'s bound, one record alone may be larger."""
    import numpy as np

    n = len(values)
    if n == 0:
        return []
    sizes = _lengths(values) + RECORD_OVERHEAD_MAX
    if keys is not None:
        sizes += _lengths(keys)
    ends = np.zeros(n + 1, np.int64)
    np.cumsum(sizes, out=ends[1:])
    bounds = []
    i = 0
    while i < n:
        j = max(i + 1, int(np.searchsorted(ends, ends[i] + room, side="right")) - 1)
        bounds.append((i, j))
        i = j
    return bounds


def _varint_cols(v: Any) -> tuple[Any, Any]:
    """The zigzag varints of ``v`` (int64, each >= -1 and < 2**34): a [n, w] uint8 matrix of their bytes
    (w: the longest; unused bytes arbitrary) and their lengths (None when all are 1 byte long)."""
    import numpy as np

    z = (v << 1) ^ (v >> 63)
    top = int(z.max()) if len(z) else 0
    w = 1
    while top >= 1 << (7 * w):
        w += 1
    if w == 1:
        return z.astype(np.uint8).reshape(-1, 1), None
    nb = np.ones(len(v), np.int64)
    out = np.empty((len(v), w), np.uint8)
    for k in range(w):
        if k < w - 1:
            more = z >= (1 << (7 * (k + 1)))
            out[:, k] = ((z >> (7 * k)) & 0x7F) | (more.astype(np.int64) << 7)
            nb += more
        else:
            out[:, k] = z >> (7 * k)
    return out, nb


def arrow_sections(values: Any, keys: Any, bounds: list[tuple[int, int]]) -> list[memoryview]:
    """The records sections of the batches ``bounds`` (as in :func:`~oncelog.client.batch.encode_sections`)
    of ``values`` and ``keys`` (:func:`as_binary` arrays, or ``keys`` None for null keys)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(values)
    if n == 0:
        return []
    starts = np.fromiter((i for i, _ in bounds), np.int64, len(bounds))
    counts = np.fromiter((j - i for i, j in bounds), np.int64, len(bounds))
    vlen = _lengths(values)
    vnull = _nulls(values) if values.null_count else None
    vh = vlen if vnull is None else np.where(vnull, -1, vlen)
    delta = np.arange(n, dtype=np.int64) - np.repeat(starts, counts)
    if keys is None:
        klen = np.zeros(n, np.int64)
        kh = np.full(n, -1, np.int64)
    else:
        klen = _lengths(keys)
        kh = klen if not keys.null_count else np.where(_nulls(keys), -1, klen)
    dv, dn = _varint_cols(delta)
    kv, kn = _varint_cols(kh)
    vv, vn = _varint_cols(vh)
    body = 3 + klen + vlen + (1 if dn is None else dn) + (1 if kn is None else kn) + (1 if vn is None else vn)  # attributes, ts delta (0), ..., header count (0)
    pv, pn = _varint_cols(body)
    zero2 = np.zeros((n, 2), np.uint8)
    # bytes before the key: length, attributes + ts delta, offset delta, key length; before the value:
    # value length (when there is no key they are one piece)
    pieces = [(pv, pn), (zero2, None), (dv, dn), (kv, kn)]
    if keys is None:
        pieces.append((vv, vn))
    before = _compact(pieces)
    big = pa.types.is_large_binary(values.type) or int(body.sum()) + 5 * n >= 1 << 31
    btype = pa.large_binary() if big else pa.binary()
    if values.type != btype:
        values = values.cast(btype)
    args = [_binary(before, btype)]
    if keys is not None:
        args += [keys.cast(btype) if keys.type != btype else keys, _binary(_compact([(vv, vn)]), btype)]
    args += [values, pa.scalar(b"\x00", btype), pa.scalar(b"", btype)]  # header count; separator
    joined = pc.binary_join_element_wise(*args, null_handling="replace", null_replacement="")
    offs = np.frombuffer(joined.buffers()[1], dtype=np.int64 if big else np.int32, count=n + 1)
    data = memoryview(joined.buffers()[2])  # type: ignore[arg-type]
    base = int(offs[0])
    edges = (offs[np.append(starts, n)] - base).tolist()
    data = data[base:]
    return [data[edges[b]:edges[b + 1]] for b in range(len(bounds))]


def _compact(pieces: list[tuple[Any, Any]]) -> tuple[Any, Any]:
    """Per record, the concatenation of ``pieces`` (each a byte matrix and the bytes used per row, None:
    all its columns): (bytes of all records, int64 offsets)."""
    import numpy as np

    mat = np.concatenate([m for m, _ in pieces], axis=1)
    offsets = np.zeros(len(mat) + 1, np.int64)
    if all(c is None for _, c in pieces):  # every row as wide as the matrix
        offsets[1:] = np.arange(1, len(mat) + 1) * mat.shape[1]
        return mat.reshape(-1), offsets
    keep = np.concatenate([np.ones(m.shape, bool) if c is None else
                           (np.arange(m.shape[1]) < c[:, None]) for m, c in pieces], axis=1)
    np.cumsum(keep.sum(axis=1), out=offsets[1:])
    return mat[keep], offsets


def _binary(compacted: tuple[Any, Any], btype: Any) -> Any:
    import numpy as np
    import pyarrow as pa

    data, offsets = compacted
    if btype == pa.binary():
        offsets = offsets.astype(np.int32)
    return pa.Array.from_buffers(btype, len(offsets) - 1, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
