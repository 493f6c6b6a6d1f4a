"""Authorized-operations bitfields (Metadata v8+, DescribeCluster, DescribeGroups).

oncelog has no authorizer, so, as Kafka does without one, every operation a
resource type supports is authorized. The answer is a 32-bit field with bit
``1 << code`` set for each ACL operation code (READ=3, WRITE=4, CREATE=5,
DELETE=6, ALTER=7, DESCRIBE=8, CLUSTER_ACTION=9, DESCRIBE_CONFIGS=10,
ALTER_CONFIGS=11, IDEMPOTENT_WRITE=12). The operation sets per resource type
are Kafka 4.x's. When the request does not ask for them, the field keeps the
schema default ``NOT_REQUESTED`` (-2**31).
"""

from __future__ import annotations

NOT_REQUESTED = -2147483648

READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE = 3, 4, 5, 6, 7, 8
CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE = 9, 10, 11, 12


def bitfield(*codes: int) -> int:
    out = 0
    for code in codes:
        out |= 1 << code
    return out


TOPIC_OPERATIONS = bitfield(READ, WRITE, CREATE, DESCRIBE, DELETE, ALTER, DESCRIBE_CONFIGS, ALTER_CONFIGS)
GROUP_OPERATIONS = bitfield(READ, DESCRIBE, DELETE, DESCRIBE_CONFIGS, ALTER_CONFIGS)
CLUSTER_OPERATIONS = bitfield(CREATE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE, ALTER, DESCRIBE)
