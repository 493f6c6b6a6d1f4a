"""oncelog's Kafka client library. Never imports broker/ or storage/.

Blocking: ``from oncelog.client import Producer, Consumer, Admin``; asyncio:
``from oncelog.client.aio import Producer, Consumer, Admin``. Both take one config dict with
Kafka's property names (:mod:`oncelog.client.config`) and raise typed
:mod:`oncelog.client.errors`. The CLI uses ``Admin``; the blocking
``connection`` and ``reader`` (read_committed partition reader) serve ``verify``.
"""

from oncelog.client.admin import Admin, AlterConfigOp, ConfigResource, NewTopic, OffsetSpec
from oncelog.client.aio.consumer import Message, TopicPartition
from oncelog.client.aio.producer import RecordMetadata
from oncelog.client.aio.transactions import ConsumerGroupMetadata, PreparedTxnState
from oncelog.client.config import ConfigError
from oncelog.client.consumer import Consumer
from oncelog.client.errors import (
    ConditionalProduceNotSupported,
    ConditionalProduceRefused,
    KafkaError,
    OffsetMismatch,
)
from oncelog.client.logwriter import AsyncLogWriter, LogWriter
from oncelog.client.producer import DeliveryFuture, Producer
from oncelog.client.session import TransactSession

__all__ = ["Admin", "AlterConfigOp", "AsyncLogWriter", "ConditionalProduceNotSupported",
           "ConditionalProduceRefused", "ConfigError", "ConfigResource", "Consumer", "ConsumerGroupMetadata",
           "DeliveryFuture", "KafkaError", "LogWriter", "Message", "NewTopic", "OffsetMismatch", "OffsetSpec",
           "PreparedTxnState", "Producer", "RecordMetadata", "TopicPartition", "TransactSession"]
