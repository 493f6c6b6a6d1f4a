"""Reference values of Java's ``Utils.murmur2`` (signed int), shared by the partitioner tests
(tests/unit/test_client_batch.py: the scalar ``murmur2``; tests/unit/test_client_partitioner_vector.py:
the numpy hash of many keys at once), so a vector added here reaches both."""

from __future__ import annotations

# Apache Kafka's UtilsTest (all ASCII)
KAFKA_UTILS_TEST = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]

# Bytes >= 0x80, which Java reads as negative bytes (the hash masks them with & 0xff), in the blocks and in
# every tail length. Computed once (2026-11-24, by the review of branch `murmur`) with OpenJDK 17 running a
# javac-compiled copy of Kafka's Utils.murmur2, the inputs given as hex; not produced by oncelog's code.
JAVA_HIGH_BYTES = [
    (b"\x80", 857690492),
    (b"\xff\xff", -1642832928),
    (b"\xff\xff\xff", 1548199422),
    (b"\xff" * 4, 644171429),
    (b"\x80" * 5, -1525148316),
    (b"\x00\xff" * 9, 883167456),
    ("ключ".encode(), 2122343024),
    ("€𝄞".encode(), 984815612),
    (bytes(range(0x80, 0x8D)), -2144995048),
    (bytes([0x7F, 0x80, 0xFE, 0xFF] * 3) + b"\xc3", 689196140),
]

MURMUR2_JAVA = KAFKA_UTILS_TEST + JAVA_HIGH_BYTES
