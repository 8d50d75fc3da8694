"""The local stack: a private PostgreSQL cluster plus Apache Kafka (KRaft), on loopback ports; with ``source="mariadb"``
a private MariaDB server as the source database beside them; with
``storage="s3"`` a local S3-compatible store holds the warehouse, with ``catalog="rest"`` a local Iceberg
REST catalog serves it (Apache Iceberg's own server by default), with ``connect=True`` a Kafka Connect worker runs
Debezium beside the broker, with ``registry=True`` a Schema Registry (Apicurio Registry) serves Avro schemas, with
``trino=True`` a Trino node reads the catalog's tables."""

from __future__ import annotations

import logging

from lakestream.stack import process
from lakestream.stack.broker import KafkaBroker, make_broker
from lakestream.stack.connect import ConnectWorker
from lakestream.stack.mariadb import MariaDBServer
from lakestream.stack.models import ServiceStatus, StackInfo, StackSettings
from lakestream.stack.objectstore import ObjectStore
from lakestream.stack.postgres import PostgresCluster
from lakestream.stack.registry import SchemaRegistry
from lakestream.stack.rest_catalog import IcebergRestServer, RestCatalogServer
from lakestream.stack.trino import TrinoServer, iceberg_catalog_properties, native_s3_properties

log = logging.getLogger(__name__)


class Stack:
    """Start, stop and inspect the local services described by one `StackSettings`."""

    def __init__(self, settings: StackSettings):
        self.settings = settings
        self.postgres = PostgresCluster(settings)
        self.mariadb = MariaDBServer(settings)
        self.broker: KafkaBroker = make_broker(settings)
        self.objectstore = ObjectStore(settings)
        if settings.rest_server == "iceberg":
            self.rest_catalog: IcebergRestServer | RestCatalogServer = IcebergRestServer(
                settings, warehouse=self.warehouse, io_properties=self._io_properties()
            )
        else:
            self.rest_catalog = RestCatalogServer(
                settings, warehouse=self.warehouse, io_properties=self._io_properties()
            )
        self.connect = ConnectWorker(settings, self.broker.bootstrap_servers)
        self.registry = SchemaRegistry(settings.state_dir, settings.registry_port)
        # Last: the catalogs come from `info()`, which names every service above.
        self.trino = TrinoServer(settings.state_dir, settings.trino_port, {})
        self.trino.catalogs = self._trino_catalogs()

    @property
    def warehouse(self) -> str:
        s = self.settings
        return self.objectstore.warehouse if s.storage == "s3" else (s.state_dir / "warehouse").as_uri()

    def _io_properties(self) -> dict[str, str]:
        """The REST catalog server's FileIO: S3FileIO on the local store (the server writes metadata files)."""
        s = self.settings
        if s.storage != "s3":
            return {}
        return {
            "io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
            "s3.endpoint": self.objectstore.endpoint,
            "s3.path-style-access": "true",
            "client.region": s.s3_region,
            "s3.access-key-id": s.s3_access_key,
            "s3.secret-access-key": s.s3_secret_key,
        }

    def _trino_catalogs(self) -> dict[str, dict[str, str]]:
        """Trino's Iceberg catalog over the stack's catalog and warehouse (the store's keys written in: the
        catalog file is the node's own, owner-only)."""
        from lakestream.config import CatalogSettings

        s = self.settings
        info = self.info()
        props = iceberg_catalog_properties(CatalogSettings(**info.catalog_config(s.trino_catalog)))
        if s.storage == "s3":
            props = {k: v for k, v in props.items() if not k.startswith(("fs.native-local.", "local."))}
            props |= native_s3_properties(
                s.s3_region, self.objectstore.endpoint, True, (s.s3_access_key, s.s3_secret_key)
            )
        return {s.trino_catalog: props}

    def _services(self) -> list:
        services = [self.postgres, self.broker]
        if self.settings.source == "mariadb":
            services.append(self.mariadb)
        if self.settings.storage == "s3":
            services.append(self.objectstore)
        if self.settings.catalog == "rest":
            services.append(self.rest_catalog)
        if self.settings.registry:
            services.append(self.registry)
        if self.settings.connect:
            services.append(self.connect)  # after the broker it stores its state in
        if self.settings.trino:
            services.append(self.trino)  # after the catalog and the store it reads
        return services

    def up(self) -> StackInfo:
        """Start whatever is not running (idempotent) and health-check every service."""
        # Check every port first so a conflict never leaves half a stack running.
        for service in self._services():
            if service.pid() is None:
                service.check_port_free()
        self.settings.state_dir.mkdir(parents=True, exist_ok=True)
        (self.settings.state_dir / "warehouse").mkdir(exist_ok=True)
        for service in self._services():  # in order: the REST catalog needs PostgreSQL and the store
            if service is self.trino and self.settings.catalog == "jdbc":
                self._create_jdbc_catalog_tables()
            service.start()
        return self.info()

    def _create_jdbc_catalog_tables(self) -> None:
        """Iceberg's JDBC catalog tables in the catalog database. Trino's JDBC catalog expects them (it creates none,
        and fails `Cannot check and eventually update SQL schema` on a database without them); every other client
        here (Spark's catalog, pyiceberg's SqlCatalog) creates them when it first opens the catalog, as done here."""
        from lakestream.config import CatalogSettings
        from lakestream.read.query import pyiceberg_catalog

        pyiceberg_catalog(CatalogSettings(**self.info().catalog_config(self.settings.trino_catalog)))

    def down(self) -> None:
        """Stop every service by pid; data directories are kept. Safe when nothing runs."""
        self.trino.stop()
        self.connect.stop()
        self.registry.stop()
        self.rest_catalog.stop()
        self.objectstore.stop()
        self.broker.stop()
        self.mariadb.stop()
        self.postgres.stop()

    def status(self) -> dict[str, ServiceStatus]:
        """Each service by name: running, pid, port, healthy, persistence (the object store and the REST
        catalog also when they run without being asked for: an `up --storage s3` seen by a plain `status`)."""
        services = self._services()
        services += [
            s
            for s in (self.mariadb, self.objectstore, self.rest_catalog, self.registry, self.connect, self.trino)
            if s not in services and s.pid() is not None
        ]
        return {service.name: service.status() for service in services}

    def info(self) -> StackInfo:
        """Connection facts (valid whether or not the services currently run)."""
        s = self.settings
        return StackInfo(
            bootstrap_servers=self.broker.bootstrap_servers,
            pg_host=process.LOOPBACK,
            pg_port=s.pg_port,
            pg_user=s.pg_user,
            pg_password=s.pg_password,
            source_db=s.source_db,
            catalog_db=s.catalog_db,
            warehouse=self.warehouse,
            catalog_type=s.catalog,
            rest_uri=self.rest_catalog.uri if s.catalog == "rest" else None,
            s3_endpoint=self.objectstore.endpoint if s.storage == "s3" else None,
            s3_region=s.s3_region if s.storage == "s3" else None,
            s3_access_key=s.s3_access_key if s.storage == "s3" else None,
            s3_secret_key=s.s3_secret_key if s.storage == "s3" else None,
            kafka_sasl_bootstrap_servers=self.broker.sasl_bootstrap_servers,
            kafka_ca_location=str(self.broker.ca_location) if s.kafka_sasl_port else None,
            kafka_sasl_user=s.kafka_sasl_user if s.kafka_sasl_port else None,
            kafka_sasl_password_file=str(self.broker.sasl_password_file) if s.kafka_sasl_port else None,
            connect_url=self.connect.url if s.connect else None,
            mariadb_port=s.mariadb_port if s.source == "mariadb" else None,
            trino_uri=self.trino.uri if s.trino else None,
            trino_catalog=s.trino_catalog if s.trino else None,
            schema_registry_url=self.registry.url if s.registry else None,
        )
