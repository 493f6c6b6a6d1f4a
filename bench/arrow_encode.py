#!/usr/bin/env python3
"""produce_batch's encoding alone, Arrow input: from the array's buffers vs through ``to_pylist()``.

For each value size: a pyarrow ``binary`` array of ``--records`` values (one payload, or random
lengths 0..2x with ``--random``), split into 16 KiB batches and encoded into records sections three
ways, paired in each round (A B C, A B C, ...): ``list`` (the values already a list of bytes: the
list path), ``arrow-old`` (``to_pylist()`` then the list path: what produce_batch and the Spark sink
did with Arrow input before), ``arrow-new`` (``oncelog.client.arrow``: bounds and sections from the
buffers). CPU per record (``time.process_time``), median over rounds. No broker.

Usage: ``python bench/arrow_encode.py --rounds 7 --records 100000 --sizes 10,100,1024``
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import pyarrow as pa  # noqa: E402

from oncelog.client.arrow import arrow_bounds, arrow_sections, as_binary  # noqa: E402
from oncelog.client.batch import batch_bounds, encode_sections  # noqa: E402

ROOM = 16384 - 61


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--sizes", default="10,100,1024")
    ap.add_argument("--random", action="store_true", help="random value lengths 0..2x size")
    args = ap.parse_args()
    n = args.records
    print(f"`{' '.join(sys.argv)}`\n\n| value size | list | arrow-old (to_pylist) | arrow-new (buffers) | old/new |")
    print("|---:|---:|---:|---:|---:|")
    arrow_sections(as_binary(pa.array([b"warm-up"])), None, [(0, 1)])
    for size in (int(s) for s in args.sizes.split(",")):
        rng = random.Random(size)
        if args.random:
            vals = [os.urandom(rng.randrange(2 * size + 1)) for _ in range(n)]
        else:
            vals = [os.urandom(size)] * n
        arr = pa.array(vals, pa.binary())
        res: dict[str, list[float]] = {"list": [], "old": [], "new": []}
        for _ in range(args.rounds):
            t = time.process_time()
            encode_sections(vals, None, batch_bounds(vals, None, ROOM))
            res["list"].append(time.process_time() - t)
            t = time.process_time()
            v = arr.to_pylist()
            encode_sections(v, None, batch_bounds(v, None, ROOM))
            res["old"].append(time.process_time() - t)
            del v
            t = time.process_time()
            a = as_binary(arr)
            arrow_sections(a, None, arrow_bounds(a, None, ROOM))
            res["new"].append(time.process_time() - t)
        us = {k: statistics.median(x) / n * 1e6 for k, x in res.items()}
        ratio = statistics.median(o / w for o, w in zip(res["old"], res["new"]))
        print(f"| {size} B | {us['list']:.3f} us | {us['old']:.3f} us | {us['new']:.3f} us | {ratio:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
