"""SchemaCachingJsonConverter writes exactly JsonConverter's bytes (schemas on), for every shape Debezium
sends: nested structs, optional and defaulted fields, decimals, dates, arrays, maps, NaN, a schema that
changes on a topic and changes back, keys, nulls. Checked by tests/capture/java/ConverterCheck.java, run on a
JVM against the capture jar and Debezium's Kafka Connect jars (io.debezium by coordinates)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from lakestream.runtime.jvm_jars import capture_jar, debezium_jars


def test_schema_caching_converter_writes_json_converters_bytes(tmp_path):
    javac, java = shutil.which("javac"), shutil.which("java")
    if not javac or not java:
        pytest.fail("javac/java not found: the JDK is part of the bootstrap")
    classpath = os.pathsep.join([str(capture_jar()), *map(str, debezium_jars())])
    source = Path(__file__).parent / "java" / "ConverterCheck.java"
    subprocess.run(
        [javac, "--release", "11", "-nowarn", "-cp", classpath, "-d", str(tmp_path), str(source)],
        check=True,
        capture_output=True,
        text=True,
    )
    run = subprocess.run(
        [java, "-cp", os.pathsep.join([str(tmp_path), classpath]), "ConverterCheck"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and run.stdout.startswith("OK "), run.stdout + run.stderr[-3000:]
