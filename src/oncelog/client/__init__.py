"""oncelog's Kafka client library. Never imports broker/ or storage/.

Blocking: ``from oncelog.client import Producer``; asyncio:
``from oncelog.client.aio import Producer``. Both take one config dict with
Kafka's property names (:mod:`oncelog.client.config`) and raise typed
:mod:`oncelog.client.errors`. The CLI's protocol helpers (``connection``,
``admin``, ``groups``, ``txns``, ``reader``) live here too.
"""

from oncelog.client.aio.consumer import Message, TopicPartition
from oncelog.client.aio.producer import RecordMetadata
from oncelog.client.aio.transactions import ConsumerGroupMetadata, PreparedTxnState
from oncelog.client.config import ConfigError
from oncelog.client.consumer import Consumer
from oncelog.client.errors import KafkaError
from oncelog.client.producer import DeliveryFuture, Producer
from oncelog.client.session import TransactSession

__all__ = ["ConfigError", "Consumer", "ConsumerGroupMetadata", "DeliveryFuture", "KafkaError", "Message",
           "PreparedTxnState", "Producer", "RecordMetadata", "TopicPartition", "TransactSession"]
