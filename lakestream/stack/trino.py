"""Trino beside Spark: the Iceberg connector's catalog for a lakestream catalog, and a local Trino server.

`iceberg_catalog_properties` turns a pipeline's ``catalog`` (+ ``storage``) section into the properties of a
Trino Iceberg catalog over the same tables: the same JDBC catalog rows (``iceberg.jdbc-catalog.catalog-name``
is the Spark catalog's name, which keys them) or the same REST catalog, and the same files. A deployment
writes them to ``etc/catalog/<name>.properties`` on every Trino node.

`TrinoServer` runs one Trino node (coordinator and worker) on loopback from the server assembled from Trino's
modules by coordinates (`lakestream.stack.trino_install`: ``jars.toml``'s ``trino-server`` and
``trino-plugin-iceberg``), on a Java 25 runtime (the Temurin 25 JDK of these machines, or
``LAKESTREAM_TRINO_JAVA_HOME``). Configuration under ``<state_dir>/trino/etc``
(catalog files owner-only: they hold the catalog's secrets), its pid, its log; stopped by pid. The engine tests
(`make test-engines`) read the pipeline's tables with it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from lakestream.config import CatalogSettings
from lakestream.errors import StackError
from lakestream.stack import process, trino_install

log = logging.getLogger(__name__)

# Where the machines of this kind keep a JDK Trino runs on (Trino 483 requires Java 25).
TRINO_JAVA_HOMES = ("/usr/lib/jvm/temurin-25-jdk-amd64",)
JAVA_HOME_ENV = "LAKESTREAM_TRINO_JAVA_HOME"
MIN_JAVA = 25


def iceberg_catalog_properties(catalog: CatalogSettings) -> dict[str, str]:
    """The Trino Iceberg connector's properties for ``catalog`` (and its storage): secrets included, so write
    them to a file only its owner reads."""
    props = {"connector.name": "iceberg"}
    if catalog.type == "jdbc":
        props |= {
            "iceberg.catalog.type": "jdbc",
            "iceberg.jdbc-catalog.driver-class": "org.postgresql.Driver",
            "iceberg.jdbc-catalog.connection-url": catalog.uri,
            # The JDBC catalog's rows are keyed by the catalog's name: Trino must use Spark's.
            "iceberg.jdbc-catalog.catalog-name": catalog.name,
            "iceberg.jdbc-catalog.default-warehouse-dir": catalog.warehouse,
        }
        if catalog.user:
            props["iceberg.jdbc-catalog.connection-user"] = catalog.user
        if catalog.password is not None:
            props["iceberg.jdbc-catalog.connection-password"] = catalog.password.get_secret_value()
    elif catalog.type == "rest":
        props |= {
            "iceberg.catalog.type": "rest",
            "iceberg.rest-catalog.uri": catalog.uri,
            "iceberg.rest-catalog.warehouse": catalog.warehouse,
        }
        secret = catalog.rest_secret()
        if secret is not None:
            props["iceberg.rest-catalog.security"] = "OAUTH2"
            props[f"iceberg.rest-catalog.oauth2.{secret[0]}"] = secret[1]
            if secret[0] == "credential" and catalog.oauth2_token_uri:
                props["iceberg.rest-catalog.oauth2.server-uri"] = catalog.oauth2_token_uri
            if catalog.scope:
                props["iceberg.rest-catalog.oauth2.scope"] = catalog.scope
        if catalog.vended_credentials:
            props["iceberg.rest-catalog.vended-credentials-enabled"] = "true"
    else:
        raise StackError(f"catalog.type {catalog.type!r}: only jdbc and rest catalogs are mapped to Trino here")
    storage = catalog.storage
    if storage is None:
        # Table locations are file:/ URIs, which Trino's native local file system reads under its root.
        return props | {"fs.native-local.enabled": "true", "local.location": "/"}
    creds = storage.credentials
    return props | native_s3_properties(
        storage.region,
        storage.endpoint,
        storage.path_style,
        (creds.access_key_id, creds.secret_access_key.get_secret_value()) if creds is not None else None,
    )


def native_s3_properties(
    region: str, endpoint: str | None, path_style: bool, keys: tuple[str, str] | None
) -> dict[str, str]:
    """Trino's native S3 file system on ``endpoint`` (None: AWS's), with static ``keys`` (access key, secret) or
    none (the default credential chain)."""
    props = {"fs.native-s3.enabled": "true", "s3.region": region, "s3.path-style-access": str(path_style).lower()}
    if endpoint:
        props["s3.endpoint"] = endpoint
    if keys is not None:
        props["s3.aws-access-key"], props["s3.aws-secret-key"] = keys
    return props


def java_home() -> Path:
    """A JDK that runs Trino: ``LAKESTREAM_TRINO_JAVA_HOME``, else the machine's Temurin 25."""
    candidates = [os.environ[JAVA_HOME_ENV]] if os.environ.get(JAVA_HOME_ENV) else list(TRINO_JAVA_HOMES)
    for home in map(Path, candidates):
        java = home / "bin" / "java"
        if java.exists() and _java_major(java) >= MIN_JAVA:
            return home
    raise StackError(
        f"no Java {MIN_JAVA}+ runtime for Trino in {', '.join(candidates)} — fix: install a JDK {MIN_JAVA} or "
        f"newer and set {JAVA_HOME_ENV} to its home"
    )


def _java_major(java: Path) -> int:
    out = subprocess.run([str(java), "-version"], capture_output=True, text=True, timeout=30).stderr
    found = re.search(r'version "(\d+)', out)
    return int(found.group(1)) if found else 0


class TrinoServer(process.PidService):
    """One Trino node on 127.0.0.1:<port> with an Iceberg catalog per entry of ``catalogs`` (name →
    connector properties, e.g. `iceberg_catalog_properties`), tracked by a pid file under ``state_dir``."""

    name = "trino"
    stop_timeout = 30.0
    start_timeout = 180.0  # ~30-60 s on an idle 2-core machine; much more while Spark runs beside it

    def __init__(self, state_dir: Path, port: int, catalogs: dict[str, dict[str, str]], *, heap: str = "1200m"):
        self.dir = Path(state_dir) / "trino"
        self._port = port
        self.catalogs = catalogs
        self.heap = heap
        self.log_path = Path(state_dir) / "logs" / f"{self.name}.log"
        self.pid_file = process.PidFile(Path(state_dir) / "pids" / f"{self.name}.pid", "java")

    @property
    def port(self) -> int:
        return self._port

    @property
    def uri(self) -> str:
        return f"http://{process.LOOPBACK}:{self.port}"

    def _write_config(self, install: Path) -> Path:
        etc = self.dir / "etc"
        (etc / "catalog").mkdir(parents=True, exist_ok=True)
        for old in (etc / "catalog").glob("*.properties"):
            old.unlink()
        config = {
            "coordinator": "true",
            "node-scheduler.include-coordinator": "true",
            "http-server.http.port": str(self.port),
            "discovery.uri": self.uri,
            "catalog.config-dir": str(etc / "catalog"),
            "plugin.dir": str(install / "plugin"),
            # One small node beside Spark on a shared 2-core machine.
            "query.max-memory": "512MB",
            "query.max-memory-per-node": "512MB",
            "task.concurrency": "2",
        }
        _write_properties(etc / "config.properties", config)
        _write_properties(etc / "log.properties", {"io.trino": "INFO", "org.apache.iceberg": "WARN"})
        for name, props in self.catalogs.items():
            _write_properties(etc / "catalog" / f"{name}.properties", props)
        return etc

    def argv(self) -> list[str]:
        install = trino_install.install_dir()
        etc = self._write_config(install)
        data = self.dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        java = java_home() / "bin" / "java"
        return [
            str(java),
            # jvm.config as Trino's deployment docs give it, with a small heap.
            f"-Xmx{self.heap}",
            "-XX:+UseG1GC",
            "-XX:+ExplicitGCInvokesConcurrent",
            "-XX:+ExitOnOutOfMemoryError",
            "-XX:-OmitStackTraceInFastThrow",
            "-XX:ReservedCodeCacheSize=256M",
            "-XX:PerMethodRecompilationCutoff=10000",
            "-XX:PerBytecodeRecompilationCutoff=10000",
            "-Djdk.attach.allowAttachSelf=true",
            "-Djdk.nio.maxCachedBufferSize=2000000",
            "-Dfile.encoding=UTF-8",
            "-XX:+EnableDynamicAgentLoading",
            "--add-modules=jdk.incubator.vector",
            "--enable-native-access=ALL-UNNAMED",
            # node.properties, as Trino's launcher passes them: system properties.
            "-Dnode.environment=lakestream",
            f"-Dnode.id={uuid.uuid5(uuid.NAMESPACE_URL, str(self.dir))}",
            f"-Dnode.data-dir={data}",
            f"-Dnode.internal-address={process.LOOPBACK}",
            f"-Dconfig={etc / 'config.properties'}",
            f"-Dlog.levels-file={etc / 'log.properties'}",
            "-cp",
            str(install / "lib" / "*"),
            trino_install.MAIN_CLASS,
        ]

    def start(self) -> None:
        """Start the node unless it runs; wait until it has started (``/v1/info``: ``starting`` false)."""
        if self.pid() is None:
            self.check_port_free()
            argv = self.argv()
            log.info("starting Trino on %s", self.uri)
            pid = process.spawn_detached(argv, self.log_path, cwd=self.dir)
            self.pid_file.write(pid)
            process.wait_until(lambda: not process.pid_alive(pid) or self.healthy(), self.start_timeout, 0.5)
            if not process.pid_alive(pid) or not self.healthy():
                self.stop(timeout=5)
                raise StackError(
                    f"Trino on {self.uri} did not start\n--- {self.log_path} ---\n{process.log_tail(self.log_path, 40)}"
                )

    def healthy(self) -> bool:
        """Whether the node answers and has finished starting (its plugins and catalogs loaded)."""
        try:
            with urllib.request.urlopen(f"{self.uri}/v1/info", timeout=2) as resp:
                return json.load(resp).get("starting") is False
        except (OSError, ValueError, urllib.error.URLError):
            return False

    def check_port_free(self) -> None:
        process.require_free_port(self.port, "Trino", "--trino-port / StackSettings.trino_port")

    @property
    def detail(self) -> str:
        return f"Trino {trino_install.version()}, catalogs {', '.join(self.catalogs)}"


def _write_properties(path: Path, values: dict[str, str]) -> None:
    # Owner-only: catalog files hold the catalog's and the store's secrets.
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write("".join(f"{k}={_escape(v)}\n" for k, v in values.items()))


def _escape(value: str) -> str:
    # java.util.Properties (airlift reads these files with it): backslashes and line breaks.
    return value.replace("\\", "\\\\").replace("\n", "\\n")
