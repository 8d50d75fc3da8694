"""`lakestream demo --pattern iot`: sensor readings → Kafka → windows per machine in Iceberg.

The processing part of the config is `examples/iot/pipeline.yaml`; this module adds the local stack's
connection settings, produces two waves of simulated readings (the second with readings ten minutes
late) and runs the pipeline after each until it is idle, then prints the windows per machine.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from lakestream.config import PipelineConfig, parse_config
from lakestream.demo.fraud import drop_namespace_tables
from lakestream.demo.runner import Step, example_stack, write_private_yaml
from lakestream.demo.sensors import SensorProducer
from lakestream.engine.loop import run_pipeline
from lakestream.errors import LakestreamError
from lakestream.identifiers import quote_table
from lakestream.stack import StackInfo, StackSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "iot" / "pipeline.yaml"


@dataclass
class IotSettings:
    state_dir: Path = Path(".lakestream")
    pg_port: int = StackSettings.pg_port
    kafka_port: int = StackSettings.kafka_port
    readings: int = 400  # first wave; the second is a quarter of it, plus `too_late`
    too_late: int = 3
    machines: int = 6
    seed: int | None = None
    namespace: str = "iot"
    example: Path = EXAMPLE


@dataclass
class IotResult:
    config: PipelineConfig
    kept: list[dict[str, Any]] = field(default_factory=list)  # readings the windows must count
    too_late: list[dict[str, Any]] = field(default_factory=list)
    windows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # table → rows
    late_dead_letters: int = 0


def iot_config_data(settings: IotSettings, info: StackInfo, topic: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(settings.example.read_text())
    except OSError as exc:
        raise LakestreamError(
            f"cannot read the IoT example config {settings.example}: {exc.strerror} — fix: run "
            f"from a checkout of the repository (examples/iot/pipeline.yaml)"
        ) from None
    ns = settings.namespace
    for stream in data["streams"]:
        stream["topics"] = [t.replace("{topic}", topic) for t in stream["topics"]]
        stream["namespace"] = ns
    for w in data.get("windows", []):
        w["source"] = f"{ns}.{w['source'].split('.', 1)[1]}"
        w["table"] = f"{ns}.{w['table'].split('.', 1)[1]}"
    for policy in data.get("maintenance", {}).get("policies", []):
        policy["tables"] = policy["tables"].replace("iot\\.", f"{ns}\\.")
    data["name"] = f"{data.get('name', 'iot')}_{topic}"
    data["state_dir"] = str(Path(settings.state_dir).resolve())
    data["kafka"] = {"bootstrap_servers": info.bootstrap_servers, "group_id": f"lakestream-{topic}"}
    data["catalog"] = {
        "name": "lake",
        "type": "jdbc",
        "uri": info.catalog_jdbc_uri(),
        "user": info.pg_user,
        "password": info.pg_password,
        "warehouse": info.warehouse,
    }
    return data


def run_iot_demo(settings: IotSettings, info: StackInfo | None = None, spark: SparkSession | None = None) -> IotResult:
    """Run the example end to end and print its report; ``info``/``spark`` reuse a running stack/session."""
    step = Step(total=5)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    state_dir = Path(settings.state_dir).expanduser().resolve()
    info = example_stack(settings, state_dir, info, step)
    topic = f"iot_readings_{int(time.time() * 1000) % 10**10}"
    data = iot_config_data(settings, info, topic)
    config = parse_config(data, str(settings.example))
    work = state_dir / topic
    work.mkdir(parents=True, exist_ok=True)
    write_private_yaml(work / "pipeline.yaml", data)
    own_spark = spark is None
    if spark is None:
        from lakestream.runtime.spark import session_for

        spark = session_for(config)
    try:
        drop_namespace_tables(spark, config.catalog.name, settings.namespace)
        sensors = SensorProducer(info.bootstrap_servers, topic, machines=settings.machines, seed=settings.seed)
        sensors.create_topic(partitions=4)
        first = sensors.readings(settings.readings)
        step(
            f"sending {len(first)} readings of {settings.machines} machines to {topic} and running the pipeline "
            f"({work / 'pipeline.yaml'})"
        )
        sensors.send(first)
        run_pipeline(config, spark=spark, stop_when_idle=True)
        second = sensors.readings(max(1, settings.readings // 4))
        too_late = sensors.too_late(settings.too_late)
        step(f"sending {len(second)} more readings and {len(too_late)} ten minutes late; running the pipeline")
        half = len(second) // 2
        sensors.send(second[:half] + too_late + second[half:])
        run_pipeline(config, spark=spark, stop_when_idle=True)
        step("report")
        windows = {}
        for w in config.windows:
            ns, tbl = w.table.split(".")
            windows[w.table] = [
                r.asDict()
                for r in spark.sql(
                    f"SELECT * FROM {quote_table(config.catalog.name, ns, tbl)} ORDER BY window_start, {w.key}"
                ).collect()
            ]
        ns, tbl = config.engine.dead_letter_table.split(".")
        late = spark.sql(
            f"SELECT count(*) FROM {quote_table(config.catalog.name, ns, tbl)} WHERE topic = "
            f"'{topic}' AND error LIKE 'late:%'"
        ).collect()[0][0]
    finally:
        if own_spark:
            spark.stop()
    _print_report(config, windows, late)
    return IotResult(config, first + second, too_late, windows, late)


def _print_report(config: PipelineConfig, windows: dict[str, list[dict[str, Any]]], late: int) -> None:
    minutes = config.windows[0]
    rows = windows[minutes.table]
    print(f"\n{minutes.table}: {len(rows)} window rows; the latest window per machine:")
    print(f"{'machine':<9}{'window start (UTC)':<22}{'readings':>9}{'avg °C':>9}{'max °C':>9}{'max vib':>9}")
    latest: dict[str, dict[str, Any]] = {}
    for r in rows:
        latest[r[minutes.key]] = r
    for key in sorted(latest):
        r = latest[key]
        print(
            f"{key:<9}{r['window_start']:%Y-%m-%d %H:%M:%S}   {r['count']:>9}{r['temperature_avg']:>9.1f}"
            f"{r['temperature_max']:>9.1f}{r['vibration_max']:>9.2f}"
        )
    for w in config.windows[1:]:
        print(f"{w.table}: {len(windows[w.table])} window rows ({w.size_s}s windows every {w.slide}s)")
    print(f"late readings refused (dead letters with reason 'late'): {late}")
