#!/usr/bin/env python3
"""The asyncio consumer's ``poll()`` (``consume(1)``: what ``async for`` runs per record), this tree's
``Consumer._big_group`` (the offload's check) against an older one's, alternating in one process,
without a broker or a socket.

Per round and variant, a fresh ``oncelog.client.aio.Consumer`` is handed one Fetch answer
(``--records`` uncompressed records of 100 bytes, batches of 500, ``_apply``) and ``await poll(0)``
takes them all; the thread's CPU time (``time.thread_time()``) per record is what counts. The variants
alternate (old new, new old, ...); the first round is dropped. ``none``: ``_big_group`` stubbed out
(the floor).

``--base FILE``: an older ``client/aio/consumer.py`` (e.g. ``git show c8f2c2c:src/oncelog/client/aio/consumer.py
> /tmp/consumer_old.py``) whose ``Consumer._big_group`` is run in this tree's module namespace.

Usage: ``python bench/consume_poll_ab.py --base /tmp/consumer_old.py --rounds 15``
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import oncelog.client.aio.consumer as consumer_mod  # noqa: E402
from oncelog.protocol.records import Record, encode_record_batch  # noqa: E402


def old_big_group(path: str) -> Any:
    tree = ast.parse(Path(path).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Consumer")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_big_group")
    ns = dict(vars(consumer_mod))
    exec(compile(ast.Module([fn], []), path, "exec"), ns)
    return ns["_big_group"]


async def one(data: bytes, records: int, big_group: Any) -> float:
    c = consumer_mod.Consumer({"bootstrap.servers": "127.0.0.1:1", "enable.auto.commit": False})
    c.assign([("t", 0, 0)])
    c._big_group = big_group.__get__(c)  # type: ignore[method-assign]
    assert c._apply(c._parts[("t", 0)], SimpleNamespace(error_code=0, records=data, aborted_transactions=[]))
    t0, n = time.thread_time(), 0
    while await c.poll(0) is not None:
        n += 1
    assert n == records, n
    return (time.thread_time() - t0) / n * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="an older client/aio/consumer.py")
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    data = b"".join(encode_record_batch([Record(None, b"v" * 100) for _ in range(500)], base_offset=o)
                    for o in range(0, args.records, 500))
    variants = {"old": old_big_group(args.base), "new": consumer_mod.Consumer._big_group,
                "none": lambda self, n: None}
    res: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(args.rounds):
        for k in (("old", "new", "none") if r % 2 == 0 else ("none", "new", "old")):
            res[k].append(asyncio.run(one(data, args.records, variants[k])))
    rel = [a / b for a, b in zip(res["new"][1:], res["old"][1:])]
    floor = [a / b for a, b in zip(res["none"][1:], res["old"][1:])]
    print(f"poll(): old {statistics.median(res['old'][1:]):.3f}, new {statistics.median(res['new'][1:]):.3f}, "
          f"none {statistics.median(res['none'][1:]):.3f} µs a record (thread CPU); new/old "
          f"{statistics.median(rel):.3f} ({min(rel):.2f}-{max(rel):.2f}), none/old {statistics.median(floor):.3f}, "
          f"{len(rel)} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
