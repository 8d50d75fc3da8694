"""The local stack's Kafka Connect worker: one worker in distributed mode, Debezium's PostgreSQL connector
installed as a plugin, on the stack's broker.

It is the shape most deployments run Debezium in: the connector configuration that `lakestream capture
--print-connector-config` prints is posted to its REST API (``POST /connectors``), and the connector's source
offsets, its configuration and its status live in Kafka topics (``<group>-offsets``, ``-configs``,
``-status``), so a restart (even after a SIGKILL) resumes from the last offsets flushed, re-sending what came
after them. The worker's jars come from ``org.apache.kafka:connect-runtime`` (group ``connect`` of
``lakestream/runtime/jars.toml``) at the broker's Kafka version, the connector's from its own coordinates (group
``connect-debezium-postgres``), linked as one directory under ``plugin.path``; Apicurio Registry's Avro converter
(group ``connect-apicurio-converter``) is a second plugin there.

Secrets stay out of connector configurations: the worker has Kafka's ``FileConfigProvider`` as ``file``, so a
configuration says ``${file:<path>:database.password}`` and the worker reads the value from that file.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

from lakestream.errors import StackError
from lakestream.runtime import jars
from lakestream.stack import process
from lakestream.stack.broker import java_binary
from lakestream.stack.models import StackSettings

log = logging.getLogger(__name__)

# plugin.path directory name → the jars.toml group it links to.
PLUGINS = {
    "debezium-connector-postgres": "connect-debezium-postgres",
    # Apicurio Registry's Avro converter (`capture.avro_converter: apicurio`).
    "apicurio-registry-converter": "connect-apicurio-converter",
}
# ServiceLoader entries a plugin's jars lack: with plugin.discovery=service_load the worker finds only plugins its
# jars declare, and Apicurio's converter jar declares none. A one-file jar beside the plugin's declares them.
PLUGIN_SERVICES = {
    "apicurio-registry-converter": {
        "org.apache.kafka.connect.storage.Converter": "io.apicurio.registry.utils.converter.AvroConverter",
    },
}

_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.target = SYSTEM_OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
logger.kafka.name = org.apache.kafka
logger.kafka.level = warn
logger.runtime.name = org.apache.kafka.connect.runtime
logger.runtime.level = info
logger.sourcetask.name = org.apache.kafka.connect.runtime.WorkerSourceTask
logger.sourcetask.level = warn
logger.reflections.name = org.reflections
logger.reflections.level = error
logger.jetty.name = org.eclipse.jetty
logger.jetty.level = warn
"""


def _plugin_with_services(directory: Path, jars_dir: Path, services: dict[str, str]) -> None:
    """``directory``: links to the jars of ``jars_dir`` and a jar of ServiceLoader files (interface → class)."""
    if directory.is_symlink():
        directory.unlink()
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    for jar in sorted(jars_dir.glob("*.jar")):
        (directory / jar.name).symlink_to(jar)
    with zipfile.ZipFile(directory / "lakestream-plugin-services.jar", "w") as services_jar:
        for interface, implementation in services.items():
            services_jar.writestr(f"META-INF/services/{interface}", implementation + "\n")


class ConnectError(StackError):
    """The Connect worker refused a request: its REST API's status code (``status``) and message."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class ConnectWorker(process.PidService):
    """A Kafka Connect worker (distributed mode) with its REST API on 127.0.0.1:<connect_port>, tracked by a
    pid file."""

    name = "connect"
    persistent = True  # its state is in the broker's topics
    start_timeout = 120.0
    # A clean stop commits the source offsets and leaves the group; past this the worker is SIGKILLed.
    stop_timeout = 30.0

    def __init__(self, settings: StackSettings, bootstrap_servers: str):
        self.settings = settings
        self.bootstrap_servers = bootstrap_servers
        self.dir = settings.state_dir / "connect"
        self.log_path = settings.state_dir / "logs" / f"{self.name}.log"
        self.pid_file = process.PidFile(settings.state_dir / "pids" / f"{self.name}.pid", "java")

    @property
    def port(self) -> int:
        return self.settings.connect_port

    @property
    def url(self) -> str:
        """The worker's REST API."""
        return f"http://{process.LOOPBACK}:{self.port}"

    @property
    def group_id(self) -> str:
        return self.settings.connect_group_id

    @property
    def plugin_path(self) -> Path:
        return self.dir / "plugins"

    def worker_properties(self) -> dict[str, str]:
        """The worker's configuration: one distributed worker, internal topics at replication 1."""
        group = self.group_id
        return {
            "bootstrap.servers": self.bootstrap_servers,
            "group.id": group,
            "config.storage.topic": f"{group}-configs",
            "offset.storage.topic": f"{group}-offsets",
            "status.storage.topic": f"{group}-status",
            "config.storage.replication.factor": "1",
            "offset.storage.replication.factor": "1",
            "status.storage.replication.factor": "1",
            "key.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "listeners": f"http://{process.LOOPBACK}:{self.port}",
            "rest.advertised.host.name": process.LOOPBACK,
            "rest.advertised.port": str(self.port),
            "plugin.path": str(self.plugin_path),
            # Kafka's own jars and Debezium's carry ServiceLoader manifests: no reflective scan of every jar
            # (seconds of a core at each start).
            "plugin.discovery": "service_load",
            # Offsets flushed every second (Connect's default: 60 s): after a crash Debezium re-sends the
            # changes since the last flush, so a shorter interval re-sends less.
            "offset.flush.interval.ms": "1000",
            # One worker: a worker that left (a SIGKILL) comes back as a new member; without a delay its
            # connector is assigned to it at once instead of after the 5 minutes Connect waits by default for
            # the old member to return.
            "scheduled.rebalance.max.delay.ms": "0",
            "session.timeout.ms": "6000",
            "heartbeat.interval.ms": "2000",
            "config.providers": "file",
            "config.providers.file.class": "org.apache.kafka.common.config.provider.FileConfigProvider",
        }

    def _write_config(self) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "log4j2.properties").write_text(_LOG4J2)
        self._link_plugins()
        path = self.dir / "worker.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in self.worker_properties().items()))
        return path

    def _link_plugins(self) -> None:
        """``plugin.path`` holds one directory per plugin (Debezium's connector, Apicurio's converter), each
        linked to its resolved jars."""
        self.plugin_path.mkdir(parents=True, exist_ok=True)
        for name, group in PLUGINS.items():
            target = jars.jars(group)[0].parent
            if name in PLUGIN_SERVICES:
                _plugin_with_services(self.plugin_path / name, target, PLUGIN_SERVICES[name])
                continue
            link = self.plugin_path / name
            if link.is_symlink() and Path(os.readlink(link)) == target:
                continue
            link.unlink(missing_ok=True)
            link.symlink_to(target, target_is_directory=True)

    def argv(self) -> list[str]:
        config = self._write_config()
        heap = os.environ.get("LAKESTREAM_CONNECT_HEAP", "512m")
        classpath = os.pathsep.join(str(j) for j in jars.jars("connect"))
        return [
            java_binary(),
            f"-Xmx{heap}",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={(self.dir / 'log4j2.properties').as_uri()}",
            "-cp",
            classpath,
            "org.apache.kafka.connect.cli.ConnectDistributed",
            str(config),
        ]

    def check_port_free(self) -> None:
        process.require_free_port(self.port, "Kafka Connect's REST API", "--connect-port / StackSettings.connect_port")

    def start(self) -> None:
        """Start the worker unless it runs; wait until its REST API says it is ready (it joined its group and
        read its configuration topic)."""
        pid = self.pid()
        if pid is None:
            self.check_port_free()
            argv = self.argv()
            log.info("starting Kafka Connect on %s", self.url)
            # This pid, not the pid file's: until the child has exec'ed java, the pid file reads as stale.
            pid = process.spawn_detached(argv, self.log_path, cwd=self.dir)
            self.pid_file.write(pid)
        process.wait_until(lambda: not process.pid_alive(pid) or self.healthy(), self.start_timeout, 0.5)
        if not self.healthy():
            alive = process.pid_alive(pid)
            why = f"is not ready after {self.start_timeout:.0f}s" if alive else "exited during startup"
            if alive:
                process.stop_pid(pid, timeout=5)
            self.pid_file.remove()
            raise StackError(
                f"Kafka Connect on {self.url} {why}\n--- {self.log_path} ---\n{process.log_tail(self.log_path)}"
            )

    def healthy(self) -> bool:
        """True once ``GET /health`` answers 200: the worker joined its group and can take requests."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=3) as response:
                return response.status == 200
        except (OSError, urllib.error.URLError):
            return False

    @property
    def detail(self) -> str:
        return f"Kafka Connect (distributed, group {self.group_id}), REST {self.url}"

    # -- the REST API --------------------------------------------------------------------------------------

    def request(self, method: str, path: str, body: dict[str, Any] | None = None, timeout: float = 30.0) -> Any:
        """One REST call; its JSON answer (None when empty). ConnectError with the worker's message when it
        refuses."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"{self.url}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            try:
                detail = json.loads(detail).get("message", detail)
            except (ValueError, AttributeError):
                pass
            raise ConnectError(f"Kafka Connect {method} {path}: {exc.code} {detail}", exc.code) from None
        return json.loads(text) if text.strip() else None

    def create_connector(self, doc: dict[str, Any]) -> dict[str, Any]:
        """``POST /connectors`` with ``{"name", "config"[, "initial_state"]}`` as `--print-connector-config`
        prints it."""
        return self.request("POST", "/connectors", doc)

    def connector_status(self, name: str) -> dict[str, Any] | None:
        """``GET /connectors/<name>/status`` (None if there is no such connector)."""
        try:
            return self.request("GET", f"/connectors/{urllib.parse.quote(name, safe='')}/status")
        except ConnectError as exc:
            if exc.status == 404:
                return None
            raise

    def delete_connector(self, name: str) -> None:
        try:
            self.request("DELETE", f"/connectors/{urllib.parse.quote(name, safe='')}")
        except ConnectError as exc:
            if exc.status != 404:
                raise
