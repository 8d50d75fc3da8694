"""Event-time windows: tumbling and hopping windows per machine over readings that arrive out of
order, across batches; late readings within the allowed lateness update their windows, later ones
are dead letters "late"; the windows tables equal a reference aggregation."""
from __future__ import annotations

import json
import random
import uuid

from conftest import produce_records
from lakestream.engine.loop import run_pipeline

DEAD_LETTER = "lake.lakestream.dead_letter"
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def _readings(rng: random.Random, n: int, start_ms: int, machines: int = 4) -> tuple[list[dict], int]:
    """In-order readings with some up to 30 s late (always within the lateness); the newest time."""
    out, t, newest = [], start_ms, start_ms
    for _ in range(n):
        t += rng.randint(0, 4000)
        newest = max(newest, t)
        ts = t - rng.randint(1000, 30_000) if rng.random() < 0.15 else t
        out.append({"equipment_id": f"m{rng.randint(1, machines)}", "ts": ts,
                    "temperature": round(rng.uniform(40, 90), 2)})
    return out, newest


def _reference(readings: list[dict], size_ms: int, slide_ms: int) -> dict[tuple[str, int], tuple[int, float, float]]:
    windows: dict[tuple[str, int], list[float]] = {}
    for r in readings:
        last = r["ts"] // slide_ms * slide_ms
        for start in range(last - size_ms + slide_ms, last + 1, slide_ms):
            windows.setdefault((r["equipment_id"], start), []).append(r["temperature"])
    return {k: (len(v), round(sum(v), 6), max(v)) for k, v in windows.items()}


def _table(spark, name: str) -> dict[tuple[str, int], tuple[int, float, float]]:
    rows = spark.sql(f"SELECT equipment_id, unix_millis(window_start) AS ws, unix_millis(window_end) AS we, `count`, "
                     f"temperature_sum, temperature_max, temperature_avg, temperature_count FROM {name}").collect()
    for r in rows:
        assert abs(r["temperature_avg"] - r["temperature_sum"] / r["temperature_count"]) < 1e-9
    return {(r["equipment_id"], r["ws"]): (r["count"], round(r["temperature_sum"], 6), r["temperature_max"])
            for r in rows}


def test_windows_match_a_reference_aggregation_with_late_events(stack, spark, pipeline_config_factory):
    uid = uuid.uuid4().hex[:6]
    topic, ns = f"readings_{uid}", f"iot_{uid}"
    window = {"source": f"{ns}.readings_log", "key": "equipment_id", "event_time": "ts", "fields": ["temperature"],
              "watermark_delay_s": 5, "allowed_lateness_s": 60}
    config = pipeline_config_factory(
        [{"topics": [topic], "mode": "append", "namespace": ns, "table": "readings",
          "transforms": [{"name": "log", "table": "readings_log",
                          "sql": "SELECT equipment_id, ts, temperature, _topic, _kafka_partition, _kafka_offset "
                                 "FROM batch"}]}],
        name=f"win{uid}", engine={"max_records_per_batch": 60},
        windows=[window | {"name": "minute", "size_s": 60, "table": f"{ns}.machine_minutes"},
                 window | {"name": "hop", "size_s": 60, "slide_s": 30, "table": f"{ns}.machine_hops",
                           "key_buckets": 4}])
    rng = random.Random(11)
    first, newest = _readings(rng, 150, T0)
    produce_records(stack.bootstrap_servers, topic, [(r["equipment_id"], json.dumps(r)) for r in first])
    run_pipeline(config, spark=spark, stop_when_idle=True)

    # Later: more readings, and some ten minutes late (their windows closed long ago).
    second, _ = _readings(rng, 40, newest)
    too_late = [{"equipment_id": "m1", "ts": newest - 600_000 + i * 1000, "temperature": 99.0} for i in range(3)]
    batch = second[:20] + too_late + second[20:]
    produce_records(stack.bootstrap_servers, topic, [(r["equipment_id"], json.dumps(r)) for r in batch])
    run_pipeline(config, spark=spark, stop_when_idle=True)

    kept = first + second
    assert _table(spark, f"lake.{ns}.machine_minutes") == _reference(kept, 60_000, 60_000)
    assert _table(spark, f"lake.{ns}.machine_hops") == _reference(kept, 60_000, 30_000)
    late = spark.sql(f"SELECT `offset`, error, target_table FROM {DEAD_LETTER} WHERE topic = '{topic}'").collect()
    assert sorted(r["offset"] for r in late if r["target_table"] == f"{ns}.machine_minutes") == [170, 171, 172]
    assert all(r["error"].startswith("late: window") for r in late)
    spec = spark.sql(f"SELECT * FROM lake.{ns}.machine_hops.partitions").columns
    assert "partition" in spec
    fields = [f.name for f in spark.table(f"lake.{ns}.machine_hops.partitions").schema["partition"].dataType.fields]
    assert fields == ["window_start_day", "equipment_id_bucket"]
