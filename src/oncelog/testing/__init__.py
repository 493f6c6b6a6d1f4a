"""Run a real oncelog broker inside tests: :class:`EmbeddedBroker` and a pytest fixture."""

from oncelog.testing.embedded import EmbeddedBroker, free_port

__all__ = ["EmbeddedBroker", "free_port"]
