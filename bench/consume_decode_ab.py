#!/usr/bin/env python3
"""The asyncio consumer's decode and hand-out of fetched batches, this tree's ``group_sections`` against
an older one's, alternating in one process, without a socket.

The topic is filled as ``bench/client_consume.py`` fills it (one oncelog broker, 8 partitions,
``--records`` × 1 KiB, confluent-kafka with ``linger.ms=5`` and ``--compression``), each partition
is fetched back once (1 MiB Fetches) and the broker stopped. Then, per round and variant, a fresh
``oncelog.client.aio.Consumer`` is handed those Fetch answers (``_apply``) and everything is taken
with ``take_nowait(500)``; the calling thread's CPU time (``time.thread_time()``) per record is
what counts: decompression, the record decode and the hand-out, none of the socket or the loop.
The variants alternate (old new, new old, ...); the first round is dropped.

``--base FILE``: an older ``client/reader.py`` (e.g. ``git show ce1658d:src/oncelog/client/reader.py
> /tmp/reader_old.py``) whose ``group_sections`` is run in this tree's ``reader`` namespace.

Usage: ``python bench/consume_decode_ab.py --base /tmp/reader_old.py --compression lz4 --rounds 15``
"""

from __future__ import annotations

import argparse
import ast
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "src"))

from client_consume import PARTITIONS, prefill  # noqa: E402
from common import OncelogBroker  # noqa: E402

import oncelog.client.aio.consumer as consumer_mod  # noqa: E402
from oncelog.client import reader  # noqa: E402
from oncelog.client.reader import LATEST, PartitionReader  # noqa: E402
from oncelog.protocol.records import iter_batch_headers  # noqa: E402


def capture(records: int, compression: str) -> list[tuple[int, bytes]]:
    with tempfile.TemporaryDirectory() as tmp, OncelogBroker(Path(tmp) / "data") as broker:
        topic = f"ab-{uuid.uuid4().hex[:6]}"
        broker.create_topic(topic, PARTITIONS)
        prefill(broker.bootstrap, topic, records, 1024, compression)
        blobs = []
        with PartitionReader(broker.bootstrap) as r:
            for p in range(PARTITIONS):
                pos, end = 0, r.list_offset(topic, p, LATEST)
                while pos < end:
                    data = bytes(r.fetch(topic, p, pos, 0, max_bytes=1 << 20).records)
                    blobs.append((p, data))
                    pos = list(iter_batch_headers(data))[-1][0].next_offset
    return blobs


def old_group_sections(path: str):
    tree = ast.parse(Path(path).read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "group_sections")
    ns = dict(vars(reader))
    exec(compile(ast.Module([fn], []), path, "exec"), ns)
    return ns["group_sections"]


def one(blobs: list[tuple[int, bytes]], records: int, group_sections) -> float:
    consumer_mod.group_sections = group_sections
    c = consumer_mod.Consumer({"bootstrap.servers": "127.0.0.1:1", "enable.auto.commit": False})
    c.assign([("t", p, 0) for p in range(PARTITIONS)])
    t0, n = time.thread_time(), 0
    for p, data in blobs:
        c._apply(c._parts[("t", p)], SimpleNamespace(error_code=0, records=data, aborted_transactions=[]))
        while got := c.take_nowait(500):
            n += len(got)
    assert n == records, n
    return (time.thread_time() - t0) / n * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="an older client/reader.py")
    ap.add_argument("--compression", choices=["none", "gzip", "snappy", "lz4", "zstd"], default="lz4")
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    blobs = capture(args.records, args.compression)
    variants = {"old": old_group_sections(args.base), "new": reader.group_sections}
    res: dict[str, list[float]] = {"old": [], "new": []}
    saved = consumer_mod.group_sections
    try:
        for r in range(args.rounds):
            for k in (("old", "new") if r % 2 == 0 else ("new", "old")):
                res[k].append(one(blobs, args.records, variants[k]))
    finally:
        consumer_mod.group_sections = saved
    rel = [a / b for a, b in zip(res["new"][1:], res["old"][1:])]
    print(f"{args.compression}: old {statistics.median(res['old'][1:]):.3f}, new {statistics.median(res['new'][1:]):.3f} "
          f"µs a record (thread CPU); new/old {statistics.median(rel):.3f} ({min(rel):.2f}-{max(rel):.2f}), "
          f"{len(rel)} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
