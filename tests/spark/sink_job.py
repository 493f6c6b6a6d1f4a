"""A streaming query source -> sink in its own process, for the driver-kill cases of test_sink_crash.py.

``python sink_job.py BOOTSTRAP SRC DST CHECKPOINT``; the crash hook comes from
ONCELOG_SPARK_SINK_CRASH. The process leads its own process group, which the
hook SIGKILLs whole (the JVM and every Python worker).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main() -> None:
    bootstrap, src, dst, ckpt = sys.argv[1:5]
    os.environ["ONCELOG_SPARK_SINK_CRASH_PGID"] = str(os.getpgrp())
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    from pyspark.sql import SparkSession, functions as F

    from oncelog.spark import register

    spark = (SparkSession.builder.master("local[2]").appName("oncelog-sink-job")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    df = (spark.readStream.format("oncelog").option("kafka.bootstrap.servers", bootstrap).option("subscribe", src)
          .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "100").load()
          .select("value", "partition"))
    q = (df.writeStream.format("oncelog").option("kafka.bootstrap.servers", bootstrap).option("topic", dst)
         .option("checkpointLocation", ckpt).trigger(availableNow=True).start())
    q.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
