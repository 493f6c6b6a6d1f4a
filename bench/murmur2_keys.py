#!/usr/bin/env python3
"""Hashing and grouping the keys of a keyed ``produce_batch``: per key (Python) vs all at once (numpy).

For batches of 1, 10, 100, ... keys (16 bytes by default, like ``user-00000012345``), CPU microseconds
per key (``time.process_time``, median of ``--rounds`` paired rounds, each timing enough repetitions
to run about 0.2 s) of:

* ``scalar hash``: ``[murmur2(k) for k in keys]`` (the per-record produce path's function);
* ``numpy hash``: ``murmur2_many(keys)`` of the list (join, lengths, column-wise blocks);
* ``numpy hash arrow``: ``murmur2_many`` of a pyarrow binary array (offsets and data buffers);
* ``loop groups``: the per-record grouping ``produce_batch`` ran before (``partition_for_key`` per key
  into a dict of index lists);
* ``numpy groups``: ``key_groups`` (hash, ``% partitions``, a stable sort) with numpy forced on.

Usage: ``python bench/murmur2_keys.py --rounds 7 --counts 1,10,100,10000 --key-size 16 --partitions 8``

``--first-future N``: instead, the first record future asked for of a keyed call of ``N`` records (its spans
placed as ``produce_batch`` places them: ``key_groups``, then ``--per-batch`` records per batch), which maps
every record to its span: CPU ms of that first ``futs[5]`` (``time.thread_time``), the longest time the
call's lock (the one the loop thread's completions take) was held during it, and the memory the map keeps
(``tracemalloc``). Run it with the old and the new tree first on ``PYTHONPATH``, alternating.

``--column-min``: instead, where ``murmur2_buffers``' column loop should stop (``_COLUMN_MIN``): 24 short keys
plus ``c`` long ones (``--long-sizes``), hashed with the column loop running to the end (numpy passes) and
with it stopping as soon as only the long keys are left (their blocks key by key), CPU ms each and the
ratio (median of ``--rounds`` paired rounds).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from oncelog.client import partitioner
from oncelog.client.partitioner import key_groups, murmur2, murmur2_many, partition_for_key


def per_key_us(fn: Callable[[], Any], n: int, budget: float = 0.2) -> float:
    reps = 1
    while True:
        t0 = time.process_time()
        for _ in range(reps):
            fn()
        dt = time.process_time() - t0
        if dt >= budget:
            return dt / reps / n * 1e6
        reps *= 2 if dt < budget / 10 else max(2, int(budget / max(dt, 1e-6)) + 1)


def loop_groups(keys: list[bytes | None], partitions: int) -> list[tuple[int, list[int]]]:
    groups: dict[int, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(0 if k is None else partition_for_key(k, partitions), []).append(i)
    return list(groups.items())


class ProbeLock:
    """A lock that records how long it was held, the longest hold first."""

    def __init__(self) -> None:
        import threading

        self._lock = threading.Lock()
        self.longest = 0.0
        self._t0 = 0.0

    def acquire(self) -> bool:
        self._lock.acquire()
        self._t0 = time.perf_counter()
        return True

    def release(self) -> None:
        self.longest = max(self.longest, time.perf_counter() - self._t0)
        self._lock.release()

    __enter__ = acquire

    def __exit__(self, *exc: object) -> None:
        self.release()


def first_future(n: int, partitions: int, per_batch: int, rounds: int) -> int:
    import tracemalloc
    from concurrent.futures import Future

    from oncelog.client.aio.producer import BatchFutures

    rng = random.Random(2)
    keys = [b"user-%011d" % rng.randrange(10 ** 9) for _ in range(n)]
    groups = key_groups(keys, partitions, lambda: 0)
    def placed(lock: Any) -> Any:
        futs = BatchFutures(n, Future, lock)
        for _, idx in groups:
            sf = futs.spread(idx)
            for i in range(0, len(idx), per_batch):
                sf._span(i, min(per_batch, len(idx) - i))
        return futs

    cpu, held, kept = [], [], []
    for _ in range(rounds):
        lock = ProbeLock()
        futs = placed(lock)
        t0 = time.thread_time()
        futs[5]
        cpu.append((time.thread_time() - t0) * 1e3)
        held.append(lock.longest * 1e3)
        futs = placed(None)  # the memory the map keeps (a separate run: tracemalloc slows allocations)
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        futs[5]
        kept.append((tracemalloc.get_traced_memory()[0] - base) / 1e6)
        tracemalloc.stop()
        del futs
    print(f"`{' '.join(['python', *sys.argv])}`\n")
    print(f"{n:,} records, {partitions} partitions, {per_batch} a batch ({sum(-(-len(i) // per_batch) for _, i in groups):,}"
          f" spans), median of {rounds}: first future CPU {statistics.median(cpu):.1f} ms, lock held at most "
          f"{statistics.median(held):.2f} ms, map kept {statistics.median(kept):.1f} MB")
    return 0


def column_min(rounds: int, long_sizes: list[int], counts: list[int]) -> int:
    rng = random.Random(3)
    saved = partitioner._COLUMN_MIN
    print(f"`{' '.join(['python', *sys.argv])}`\n")
    print("| long key bytes | long keys | numpy passes ms | key by key ms | key by key / numpy |")
    print("|---:|---:|---:|---:|---:|")
    try:
        for size in long_sizes:
            for c in counts:
                keys = [rng.randbytes(rng.randrange(0, 24)) for _ in range(24)] + \
                    [rng.randbytes(size) for _ in range(c)]
                rng.shuffle(keys)
                res: dict[int, list[float]] = {1: [], c + 1: []}
                for rnd in range(rounds):
                    for m in ((1, c + 1) if rnd % 2 == 0 else (c + 1, 1)):
                        partitioner._COLUMN_MIN = m
                        res[m].append(per_key_us(lambda: murmur2_many(keys), 1, 0.1) / 1000)
                ratio = statistics.median(b / a for a, b in zip(res[1], res[c + 1]))
                print(f"| {size:,} | {c} | {statistics.median(res[1]):.3f} | {statistics.median(res[c + 1]):.3f} "
                      f"| {ratio:.2f}x |")
    finally:
        partitioner._COLUMN_MIN = saved
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--counts", default="1,10,100,10000")
    ap.add_argument("--key-size", type=int, default=16)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--first-future", type=int, default=0)
    ap.add_argument("--per-batch", type=int, default=150)
    ap.add_argument("--column-min", action="store_true")
    ap.add_argument("--long-sizes", default="1024,40960")
    args = ap.parse_args()
    if args.column_min:
        return column_min(args.rounds, [int(x) for x in args.long_sizes.split(",")],
                          [int(c) for c in args.counts.split(",")])
    if args.first_future:
        return first_future(args.first_future, args.partitions, args.per_batch, args.rounds)
    import pyarrow as pa

    rng = random.Random(1)
    counts = [int(c) for c in args.counts.split(",")]
    kinds = ["scalar hash", "numpy hash", "numpy hash arrow", "loop groups", "numpy groups"]
    res: dict[tuple[str, int], list[float]] = {}
    saved = partitioner.VECTOR_MIN
    partitioner.VECTOR_MIN = 0  # key_groups: numpy at every size here
    try:
        for rnd in range(args.rounds):
            for n in counts:
                keys = [(b"user-%0*d" % (max(1, args.key_size - 5), rng.randrange(10 ** 9)))[:args.key_size]
                        for _ in range(n)]
                arr = pa.array(keys, pa.binary())
                fns: dict[str, Callable[[], Any]] = {
                    "scalar hash": lambda: [murmur2(k) for k in keys],
                    "numpy hash": lambda: murmur2_many(keys),
                    "numpy hash arrow": lambda: murmur2_many(arr),
                    "loop groups": lambda: loop_groups(keys, args.partitions),
                    "numpy groups": lambda: key_groups(keys, args.partitions, lambda: 0),
                }
                order = kinds if rnd % 2 == 0 else kinds[::-1]  # A B ... then B A ...
                for k in order:
                    res.setdefault((k, n), []).append(per_key_us(fns[k], n))
    finally:
        partitioner.VECTOR_MIN = saved
    print(f"`{' '.join(['python', *sys.argv])}`\n")
    print(f"CPU us per key (median of {args.rounds} rounds), {args.key_size}-byte keys, "
          f"{args.partitions} partitions\n")
    print("| keys | " + " | ".join(kinds) + " | scalar/numpy hash | loop/numpy groups |")
    print("|---:|" + "---:|" * (len(kinds) + 2))
    for n in counts:
        med = {k: statistics.median(res[(k, n)]) for k in kinds}
        hr = statistics.median(a / b for a, b in zip(res[("scalar hash", n)], res[("numpy hash", n)]))
        gr = statistics.median(a / b for a, b in zip(res[("loop groups", n)], res[("numpy groups", n)]))
        print(f"| {n:,} | " + " | ".join(f"{med[k]:.3f}" for k in kinds) + f" | {hr:.2f}x | {gr:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
