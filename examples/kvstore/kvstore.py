"""A sharded key-value store whose shards' write-ahead logs are partitions (conditional produce, KIP-27).

One partition per shard. Every operation is a compare-and-set on a counter
(``{"id", "key", "expect", "set"}``: valid only if the key's value is
``expect``), so a duplicated, skipped, reordered or interleaved operation
changes the result. See docs/conditional-publish.md, "Building on it".

* ``replay(records)`` applies a shard's log; an operation whose precondition
  does not hold on replay makes the history **illegal** (counted).
* A **leader** (``kvstore.py leader``) bootstraps (reads its shard to the end,
  tracking the next offset ``k``), then repeatedly batches a few client
  operations, valid against its state, into one conditional append at ``k``
  (``LogWriter``). On success it applies and acknowledges them (a line per
  operation id in ``<out>/<name>.acks``, fsynced); on refusal it records them
  as refused (``.refused``) and re-bootstraps from ``k`` up to the actual next
  offset. ``--plain`` uses unconditional produce instead (the control: two
  leaders then interleave and the history becomes illegal).
* ``kvstore.py check`` replays every shard and prints a JSON report.

Usage: ``kvstore.py leader --bootstrap H:P --topic T --shard N --name X --out DIR
[--seconds S] [--plain]``; ``kvstore.py check --bootstrap H:P --topic T --shards N``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from oncelog.client import Consumer, KafkaError, LogWriter, OffsetMismatch, Producer, TopicPartition

KEYS = ["a", "b", "c"]


def apply(state: dict[str, int], op: dict[str, Any]) -> bool:
    """Apply one compare-and-set; False (state unchanged) if its precondition does not hold."""
    if state.get(op["key"], 0) != op["expect"]:
        return False
    state[op["key"]] = op["set"]
    return True


def read_shard(consumer: Consumer, topic: str, shard: int, start: int, end: int | None = None
               ) -> list[tuple[int, dict[str, Any]]]:
    """The shard's records from ``start`` up to ``end`` (default: the high watermark now)."""
    tp = TopicPartition(topic, shard)
    if end is None:
        end = consumer.get_watermark_offsets(tp, timeout=10)[1]
    out: list[tuple[int, dict[str, Any]]] = []
    if start >= end:
        return out
    consumer.assign([TopicPartition(topic, shard, start)])
    deadline = time.monotonic() + 30
    pos = start
    while pos < end:
        if time.monotonic() > deadline:
            raise TimeoutError(f"shard {shard}: read to {pos}, expected {end}")
        for m in consumer.consume(500, timeout=0.5):
            if m.offset >= end:
                continue
            out.append((m.offset, json.loads(m.value)))
            pos = m.offset + 1
    return out


def replay(records: list[tuple[int, dict[str, Any]]]) -> tuple[dict[str, int], int]:
    """The state after the log, and how many operations did not hold (0: a legal history)."""
    state: dict[str, int] = {}
    illegal = sum(0 if apply(state, op) else 1 for _, op in records)
    return state, illegal


class Leader:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.state: dict[str, int] = {}
        self.k = 0
        self.seq = 0
        self.inc = f"{args.name}.{os.getpid()}"
        out = Path(args.out)
        self.acks = open(out / f"{args.name}.acks", "a")
        self.refused = open(out / f"{args.name}.refused", "a")
        conf = {"bootstrap.servers": args.bootstrap, "linger.ms": 0}
        self.producer = Producer(conf)
        self.consumer = Consumer({"bootstrap.servers": args.bootstrap, "auto.offset.reset": "earliest"})

    def bootstrap(self, end: int | None = None) -> None:
        deadline = time.monotonic() + 60
        while True:  # the broker may be restarting: retry for a while
            try:
                records = read_shard(self.consumer, self.args.topic, self.args.shard, self.k, end)
                break
            except (KafkaError, TimeoutError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        for off, op in records:
            apply(self.state, op)  # a follower applies what holds (a legal log: everything)
            self.k = off + 1
        if end is not None:
            self.k = max(self.k, end)

    @staticmethod
    def _record(f: Any, ids: list[str]) -> None:
        f.write("".join(i + "\n" for i in ids))
        f.flush()
        os.fsync(f.fileno())

    def ops(self) -> list[dict[str, Any]]:
        shadow = dict(self.state)
        batch = []
        for _ in range(random.randint(1, 3)):
            key = random.choice(KEYS)
            self.seq += 1
            op = {"id": f"{self.inc}.{self.seq}", "key": key, "expect": shadow.get(key, 0),
                  "set": shadow.get(key, 0) + 1}
            apply(shadow, op)
            batch.append(op)
        return batch

    def run(self) -> None:
        args = self.args
        self.bootstrap()
        writer = LogWriter(self.producer, args.topic, args.shard, self.k)
        stop = time.monotonic() + args.seconds
        while time.monotonic() < stop:
            batch = self.ops()
            ids = [op["id"] for op in batch]
            values = [json.dumps(op).encode() for op in batch]
            if args.plain:
                futs = [self.producer.produce(args.topic, v, partition=args.shard) for v in values]
                self.producer.flush(30)
                if all(f.exception(0) is None for f in futs):
                    for op in batch:
                        apply(self.state, op)
                    self._record(self.acks, ids)
                self.bootstrap()  # catch up with the others (a follower's view; nothing stops a race)
                continue
            try:
                writer.append(values, timeout=30)
            except OffsetMismatch as e:
                self._record(self.refused, ids)
                self.bootstrap(e.actual_offset)  # someone else appended: re-bootstrap, then try again
                writer = LogWriter(self.producer, args.topic, args.shard, self.k)
                continue
            except KafkaError:
                continue  # fate unknown (e.g. broker away): not acknowledged, not claimed refused
            for op in batch:
                apply(self.state, op)
            self.k = writer.next_offset
            self._record(self.acks, ids)
            time.sleep(random.random() * 0.01)
        self.bootstrap()  # end as a follower: catch up, and leave the state for comparison with a replay
        (Path(args.out) / f"{args.name}.state").write_text(json.dumps({"k": self.k, "state": self.state}))
        self.producer.close()
        self.consumer.close()


def check(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {}
    with Consumer({"bootstrap.servers": args.bootstrap, "auto.offset.reset": "earliest"}) as c:
        for shard in range(args.shards):
            recs = read_shard(c, args.topic, shard, 0)
            state, illegal = replay(recs)
            prefixes = {}
            for k in getattr(args, "prefix", None) or ():
                prefixes[str(k)] = replay([r for r in recs if r[0] < k])[0]
            report[str(shard)] = {"ids": [op["id"] for _, op in recs], "illegal": illegal, "state": state,
                                  "prefix_states": prefixes,
                                  "offsets_contiguous": [o for o, _ in recs] == list(range(len(recs)))}
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kvstore.py")
    sub = ap.add_subparsers(dest="cmd", required=True)
    lp = sub.add_parser("leader")
    lp.add_argument("--bootstrap", required=True)
    lp.add_argument("--topic", required=True)
    lp.add_argument("--shard", type=int, required=True)
    lp.add_argument("--name", required=True)
    lp.add_argument("--out", required=True)
    lp.add_argument("--seconds", type=float, default=5.0)
    lp.add_argument("--plain", action="store_true", help="unconditional produce (the control)")
    cp = sub.add_parser("check")
    cp.add_argument("--bootstrap", required=True)
    cp.add_argument("--topic", required=True)
    cp.add_argument("--shards", type=int, required=True)
    cp.add_argument("--prefix", type=int, action="append", help="also replay each shard's first N offsets")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "leader":
            deadline = time.monotonic() + 30
            while True:  # the broker may be restarting
                try:
                    leader = Leader(args)
                    break
                except KafkaError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            leader.run()
        else:
            print(json.dumps(check(args)))
    except (KafkaError, TimeoutError, OSError) as exc:
        print(f"kvstore: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
