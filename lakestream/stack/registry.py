"""The local stack's Schema Registry: Apicurio Registry 3.x, in memory, with Confluent's API at /apis/ccompat/v7.

Apicurio Registry is a Quarkus application; Maven Central serves its runnable ``all`` assembly
(``[distributions.apicurio-registry]`` in ``lakestream/runtime/jars.toml``), unpacked into the cache and started with
``java -jar quarkus-run.jar``. Its class files are Java 21's: it runs on a JDK 21+ (``LAKESTREAM_REGISTRY_JAVA_HOME``,
else the machine's Temurin 25). Storage is in memory, as in Apicurio's default: schemas live as long as the process.

Clients speak Confluent's Schema Registry API to ``url`` (``<root>/apis/ccompat/v7``): Confluent's serializer and
converter in `lakestream capture` (``capture.format: avro``), confluent-kafka's client in the pipeline's decoder,
and Apicurio's own Kafka Connect converter in its Confluent-compatible mode. With ``user_info`` (``user:password``)
the registry asks for HTTP basic authentication (Quarkus's embedded users, one user with Apicurio's admin role);
the password goes to a configuration file readable by its owner only, never to argv.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import urllib.error
import urllib.request
from base64 import b64encode
from pathlib import Path

from lakestream.errors import StackError
from lakestream.runtime import jars
from lakestream.stack import process

log = logging.getLogger(__name__)

DISTRIBUTION = "apicurio-registry"
CCOMPAT_PATH = "/apis/ccompat/v7"
MIN_JAVA = 21
JAVA_HOME_ENV = "LAKESTREAM_REGISTRY_JAVA_HOME"
JAVA_HOMES = ("/usr/lib/jvm/temurin-25-jdk-amd64",)


def java_binary() -> str:
    """A java that runs Apicurio Registry: ``LAKESTREAM_REGISTRY_JAVA_HOME``'s, else the Temurin 25, else
    JAVA_HOME's or the one on PATH when it is 21 or newer."""
    candidates = [os.environ[JAVA_HOME_ENV]] if os.environ.get(JAVA_HOME_ENV) else list(JAVA_HOMES)
    found = [str(Path(home) / "bin" / "java") for home in candidates]
    if not os.environ.get(JAVA_HOME_ENV):
        if os.environ.get("JAVA_HOME"):
            found.append(str(Path(os.environ["JAVA_HOME"]) / "bin" / "java"))
        found.append("java")
    for java in found:
        if _java_major(java) >= MIN_JAVA:
            return java
    raise StackError(
        f"no Java {MIN_JAVA}+ runtime for Apicurio Registry (tried {', '.join(found)}) — fix: install a JDK "
        f"{MIN_JAVA} or newer and set {JAVA_HOME_ENV} to its home"
    )


def _java_major(java: str) -> int:
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    except OSError:
        return 0
    found = re.search(r'version "(\d+)', out)
    return int(found.group(1)) if found else 0


class SchemaRegistry(process.PidService):
    """Apicurio Registry on 127.0.0.1:<port>, tracked by a pid file."""

    name = "registry"
    persistent = False  # in-memory storage: a restart starts empty
    start_timeout = 120.0

    def __init__(
        self,
        state_dir: Path,
        port: int,
        user_info: str | None = None,
        access_log: bool = False,
        compatibility: str | None = "BACKWARD",
    ):
        """``access_log``: a line per request in its log; ``compatibility``: the global compatibility level set
        once it answers (Confluent's default, BACKWARD; Apicurio's own is NONE), or None to keep Apicurio's."""
        self.state_dir = state_dir
        self._port = port
        self.user_info = user_info
        self.access_log = access_log
        self.compatibility = compatibility
        self.dir = state_dir / "registry"
        self.log_path = state_dir / "logs" / f"{self.name}.log"
        self.pid_file = process.PidFile(state_dir / "pids" / f"{self.name}.pid", "java")

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        """The Confluent-compatible API: the URL Confluent's clients take as the registry's."""
        return f"http://{process.LOOPBACK}:{self.port}{CCOMPAT_PATH}"

    def check_port_free(self) -> None:
        process.require_free_port(self.port, "the Schema Registry", "--registry-port / StackSettings.registry_port")

    def _write_config(self) -> None:
        """Quarkus reads ``config/application.properties`` below its working directory."""
        lines = [
            f"quarkus.http.host={process.LOOPBACK}",
            f"quarkus.http.port={self.port}",
            # The management interface (health, metrics) is built in; on loopback, on a free port.
            f"quarkus.management.host={process.LOOPBACK}",
            "quarkus.management.port=0",
            f"quarkus.http.access-log.enabled={'true' if self.access_log else 'false'}",
            'quarkus.log.category."io.apicurio".level=WARN',
            "quarkus.otel.sdk.disabled=true",
        ]
        if self.user_info:
            user, _, password = self.user_info.partition(":")
            lines += [
                # Quarkus warns that this build-time property is fixed; without it no request is checked.
                "quarkus.http.auth.basic=true",
                "apicurio.authn.enabled=true",
                "apicurio.authn.mechanism.priority=basic",
                "quarkus.security.users.embedded.enabled=true",
                "quarkus.security.users.embedded.plain-text=true",
                f"quarkus.security.users.embedded.users.{user}={password}",
                f"quarkus.security.users.embedded.roles.{user}=sr-admin",
            ]
        config = self.dir / "config" / "application.properties"
        config.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("".join(f"{line}\n" for line in lines))

    def argv(self) -> list[str]:
        home = jars.distribution(DISTRIBUTION)
        heap = os.environ.get("LAKESTREAM_REGISTRY_HEAP", "384m")
        return [java_binary(), f"-Xmx{heap}", "-XX:+UseSerialGC", "-jar", str(home / "quarkus-run.jar")]

    def start(self) -> None:
        """Start the registry unless it runs; wait until its Confluent-compatible API answers."""
        pid = self.pid()
        if pid is None:
            self.check_port_free()
            argv = self.argv()
            self._write_config()
            log.info("starting Apicurio Registry on %s", self.url)
            pid = process.spawn_detached(argv, self.log_path, cwd=self.dir)
            self.pid_file.write(pid)
        process.wait_until(lambda: not process.pid_alive(pid) or self.healthy(), self.start_timeout, 0.3)
        if not self.healthy():
            alive = process.pid_alive(pid)
            why = f"is not ready after {self.start_timeout:.0f}s" if alive else "exited during startup"
            if alive:
                process.stop_pid(pid, timeout=5)
            self.pid_file.remove()
            raise StackError(
                f"Apicurio Registry on {self.url} {why}\n--- {self.log_path} ---\n{process.log_tail(self.log_path)}"
            )
        if self.compatibility:
            self._request("PUT", "/config", {"compatibility": self.compatibility})

    def _request(self, method: str, path: str, body: dict | None = None, timeout: float = 10) -> object:
        """One call of the Confluent-compatible API, with the credentials when it asks for them."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        request.add_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        if self.user_info:
            request.add_header("Authorization", "Basic " + b64encode(self.user_info.encode()).decode())
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read() or b"null")

    def healthy(self) -> bool:
        """True once ``GET <url>/subjects`` answers (with the credentials, when it asks for them)."""
        try:
            self._request("GET", "/subjects", timeout=3)
            return True
        except (OSError, urllib.error.URLError, ValueError):
            return False

    @property
    def detail(self) -> str:
        return f"Apicurio Registry, in memory; Confluent API {self.url}"
