"""Builds the SparkSession: Iceberg runtime, JDBC driver and AWS bundle by Maven coordinates, the configured catalog."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lakestream import storage
from lakestream.config import CatalogSettings, PipelineConfig, SparkSettings
from lakestream.runtime import jars as jar_groups
from lakestream.runtime.jvm_jars import aws_sdk_jars, helper_jar, iceberg_runtime_jar, local_fs_jar, postgres_jdbc_jar

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# WARN and above to stderr. Without a config file log4j2 falls back to its default console appender
# on *stdout*, and a bare ``-Dlog4j2.level`` is enough to stop Spark installing its own defaults.
LOG4J2_CONFIG = Path(__file__).parent / "log4j2.properties"
# The FAIR scheduler's pools: the batches first, inline maintenance with what is left.
FAIR_POOLS = Path(__file__).parent / "fairscheduler.xml"


def catalog_conf(catalog: CatalogSettings) -> dict[str, str]:
    """Spark settings that register ``catalog`` as an Iceberg SparkCatalog."""
    prefix = f"spark.sql.catalog.{catalog.name}"
    conf = {prefix: "org.apache.iceberg.spark.SparkCatalog", f"{prefix}.warehouse": catalog.warehouse}
    if catalog.type == "jdbc":
        conf[f"{prefix}.catalog-impl"] = "org.apache.iceberg.jdbc.JdbcCatalog"
        conf[f"{prefix}.uri"] = catalog.uri or ""
        # Cached table metadata would hide commits made by other processes (maintenance, a restart).
        conf[f"{prefix}.cache-enabled"] = "false"
        # Creates the catalog tables with the V1 schema when missing; both Spark and pyiceberg read it.
        conf[f"{prefix}.jdbc.schema-version"] = "V1"
        if catalog.user:
            conf[f"{prefix}.jdbc.user"] = catalog.user
        if catalog.password:
            conf[f"{prefix}.jdbc.password"] = catalog.password.get_secret_value()
    else:
        conf[f"{prefix}.type"] = catalog.type
        if catalog.uri:
            conf[f"{prefix}.uri"] = catalog.uri
        conf[f"{prefix}.cache-enabled"] = "false"
    if catalog.type == "rest":
        conf.update({f"{prefix}.{k}": v for k, v in rest_properties(catalog).items()})
    conf.update({f"{prefix}.{k}": v for k, v in storage.iceberg_io_properties(catalog).items()})
    for key, value in catalog.properties.items():
        conf[f"{prefix}.{key}"] = value
    return conf


def rest_properties(catalog: CatalogSettings) -> dict[str, str]:
    """Iceberg REST catalog client properties for Spark's and the Java committer's ``RESTCatalog``."""
    props = catalog.rest_client_properties()
    if "credential" in props or "token" in props:
        props["rest.auth.type"] = "oauth2"  # both a client credential and a bearer token are OAuth2 here
    if catalog.ssl_ca_bundle:
        # Iceberg's REST client trusts the JVM's default store; a private CA's bundle comes in through our
        # TLSConfigurer (java/LakestreamTlsConfigurer.java), as pyiceberg takes it as ssl.cabundle.
        props["rest.client.tls.configurer-impl"] = "lakestream.LakestreamTlsConfigurer"
        props["lakestream.ssl-ca-bundle"] = catalog.ssl_ca_bundle
    return props


def session_jars(spark: SparkSettings) -> list[str]:
    """The jars of a session (``spark.jars``): Iceberg's runtime, the JDBC driver, the AWS bundle for
    ``S3FileIO`` (unless turned off; all three only with ``jars_from: cache``), lakestream's helpers and
    ``spark.extra_jars``."""
    jars = [str(helper_jar())]
    if spark.jars_from == "cache":
        jars += [str(iceberg_runtime_jar()), str(postgres_jdbc_jar())]
        if spark.bundled_aws_sdk:
            jars += [str(j) for j in aws_sdk_jars()]
    return jars + list(spark.extra_jars)


def session_packages(spark: SparkSettings) -> str | None:
    """``spark.jars.packages`` for ``jars_from: packages``: the coordinates of lakestream/runtime/jars.toml, the Spark
    group of the running pyspark's Spark line."""
    if spark.jars_from != "packages":
        return None
    return jar_groups.packages(jar_groups.spark_group(), *(["spark-aws"] if spark.bundled_aws_sdk else []))


def build_session(
    catalog: CatalogSettings, spark: SparkSettings | None = None, client_compiler: bool = False
) -> SparkSession:
    """A SparkSession with Iceberg's extensions and ``catalog`` registered (a running session gets
    ``catalog`` added). The catalog's object storage becomes this process's (`lakestream.storage`)."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    spark = spark or SparkSettings()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    storage.activate(catalog.storage)
    jars = session_jars(spark)
    builder = (
        SparkSession.builder.master(spark.master)
        .appName(spark.app_name)
        .config("spark.jars", ",".join(jars))
        .config("spark.driver.memory", spark.driver_memory)
        .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.adaptive.enabled", "true")
        # Inline maintenance runs its jobs in a pool of their own: a batch's tasks then take the next free
        # slot first instead of queueing behind every task of a maintenance job (FIFO).
        .config("spark.scheduler.mode", "FAIR")
        .config("spark.scheduler.allocation.file", str(FAIR_POOLS))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.worker.reuse", "true")
        .config("spark.python.daemon.module", "lakestream.sink.write.worker_daemon")
    )
    packages = session_packages(spark)
    if packages:
        builder = builder.config("spark.jars.packages", packages)
    for key, value in catalog_conf(catalog).items():
        builder = builder.config(key, value)
    sdk_options = " ".join(storage.jvm_options(catalog.storage))
    java_options = f"-Dlog4j2.configurationFile={LOG4J2_CONFIG.as_uri()} {sdk_options}".strip()
    executor_options = sdk_options
    driver_classpath = []
    if (spark.master == "local" or spark.master.startswith("local[")) and SparkContext._active_spark_context is None:
        # file: without a chmod process per file (java/fs/LocalFileSystemNoFork.java). Only in local mode, where the
        # executors are the driver's JVM, and for a JVM started here: Spark opens file: before spark.jars load, so
        # the class must be on the JVM's own class path, which a cluster's executors (or a running JVM) lack.
        driver_classpath.append(str(local_fs_jar()))
        builder = builder.config("spark.hadoop.fs.file.impl", "lakestream.fs.LocalFileSystemNoFork")
        if client_compiler:
            java_options = f"{java_options} -XX:TieredStopAtLevel=1"  # SparkSettings.jit
    for key, value in spark.conf.items():
        if key == "spark.driver.extraJavaOptions":
            java_options = f"{java_options} {value}"  # the user's options come last and win
            continue
        if key == "spark.driver.extraClassPath":
            driver_classpath.append(value)
            continue
        if key == "spark.executor.extraJavaOptions":
            executor_options = f"{executor_options} {value}".strip()
            continue
        builder = builder.config(key, value)
    builder = builder.config("spark.driver.extraJavaOptions", java_options)
    if driver_classpath:
        builder = builder.config("spark.driver.extraClassPath", os.pathsep.join(driver_classpath))
    if executor_options:
        builder = builder.config("spark.executor.extraJavaOptions", executor_options)
    with _jvm_stdout_to_stderr():
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    _quiet_query_context_loggers()
    # A running driver JVM (a catalog added to it) never saw the options above: set them as properties too.
    # The SDK reads them whenever it builds a client.
    for option in storage.jvm_options(catalog.storage):
        key, value = option[2:].split("=", 1)
        driver_jvm(session).java.lang.System.setProperty(key, value)
    return session


def _quiet_query_context_loggers() -> None:
    """PySpark 4 logs every Spark SQL error it converts to a Python exception, at ERROR with the whole JVM stack
    as one JSON line on stderr (loggers ``SQLQueryContextLogger``, ``DataFrameQueryContextLogger``), also the
    errors a caller catches and handles. The exception itself still carries the message and the stack; lakestream
    logs the errors it does not handle. (pyspark 3.5 has no such loggers.)"""
    try:
        from pyspark.logger import PySparkLogger
    except ImportError:
        return
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        # Through PySparkLogger: a plain logging.Logger of that name would not take the keyword arguments
        # PySpark passes to it.
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL)


@contextlib.contextmanager
def _jvm_stdout_to_stderr() -> Iterator[None]:
    """Start the driver JVM (and what it spawns: Python workers) with stderr as its stdout.

    pyspark starts the JVM with this process's stdout, so anything it prints with ``System.out``
    would land in the middle of a command's JSON. The JVM inherits file descriptor 1 when it is
    spawned, so pointing fd 1 at stderr for the duration of the launch is enough; this process's own
    stdout is restored right after. A session that already runs is reused and unaffected.
    """
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def session_for(config: PipelineConfig, pipeline: bool = False) -> SparkSession:
    """The SparkSession for a pipeline config, once its object storage answered (`storage.check_storage`:
    credentials the store refuses or a missing bucket stop here, naming the setting) and an https REST
    catalog's certificate is trusted (`check_catalog_tls`). ``pipeline``: the session of `lakestream run`
    (its JIT, `SparkSettings.jit`)."""
    storage.check_storage(config.catalog)
    check_catalog_tls(config.catalog)
    return build_session(config.catalog, config.spark, client_compiler=client_compiler(config, pipeline))


def client_compiler(config: PipelineConfig, pipeline: bool) -> bool:
    """Whether a local JVM started for ``config`` compiles with C1 only (`SparkSettings.jit`): asked, or ``auto``
    for a pipeline whose JVM runs no Spark SQL of its own (its tasks' work is in the Python workers)."""
    jit = config.spark.jit
    if jit != "auto":
        return jit == "c1"
    return pipeline and not config.derived_tables and not config.windows and config.maintenance.mode != "inline"


def check_catalog_tls(catalog: CatalogSettings, timeout_s: float = 5.0) -> None:
    """An https REST catalog whose certificate is not trusted is a config error (no retry can cure it), named
    with its fix before anything starts. An unreachable catalog is not decided here: the engine waits outages
    out. The check is Python's TLS with the same trust as the clients: ``catalog.ssl_ca_bundle``, else the
    system's CAs."""
    import socket
    import ssl
    from urllib.parse import urlsplit

    from lakestream.errors import ConfigError

    uri = catalog.uri or ""
    if catalog.type != "rest" or not uri.startswith("https://"):
        return
    url = urlsplit(uri)
    context = (
        ssl.create_default_context(cafile=catalog.ssl_ca_bundle)
        if catalog.ssl_ca_bundle
        else ssl.create_default_context()
    )
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout_s) as sock:
            with context.wrap_socket(sock, server_hostname=url.hostname):
                return
    except ssl.SSLCertVerificationError as exc:
        fix = (
            "the bundle does not hold the CA that signed it — fix: catalog.ssl_ca_bundle must hold that CA's "
            "certificate"
            if catalog.ssl_ca_bundle
            else "fix: set catalog.ssl_ca_bundle to a PEM file holding the certificate of the CA that signed it"
        )
        raise ConfigError(
            f"catalog.uri {catalog.uri}: its TLS certificate is not trusted ({exc.verify_message or exc.reason}); {fix}"
        ) from None
    except OSError:
        return  # unreachable or not TLS: left to the clients (an outage is waited out)


def driver_jvm(spark: SparkSession) -> Any:
    """The driver JVM's packages and classes through py4j (``sparkContext._jvm``, gone once the context stops)."""
    jvm = spark.sparkContext._jvm
    if jvm is None:
        raise RuntimeError("the SparkContext has stopped: its driver JVM is gone")
    return jvm


def jvm_helper(session: SparkSession) -> Any:
    """The ``lakestream.LakestreamHelper`` class, callable through py4j."""
    return driver_jvm(session).lakestream.LakestreamHelper


def jvm_alive(spark: SparkSession) -> bool:
    """Whether the driver's JVM still answers (a dead one cannot be retried back to life)."""
    try:
        driver_jvm(spark).java.lang.System.currentTimeMillis()
        return True
    except Exception:  # noqa: BLE001 — any failure to reach it means it is gone
        return False


def jvm_pid(spark: SparkSession) -> int:
    """The process id of the driver's JVM (always on the driver's host: py4j talks to it over loopback)."""
    return int(driver_jvm(spark).java.lang.ProcessHandle.current().pid())
