"""FrameDecoder CPU per frame (process CPU time, robust to a shared machine).

    PYTHONPATH=src python bench/frame_decode.py [--base OLD_FRAMING_PY]

With ``--base`` (e.g. ``git show REV:src/oncelog/protocol/framing.py > /tmp/old.py``) the two
decoders run in alternation (9 paired rounds in one process) and the median new/base ratio is shown.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import struct
import time

from oncelog.protocol.framing import FrameDecoder

CASES = [("10 B frames, 4 KiB reads", 10, 4096), ("300 B frames, 64 KiB reads", 300, 65536),
         ("1000 B frames, 64 KiB reads", 1000, 65536), ("200 KB frames, 64 KiB reads", 200_000, 65536),
         ("4 MB frame, 64 KiB reads", 4_000_000, 65536), ("4 MB frame, 1460 B reads", 4_000_000, 1460),
         ("4 MB frame, 512 B reads", 4_000_000, 512), ("4 MB frame, 8 B reads", 4_000_000, 8)]


def reads(size: int, chunk: int, total: int = 2_000_000) -> list[bytes]:
    data = (struct.pack(">i", size) + b"x" * size) * max(1, total // (size + 4))
    return [data[i : i + chunk] for i in range(0, len(data), chunk)]


def per_frame(cls: type, pieces: list[bytes]) -> float:
    d = cls(1 << 30)
    t = time.process_time()
    n = 0
    for _ in range(3):
        for p in pieces:
            n += len(d.feed(p))
    return (time.process_time() - t) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", help="another framing.py to compare with")
    args = ap.parse_args()
    base = None
    if args.base:
        spec = importlib.util.spec_from_file_location("base_framing", args.base)
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        base = mod.FrameDecoder
    for name, size, chunk in CASES:
        pieces = reads(size, chunk)
        new, old, ratios = [], [], []
        for _ in range(9):
            if base is not None:
                old.append(per_frame(base, pieces))
            new.append(per_frame(FrameDecoder, pieces))
            if base is not None:
                ratios.append(new[-1] / old[-1])
        line = f"{name:28s} {statistics.median(new) * 1e9:10.0f} ns/frame"
        if base is not None:
            line += f"  base {statistics.median(old) * 1e9:10.0f}  median new/base {statistics.median(ratios):.2f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
