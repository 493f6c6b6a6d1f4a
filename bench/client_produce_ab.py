#!/usr/bin/env python3
"""Before/after CPU of our producer: two source trees in alternating processes.

Runs ``bench/client_produce.py --rounds 1`` (this tree's bench and broker)
``--pairs`` times for each tree, alternating (old, new, old, new, ...), with
``PYTHONPATH`` set to the tree's ``src`` so that only the client's code
differs, and reads each run's client and broker CPU per record (utime+stime
from /proc, as the bench prints it). Prints the medians per tree and the
median of the per-pair ratios new/old, which load on a shared machine
distorts far less than records/s.

Usage: ``python bench/client_produce_ab.py --old /tmp/old/src --new src --pairs 5
-- --clients oncelog,oncelog-batch --same-batch-size 16384``
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent / "client_produce.py"
LINE = re.compile(r"round \d+ (\S+): ([\d,]+) records/s, client [\d.]+ CPU s/MB \(([\d.]+) us/record\), "
                  r"broker [\d.]+ CPU s/MB \(([\d.]+) us/record\)")


def run(src: str, extra: list[str]) -> dict[str, tuple[float, float, float]]:
    env = dict(os.environ, PYTHONPATH=str(Path(src).resolve()))
    out = subprocess.run([sys.executable, str(BENCH), "--rounds", "1", *extra], env=env, capture_output=True,
                         text=True, timeout=900)
    got = {m[1]: (float(m[2].replace(",", "")), float(m[3]), float(m[4])) for m in LINE.finditer(out.stderr)}
    if out.returncode != 0 or not got:
        sys.exit(f"bench failed ({src}): {out.stderr[-2000:]}")
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, help="the old tree's src directory")
    ap.add_argument("--new", required=True, help="the new tree's src directory")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("extra", nargs=argparse.REMAINDER, help="-- then arguments for client_produce.py")
    args = ap.parse_args()
    extra = [a for a in args.extra if a != "--"]
    runs: dict[str, dict[str, list[tuple[float, float, float]]]] = {"old": {}, "new": {}}
    for i in range(args.pairs):
        for side, src in (("old", args.old), ("new", args.new)) if i % 2 == 0 else (("new", args.new),
                                                                                   ("old", args.old)):
            for client, r in run(src, extra).items():
                runs[side].setdefault(client, []).append(r)
                print(f"pair {i} {side} {client}: {r[0]:,.0f} records/s, client {r[1]:.2f} us/record, "
                      f"broker {r[2]:.2f} us/record", file=sys.stderr)
    print(f"`{' '.join([Path(sys.executable).name, *sys.argv])}`\n")
    print("| client | old client CPU us/record | new client CPU us/record | new/old (median of pairs) "
          "| old broker us/record | new broker us/record | old records/s | new records/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for client in runs["old"]:
        old, new = runs["old"][client], runs["new"][client]
        med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
        ratio = statistics.median(n[1] / o[1] for o, n in zip(old, new))
        print(f"| {client} | {med(old, 1):.2f} | {med(new, 1):.2f} | {ratio:.2f} | {med(old, 2):.2f} "
              f"| {med(new, 2):.2f} | {med(old, 0):,.0f} | {med(new, 0):,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
