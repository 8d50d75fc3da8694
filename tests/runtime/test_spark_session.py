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


def test_local_files_get_the_permission_they_ask_for_through_java_nio(spark, tmp_path):
    """In local mode ``file:`` is lakestream's ``LocalFileSystemNoFork`` (Hadoop's local file system, checksum files
    included, whose permissions are set by java.nio instead of a ``chmod`` child of the JVM): a created file gets the
    permission it asks for, umask applied, and a later ``setPermission`` shows on disk and in Hadoop's status."""
    import os
    import stat

    jvm = spark.sparkContext._jvm
    hadoop = jvm.org.apache.hadoop.fs
    fs = hadoop.Path(tmp_path.as_uri()).getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    assert fs.getClass().getName() == "lakestream.fs.LocalFileSystemNoFork"
    assert fs.getRawFileSystem().getClass().getName() == "lakestream.fs.LocalFileSystemNoFork$Raw"

    umask = os.umask(0)
    os.umask(umask)
    path = hadoop.Path((tmp_path / "d" / "f").as_uri())
    out = fs.create(path, hadoop.permission.FsPermission.createImmutable(0o640), False, 4096, 1, 1 << 20, None)
    out.write(bytearray(b"x" * 100))
    out.close()
    assert stat.S_IMODE(os.stat(tmp_path / "d" / "f").st_mode) == 0o640 & ~umask
    assert (tmp_path / "d" / ".f.crc").exists()
    fs.setPermission(path, hadoop.permission.FsPermission.createImmutable(0o604))
    assert stat.S_IMODE(os.stat(tmp_path / "d" / "f").st_mode) == 0o604
    assert fs.getFileStatus(path).getPermission().toShort() == 0o604
