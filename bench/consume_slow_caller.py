#!/usr/bin/env python3
"""The blocking consumer's fetch policy with a caller that does work per record: records/s and CPU.

One oncelog broker, one 8-partition topic of ``--records`` × 1 KiB random records (the prefill of
``client_consume.py``); each round reads it all with ``oncelog.client.Consumer.consume(500, 1.0)``,
hashing each value ``--work`` times (``hashlib.sha256``, about 1-2 µs a 1 KiB value: a caller slower
than the bare loop), once with the current policy (``FETCH_HOLD = 1``: a leader's drained partitions
are fetched once at most one of its partitions has records left; the caller waits on its own thread)
and once with the earlier one (``prev``: each partition fetched as it drains, Java's policy; waits
through the loop thread), alternating the order round by round, in one process.

Usage: ``python bench/consume_slow_caller.py --rounds 8 --work 1``. Prints the median records/s
and CPU seconds of each, and the per-round ratios.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from client_consume import PARTITIONS, prefill  # noqa: E402
from common import OncelogBroker  # noqa: E402

POLICIES = {"prev": (None, 0), "hold1": (1, 1.0)}


def one(bootstrap: str, topic: str, n: int, work: int, policy: str) -> tuple[float, float]:
    from oncelog.client import Consumer, TopicPartition
    from oncelog.client import consumer as facade

    saved = facade.FETCH_HOLD, facade.FAST_WAIT
    facade.FETCH_HOLD, facade.FAST_WAIT = POLICIES[policy]
    try:
        c = Consumer({"bootstrap.servers": bootstrap, "enable.auto.commit": False})
        try:
            c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
            t0, c0, got = time.perf_counter(), time.process_time(), 0
            while got < n:
                for m in c.consume(500, 1.0):
                    got += 1
                    for _ in range(work):
                        hashlib.sha256(m.value).digest()
            return n / (time.perf_counter() - t0), time.process_time() - c0
        finally:
            c.close()
    finally:
        facade.FETCH_HOLD, facade.FAST_WAIT = saved


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--work", type=int, default=1, help="sha256 passes over each value")
    args = ap.parse_args()
    res: dict[str, list[tuple[float, float]]] = {p: [] for p in POLICIES}
    with tempfile.TemporaryDirectory() as tmp, OncelogBroker(Path(tmp) / "data") as broker:
        topic = f"cs-{uuid.uuid4().hex[:6]}"
        broker.create_topic(topic, PARTITIONS)
        prefill(broker.bootstrap, topic, args.records, 1024, "none")
        order = list(POLICIES)
        for r in range(args.rounds):
            for p in (order if r % 2 == 0 else order[::-1]):
                res[p].append(one(broker.bootstrap, topic, args.records, args.work, p))
    for p, runs in res.items():
        print(f"{p}: records/s median {statistics.median(x[0] for x in runs):,.0f}, "
              f"CPU s median {statistics.median(x[1] for x in runs):.3f}")
    rate = [b[0] / a[0] for a, b in zip(res["prev"], res["hold1"])]
    cpu = [b[1] / a[1] for a, b in zip(res["prev"], res["hold1"])]
    print(f"hold1/prev per round: records/s {statistics.median(rate):.3f} ({min(rate):.2f}-{max(rate):.2f}), "
          f"CPU {statistics.median(cpu):.3f} ({min(cpu):.2f}-{max(cpu):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
