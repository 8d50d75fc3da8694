"""The local stack's broker: Apache Kafka in KRaft mode, one process as both broker and controller.

Its jars come from ``org.apache.kafka:kafka_2.13`` by coordinates (``lakestream/runtime/jars.toml``, group ``kafka``).
The storage is formatted once (a cluster id and the metadata log under ``<state_dir>/kafka/data``); topics
persist across restarts and SIGKILLs as on any Kafka broker (the log is recovered at start). The pipeline
only ever sees ``bootstrap.servers`` and runs unchanged against any Kafka cluster.

With ``StackSettings.kafka_sasl_port`` the broker also listens for SASL_SSL (SCRAM-SHA-512 over TLS, a
certificate of the stack's own CA in ``<state_dir>/kafka/tls``) and enforces ACLs (KRaft's
StandardAuthorizer) for the principals of that listener. The PLAINTEXT and controller listeners' principal
(``User:ANONYMOUS``) is a super user, so PLAINTEXT clients keep working as without ACLs. The stack's SCRAM
user (``kafka_sasl_user``) may do anything on every topic, group and transactional id; its password is
generated once and kept in ``<state_dir>/kafka/sasl/<user>.password`` (mode 0600), never logged.
"""

from __future__ import annotations

import base64
import logging
import os
import secrets
import shutil
import uuid
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from lakestream.errors import StackError
from lakestream.runtime import jars
from lakestream.stack import process, tls
from lakestream.stack.models import StackSettings

log = logging.getLogger(__name__)

# The broker's own log4j2 configuration: INFO to its log file (the process's stdout), Kafka's noisiest
# loggers at WARN.
_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.target = SYSTEM_OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
logger.state.name = state.change.logger
logger.state.level = warn
logger.request.name = kafka.request.logger
logger.request.level = warn
logger.cleaner.name = kafka.log.LogCleaner
logger.cleaner.level = warn
logger.logs.name = org.apache.kafka.storage.internals.log
logger.logs.level = warn
logger.coordinator.name = org.apache.kafka.coordinator
logger.coordinator.level = warn
"""


def kafka_healthy(bootstrap_servers: str, timeout: float = 3.0) -> bool:
    """True if a broker answers a metadata request (AdminClient.list_topics) within ``timeout``."""
    # log_level 0: librdkafka would otherwise print connection-refused lines while we poll.
    admin = AdminClient({"bootstrap.servers": bootstrap_servers, "log_level": 0})
    try:
        admin.list_topics(timeout=timeout)
        return True
    except KafkaException:
        return False


def upsert_scram_user(bootstrap_servers: str, user: str, password: str, timeout: float = 30.0) -> None:
    """Create SCRAM-SHA-512 credentials for ``user`` (or replace its password), through a super user's
    listener (the stack's PLAINTEXT one)."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    upsertion = UserScramCredentialUpsertion(
        user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), password.encode()
    )
    for future in admin.alter_user_scram_credentials([upsertion], request_timeout=timeout).values():
        future.result(timeout=timeout)


def allow(
    bootstrap_servers: str,
    user: str,
    resources: list[tuple[ResourceType, str]],
    operation: AclOperation = AclOperation.ALL,
    timeout: float = 30.0,
) -> None:
    """Grant ``User:<user>`` ``operation`` on each (resource type, literal name; ``"*"`` is every one),
    through a super user's listener. Granting what is granted already changes nothing."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    bindings = [
        AclBinding(kind, name, ResourcePatternType.LITERAL, f"User:{user}", "*", operation, AclPermissionType.ALLOW)
        for kind, name in resources
    ]
    for future in admin.create_acls(bindings, request_timeout=timeout).values():
        future.result(timeout=timeout)


def java_binary() -> str:
    """The java of JAVA_HOME, else the one on PATH (the broker and the Connect worker run on it)."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists():
        raise StackError("java not found: install a JDK 17+ (apt-get install openjdk-17-jdk-headless) or set JAVA_HOME")
    return java


class KafkaBroker(process.PidService):
    """Apache Kafka on 127.0.0.1:<kafka_port> (PLAINTEXT) with its KRaft controller on
    127.0.0.1:<kafka_controller_port>, and SASL_SSL on 127.0.0.1:<kafka_sasl_port> when asked; tracked by a
    pid file."""

    name = "kafka"
    persistent = True
    start_timeout = 60.0
    # A clean stop writes the logs' recovery points; past this the broker is SIGKILLed (it recovers its
    # logs at the next start, losing nothing it acknowledged with acks=all on this single node... once
    # flushed by the OS; see docs/stack.md).
    stop_timeout = 30.0

    def __init__(self, settings: StackSettings):
        self.settings = settings
        self.dir = settings.state_dir / "kafka"
        self.data_dir = self.dir / "data"
        self.log_path = settings.state_dir / "logs" / f"{self.name}.log"
        self.pid_file = process.PidFile(settings.state_dir / "pids" / f"{self.name}.pid", "java")

    @property
    def port(self) -> int:
        return self.settings.kafka_port

    @property
    def bootstrap_servers(self) -> str:
        return f"{process.LOOPBACK}:{self.port}"

    @property
    def controller_port(self) -> int:
        """The controller listener's port: the setting, or one chosen when the storage was formatted (kept
        in ``<state_dir>/kafka/controller.port`` so a restart finds the same quorum)."""
        if self.settings.kafka_controller_port:
            return self.settings.kafka_controller_port
        path = self.dir / "controller.port"
        if path.exists():
            return int(path.read_text().strip())
        port = process.free_port()
        self.dir.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{port}\n")
        return port

    @property
    def sasl_port(self) -> int:
        """The SASL_SSL listener's port; 0: none."""
        return self.settings.kafka_sasl_port

    @property
    def sasl_bootstrap_servers(self) -> str | None:
        return f"{process.LOOPBACK}:{self.sasl_port}" if self.sasl_port else None

    @property
    def tls_dir(self) -> Path:
        return self.dir / "tls"

    @property
    def ca_location(self) -> Path:
        """The PEM certificate of the CA that signed the SASL_SSL listener's (librdkafka's ``ssl.ca.location``)."""
        return self.tls_dir / "ca.pem"

    @property
    def sasl_password_file(self) -> Path:
        return self.dir / "sasl" / f"{self.settings.kafka_sasl_user}.password"

    def server_properties(self) -> dict[str, str]:
        """The broker's configuration: a single KRaft node on loopback, internal topics at replication 1."""
        loopback = process.LOOPBACK
        return {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{loopback}:{self.controller_port}",
            "listeners": f"PLAINTEXT://{loopback}:{self.port},CONTROLLER://{loopback}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{loopback}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir),
            # One node: every internal topic at replication factor 1 (Kafka's defaults ask for 3).
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            # A consumer group of one member need not wait 3 s for others to join.
            "group.initial.rebalance.delay.ms": "0",
            "num.partitions": "1",
            "auto.create.topics.enable": "true",
            **(self._sasl_ssl_properties() if self.sasl_port else {}),
        }

    def _sasl_ssl_properties(self) -> dict[str, str]:
        """The SASL_SSL listener (SCRAM-SHA-512, the stack's certificate) and ACLs enforced on it."""
        loopback = process.LOOPBACK
        cert = tls.ServerCertificate(keystore=self.tls_dir / "server.p12", ca_pem=self.ca_location)
        return {
            "listeners": f"PLAINTEXT://{loopback}:{self.port},CONTROLLER://{loopback}:{self.controller_port},"
            f"SASL_SSL://{loopback}:{self.sasl_port}",
            "advertised.listeners": f"PLAINTEXT://{loopback}:{self.port},SASL_SSL://{loopback}:{self.sasl_port}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL",
            "sasl.enabled.mechanisms": "SCRAM-SHA-512",
            # Per listener: the broker's SCRAM server needs a JAAS entry even though it holds no secret.
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(cert.keystore),
            "ssl.keystore.password": cert.keystore_password,
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            # PLAINTEXT and CONTROLLER authenticate nobody: their principal is ANONYMOUS. As a super user it
            # keeps inter-broker, controller and PLAINTEXT traffic working without any ACL.
            "super.users": "User:ANONYMOUS",
        }

    def _write_config(self) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "log4j2.properties").write_text(_LOG4J2)
        if self.sasl_port:
            tls.make_server_certificate(self.tls_dir, "lakestream local Kafka")
        path = self.dir / "server.properties"
        path.unlink(missing_ok=True)
        # Owner-only: with SASL_SSL it holds the keystore's password.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write("".join(f"{k}={v}\n" for k, v in self.server_properties().items()))
        return path

    def _format_storage(self, config: Path) -> None:
        """Format the KRaft storage once (a new cluster id); a formatted data dir is kept as it is."""
        if (self.data_dir / "meta.properties").exists():
            return
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        result = process.run_logged(
            [
                java_binary(),
                "-Xmx256m",
                "-cp",
                self._classpath(),
                "kafka.tools.StorageTool",
                "format",
                f"--cluster-id={cluster_id}",
                "--config",
                str(config),
            ],  # an id may start with "-"
            self.log_path,
        )
        if result != 0:
            raise StackError(
                f"formatting Kafka's storage in {self.data_dir} failed (exit {result})\n"
                f"--- {self.log_path} ---\n{process.log_tail(self.log_path)}"
            )

    def _classpath(self) -> str:
        return os.pathsep.join(str(j) for j in jars.jars("kafka"))

    def argv(self) -> list[str]:
        config = self._write_config()
        self._format_storage(config)
        heap = os.environ.get("LAKESTREAM_KAFKA_HEAP", "512m")
        return [
            java_binary(),
            f"-Xmx{heap}",
            f"-Xms{heap}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={(self.dir / 'log4j2.properties').as_uri()}",
            f"-Dkafka.logs.dir={self.dir / 'logs'}",
            "-cp",
            self._classpath(),
            "kafka.Kafka",
            str(config),
        ]

    def start(self) -> None:
        """Start the broker unless it runs; wait until it answers metadata requests."""
        if self.pid() is None:
            self.check_port_free()
            argv = self.argv()
            log.info("starting Apache Kafka on %s", self.bootstrap_servers)
            pid = process.spawn_detached(argv, self.log_path, cwd=self.dir)
            self.pid_file.write(pid)
            process.wait_until(
                lambda: not process.pid_alive(pid) or process.port_accepts(self.port), self.start_timeout
            )
            if not process.pid_alive(pid) or not process.port_accepts(self.port):
                alive = process.pid_alive(pid)
                why = f"did not listen within {self.start_timeout:.0f}s" if alive else "exited during startup"
                self.stop(timeout=5)
                raise StackError(
                    f"Kafka on {self.bootstrap_servers} {why}\n"
                    f"--- {self.log_path} ---\n{process.log_tail(self.log_path)}"
                )
        if not process.wait_until(self.healthy, 30.0, 0.2):
            raise StackError(
                f"Kafka on {self.bootstrap_servers} does not answer metadata requests\n"
                f"--- {self.log_path} ---\n{process.log_tail(self.log_path)}"
            )
        if not process.wait_until(self.coordinator_ready, 30.0, 0.2):
            raise StackError(
                f"Kafka on {self.bootstrap_servers} has no group coordinator after 30 s\n"
                f"--- {self.log_path} ---\n{process.log_tail(self.log_path)}"
            )
        if self.sasl_port:
            self._provision_sasl_user()

    def sasl_password(self) -> str:
        """The stack's SCRAM user's password, generated (and kept, mode 0600) the first time it is asked for."""
        path = self.sasl_password_file
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_urlsafe(24) + "\n")
        return path.read_text().strip()

    def _provision_sasl_user(self) -> None:
        """The stack's SCRAM user and its ACLs (both kept in the metadata log; re-applying them is harmless),
        then wait until that user can ask for metadata over SASL_SSL."""
        user = self.settings.kafka_sasl_user
        try:
            upsert_scram_user(self.bootstrap_servers, user, self.sasl_password())
            allow(
                self.bootstrap_servers,
                user,
                [
                    (ResourceType.TOPIC, "*"),
                    (ResourceType.GROUP, "*"),
                    (ResourceType.TRANSACTIONAL_ID, "*"),
                    (ResourceType.BROKER, "kafka-cluster"),
                ],
            )
        except KafkaException as exc:
            raise StackError(
                f"creating the SCRAM user {user!r} or its ACLs on {self.bootstrap_servers} failed: {exc}"
            ) from None
        # The credential reaches the SASL_SSL listener once the broker applied the metadata record.
        if not process.wait_until(self.sasl_healthy, 30.0, 0.2):
            raise StackError(
                f"Kafka's SASL_SSL listener on {self.sasl_bootstrap_servers} does not answer user {user!r}\n"
                f"--- {self.log_path} ---\n{process.log_tail(self.log_path)}"
            )

    def sasl_healthy(self) -> bool:
        """True if the stack's SCRAM user gets metadata over SASL_SSL."""
        admin = AdminClient(
            {
                "bootstrap.servers": self.sasl_bootstrap_servers,
                "log_level": 0,
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.username": self.settings.kafka_sasl_user,
                "sasl.password": self.sasl_password(),
                "ssl.ca.location": str(self.ca_location),
            }
        )
        try:
            admin.list_topics(timeout=3.0)
            return True
        except KafkaException:
            return False

    def check_port_free(self) -> None:
        """Raise StackError naming the port and the setting if another process holds a port of the broker."""
        process.require_free_port(self.port, "Kafka", "--kafka-port / StackSettings.kafka_port")
        process.require_free_port(self.controller_port, "Kafka's controller", "StackSettings.kafka_controller_port")
        if self.sasl_port:
            process.require_free_port(self.sasl_port, "Kafka's SASL_SSL listener", "StackSettings.kafka_sasl_port")

    def healthy(self) -> bool:
        return kafka_healthy(self.bootstrap_servers)

    def coordinator_ready(self) -> bool:
        """True once a consumer group's coordinator answers. A new broker creates ``__consumer_offsets`` on the
        first such request and answers COORDINATOR_LOAD_IN_PROGRESS / NOT_COORDINATOR while it loads: the stack
        is up only when a pipeline's first offset lookup would succeed, as on a running cluster."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(
            {"bootstrap.servers": self.bootstrap_servers, "group.id": "lakestream-stack-probe", "log_level": 0}
        )
        try:
            consumer.committed([TopicPartition("lakestream-stack-probe", 0)], timeout=2)
            return True
        except KafkaException:
            return False
        finally:
            consumer.close()

    @property
    def detail(self) -> str:
        return f"Apache Kafka (KRaft), data in {self.data_dir}"


def make_broker(settings: StackSettings) -> KafkaBroker:
    """The stack's broker."""
    return KafkaBroker(settings)
