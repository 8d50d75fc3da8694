"""The three writers as processes: how each is started on a topic and a table, in its own process group (so that its
CPU is counted from /proc over all its processes, and a SIGKILL takes all of it at once).

- ``lakestream``: `lakestream run` on a pipeline config with the defaults (commit interval 2 s) and one upsert stream;
- ``flink``: bench/peers/flink_upsert.py under PyFlink in ``.venv-peers`` (`make bench-peers` creates it);
- ``spark``: bench/peers/spark_merge.py under this venv's pyspark, with Spark's Kafka source by coordinates.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from _common import ROOT, pipeline_data, write_pipeline_yaml
from sustained import tree_pids

from lakestream.runtime import jars

SYSTEMS = ("lakestream", "flink", "spark")
NAMESPACE = "peers"
COMMIT_INTERVAL_S = 2.0  # Lakestream's default engine.commit_interval_s: Flink's checkpoint and Spark's trigger
PEERS_VENV = Path(os.environ.get("LAKESTREAM_PEERS_VENV", ROOT / ".venv-peers"))
HERE = Path(__file__).resolve().parent


@dataclass
class Writer:
    """One system writing ``topic`` into ``NAMESPACE.<table>``."""

    system: str
    topic: str
    table: str
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    log_path: Path
    proc: subprocess.Popen | None = None

    @property
    def qualified(self) -> str:
        return f"{NAMESPACE}.{self.table}"

    def start(self, note: str = "start") -> None:
        with open(self.log_path, "ab") as out:
            out.write(f"\n===== {time.strftime('%H:%M:%S')} {note} =====\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.cwd,
                env={**os.environ, **self.env},
            )

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


def lakestream_writer(info, work: Path, topic: str, table: str, driver_memory: str = "2g") -> Writer:
    data = pipeline_data(
        info,
        work,
        f"peers-{table}",
        [{"topics": [topic], "mode": "upsert", "namespace": NAMESPACE, "table": table}],
        driver_memory=driver_memory,
    )
    data["engine"] = {}  # the defaults, as a user runs it (pipeline_data's bench settings commit continuously)
    config = write_pipeline_yaml(work / "pipeline.yaml", data)
    return Writer(
        "lakestream",
        topic,
        table,
        [sys.executable, "-m", "lakestream", "run", str(config)],
        {},
        work,
        work / "writer.log",
    )


def flink_writer(info, work: Path, topic: str, table: str) -> Writer:
    python = PEERS_VENV / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"{python} is missing: `make bench-peers` creates it (scripts/peers_venv.sh)")
    flink_jars = jars.jars("bench-flink")
    argv = [
        str(python),
        str(HERE / "flink_upsert.py"),
        "--bootstrap",
        info.bootstrap_servers,
        "--topic",
        topic,
        "--group-id",
        f"peer-flink-{table}",
        "--table",
        f"{NAMESPACE}.{table}",
        "--catalog-uri",
        info.catalog_jdbc_uri(),
        "--catalog-user",
        info.pg_user,
        "--warehouse",
        info.warehouse,
        "--checkpoints",
        str(work / "checkpoints"),
        "--jars",
        ",".join(str(j) for j in flink_jars if j.name.startswith(("iceberg-", "flink-"))),
        "--classpath",
        ",".join(str(j) for j in flink_jars if not j.name.startswith(("iceberg-", "flink-"))),
        "--interval-s",
        str(COMMIT_INTERVAL_S),
        "--parallelism",
        "2",
    ]
    # PyFlink's own Python is not this checkout's: it must not import the main venv's packages.
    env = {"CATALOG_PASSWORD": info.pg_password, "PYTHONPATH": "", "JVM_ARGS": "-Xmx2g"}
    return Writer("flink", topic, table, argv, env, work, work / "writer.log")


def spark_writer(info, work: Path, topic: str, table: str, driver_memory: str = "2g") -> Writer:
    spark_jars = [*jars.jars(jars.spark_group()), *jars.jars("bench-spark-kafka")]
    argv = [
        sys.executable,
        str(HERE / "spark_merge.py"),
        "--bootstrap",
        info.bootstrap_servers,
        "--topic",
        topic,
        "--table",
        f"{NAMESPACE}.{table}",
        "--catalog-uri",
        info.catalog_jdbc_uri(),
        "--catalog-user",
        info.pg_user,
        "--warehouse",
        info.warehouse,
        "--checkpoint",
        str(work / "checkpoint"),
        "--trigger-s",
        str(COMMIT_INTERVAL_S),
        "--jars",
        ",".join(map(str, spark_jars)),
        "--driver-memory",
        driver_memory,
    ]
    return Writer("spark", topic, table, argv, {"CATALOG_PASSWORD": info.pg_password}, work, work / "writer.log")


def writer_for(system: str, info, work: Path, topic: str, table: str) -> Writer:
    work.mkdir(parents=True, exist_ok=True)
    if system == "lakestream":
        return lakestream_writer(info, work, topic, table)
    if system == "flink":
        return flink_writer(info, work, topic, table)
    if system == "spark":
        return spark_writer(info, work, topic, table)
    raise SystemExit(f"unknown system {system!r}: one of {', '.join(SYSTEMS)}")
