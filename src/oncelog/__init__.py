"""oncelog: Kafka-style transactional messaging in Python."""

__version__ = "0.1.0"
