"""One module per Kafka API, in the manner of franz-go's kfake.

Each module opens with the API's behaviour and version notes, declares
``API_KEY``, ``MIN_VERSION`` and ``MAX_VERSION`` (the versions it really
handles, which is what ApiVersions advertises), and defines
``async def handle(ctx, request)``. A handler returns a dict shaped like the
response schema (see :mod:`oncelog.protocol.build`), a kio entity, raw
``bytes`` of an already encoded body, or ``None`` for "no response" (acks=0).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any, Awaitable, Callable

from oncelog.broker.handlers import (
    add_offsets_to_txn,
    add_partitions_to_txn,
    api_versions,
    create_partitions,
    create_topics,
    delete_groups,
    delete_records,
    delete_topics,
    describe_cluster,
    describe_configs,
    describe_groups,
    describe_log_dirs,
    describe_producers,
    describe_transactions,
    end_txn,
    fetch,
    find_coordinator,
    heartbeat,
    incremental_alter_configs,
    init_producer_id,
    alter_configs,
    join_group,
    leave_group,
    list_groups,
    list_offsets,
    list_transactions,
    metadata,
    offset_commit,
    offset_delete,
    offset_fetch,
    offset_for_leader_epoch,
    produce,
    sasl_authenticate,
    sasl_handshake,
    sync_group,
    txn_offset_commit,
    write_txn_markers,
)


@dataclass(frozen=True)
class Handler:
    api_key: int
    min_version: int
    max_version: int
    handle: Callable[..., Awaitable[Any]]
    name: str


def _from(module: ModuleType) -> Handler:
    return Handler(
        module.API_KEY,
        module.MIN_VERSION,
        module.MAX_VERSION,
        module.handle,
        module.__name__.rsplit(".", 1)[-1],
    )


HANDLERS: dict[int, Handler] = {
    h.api_key: h
    for h in map(
        _from,
        (
            produce,
            fetch,
            list_offsets,
            metadata,
            api_versions,
            create_topics,
            delete_topics,
            delete_records,
            create_partitions,
            describe_configs,
            alter_configs,
            incremental_alter_configs,
            describe_cluster,
            init_producer_id,
            describe_producers,
            offset_commit,
            offset_fetch,
            find_coordinator,
            join_group,
            heartbeat,
            leave_group,
            sync_group,
            describe_groups,
            list_groups,
            delete_groups,
            offset_delete,
            add_partitions_to_txn,
            add_offsets_to_txn,
            end_txn,
            write_txn_markers,
            txn_offset_commit,
            describe_transactions,
            list_transactions,
            offset_for_leader_epoch,
            describe_log_dirs,
            sasl_handshake,
            sasl_authenticate,
        ),
    )
}
