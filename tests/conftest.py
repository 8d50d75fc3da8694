"""Shared fixtures that start real services. THE one place for them: add new ones in a section below.

Every fixture picks free ports at runtime (several test runs may share this machine) and keeps its
state in a fresh temporary directory that it removes afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg2
import pytest

from lakestream.stack import Stack, StackInfo, StackSettings
from lakestream.stack.process import free_ports

# ---------------------------------------------------------------------------------------------
# Order: with pytest-xdist (`make test`), the modules that take a minute or more go first
# ---------------------------------------------------------------------------------------------

# `--dist loadfile` hands modules to the workers in collection order: a long module collected last runs alone at the
# end while the other worker idles. Measured with `--durations` on this machine kind; order within a module is kept.
LONG_MODULES = (
    "engine/test_chaos.py",
    "demo/test_demo.py",
    "changes/test_change_feed.py",
    "dashboard/test_dashboard_browser.py",
    "storage/test_object_storage.py",
    "security/test_kafka_sasl_ssl.py",
    "snapshot/test_resnapshot.py",
    "verify/test_verify.py",
    "maintenance/test_maintenance_kills.py",
    "stack/test_broker_durability.py",
    "cli/test_clean_output.py",
    "capture/test_source_tables.py",
    "sink/test_dead_letter_replay.py",
    "process/test_fraud_example.py",
    "engine/test_cluster.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("dist", "no") == "no":
        return  # one process (or `make test-random`'s shuffled order): nothing to balance

    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0].removeprefix("tests/")
        return LONG_MODULES.index(path) if path in LONG_MODULES else len(LONG_MODULES)

    items.sort(key=rank)  # stable: the other modules keep their order


# ---------------------------------------------------------------------------------------------
# The JIT of every JVM the suite starts
# ---------------------------------------------------------------------------------------------

# Most JVMs a test starts (Spark sessions, `lakestream` commands, brokers, capture, Trino) live well under a minute and
# run little hot code, and HotSpot's C2 spends its CPU compiling code such a JVM barely runs again (docs/stack.md,
# "The pipeline's JIT"). On two cores shared by two workers, every JVM of the suite compiles with C1 only: through
# JAVA_TOOL_OPTIONS, inherited by each process the tests start, so no command line and no configuration under test
# changes. LAKESTREAM_TEST_JIT=tiered keeps the JVMs' default.
if os.environ.get("LAKESTREAM_TEST_JIT", "c1") == "c1":
    _tool_options = os.environ.get("JAVA_TOOL_OPTIONS", "")
    if "TieredStopAtLevel" not in _tool_options:
        os.environ["JAVA_TOOL_OPTIONS"] = f"{_tool_options} -XX:TieredStopAtLevel=1".strip()


# ---------------------------------------------------------------------------------------------
# State directories
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def service_dir_factory() -> Iterator[Callable[[str], Path]]:
    """Make fresh state directories for services; all are removed at the end of the session.

    Not under pytest's tmp_path: pytest keeps its base dir at mode 0700 (and resets it in every new
    session), but PostgreSQL runs as the `postgres` OS user and must be able to enter the directory.
    Short paths also keep PostgreSQL's Unix socket path under the kernel's 107-byte limit.
    """
    made: list[Path] = []

    def make(name: str) -> Path:
        path = Path(tempfile.mkdtemp(prefix=f"lakestream-{name}-"))
        path.chmod(0o711)
        made.append(path)
        return path

    yield make
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Local stack: PostgreSQL + Apache Kafka
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def stack_factory(service_dir_factory) -> Iterator[Callable[..., Stack]]:
    """Build (not start) independent `Stack`s on free ports; every one made is stopped at session end.

    Use it for tests that stop and restart services; everything else should share `stack`. With
    ``kafka_sasl=True`` the broker also opens its SASL_SSL listener on a free port.
    """
    made: list[Stack] = []

    def make(kafka_sasl: bool = False, **overrides) -> Stack:
        pg_port, kafka_port, sasl_port = free_ports(3)
        fields = {"pg_port": pg_port, "kafka_port": kafka_port, **overrides}
        if kafka_sasl:
            fields["kafka_sasl_port"] = sasl_port
        settings = StackSettings(state_dir=service_dir_factory("stack"), **fields)
        stack = Stack(settings)
        made.append(stack)
        return stack

    yield make
    for stack in made:
        stack.down()


@pytest.fixture(scope="session")
def stack(stack_factory) -> StackInfo:
    """The shared running stack (PostgreSQL + Apache Kafka, with its SASL_SSL listener), started once per
    session."""
    return stack_factory(kafka_sasl=True).up()


@pytest.fixture
def pg_conn(stack: StackInfo) -> Iterator[psycopg2.extensions.connection]:
    """An autocommit psycopg2 connection to the source database of the shared stack."""
    conn = psycopg2.connect(stack.pg_dsn())
    conn.autocommit = True
    try:
        yield conn
    finally:
        conn.close()


@pytest.fixture
def source_db(stack) -> Iterator[tuple[str, psycopg2.extensions.connection]]:
    """A fresh source database per test (its name, an autocommit connection), so each test owns its slot and
    publication; dropped afterwards with the slots left in it."""
    import uuid

    name = f"src_{uuid.uuid4().hex[:8]}"
    admin = psycopg2.connect(stack.pg_dsn())
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    conn = psycopg2.connect(stack.pg_dsn(name))
    conn.autocommit = True
    try:
        yield name, conn
    finally:
        conn.close()
        with admin.cursor() as cur:
            cur.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE database = %s AND NOT active",
                (name,),
            )
            cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()


# ---------------------------------------------------------------------------------------------
# MariaDB: a private server (binlog on, ROW, FULL images, GTIDs) beside the shared stack
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def mariadb(stack, service_dir_factory):
    """A running MariaDB server (`lakestream.stack.mariadb.MariaDBServer`) on a free loopback port with a state
    dir of its own, configured as `lakestream stack up --source mariadb` configures it; the user and password
    are the shared stack's. Stopped at session end."""
    from lakestream.stack.mariadb import MariaDBServer

    kafka_port = int(stack.bootstrap_servers.rsplit(":", 1)[1])
    (port,) = free_ports(1)
    server = MariaDBServer(
        StackSettings(
            state_dir=service_dir_factory("mariadb"),
            pg_port=stack.pg_port,
            kafka_port=kafka_port,
            source="mariadb",
            mariadb_port=port,
        )
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def mariadb_source(mariadb):
    """A fresh MariaDB database per test (its name, an autocommit PyMySQL connection to it); dropped afterwards."""
    import uuid

    name = f"src_{uuid.uuid4().hex[:8]}"
    mariadb.run_as_root(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci")
    conn = mariadb.connect(name)
    try:
        yield name, conn
    finally:
        conn.close()
        mariadb.run_as_root(f"DROP DATABASE IF EXISTS `{name}`")


def mariadb_database(server, dbname: str) -> dict:
    """The ``capture.database`` section for database ``dbname`` of a `MariaDBServer` (holds the password)."""
    s = server.settings
    return {
        "kind": "mariadb",
        "host": "127.0.0.1",
        "port": server.port,
        "dbname": dbname,
        "user": s.pg_user,
        "password": s.pg_password,
    }


# ---------------------------------------------------------------------------------------------
# Spark with the Iceberg runtime, on the shared stack's JDBC catalog
# ---------------------------------------------------------------------------------------------


def catalog_settings(info: StackInfo, name: str = "lake"):
    """The Iceberg catalog of a running stack (JDBC catalog in its PostgreSQL)."""
    from lakestream.config import CatalogSettings

    return CatalogSettings(
        name=name, uri=info.catalog_jdbc_uri(), user=info.pg_user, password=info.pg_password, warehouse=info.warehouse
    )


@pytest.fixture(scope="session")
def spark(stack: StackInfo):
    """One SparkSession per test process: local[2], modest memory, catalog `lake` on the shared stack."""
    from lakestream.config import SparkSettings
    from lakestream.runtime.spark import build_session

    session = build_session(catalog_settings(stack), SparkSettings(master="local[2]", driver_memory="1500m"))
    yield session
    session.stop()


def pipeline_config(stack: StackInfo, state_dir: Path, streams: list[dict], name: str = "test", **overrides):
    """A validated PipelineConfig for ``stack`` (top-level dict overrides are merged into the defaults)."""
    from lakestream.config import parse_config

    data = {
        "name": name,
        "kafka": {
            "bootstrap_servers": stack.bootstrap_servers,
            "group_id": f"lakestream-{name}",
            "client": {"session.timeout.ms": 6000},
        },
        "catalog": catalog_settings(stack).model_dump(mode="json") | {"password": stack.pg_password},
        "streams": streams,
        "engine": {"commit_interval_s": 0, "idle_poll_s": 0.2},
        "spark": {"master": "local[2]", "driver_memory": "1500m"},
        "state_dir": str(state_dir),
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return parse_config(data, "<test>")


@pytest.fixture
def pipeline_config_factory(stack: StackInfo, service_dir_factory):
    """Build a validated PipelineConfig for the shared stack: `make(streams=[...], **overrides)`."""

    def make(streams: list[dict], name: str = "test", **overrides):
        return pipeline_config(stack, service_dir_factory("state"), streams, name, **overrides)

    return make


def write_pipeline_yaml(config, stack: StackInfo, path: Path) -> Path:
    """Write ``config`` as a pipeline YAML file for the CLI (secrets are masked in a dump: put them back)."""
    import yaml

    data = config.model_dump(mode="json", exclude_none=True)
    data["catalog"]["password"] = stack.pg_password
    if "capture" in data:
        data["capture"]["database"]["password"] = stack.pg_password
    path.write_text(yaml.safe_dump(data))
    return path


def run_lakestream(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the real `lakestream` command in a new process; stdout and stderr are kept apart."""
    from lakestream.capture.process import LAKESTREAM_COMMAND

    return subprocess.run(
        [*LAKESTREAM_COMMAND, *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


# ---------------------------------------------------------------------------------------------
# Kafka helpers
# ---------------------------------------------------------------------------------------------


def produce_records(
    bootstrap: str,
    topic: str,
    records: list[tuple[bytes | str | None, bytes | str | None]],
    partition: int | None = None,
) -> None:
    """Produce (key, value) pairs to ``topic`` and wait for every delivery."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    failures: list[str] = []

    def on_delivery(err, _msg):
        if err is not None:
            failures.append(str(err))

    for key, value in records:
        kwargs = {"partition": partition} if partition is not None else {}
        producer.produce(topic, key=key, value=value, on_delivery=on_delivery, **kwargs)
        producer.poll(0)
    producer.flush(30)
    assert not failures, failures


def load_debezium_fixture(name: str = "debezium_events.jsonl") -> list[dict]:
    """Genuine Debezium events recorded by tests/capture (see tests/data)."""
    import json

    path = Path(__file__).parent / "data" / name
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------
# Spark standalone cluster on loopback: a master and one worker from pyspark's own spark-class
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def spark_cluster(service_dir_factory) -> Iterator[str]:
    """``spark://127.0.0.1:PORT`` of a standalone master with one worker (1 core, 1 GiB): executors
    are separate JVMs and Python workers, so nothing can lean on state local to the driver."""
    import os
    import socket
    import subprocess
    import sys
    import time

    import pyspark

    home = Path(pyspark.__file__).parent
    work = service_dir_factory("cluster")
    master_port, web_port, worker_web = free_ports(3)
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOG_DIR": str(work),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_WORKER_DIR": str(work / "worker"),
    }
    spark_class = str(home / "bin" / "spark-class")
    url = f"spark://127.0.0.1:{master_port}"
    procs = [
        subprocess.Popen(
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(master_port),
                "--webui-port",
                str(web_port),
            ],
            env=env,
            stdout=open(work / "master.log", "wb"),
            stderr=subprocess.STDOUT,
        )
    ]
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", master_port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline or procs[0].poll() is not None:
                raise RuntimeError(f"Spark master did not start: {(work / 'master.log').read_text()[-2000:]}") from None
            time.sleep(0.5)
    procs.append(
        subprocess.Popen(
            [
                spark_class,
                "org.apache.spark.deploy.worker.Worker",
                url,
                "--host",
                "127.0.0.1",
                "--cores",
                "1",
                "--memory",
                "1g",
                "--webui-port",
                str(worker_web),
            ],
            env=env,
            stdout=open(work / "worker.log", "wb"),
            stderr=subprocess.STDOUT,
        )
    )
    deadline = time.monotonic() + 60
    while b"Successfully registered with master" not in (work / "worker.log").read_bytes():
        if time.monotonic() > deadline or procs[1].poll() is not None:
            raise RuntimeError(f"Spark worker did not register: {(work / 'worker.log').read_text()[-2000:]}")
        time.sleep(0.5)
    try:
        yield url
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


# ---------------------------------------------------------------------------------------------
# Schema Registry: Apicurio Registry 3.x (lakestream.stack.registry), Confluent's API at /apis/ccompat/v7
# ---------------------------------------------------------------------------------------------


class RegistryUnderTest:
    """A running Apicurio Registry and what the tests ask of it: ``url`` (Confluent-compatible), ``user_info``,
    ``requests(method, prefix)`` (counted in its access log) and ``versions(subject)`` (ids, oldest first)."""

    def __init__(self, service):
        self.service = service
        self.url = service.url
        self.user_info = service.user_info

    def _get(self, path: str):
        import base64
        import urllib.request

        request = urllib.request.Request(f"{self.url}{path}")
        if self.user_info:
            request.add_header("Authorization", "Basic " + base64.b64encode(self.user_info.encode()).decode())
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def requests(self, method: str, prefix: str) -> int:
        """How many requests of ``method`` to paths under the Confluent API starting with ``prefix`` it served."""
        import time

        from lakestream.stack.registry import CCOMPAT_PATH

        needle = f'method="{method}" path="{CCOMPAT_PATH}{prefix}'
        # The access log's line is written as the response completes, a moment after the client has it: read
        # until two reads a quarter second apart agree.
        count, deadline = -1, time.monotonic() + 5
        while time.monotonic() < deadline:
            now = self.service.log_path.read_text(errors="replace").count(needle)
            if now == count:
                break
            count = now
            time.sleep(0.25)
        return count

    def subjects(self) -> list[str]:
        return self._get("/subjects")

    def versions(self, subject: str) -> list[int]:
        """The schema ids of ``subject``'s versions, oldest first ([] for an unknown subject)."""
        import urllib.error
        from urllib.parse import quote

        try:
            numbers = self._get(f"/subjects/{quote(subject, safe='')}/versions")
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return []
            raise
        return [self._get(f"/subjects/{quote(subject, safe='')}/versions/{n}")["id"] for n in sorted(numbers)]


def _start_registry(service_dir_factory, name: str, user_info: str | None):
    from lakestream.stack.registry import SchemaRegistry

    service = SchemaRegistry(
        service_dir_factory(name), free_ports(1)[0], user_info=user_info, access_log=True, compatibility="BACKWARD"
    )
    service.start()
    return service


@pytest.fixture(scope="session")
def schema_registry(service_dir_factory):
    """Apicurio Registry on a free loopback port, open (no credentials), BACKWARD by default as Confluent's is;
    one for the session (tests use subjects of their own)."""
    service = _start_registry(service_dir_factory, "registry", None)
    try:
        yield RegistryUnderTest(service)
    finally:
        service.stop()


@pytest.fixture(scope="session")
def secured_schema_registry(service_dir_factory):
    """Apicurio Registry that demands HTTP basic auth; ``.user_info`` holds the credentials (user:password)."""
    import uuid

    service = _start_registry(service_dir_factory, "registry-auth", f"lakestream:pw-{uuid.uuid4().hex}")
    try:
        yield RegistryUnderTest(service)
    finally:
        service.stop()


# ---------------------------------------------------------------------------------------------
# Object storage (versitygw, S3-compatible) and Iceberg REST catalogs, beside the shared stack
# ---------------------------------------------------------------------------------------------


def _satellite_settings(stack: StackInfo, state_dir: Path, **overrides) -> StackSettings:
    """Settings for services that join the shared stack (its PostgreSQL holds their catalogs)."""
    kafka_port = int(stack.bootstrap_servers.rsplit(":", 1)[1])
    s3_port, rest_port = free_ports(2)
    fields = {"s3_port": s3_port, "rest_port": rest_port, **overrides}
    return StackSettings(state_dir=state_dir, pg_port=stack.pg_port, kafka_port=kafka_port, **fields)


def _restartable_port() -> int:
    """A free loopback port below the kernel's ephemeral range: a service stopped for a while can take it
    back, where a port from the ephemeral range may meanwhile be some client connection's local port."""
    import random

    from lakestream.stack.process import port_is_free

    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(200):
        port = rng.randint(20_000, max(20_001, low - 1))
        if port_is_free(port):
            return port
    raise RuntimeError("no free port below the ephemeral range")


@pytest.fixture(scope="session")
def object_store(stack, service_dir_factory):
    """A running S3-compatible store (Versity's S3 gateway) on a free loopback port (objects on disk), its
    bucket created.

    ``.endpoint``, ``.warehouse`` (``s3://<bucket>/warehouse``), ``.settings`` (key, secret, region);
    ``.stop()``/``.start()`` make an outage that loses nothing (on the same port)."""
    from lakestream.stack.objectstore import ObjectStore

    store = ObjectStore(
        _satellite_settings(stack, service_dir_factory("s3"), storage="s3", s3_port=_restartable_port())
    )
    store.start()
    try:
        yield store
    finally:
        store.stop()


def storage_section(store) -> dict:
    """The pipeline config's ``storage`` section for ``store``; export `storage_env(store)` for it."""
    from lakestream.stack.objectstore import ACCESS_KEY_ENV, SECRET_KEY_ENV

    return {
        "endpoint": store.endpoint,
        "region": store.settings.s3_region,
        "path_style": True,
        "access_key_id_env": ACCESS_KEY_ENV,
        "secret_access_key_env": SECRET_KEY_ENV,
    }


def storage_env(store) -> dict[str, str]:
    from lakestream.stack.objectstore import ACCESS_KEY_ENV, SECRET_KEY_ENV

    return {ACCESS_KEY_ENV: store.settings.s3_access_key, SECRET_KEY_ENV: store.settings.s3_secret_key}


@pytest.fixture(scope="session")
def rest_catalog_factory(stack, service_dir_factory):
    """Start Iceberg REST catalog servers over JDBC catalogs in the shared PostgreSQL
    (`lakestream.stack.rest_catalog`): ``make(warehouse, store=None, credential=None, vend=False, tls=False)``;
    each is stopped at session end. Apache Iceberg's own server (RESTCatalogServer) unless ``tls`` asks for https,
    which only the server written here serves (it also checks ``credential``, which Iceberg's accepts unchecked).
    With ``store`` the server's FileIO is S3FileIO on that store; ``vend`` makes it hand the store's credentials
    to clients that load a table; ``tls`` serves https with a certificate of its own CA (``server.ca_bundle``)."""
    from lakestream.stack.rest_catalog import IcebergRestServer, RestCatalogServer

    made: list = []

    def make(
        warehouse: str,
        store=None,
        credential: str | None = None,
        vend: bool = False,
        backend: str = "rest_backend",
        tls: bool = False,
    ):
        io: dict[str, str] = {}
        if store is not None:
            s = store.settings
            io = {
                "io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
                "s3.endpoint": store.endpoint,
                "s3.path-style-access": "true",
                "client.region": s.s3_region,
                "s3.access-key-id": s.s3_access_key,
                "s3.secret-access-key": s.s3_secret_key,
            }
        settings = _satellite_settings(stack, service_dir_factory("rest"), catalog="rest")
        if tls:
            vended = {k: v for k, v in io.items() if k != "io-impl"} if vend else {}
            server = RestCatalogServer(
                settings,
                warehouse=warehouse,
                io_properties=io,
                credential=credential,
                vend=vended,
                backend=backend,
                tls=True,
            )
        else:
            server = IcebergRestServer(settings, warehouse=warehouse, io_properties=io, vend=vend, backend=backend)
        made.append(server)
        server.start()
        return server

    yield make
    for server in made:
        server.stop()


# ---------------------------------------------------------------------------------------------
# Kafka Connect: one worker (distributed mode, Debezium's PostgreSQL connector) on the shared broker
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def connect_worker(stack, service_dir_factory):
    """A running Kafka Connect worker on the shared stack's broker (`lakestream.stack.connect`), one per test
    module, with a group (and internal topics) of its own. Its REST port is below the ephemeral range, so
    ``kill()`` then ``start()`` brings it back on the same port."""
    import uuid

    from lakestream.stack.connect import ConnectWorker

    settings = _satellite_settings(
        stack,
        service_dir_factory("connect"),
        connect=True,
        connect_port=_restartable_port(),
        connect_group_id=f"lakestream-connect-{uuid.uuid4().hex[:8]}",
    )
    worker = ConnectWorker(settings, stack.bootstrap_servers)
    worker.start()
    try:
        yield worker
    finally:
        worker.stop()


def simulate_death(pipeline) -> None:
    """What is left of a pipeline whose process died: nothing closed or saved by it (no ``close()``: held
    files are not committed, nothing is flushed, files in flight are not deleted). Only what the operating
    system ends with a process ends here: its sockets, and the write job still running on its thread (waited
    for; a dead process's job stops with it and leaves orphan files)."""
    pool = getattr(pipeline.prefetch, "_pool", None)
    if pool is not None:
        pool.shutdown(wait=True)
    pipeline.kafka.close()
