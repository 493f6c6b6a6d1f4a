"""CPU of the hand-written Fetch decode and the header varint helpers, this tree against a git revision.

    PYTHONPATH=src python bench/fetch_decode_varint.py --base REV [--rounds 30]

Loads ``protocol/fetch.py`` and ``protocol/headers.py`` as they are at REV (``git show``) beside
this tree's, then times both in the same process, alternating (the order rotates every round),
with ``time.process_time()``: CPU microseconds per call, medians, and the median of the per-round
ratios this tree / REV. Two Fetch v12 answers (flexible: varints and tag blocks everywhere):
4 topics x 8 partitions of 100 bytes (the structure dominates) and 4 x 2 partitions of 256 KiB
(a consumer's 2 MiB answer), decoded from a bytearray with ``copy=False`` as the consumer does.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from oncelog.protocol import fetch, headers
from oncelog.protocol.build import materialize
from oncelog.protocol.codec import encode_response, response_type


def load_at(rev: str, path: str, name: str, tmp: Path) -> ModuleType:
    src = subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, check=True, text=True).stdout
    file = tmp / f"{name}.py"
    file.write_text(src)
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def answer(partitions: int, record_bytes: int) -> bytearray:
    entity = materialize(response_type(1, 12), {"throttle_time": 0, "error_code": 0, "session_id": 1, "responses": [
        {"topic": f"topic-{t}", "partitions": [
            {"partition_index": p, "error_code": 0, "high_watermark": 5,
             "aborted_transactions": [{"producer_id": 1, "first_offset": 2}], "records": os.urandom(record_bytes)}
            for p in range(partitions)]} for t in range(4)]})
    return bytearray(encode_response(entity))


def cpu_us(fn: Any, n: int) -> float:
    c0 = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - c0) / n * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="git revision to compare with")
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        old_fetch = load_at(args.base, "src/oncelog/protocol/fetch.py", "base_fetch", Path(d))
        old_headers = load_at(args.base, "src/oncelog/protocol/headers.py", "base_headers", Path(d))
    small, big = answer(8, 100), answer(2, 256 * 1024)
    cases = {
        "Fetch v12, 32 partitions x 100 B": (lambda m: lambda: m.decode_fetch_response(small, 0, 12, False), 3000),
        "Fetch v12, 8 partitions x 256 KiB": (lambda m: lambda: m.decode_fetch_response(big, 0, 12, False), 3000),
    }
    helpers = {
        "skip_tagged_fields (empty block)": (lambda m: lambda: m.skip_tagged_fields(b"\x00", 0), 200_000),
        "read_uvarint (3 bytes)": (lambda m: lambda: m.read_uvarint(b"\xff\xff\x7f", 0), 200_000),
    }
    sides = {"base": (old_fetch, old_headers), "this": (fetch, headers)}
    results: dict[str, dict[str, list[float]]] = {k: {"base": [], "this": []} for k in [*cases, *helpers]}
    order = list(sides)
    for _ in range(args.rounds):
        order = order[1:] + order[:1]
        for side in order:
            f, h = sides[side]
            for name, (make, n) in cases.items():
                results[name][side].append(cpu_us(make(f), n))
            for name, (make, n) in helpers.items():
                results[name][side].append(cpu_us(make(h), n))
    print(f"{args.rounds} rounds, CPU us per call (median), this tree vs {args.base}")
    for name, r in results.items():
        ratio = statistics.median(t / b for t, b in zip(r["this"], r["base"]))
        print(f"  {name}: base {statistics.median(r['base']):.3f}, this {statistics.median(r['this']):.3f}, "
              f"ratio {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
