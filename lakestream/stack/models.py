"""The typed facts of the local stack: what to start (settings), how to connect (info), what runs (status)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from lakestream.errors import ConfigError

# The local object store's keys reach its clients through these variables (never through a config file).
ACCESS_KEY_ENV = "LAKESTREAM_S3_ACCESS_KEY_ID"
SECRET_KEY_ENV = "LAKESTREAM_S3_SECRET_ACCESS_KEY"

StorageKind = Literal["local", "s3"]
CatalogKind = Literal["jdbc", "rest"]
RestServerKind = Literal["iceberg", "lakestream"]
# The source database the stack runs for capture (PostgreSQL always runs: it holds the Iceberg catalog).
SourceKind = Literal["postgresql", "mariadb"]


@dataclass
class StackSettings:
    """Where the local services keep their state and which loopback ports they listen on."""

    state_dir: Path = Path(".lakestream")
    pg_port: int = 15432
    kafka_port: int = 19092
    # The KRaft controller's listener; 0: a free port chosen when the broker's storage is first formatted.
    kafka_controller_port: int = 0
    # A SASL_SSL listener (SCRAM-SHA-512, a certificate of the stack's own CA) beside PLAINTEXT, and ACLs
    # enforced for its principals; 0: none (PLAINTEXT only, no authorizer).
    kafka_sasl_port: int = 0
    # The SCRAM user the stack creates for SASL_SSL clients (its password is generated, kept in a file).
    kafka_sasl_user: str = "lakestream"
    pg_user: str = "lakestream"
    pg_password: str = "lakestream"
    source_db: str = "shop"
    catalog_db: str = "lakestream_catalog"
    # The warehouse: a directory under state_dir, or a bucket of a local S3-compatible store (versitygw).
    storage: StorageKind = "local"
    s3_port: int = 19000
    s3_bucket: str = "lakestream"
    s3_region: str = "us-east-1"
    s3_access_key: str = "lakestream"
    s3_secret_key: str = "lakestream-secret"
    # The catalog: JDBC in PostgreSQL, or a local Iceberg REST catalog server over it.
    catalog: CatalogKind = "jdbc"
    rest_port: int = 18181
    # Which REST catalog server: Apache Iceberg's own (RESTCatalogServer, http, no secret checked), or the one
    # written here (https, a checked OAuth2 secret, loopback only); `lakestream.stack.rest_catalog`.
    rest_server: RestServerKind = "iceberg"
    # A Kafka Connect worker (distributed mode, Debezium's PostgreSQL connector installed) on the broker.
    connect: bool = False
    connect_port: int = 18083
    # The worker's group; its internal topics are <group>-configs, -offsets and -status.
    connect_group_id: str = "lakestream-connect"
    # The source database: the stack's PostgreSQL, or a private MariaDB server beside it (binlog on, ROW, FULL
    # images, GTIDs) with the same user, password and source database name.
    source: SourceKind = "postgresql"
    mariadb_port: int = 13306
    mariadb_server_id: int = 1
    # A Trino node (coordinator and worker) whose Iceberg catalog `trino_catalog` opens the stack's catalog; its
    # JDBC catalog rows are keyed by that name, so it is the pipeline configs' `catalog.name`.
    trino: bool = False
    trino_port: int = 18080
    trino_catalog: str = "lake"
    # A Schema Registry (Apicurio Registry, in memory; Confluent's API at /apis/ccompat/v7) for Avro captures.
    registry: bool = False
    registry_port: int = 18085

    def __post_init__(self) -> None:
        # Resolve once: services chdir, and the pid files must not depend on the caller's cwd.
        self.state_dir = Path(self.state_dir).expanduser().resolve()
        for name in (
            "pg_port",
            "kafka_port",
            "s3_port",
            "rest_port",
            "connect_port",
            "mariadb_port",
            "trino_port",
            "registry_port",
        ):
            port = getattr(self, name)
            if not isinstance(port, int) or not 1 <= port <= 65535:
                raise ConfigError(f"{name}={port!r} is not a TCP port (1-65535)")
        if not isinstance(self.kafka_controller_port, int) or not 0 <= self.kafka_controller_port <= 65535:
            raise ConfigError(
                f"kafka_controller_port={self.kafka_controller_port!r} is not a TCP port "
                "(1-65535, or 0 to choose a free one)"
            )
        if not isinstance(self.kafka_sasl_port, int) or not 0 <= self.kafka_sasl_port <= 65535:
            raise ConfigError(
                f"kafka_sasl_port={self.kafka_sasl_port!r} is not a TCP port (1-65535, or 0 for no SASL_SSL listener)"
            )
        if self.pg_port == self.kafka_port:
            raise ConfigError(f"pg_port and kafka_port are both {self.pg_port}; give them different ports")
        used = {"pg_port": self.pg_port, "kafka_port": self.kafka_port}
        if self.kafka_controller_port:
            used["kafka_controller_port"] = self.kafka_controller_port
        if self.kafka_sasl_port:
            used["kafka_sasl_port"] = self.kafka_sasl_port
        if self.storage == "s3":
            used["s3_port"] = self.s3_port
        if self.catalog == "rest":
            used["rest_port"] = self.rest_port
        if self.connect:
            used["connect_port"] = self.connect_port
        if self.source == "mariadb":
            used["mariadb_port"] = self.mariadb_port
        if self.trino:
            used["trino_port"] = self.trino_port
        if self.registry:
            used["registry_port"] = self.registry_port
        if len(set(used.values())) != len(used):
            raise ConfigError(f"two services share a port: {used}; give them different ports")
        if self.storage not in ("local", "s3"):
            raise ConfigError(f"storage={self.storage!r} is unknown; use 'local' or 's3'")
        if self.catalog not in ("jdbc", "rest"):
            raise ConfigError(f"catalog={self.catalog!r} is unknown; use 'jdbc' or 'rest'")
        if self.rest_server not in ("iceberg", "lakestream"):
            raise ConfigError(
                f"rest_server={self.rest_server!r} is unknown; use 'iceberg' (Apache Iceberg's "
                "RESTCatalogServer) or 'lakestream' (the server written here)"
            )
        if self.trino and self.catalog == "rest" and self.rest_server == "lakestream":
            # That server serves https with a certificate of the stack's own CA, which Trino's JVM does not trust.
            raise ConfigError(
                "trino=True with rest_server='lakestream': Trino does not trust that server's private CA — fix: "
                "use rest_server='iceberg' (--rest-server iceberg, the default) with --trino"
            )
        if self.source not in ("postgresql", "mariadb"):
            raise ConfigError(f"source={self.source!r} is unknown; use 'postgresql' or 'mariadb'")
        if not isinstance(self.mariadb_server_id, int) or not 1 <= self.mariadb_server_id <= 2**32 - 1:
            raise ConfigError(f"mariadb_server_id={self.mariadb_server_id!r} is not a server id (1-4294967295)")
        for name in ("pg_user", "source_db", "catalog_db", "kafka_sasl_user", "trino_catalog"):
            value = getattr(self, name)
            if not value or not value.replace("_", "").isalnum() or value[0].isdigit():
                raise ConfigError(f"{name}={value!r}: use letters, digits and _ (not starting with a digit)")


def _dsn_value(value: str) -> str:
    # libpq key/value syntax: quote empty values and values with spaces or quotes.
    if value and not any(c in value for c in " '\\\t"):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass
class StackInfo:
    """How clients connect to a running local stack."""

    bootstrap_servers: str
    pg_host: str
    pg_port: int
    pg_user: str
    pg_password: str
    source_db: str
    catalog_db: str
    warehouse: str
    catalog_type: CatalogKind = "jdbc"
    rest_uri: str | None = None
    s3_endpoint: str | None = None
    s3_region: str | None = None
    s3_access_key: str | None = field(default=None, repr=False)
    s3_secret_key: str | None = field(default=None, repr=False)
    # The SASL_SSL listener, with `StackSettings.kafka_sasl_port`: its address, the CA's PEM to trust, the
    # SCRAM-SHA-512 user and the file holding its password (the password itself is never in this object).
    kafka_sasl_bootstrap_servers: str | None = None
    kafka_ca_location: str | None = None
    kafka_sasl_user: str | None = None
    kafka_sasl_password_file: str | None = None
    # The Kafka Connect worker's REST API, with `StackSettings.connect`.
    connect_url: str | None = None
    # The Schema Registry's Confluent-compatible API (`kafka.schema_registry.url`), with `registry`.
    schema_registry_url: str | None = None
    # The MariaDB source server's port, with `StackSettings.source` "mariadb" (same user, password, database).
    mariadb_port: int | None = None
    # The Trino node's HTTP address and its Iceberg catalog's name, with `StackSettings.trino`.
    trino_uri: str | None = None
    trino_catalog: str | None = None

    def kafka_sasl_client(self, password: str) -> dict[str, str]:
        """The ``kafka.client`` settings for the SASL_SSL listener; give ``password`` as a reference such as
        ``"${KAFKA_PASSWORD}"`` (expanded when the config loads) so that it is never written in a file."""
        if self.kafka_sasl_bootstrap_servers is None:
            raise ConfigError("this stack has no SASL_SSL listener — fix: start it with StackSettings.kafka_sasl_port")
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": self.kafka_sasl_user or "",
            "sasl.password": password,
            "ssl.ca.location": self.kafka_ca_location or "",
        }

    def kafka_sasl_password(self) -> str:
        """The SCRAM user's password, read from `kafka_sasl_password_file`."""
        if self.kafka_sasl_password_file is None:
            raise ConfigError("this stack has no SASL_SSL listener — fix: start it with StackSettings.kafka_sasl_port")
        return Path(self.kafka_sasl_password_file).read_text().strip()

    def catalog_config(self, name: str = "lake") -> dict:
        """The ``catalog`` section of a pipeline config for this stack (holds the PostgreSQL password)."""
        if self.catalog_type == "rest":
            return {"name": name, "type": "rest", "uri": self.rest_uri, "warehouse": self.warehouse}
        return {
            "name": name,
            "type": "jdbc",
            "uri": self.catalog_jdbc_uri(),
            "user": self.pg_user,
            "password": self.pg_password,
            "warehouse": self.warehouse,
        }

    def storage_config(self) -> dict | None:
        """The ``storage`` section for this stack's object store (credentials named by environment
        variable: export `storage_env()`), or None for a local warehouse."""
        if self.s3_endpoint is None:
            return None
        return {
            "endpoint": self.s3_endpoint,
            "region": self.s3_region,
            "path_style": True,
            "access_key_id_env": ACCESS_KEY_ENV,
            "secret_access_key_env": SECRET_KEY_ENV,
        }

    def storage_env(self) -> dict[str, str]:
        """The environment variables `storage_config()` names, with the object store's credentials."""
        if self.s3_endpoint is None:
            return {}
        return {ACCESS_KEY_ENV: self.s3_access_key or "", SECRET_KEY_ENV: self.s3_secret_key or ""}

    def pg_dsn(self, dbname: str | None = None) -> str:
        """A libpq key/value DSN for psycopg2 (default: the source database)."""
        parts = {
            "host": self.pg_host,
            "port": str(self.pg_port),
            "dbname": dbname or self.source_db,
            "user": self.pg_user,
            "password": self.pg_password,
        }
        return " ".join(f"{key}={_dsn_value(value)}" for key, value in parts.items())

    def source_database(self, dbname: str | None = None) -> dict:
        """The ``capture.database`` section for this stack's source database (holds the password): MariaDB's
        when the stack runs one, else PostgreSQL's."""
        if self.mariadb_port is not None:
            return {
                "kind": "mariadb",
                "host": self.pg_host,
                "port": self.mariadb_port,
                "dbname": dbname or self.source_db,
                "user": self.pg_user,
                "password": self.pg_password,
            }
        return {
            "host": self.pg_host,
            "port": self.pg_port,
            "dbname": dbname or self.source_db,
            "user": self.pg_user,
            "password": self.pg_password,
        }

    def catalog_jdbc_uri(self) -> str:
        """The JDBC URI of the Iceberg catalog database."""
        return f"jdbc:postgresql://{self.pg_host}:{self.pg_port}/{self.catalog_db}"


@dataclass
class ServiceStatus:
    """One service as seen by `Stack.status()`."""

    name: str
    running: bool
    pid: int | None
    port: int
    healthy: bool
    persistent: bool
    detail: str = field(default="")

    @property
    def state(self) -> str:
        return "running" if self.running else "stopped"
