"""One SparkSession and one broker for every Spark test (a session takes 15-20 s to start).

The session runs ``local[2,3]`` (2 cores, 3 task attempts: task retries in
local mode), no UI, 2 shuffle partitions; its Python workers are this
interpreter (``PYSPARK_PYTHON``) and everything binds to loopback
(``SPARK_LOCAL_IP``). Tests use their own topics on the shared broker.
"""

from __future__ import annotations

import os
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pyspark  # noqa: F401 - the spark extra is part of `make test` (pip install -e '.[test,spark]')

from oncelog.testing import EmbeddedBroker


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    src = str(Path(__file__).resolve().parents[2] / "src")
    os.environ["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])])
    from pyspark.sql import SparkSession

    from oncelog.spark import register

    session = (
        SparkSession.builder.master("local[2,3]")
        .appName("oncelog-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.stopTimeout", "20s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def spark_broker() -> Iterator[EmbeddedBroker]:
    tmp = Path(tempfile.mkdtemp(prefix="oncelog-spark-"))
    # the exactly-once sink prepares KIP-939 transactions: the broker must allow two-phase commit
    broker = EmbeddedBroker(data_dir=tmp / "data", log_path=tmp / "broker.log",
                            config={"transaction.two.phase.commit.enable": "true"})
    broker.start()
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture
def topic_name() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"

