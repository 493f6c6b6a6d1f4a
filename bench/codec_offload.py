#!/usr/bin/env python3
"""Compression / decompression of large batches on the event loop vs in a worker thread.

For each codec and batch size: ``--batches`` records sections (JSON-like records, about 2-4x
compressible) are compressed (``oncelog.client.batch.compress``, what the producer's sender does
when a batch is closed) or decompressed (``oncelog.protocol.compression.decompress``, what the
consumer does per fetched batch) by one coroutine, either inline on the loop (``inline``) or with
``loop.run_in_executor`` on a one-thread pool, up to two at a time, results taken in order
(``thread``). Meanwhile a ticker task sleeps 1 ms in a loop and records how late it wakes up: the
loop's blocking. Rounds are paired (inline, thread, inline, thread, ...). Per mode: max and p99
ticker lateness, wall time per batch, and CPU seconds per batch (``time.process_time``, all threads).

Usage: ``python bench/codec_offload.py --rounds 5 --batches 40 --sizes 65536,262144,1048576``
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from oncelog.client.batch import CODECS, compress  # noqa: E402
from oncelog.protocol.compression import decompress  # noqa: E402


def section(size: int, seed: int) -> bytes:
    rng = random.Random(seed)
    out = bytearray()
    i = 0
    while len(out) < size:
        out += (b'{"id": %d, "user": "user-%05d", "event": "%s", "payload": "%s"}' %
                (i, rng.randrange(100000), rng.choice([b"click", b"view", b"buy"]), rng.randbytes(24).hex().encode()))
        i += 1
    return bytes(out[:size])


async def run(mode: str, work: list[tuple[int, bytes]], fn) -> tuple[float, float, float, float]:
    loop = asyncio.get_running_loop()
    lates: list[float] = []
    stop = False

    async def ticker() -> None:
        while not stop:
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            lates.append(time.perf_counter() - t - 0.001)

    tick = asyncio.ensure_future(ticker())
    await asyncio.sleep(0.01)
    pool = concurrent.futures.ThreadPoolExecutor(1)
    c0, t0 = time.process_time(), time.perf_counter()
    if mode == "inline":
        for codec, data in work:
            fn(codec, data)
            await asyncio.sleep(0)  # the sender's next pass
    else:
        pending: list[asyncio.Future] = []
        for codec, data in work:
            pending.append(loop.run_in_executor(pool, fn, codec, data))
            if len(pending) >= 2:
                await pending.pop(0)
        for f in pending:
            await f
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    stop = True
    await tick
    pool.shutdown()
    lates.sort()
    return max(lates), lates[int(len(lates) * 0.99)], wall / len(work), cpu / len(work)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--sizes", default="65536,262144,1048576")
    ap.add_argument("--codecs", default="gzip,zstd,lz4,snappy")
    ap.add_argument("--side", choices=["compress", "decompress"], default="compress")
    args = ap.parse_args()
    print(f"{args.side}, {args.batches} batches per run, {args.rounds} rounds paired (inline, thread); "
          f"`{' '.join(sys.argv)}`\n")
    print("| codec | batch | ratio | mode | loop max late ms | loop p99 late ms | wall ms/batch | CPU ms/batch |")
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    for name in args.codecs.split(","):
        codec = CODECS[name]
        for size in (int(s) for s in args.sizes.split(",")):
            raw = [section(size, s) for s in range(4)]
            packed = [compress(codec, r) for r in raw]
            if args.side == "compress":
                work, fn = [(codec, raw[i % 4]) for i in range(args.batches)], compress
            else:
                work, fn = [(codec, packed[i % 4]) for i in range(args.batches)], decompress
            res: dict[str, list[tuple[float, float, float, float]]] = {"inline": [], "thread": []}
            for _ in range(args.rounds):
                for mode in ("inline", "thread"):
                    res[mode].append(asyncio.run(run(mode, work, fn)))
            for mode, rs in res.items():
                med = [statistics.median(r[k] for r in rs) * 1000 for k in range(4)]
                print(f"| {name} | {size // 1024} KiB | {size / len(packed[0]):.1f} | {mode} | {med[0]:.2f} | "
                      f"{med[1]:.2f} | {med[2]:.2f} | {med[3]:.2f} |")
            ratio = statistics.median(a[2] / b[2] for a, b in zip(res["thread"], res["inline"]))
            print(f"| {name} | {size // 1024} KiB | | thread/inline wall (median of paired ratios) | | | {ratio:.2f}x | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
