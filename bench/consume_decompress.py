#!/usr/bin/env python3
"""The consumer's decompression: how long it holds the thread, and the asyncio consumer's offload.

No broker. Records are 1 KiB values, either JSON-like (2-4x compressible, ``json``) or the
``bench/client_consume.py`` prefill's (``b"%08d" % i`` repeated, 50-100x, ``bench``).

* ``hold``: one batch of 1,024 records (1 MiB of values) per codec, compressed as Kafka writes it
  (``protocol.compression.compress``: xerial snappy, lz4 frames); the thread time of
  ``reader.unpack_group`` (decompressed into the thread's reused buffer, copied once into bytes),
  of the per-batch ``compression.decompress_buffer`` + ``bytes`` (the path before it), of
  cramjam's and python-lz4's lz4 frame decompression (if ``lz4`` is installed; not a dependency),
  and of the record decode after it (``group_sections``).
* ``offload``: the asyncio consumer handed 8 such batches as one Fetch answer, ``consume(500, 0)``
  until empty with an ``await asyncio.sleep(0)`` between calls; per mode (``OFFLOAD_BYTES`` as
  shipped, or never) the longest single loop step (thread CPU time of one asyncio callback, so
  that other load on the machine does not count) and the process CPU per record; modes alternate
  in one loop (one default executor), ``--rounds`` rounds, medians.

Usage: ``python bench/consume_decompress.py --rounds 8`` (``--what hold`` or ``offload``).
"""

from __future__ import annotations

import argparse
import asyncio
import asyncio.events
import random
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import oncelog.client.aio.consumer as consumer_mod  # noqa: E402
from oncelog.client.reader import fetched_batches, group_sections, unpack_group  # noqa: E402
from oncelog.protocol import compression  # noqa: E402
from oncelog.protocol.records import (  # noqa: E402
    RECORDS_OFFSET,
    Record,
    encode_record_batch,
)

CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def json_values(n: int) -> list[bytes]:
    rng = random.Random(1)
    out = []
    for i in range(n):
        v = bytearray()
        while len(v) < 1024:
            v += (b'{"id": %d, "user": "user-%05d", "event": "%s", "payload": "%s"}' %
                  (i, rng.randrange(100000), rng.choice([b"click", b"view", b"buy"]), rng.randbytes(24).hex().encode()))
        out.append(bytes(v[:1024]))
    return out


def bench_values(n: int) -> list[bytes]:
    return [(b"%08d" % i) * 128 for i in range(n)]


def compressed_batch(codec: int, values: list[bytes], base_offset: int = 0) -> bytes:
    return compression.compressed_batch(encode_record_batch([Record(None, v) for v in values], base_offset=base_offset),
                                        codec)


def ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.thread_time()
        fn()
        times.append((time.thread_time() - t0) * 1e3)
    return statistics.median(times[2:])


def hold(rounds: int) -> None:
    try:
        import lz4.frame as lz4frame
    except ImportError:
        lz4frame = None
    cj = compression.codec_library()
    print("| values | codec | compressed KiB | unpack_group ms | decompress_buffer + bytes ms | record decode after ms |")
    print("|---|---|---:|---:|---:|---:|")
    for kind, values in (("json", json_values(1024)), ("bench", bench_values(1024))):
        for name, codec in CODECS.items():
            data = compressed_batch(codec, values)
            body = memoryview(data)[RECORDS_OFFSET:]

            def unpack() -> None:
                unpack_group(fetched_batches(memoryview(data), 0, 0, 0, [], defer=True)[0])

            kept = fetched_batches(memoryview(data), 0, 0, 0, [], defer=True)[0]
            unpack_group(kept)
            dec = ms(lambda: group_sections(kept, 0), rounds + 2)
            old = ms(lambda: bytes(compression.decompress_buffer(codec, body)), rounds + 2)
            print(f"| {kind} | {name} | {len(data) / 1024:.1f} | {ms(unpack, rounds + 2):.2f} | {old:.2f} | {dec:.2f} |")
            if name == "lz4":
                line = f"lz4 frame ({kind}): cramjam.lz4.decompress {ms(lambda: cj.lz4.decompress(body), rounds + 2):.3f} ms"
                if lz4frame is not None:
                    line += f", python-lz4 lz4.frame.decompress {ms(lambda: lz4frame.decompress(body), rounds + 2):.3f} ms"
                print(line, file=sys.stderr)


STEPS: list[float] = []


def _timed_run(self: asyncio.events.Handle, _run=asyncio.events.Handle._run) -> None:
    t0 = time.thread_time()
    try:
        _run(self)
    finally:
        STEPS.append(time.thread_time() - t0)


async def _one(data: bytes, records: int, offload: bool) -> tuple[float, float]:
    consumer_mod.OFFLOAD_BYTES = 256 * 1024 if offload else 1 << 62
    c = consumer_mod.Consumer({"bootstrap.servers": "127.0.0.1:1", "enable.auto.commit": False})
    c.assign([("t", 0, 0)])
    assert c._apply(c._parts[("t", 0)], SimpleNamespace(error_code=0, records=data, aborted_transactions=[]))
    STEPS.clear()
    c0, n = time.process_time(), 0
    while msgs := await c.consume(500, 0):
        n += len(msgs)
        await asyncio.sleep(0)  # an application that lets the loop run between batches
    assert n == records
    return max(STEPS) * 1e3, (time.process_time() - c0) / n * 1e6


def offload(rounds: int) -> None:
    saved = consumer_mod.OFFLOAD_BYTES
    asyncio.events.Handle._run = _timed_run  # type: ignore[method-assign]
    print("| codec | mode | longest loop step ms (median, max) | CPU us/record |")
    print("|---|---|---|---:|")
    values = json_values(1024)
    for name, codec in CODECS.items():
        data = b"".join(compressed_batch(codec, values, 1024 * k) for k in range(8))
        res: dict[bool, list[tuple[float, float]]] = {False: [], True: []}

        async def all_rounds() -> None:
            for _ in range(rounds + 1):
                for off in (False, True):
                    res[off].append(await _one(data, 8 * 1024, off))

        asyncio.run(all_rounds())
        for off in (False, True):
            v = res[off][1:]
            print(f"| {name} | {'thread' if off else 'loop'} | {statistics.median(x[0] for x in v):.2f}, "
                  f"{max(x[0] for x in v):.2f} | {statistics.median(x[1] for x in v):.2f} |")
    consumer_mod.OFFLOAD_BYTES = saved


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--what", choices=["hold", "offload", "both"], default="both")
    args = ap.parse_args()
    if args.what in ("hold", "both"):
        hold(args.rounds)
    if args.what in ("offload", "both"):
        offload(args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
