"""The Spark session lakestream builds behaves alike on Spark 3.5 and 4.1 where PySpark 4 changed a default."""

from __future__ import annotations

import pytest


def test_a_spark_sql_error_a_caller_handles_leaves_stderr_quiet(spark, capfd):
    """PySpark 4 logs each Spark SQL error it converts to a Python exception as one JSON line with the JVM stack on
    stderr (``SQLQueryContextLogger``), also one the caller catches; lakestream's session turns that off."""
    spark.conf.set("spark.sql.ansi.enabled", "true")  # Spark 4's default; Spark 3.5 raises the same error under it
    try:
        with pytest.raises(Exception, match="CAST_INVALID_INPUT"):
            spark.sql("SELECT CAST('x' AS INT)").collect()
    finally:
        spark.conf.unset("spark.sql.ansi.enabled")
    err = capfd.readouterr().err
    assert "QueryContextLogger" not in err and "CAST_INVALID_INPUT" not in err, err[-2000:]
