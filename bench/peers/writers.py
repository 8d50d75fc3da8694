"""The writers of the named configurations (configs.py) as processes: how each is started on a topic and a table,
in its own process group (so that its CPU and memory are counted from /proc over all its processes, and a SIGKILL
takes all of it at once), and how each system's own maintenance compacts its table before the reads.

- ``lakestream``: `lakestream run` on a pipeline config with one upsert stream; compaction: `lakestream maintain`;
- ``flink-*``: bench/peers/flink_sink.py under PyFlink in ``.venv-peers`` (`make setup-peers` creates it);
  compaction: bench/peers/flink_compact.py (Iceberg's Flink rewrite action);
- ``spark-*``: bench/peers/spark_merge.py under this venv's pyspark, with Spark's Kafka source by coordinates;
  compaction: bench/peers/spark_compact.py (Iceberg's Spark procedures).

Every JVM gets the same heap, off-heap cap, JIT and local file system (configs.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from _common import ROOT, pipeline_data, write_pipeline_yaml
from configs import (
    COMMIT_INTERVAL_S,
    CONFIGS,
    HEAP,
    JVM_OPTIONS,
    KAFKA_FETCH,
    LOCAL_FS_CLASS,
    PeerConfig,
    config_named,
)
from sustained import tree_pids

from lakestream.runtime import jars
from lakestream.runtime.jvm_jars import local_fs_jar

SYSTEMS = tuple(CONFIGS)
NAMESPACE = "peers"
PEERS_VENV = Path(os.environ.get("LAKESTREAM_PEERS_VENV", ROOT / ".venv-peers"))
HERE = Path(__file__).resolve().parent


@dataclass
class Writer:
    """One configuration writing ``topic`` into ``NAMESPACE.<table>``; ``compact_argv`` is its system's own
    compaction of that table, run after the writer stopped."""

    system: str
    topic: str
    table: str
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    log_path: Path
    config: PeerConfig | None = None
    compact_argv: list[str] = field(default_factory=list)
    checkpoint: Path | None = None  # Spark's checkpoint directory (its offset and commit logs)
    group_id: str | None = None  # the consumer group Flink's Kafka source commits its offsets to
    proc: subprocess.Popen | None = None

    @property
    def qualified(self) -> str:
        return f"{NAMESPACE}.{self.table}"

    @property
    def kind(self) -> str:
        return self.config.system if self.config else self.system

    def start(self, note: str = "start") -> None:
        self.proc = self._spawn(self.argv, note)

    def _spawn(self, argv: list[str], note: str) -> subprocess.Popen:
        with open(self.log_path, "ab") as out:
            out.write(f"\n===== {time.strftime('%H:%M:%S')} {note} =====\n".encode())
            out.flush()
            return subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.cwd,
                env={**os.environ, **self.env},
            )

    def start_compaction(self) -> subprocess.Popen:
        """The system's own compaction of the table, as a process group of its own (the caller measures it)."""
        return self._spawn(self.compact_argv, "compaction")

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole process group, as a machine crash would."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(60)

    def pause(self, paused: bool) -> None:
        """SIGSTOP (``paused``) or SIGCONT to every process of the writer: its group and every descendant (PySpark's
        worker daemon makes a group of its own)."""
        if not self.alive:
            return
        for pid in tree_pids(self.proc.pid):
            try:
                os.kill(pid, signal.SIGSTOP if paused else signal.SIGCONT)
            except ProcessLookupError:
                pass

    def stop(self, timeout: float = 120) -> bool:
        """SIGTERM to the group (each system's own clean stop), SIGKILL after ``timeout``; True if it exited 0
        or by the SIGTERM."""
        if not self.alive:
            return False
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout) in (0, -signal.SIGTERM, 128 + signal.SIGTERM)
        except subprocess.TimeoutExpired:
            self.kill()
            return False

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def kafka_properties() -> str:
    return ",".join(f"{k}={v}" for k, v in KAFKA_FETCH.items())


def lakestream_writer(
    info, work: Path, topic: str, table: str, config: PeerConfig, schemas: bool, interval_s: float
) -> Writer:
    data = pipeline_data(
        info,
        work,
        f"peers-{table}",
        [{"topics": [topic], "mode": "upsert", "namespace": NAMESPACE, "table": table}],
        driver_memory=HEAP,
    )
    # The defaults, as a user runs it (pipeline_data's bench settings commit continuously), at the run's interval.
    data["engine"] = {"commit_interval_s": interval_s}
    data["spark"]["jit"] = config.settings.get("spark.jit", "tiered")
    data["spark"]["conf"] = {"spark.driver.extraJavaOptions": JVM_OPTIONS}
    # Schemas off: the decoder finds no {"schema", "payload"} wrapper and reads the event itself (decode/envelope.py).
    del schemas
    if config.settings.get("maintenance.mode") == "inline":
        data["maintenance"] = {"mode": "inline"}
    path = write_pipeline_yaml(work / "pipeline.yaml", data)
    # Compaction before the reads: `lakestream maintain` with a policy that takes the table now (the default waits
    # for a partition to be quiet for 10 minutes: a streaming table's hot partition is left to the inline rounds).
    compact = {**data, "maintenance": {"mode": "off", "policies": [{"compaction": {"quiet_time_s": 0}}]}}
    compact_path = write_pipeline_yaml(work / "maintain.yaml", compact)
    python = sys.executable
    return Writer(
        config.name,
        topic,
        table,
        [python, "-m", "lakestream", "run", str(path)],
        {},
        work,
        work / "writer.log",
        config=config,
        compact_argv=[python, "-m", "lakestream", "maintain", str(compact_path), "--table", f"{NAMESPACE}.{table}"],
    )


def hadoop_conf_dir(work: Path) -> Path:
    """A core-site.xml that gives Flink's Hadoop Configuration the bench's local file system."""
    directory = work / "hadoop-conf"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "core-site.xml").write_text(
        '<?xml version="1.0"?>\n<configuration>\n'
        f"  <property><name>fs.file.impl</name><value>{LOCAL_FS_CLASS}</value></property>\n"
        "</configuration>\n"
    )
    return directory


def flink_writer(
    info, work: Path, topic: str, table: str, config: PeerConfig, schemas: bool, interval_s: float
) -> Writer:
    python = PEERS_VENV / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"{python} is missing: `make setup-peers` creates it (scripts/peers_venv.sh)")
    flink_jars = jars.jars("bench-flink")
    connectors = ",".join(str(j) for j in flink_jars if j.name.startswith(("iceberg-", "flink-")))
    classpath = ",".join(
        [*(str(j) for j in flink_jars if not j.name.startswith(("iceberg-", "flink-"))), str(local_fs_jar())]
    )
    conf_dir = str(hadoop_conf_dir(work))
    common = [
        "--table",
        f"{NAMESPACE}.{table}",
        "--catalog-uri",
        info.catalog_jdbc_uri(),
        "--catalog-user",
        info.pg_user,
        "--warehouse",
        info.warehouse,
        "--jars",
        connectors,
        "--classpath",
        classpath,
        "--hadoop-conf-dir",
        conf_dir,
    ]
    group_id = f"peer-flink-{table}"
    argv = [
        str(python),
        str(HERE / "flink_sink.py"),
        "--bootstrap",
        info.bootstrap_servers,
        "--topic",
        topic,
        "--group-id",
        group_id,
        "--checkpoints",
        str(work / "checkpoints"),
        "--interval-s",
        str(interval_s),
        "--parallelism",
        "2",
        "--upsert",
        config.settings["write.upsert.enabled"],
        "--format-version",
        config.settings.get("format-version", "2"),
        "--maintenance",
        config.settings.get("maintenance", "off"),
        "--schemas",
        "on" if schemas else "off",
        "--kafka",
        kafka_properties(),
        # RewriteDataFiles every 10 commits, the table looked at every 60 s, the lock checked every 30 s: the documented
        # defaults. LAKESTREAM_PEERS_FLINK_MAINTENANCE_FAST=1 (the smoke test): every 2 commits, 1 s, 1 s, so that a few
        # seconds of data see a rewrite.
        *(
            ["--rewrite-commit-count", "2", "--maintenance-rate-limit-s", "1", "--maintenance-lock-check-s", "1"]
            if os.environ.get("LAKESTREAM_PEERS_FLINK_MAINTENANCE_FAST") == "1"
            else []
        ),
        *common,
    ]
    # PyFlink's own Python is not this checkout's: it must not import the main venv's packages. PyFlink's launcher
    # passes JVM_ARGS to the JVM it starts (the local cluster runs in it).
    env = {"CATALOG_PASSWORD": info.pg_password, "PYTHONPATH": "", "JVM_ARGS": f"-Xmx{HEAP} {JVM_OPTIONS}"}
    return Writer(
        config.name,
        topic,
        table,
        argv,
        env,
        work,
        work / "writer.log",
        config=config,
        compact_argv=[str(python), str(HERE / "flink_compact.py"), *common],
        group_id=group_id,
    )


def spark_writer(
    info, work: Path, topic: str, table: str, config: PeerConfig, schemas: bool, interval_s: float
) -> Writer:
    spark_jars = ",".join(map(str, [*jars.jars(jars.spark_group()), *jars.jars("bench-spark-kafka")]))
    common = [
        "--table",
        f"{NAMESPACE}.{table}",
        "--catalog-uri",
        info.catalog_jdbc_uri(),
        "--catalog-user",
        info.pg_user,
        "--warehouse",
        info.warehouse,
        "--jars",
        spark_jars,
        "--fs-jar",
        str(local_fs_jar()),
        f"--java-options={JVM_OPTIONS}",  # one argument: the value starts with a dash
        "--driver-memory",
        HEAP,
    ]
    checkpoint = work / "checkpoint"
    argv = [
        sys.executable,
        str(HERE / "spark_merge.py"),
        "--bootstrap",
        info.bootstrap_servers,
        "--topic",
        topic,
        "--checkpoint",
        str(checkpoint),
        "--trigger-s",
        str(interval_s),
        "--merge-mode",
        config.settings["write.merge.mode"],
        "--distribution",
        config.settings["write.distribution-mode"],
        "--dedupe",
        config.settings.get("dedupe", "max_by"),
        "--schemas",
        "on" if schemas else "off",
        "--kafka",
        kafka_properties(),
        *common,
    ]
    return Writer(
        config.name,
        topic,
        table,
        argv,
        {"CATALOG_PASSWORD": info.pg_password},
        work,
        work / "writer.log",
        config=config,
        compact_argv=[sys.executable, str(HERE / "spark_compact.py"), *common],
        checkpoint=checkpoint,
    )


BUILDERS = {"lakestream": lakestream_writer, "flink": flink_writer, "spark": spark_writer}


def writer_for(
    name: str,
    info,
    work: Path,
    topic: str,
    table: str,
    schemas: bool = True,
    interval_s: float = COMMIT_INTERVAL_S,
) -> Writer:
    """The writer of configuration ``name`` (configs.CONFIGS) on ``topic`` into ``NAMESPACE.table``."""
    config = config_named(name)
    work.mkdir(parents=True, exist_ok=True)
    return BUILDERS[config.system](info, work, topic, table, config, schemas, interval_s)
