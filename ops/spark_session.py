"""The SparkSession the ops jobs run on: local[*] by default, any master by option.

Facts of this machine kind (2 cores) that shape it: a local session takes ~4.5-7 s to
start and ~500 MiB; the Python workers must be this venv's interpreter
(``PYSPARK_PYTHON``); ``SPARK_LOCAL_IP=127.0.0.1`` keeps Spark off the network lookup;
the Spark UI costs start time and memory and nobody looks at it here. Spark's log4j2
output is cut to errors by a properties file of our own (the ``PythonGatewayServer`` and
``repl.Main`` loggers need their own lines: Spark sets them apart for interpreters).

Under ``spark-submit`` the master and other settings given to spark-submit win: this
module only fills in what is not set.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path

LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = stderr
appender.console.type = Console
appender.console.name = stderr
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
logger.parquet.name = org.apache.parquet
logger.parquet.level = error
"""

DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # The archive's `day` partitions stay strings ("2026-11-18"), whoever reads them.
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
    "spark.sql.parquet.compression.codec": "zstd",
    # Hadoop's own umask, not the process's: without it the archive (copies of messages)
    # is written 0644 in 0755 directories, where every file Relay makes is 0600.
    "spark.hadoop.fs.permissions.umask-mode": "077",
    # Local mode runs everything in the driver: metrics over 10 M rows ran out of a
    # 1 GiB heap (bench_ops). The heap is a ceiling, not a reservation.
    "spark.driver.memory": "4g",
}
LOCAL_DEFAULTS = {
    # Few cores: the default 200 shuffle partitions would be 200 tiny tasks.
    "spark.sql.shuffle.partitions": "8",
}


def _log4j2_file() -> Path:
    path = Path(tempfile.gettempdir()) / f"relay-ops-log4j2-{os.getuid()}.properties"
    if not path.exists() or path.read_text() != LOG4J2:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(LOG4J2)
        os.replace(tmp, path)
    return path


def spark_session(master: str | None = None, app: str = "relay-ops"):
    """The session of this process (created once; later calls return the same one)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    if "PYSPARK_GATEWAY_PORT" in os.environ:  # under spark-submit: its JVM runs already
        SparkContext._ensure_initialized()
    conf = SparkConf()  # under spark-submit, holds what it was given
    if master:
        conf.setMaster(master)
    elif not conf.contains("spark.master"):
        conf.setMaster("local[*]")
    conf.setIfMissing("spark.app.name", app)
    settings = dict(DEFAULTS)
    if conf.get("spark.master", "").startswith("local"):
        settings.update(LOCAL_DEFAULTS)
    for key, value in settings.items():
        conf.setIfMissing(key, value)
    log4j = f"-Dlog4j2.configurationFile=file:{_log4j2_file()}"
    extra = conf.get("spark.driver.extraJavaOptions", "")
    if "log4j2.configurationFile" not in extra:
        conf.set("spark.driver.extraJavaOptions", f"{extra} {log4j}".strip())
    extra = conf.get("spark.executor.extraJavaOptions", "")
    if "log4j2.configurationFile" not in extra and conf.get("spark.master").startswith("local"):
        conf.set("spark.executor.extraJavaOptions", f"{extra} {log4j}".strip())
    logging.getLogger("py4j").setLevel(logging.WARNING)  # relay's CLI logs at INFO
    spark = SparkSession.builder.config(conf=conf).getOrCreate()
    if "PYSPARK_GATEWAY_PORT" in os.environ:  # spark-submit's JVM kept its own log4j2 setup
        spark.sparkContext.setLogLevel("ERROR")
    return spark
