"""DescribeCluster (key 60).

Behavior: one broker, which is also the controller, and the cluster id
(persisted in ``<data-dir>/meta/cluster_id``). With
``include_cluster_authorized_operations`` the answer carries every operation
the cluster resource supports (no authorizer, as in Kafka without one: see
:mod:`oncelog.broker.authorized_ops`); otherwise -2147483648.

Version notes: v0-v2 handled (all flexible). v1+ endpoint type: 1 (brokers)
is answered; 2 (controllers) gets UNSUPPORTED_ENDPOINT_TYPE, as a Kafka broker
answers it. v2+ fenced brokers (none).
"""

from __future__ import annotations

from typing import Any

from oncelog.broker.authorized_ops import CLUSTER_OPERATIONS, NOT_REQUESTED
from oncelog.broker.context import RequestContext
from oncelog.protocol.errors import ErrorCode

API_KEY = 60
MIN_VERSION = 0
MAX_VERSION = 2


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    broker = ctx.broker
    host, port = broker.config.advertised
    endpoint_type = getattr(request, "endpoint_type", 1)
    code = 0 if endpoint_type == 1 else ErrorCode.unsupported_endpoint_type
    return {
        "throttle_time": 0,
        "error_code": code,
        "error_message": None if code == 0 else "only broker endpoints are served",
        "endpoint_type": endpoint_type,
        "cluster_id": broker.cluster_id,
        "controller_id": broker.node_id,
        "brokers": [{"broker_id": broker.node_id, "host": host, "port": port, "rack": None, "is_fenced": False}],
        "cluster_authorized_operations": (
            CLUSTER_OPERATIONS if getattr(request, "include_cluster_authorized_operations", False) else NOT_REQUESTED
        ),
    }
