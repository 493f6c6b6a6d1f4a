"""FrameReader (the client's receive-into-buffer framing) CPU per frame, paired against another framing.py.

    PYTHONPATH=src python bench/frame_reader.py --base OLD_FRAMING_PY

Each read copies up to ``read`` bytes of a prepared stream into ``get_buffer()`` (as ``recv_into``
does), then calls ``updated``; the two readers run in alternation (9 paired rounds in one process),
process CPU time; the median new/base ratio is shown.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import struct
import time

from oncelog.protocol.framing import FrameReader

CASES = [("300 B frames, 64 KiB reads", 300, 65536), ("200 KB frames, 64 KiB reads", 200_000, 65536),
         ("4 MB frames, 64 KiB reads", 4_000_000, 65536), ("4 MB frames, 1 MiB reads", 4_000_000, 1 << 20),
         ("50 MB frame, 256 KiB reads", 50_000_000, 262144)]


def per_frame(cls: type, stream: bytes, read: int) -> float:
    view = memoryview(stream)
    n = 0
    t = time.process_time()
    for _ in range(2):
        r = cls(1 << 30)
        pos, end = 0, len(stream)
        while pos < end:
            buf = r.get_buffer()
            k = min(len(buf), read, end - pos)
            buf[:k] = view[pos:pos + k]
            del buf
            pos += k
            n += len(r.updated(k))
    return (time.process_time() - t) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="another framing.py to compare with")
    args = ap.parse_args()
    spec = importlib.util.spec_from_file_location("base_framing", args.base)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name, size, read in CASES:
        stream = (struct.pack(">i", size) + b"x" * size) * max(1, 40_000_000 // (size + 4))
        ratios, new = [], []
        for _ in range(9):
            old = per_frame(mod.FrameReader, stream, read)
            new.append(per_frame(FrameReader, stream, read))
            ratios.append(new[-1] / old)
        print(f"{name:30s} {statistics.median(new) * 1e6:10.1f} us/frame  new/base {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
