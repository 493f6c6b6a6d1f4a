"""PySpark connector: ``format("oncelog")`` on Spark 4's Python Data Source API.

Install with ``pip install 'oncelog[spark]'``; see docs/spark.md. Uses
``oncelog.client`` only (never the broker or storage), so it reads from
Apache Kafka as well as from oncelog.
"""

from __future__ import annotations

from typing import Any

try:
    from oncelog.spark.source import OncelogDataSource
except ImportError as exc:  # pragma: no cover - depends on the environment
    if exc.name not in ("pyspark", "pyarrow", "pandas") and not str(exc.name or "").startswith("pyspark."):
        raise
    raise ImportError(f"oncelog.spark needs the spark extra: pip install 'oncelog[spark]' ({exc})") from None

__all__ = ["OncelogDataSource", "register"]


def register(spark: Any) -> None:
    """Register ``format("oncelog")`` with a SparkSession (``spark.dataSource.register``)."""
    spark.dataSource.register(OncelogDataSource)
