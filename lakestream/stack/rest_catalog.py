"""A local Iceberg REST catalog over a JDBC catalog in the stack's PostgreSQL, one of two servers:

- `IcebergRestServer` (the default): Apache Iceberg's own REST catalog server, ``RESTCatalogServer`` from the
  project's published ``iceberg-open-api`` test fixtures (the server behind Iceberg's REST compatibility kit and
  its ``apache/iceberg-rest-fixture`` image), run as Iceberg ships it, by coordinates (``jars.toml`` group
  ``iceberg-rest-server``). It serves http only, answers OAuth2 token requests without checking the client's
  secret, listens on every interface (its ``main`` takes no host) and has one warehouse.
- `RestCatalogServer`: one written here (``lakestream/java/rest/RestCatalogServer.java``, Iceberg's
  ``CatalogHandlers`` behind the JDK's HTTP server) for what Iceberg's server does not do: https with a
  certificate of its own CA, an OAuth2 client secret that is checked (a wrong one gets 401), credential vending
  of chosen storage properties, loopback only.

Both keep their tables in the same JDBC catalog (``catalog.name`` = the backend), so either serves what the
other created. Every client stays real (Spark's and the committer's RESTCatalog, pyiceberg's RestCatalog).
Their settings (the JDBC password, the storage keys) never reach a log: the home-made server reads them from
``<state_dir>/rest-catalog/server.properties`` (its owner's only), Iceberg's from its environment.
"""

from __future__ import annotations

import logging
import os
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from lakestream.errors import StackError
from lakestream.stack import process
from lakestream.stack.models import StackSettings

log = logging.getLogger(__name__)

# The name of the catalog inside the server's JDBC database (its own rows, apart from a `lake` JDBC catalog).
BACKEND_CATALOG = "rest_backend"
# The server's S3FileIO gives up on an unreachable store within about a second per request (Iceberg's
# defaults: 5 retries waiting 2-20 s). Loading a table retries reading its metadata 20 times on top, so with
# the defaults a client's request would hang for many minutes during an outage of the store; with these the
# server answers 503 within a couple of minutes and the client's retry policy takes over.
FAIL_FAST_S3 = {"s3.retry.num-retries": "1", "s3.retry.min-wait-ms": "200", "s3.retry.max-wait-ms": "1000"}


class _RestCatalogService(process.PidService):
    """What both REST catalog servers share: the stack's REST port and pid file, a JDBC catalog in the stack's
    PostgreSQL as the backend, the start that waits for ``/v1/config``."""

    name = "rest-catalog"  # one pid file: the stack runs one server or the other
    persistent = True  # its state is the JDBC catalog in PostgreSQL
    start_timeout = 60.0
    tls = False

    def __init__(self, settings: StackSettings, warehouse: str, io_properties: dict[str, str] | None, backend: str):
        self.settings = settings
        self.backend = backend
        self.warehouse = warehouse
        self.io_properties = io_properties or {}
        self.dir = settings.state_dir / "rest-catalog"
        self.log_path = settings.state_dir / "logs" / f"{self.name}.log"
        self.pid_file = process.PidFile(settings.state_dir / "pids" / f"{self.name}.pid", "java")

    @property
    def port(self) -> int:
        return self.settings.rest_port

    @property
    def uri(self) -> str:
        return f"{'https' if self.tls else 'http'}://{process.LOOPBACK}:{self.port}"

    def check_port_free(self) -> None:
        process.require_free_port(self.port, "REST catalog", "--rest-port / StackSettings.rest_port")

    def _launch(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        """Spawn ``argv`` and wait until the server answers; stopped again, with its log's tail, if it does not."""
        log.info("starting %s on %s", self.name, self.uri)
        pid = process.spawn_detached(argv, self.log_path, cwd=self.dir, env=env)
        self.pid_file.write(pid)
        process.wait_until(lambda: not process.pid_alive(pid) or self.healthy(), self.start_timeout, 0.2)
        if not process.pid_alive(pid) or not self.healthy():
            self.stop(timeout=5)
            raise StackError(
                f"{self.name} on {self.uri} did not start\n--- {self.log_path} ---\n{process.log_tail(self.log_path)}"
            )

    def healthy(self) -> bool:
        """Whether the server answers HTTP (401 without a token counts: it is up)."""
        context = ssl.create_default_context(cafile=str(self.ca_bundle)) if self.tls else None
        try:
            with urllib.request.urlopen(f"{self.uri}/v1/config", timeout=2, context=context):
                return True
        except urllib.error.HTTPError as exc:
            return exc.code in (401, 403)
        except OSError:
            return False

    @property
    def ca_bundle(self) -> Path:
        """The PEM certificate clients trust for this server (``catalog.ssl_ca_bundle``), with ``tls``."""
        return self.dir / "tls" / "ca.pem"


class RestCatalogServer(_RestCatalogService):
    """The REST catalog written here on 127.0.0.1:<rest_port>, tracked by a pid file."""

    def __init__(
        self,
        settings: StackSettings,
        *,
        warehouse: str,
        io_properties: dict[str, str] | None = None,
        credential: str | None = None,
        token: str | None = None,
        vend: dict[str, str] | None = None,
        backend: str = BACKEND_CATALOG,
        tls: bool = False,
    ):
        super().__init__(settings, warehouse, io_properties, backend)
        self.credential = credential
        self.token = token
        self.vend = vend or {}
        self.tls = tls  # serve https with a certificate of its own CA (`ca_bundle`), made on first start

    @property
    def _keystore(self) -> Path:
        return self.dir / "tls" / "server.p12"

    def _make_certificate(self) -> None:
        """A self-signed certificate for 127.0.0.1 (its own CA) in a PKCS12 key store, and its PEM for clients."""
        if self._keystore.exists() and self.ca_bundle.exists():
            return
        keytool = shutil.which("keytool")
        if keytool is None:
            raise StackError("keytool not found: it comes with the JDK (apt-get install openjdk-17-jdk-headless)")
        tls_dir = self._keystore.parent
        tls_dir.mkdir(parents=True, exist_ok=True)
        self._keystore.unlink(missing_ok=True)
        common = [
            "-alias",
            "rest",
            "-keystore",
            str(self._keystore),
            "-storetype",
            "PKCS12",
            "-storepass",
            self._keystore_password(),
        ]
        _run(
            [
                keytool,
                "-genkeypair",
                *common,
                "-keyalg",
                "RSA",
                "-keysize",
                "2048",
                "-validity",
                "3650",
                "-dname",
                "CN=lakestream local REST catalog",
                "-ext",
                f"san=ip:{process.LOOPBACK},dns:localhost",
            ],
            "keytool -genkeypair",
        )
        _run([keytool, "-exportcert", *common, "-rfc", "-file", str(self.ca_bundle)], "keytool -exportcert")

    def _keystore_password(self) -> str:
        # Protects nothing beyond the file's own mode (the key never leaves this directory): a fixed value.
        return "lakestream-local"

    def properties(self) -> dict[str, str]:
        s = self.settings
        props = {
            "server.host": process.LOOPBACK,
            "server.port": str(self.port),
            "catalog.name": self.backend,
            "catalog.catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
            "catalog.uri": f"jdbc:postgresql://{process.LOOPBACK}:{s.pg_port}/{s.catalog_db}",
            "catalog.jdbc.user": s.pg_user,
            "catalog.jdbc.password": s.pg_password,
            "catalog.jdbc.schema-version": "V1",
            "catalog.warehouse": self.warehouse,
            **({f"catalog.{k}": v for k, v in FAIL_FAST_S3.items()} if self.io_properties else {}),
            **{f"catalog.{k}": v for k, v in self.io_properties.items()},
            **{f"server.vend.{k}": v for k, v in self.vend.items()},
        }
        if self.credential:
            props["server.credential"] = self.credential
        if self.token:
            props["server.token"] = self.token
        if self.tls:
            props["server.tls.keystore"] = str(self._keystore)
            props["server.tls.keystore-password"] = self._keystore_password()
        return props

    def _write_properties(self) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / "server.properties"
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            for key, value in self.properties().items():
                fh.write(f"{_escape(key)}={_escape(value)}\n")
        return path

    def argv(self, properties: Path) -> list[str]:
        from lakestream.runtime.jvm_jars import (
            aws_sdk_jars,
            iceberg_runtime_jar,
            postgres_jdbc_jar,
            rest_catalog_jar,
            spark_jars_dir,
        )
        from lakestream.runtime.spark import LOG4J2_CONFIG
        from lakestream.storage import JVM_CHECKSUM_OPTIONS

        java = shutil.which("java")
        if java is None:
            raise StackError("java not found: install a JDK 11+ (apt-get install openjdk-17-jdk-headless)")
        classpath = [
            str(rest_catalog_jar()),
            str(iceberg_runtime_jar()),
            str(postgres_jdbc_jar()),
            *map(str, aws_sdk_jars()),
            str(spark_jars_dir() / "*"),
        ]
        # Its S3FileIO writes metadata files to an S3-compatible store: no aws-chunked uploads (storage.py).
        sdk = list(JVM_CHECKSUM_OPTIONS) if "s3.endpoint" in self.io_properties else []
        return [
            java,
            "-Xmx384m",
            *sdk,
            f"-Dlog4j2.configurationFile={LOG4J2_CONFIG.as_uri()}",
            "-cp",
            os.pathsep.join(classpath),
            "lakestream.rest.RestCatalogServer",
            str(properties),
        ]

    def start(self) -> None:
        """Start the server unless it runs; wait until ``/v1/config`` answers."""
        if self.pid() is None:
            self.check_port_free()
            if self.tls:
                self._make_certificate()
            self._launch(self.argv(self._write_properties()))

    @property
    def detail(self) -> str:
        return f"Iceberg CatalogHandlers over the JDBC catalog {self.backend!r} in {self.settings.catalog_db}"


class IcebergRestServer(_RestCatalogService):
    """Apache Iceberg's REST catalog server on port <rest_port>, tracked by a pid file."""

    start_timeout = 90.0

    def __init__(
        self,
        settings: StackSettings,
        *,
        warehouse: str,
        io_properties: dict[str, str] | None = None,
        vend: bool = False,
        backend: str = BACKEND_CATALOG,
    ):
        super().__init__(settings, warehouse, io_properties, backend)
        self.vend = vend  # hand the catalog's S3 keys to clients that load a table (include-credentials)

    def properties(self) -> dict[str, str]:
        """The server's catalog properties (it reads them from ``CATALOG_*`` environment variables)."""
        s = self.settings
        props = {
            "catalog.name": self.backend,
            "catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
            "uri": f"jdbc:postgresql://{process.LOOPBACK}:{s.pg_port}/{s.catalog_db}",
            "jdbc.user": s.pg_user,
            "jdbc.password": s.pg_password,
            "jdbc.schema-version": "V1",
            "warehouse": self.warehouse,
            "rest.port": str(self.port),
            **(FAIL_FAST_S3 if self.io_properties else {}),
            **self.io_properties,
        }
        if self.vend:
            props["include-credentials"] = "true"
        return props

    def environment(self) -> dict[str, str]:
        """`properties` as the server's ``CATALOG_*`` variables (``-`` spelt ``__``, ``.`` spelt ``_``)."""
        env = {}
        for key, value in self.properties().items():
            if "_" in key:
                raise StackError(
                    f"{key!r}: Iceberg's REST server reads its properties from environment variables, "
                    "which cannot spell an underscore in a property name"
                )
            env["CATALOG_" + key.replace("-", "__").replace(".", "_").upper()] = value
        return env

    def argv(self) -> list[str]:
        from lakestream.runtime.jars import jars
        from lakestream.runtime.spark import LOG4J2_CONFIG
        from lakestream.stack.broker import java_binary
        from lakestream.storage import JVM_CHECKSUM_OPTIONS

        classpath = os.pathsep.join(map(str, jars("iceberg-rest-server")))
        # Its S3FileIO writes metadata files to an S3-compatible store: no aws-chunked uploads (storage.py).
        sdk = list(JVM_CHECKSUM_OPTIONS) if "s3.endpoint" in self.io_properties else []
        # WARN and above only: at INFO the server logs its catalog properties, the JDBC password among them.
        return [
            java_binary(),
            "-Xmx384m",
            *sdk,
            f"-Dlog4j2.configurationFile={LOG4J2_CONFIG.as_uri()}",
            "-cp",
            classpath,
            "org.apache.iceberg.rest.RESTCatalogServer",
        ]

    def start(self) -> None:
        """Start the server unless it runs; wait until ``/v1/config`` answers."""
        if self.pid() is None:
            self.check_port_free()
            self.dir.mkdir(parents=True, exist_ok=True)
            env = {k: v for k, v in os.environ.items() if not k.startswith("CATALOG_")} | self.environment()
            self._launch(self.argv(), env)

    @property
    def detail(self) -> str:
        return (
            f"Apache Iceberg's RESTCatalogServer over the JDBC catalog {self.backend!r} in {self.settings.catalog_db}"
        )


def _run(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise StackError(f"{what} failed (exit {done.returncode}): {(done.stderr or done.stdout).strip()[-500:]}")


def _escape(value: str) -> str:
    # java.util.Properties: backslashes, and separators/comments at the start of keys or values.
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("=", "\\=").replace(":", "\\:").replace("#", "\\#")
