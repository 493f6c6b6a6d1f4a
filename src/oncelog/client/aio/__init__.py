"""oncelog's asyncio Kafka client: ``from oncelog.client.aio import Producer``.

Layout (each module documents its internal API for the clients built on it):

* :mod:`.connection`: one pipelined connection per broker (correlation ids,
  request timeouts, ApiVersions negotiation);
* :mod:`.cluster`: bootstrap, metadata, leaders, coordinators, one
  connection per broker with reconnect backoff;
* :mod:`.producer`: the producer engine and the asyncio ``Producer``;
* :mod:`.transactions`: the producer's transactions and KIP-939 two-phase
  commit (``PreparedTxnState``, ``ConsumerGroupMetadata``);
* :mod:`.consumer`: the asyncio ``Consumer`` (manual assignment or group ``subscribe``);
* :mod:`.group`, :mod:`.offsets`: group membership and offset commit/fetch;
* :mod:`.admin`: the asyncio ``Admin`` (topics, configs, records, groups, transactions, producers);
* :mod:`.session`: ``TransactSession``, exactly-once consume-transform-produce.

The blocking clients in :mod:`oncelog.client` run these on a background
event-loop thread (:mod:`oncelog.client._loop`). Nothing here imports
``oncelog.broker`` or ``oncelog.storage``.
"""

from oncelog.client.aio.admin import Admin
from oncelog.client.aio.consumer import Consumer, Message, TopicPartition
from oncelog.client.aio.producer import Producer, RecordMetadata
from oncelog.client.aio.session import TransactSession
from oncelog.client.aio.transactions import ConsumerGroupMetadata, PreparedTxnState

__all__ = ["Admin", "Consumer", "ConsumerGroupMetadata", "Message", "PreparedTxnState", "Producer",
           "RecordMetadata", "TopicPartition", "TransactSession"]
