"""pytest fixtures: ``oncelog_broker`` (one broker per test).

Enable with ``pytest_plugins = ["oncelog.testing.pytest_plugin"]`` in a conftest.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from oncelog.testing.embedded import EmbeddedBroker


@pytest.fixture
def oncelog_broker(tmp_path) -> Iterator[EmbeddedBroker]:  # type: ignore[no-untyped-def]
    broker = EmbeddedBroker(data_dir=tmp_path / "data", log_path=tmp_path / "broker.log")
    broker.start()
    try:
        yield broker
    finally:
        broker.close()
