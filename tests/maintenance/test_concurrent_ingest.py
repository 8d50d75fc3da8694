"""Maintenance beside live ingestion: compaction (even of hot partitions, to force real commit
conflicts), delete-file rewrites, manifest rewrites and snapshot expiry run in a loop while the
engine MERGEs a stream of Debezium change events into the same table. Afterwards the table must
equal the expected state exactly, with no duplicate key, and the engine must still find its offsets.
"""

from __future__ import annotations

import copy
import json
import random
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

from conftest import load_debezium_fixture, produce_records

from lakestream.engine.loop import run_pipeline
from lakestream.maintenance import maintain_tables
from lakestream.sink.commit.offsets import OFFSETS_PROPERTY, decode_offsets
from lakestream.source.kafka import TP

KEYS = 400
ROUNDS = 6
EVENTS_PER_ROUND = 500


def _events(topic_prefix: str):
    fixture = load_debezium_fixture()
    upsert = json.loads(fixture[4]["value"])  # an 'u' event with embedded schema
    delete = json.loads(fixture[5]["value"])  # a 'd' event
    key = json.loads(fixture[4]["key"])
    return upsert, delete, key


def test_maintenance_concurrent_with_cdc_load(spark, pipeline_config_factory):
    topic = f"m{uuid.uuid4().hex[:6]}.public.items"
    upsert, delete, key = _events(topic)
    rng = random.Random(7)
    expected: dict[int, str | None] = {}
    config = pipeline_config_factory(
        [
            {
                "topics": [topic],
                "namespace": "mconc",
                "table": "items_" + topic[:7],
                "layout": {"partition_by": ["bucket(4, id)"]},
            }
        ],
        name=f"mconc{topic[:7]}",
        engine={"max_records_per_batch": 600, "commit_interval_s": 0, "idle_poll_s": 0.2},
        maintenance={
            "mode": "separate",
            "policies": [
                {
                    "tables": ".*",
                    "compaction": {"max_files_per_partition": 2, "quiet_time_s": 0},
                    "max_delete_files": 1,
                    "snapshot_retention_s": 0,
                    "retain_last_snapshots": 3,
                    "orphan_min_age_s": 86400 * 3,
                    "orphan_dry_run": True,
                    "max_manifests": 2,
                }
            ],
        },
    )
    table = f"lake.mconc.items_{topic[:7]}"

    def produce_round() -> None:
        records = []
        for _ in range(EVENTS_PER_ROUND):
            k = rng.randrange(KEYS)
            key["payload"]["id"] = k
            if expected.get(k) is not None and rng.random() < 0.15:
                ev = copy.deepcopy(delete)
                ev["payload"]["before"]["id"] = k
                expected[k] = None
            else:
                ev = copy.deepcopy(upsert)
                note = f"v{rng.random():.8f}"
                ev["payload"]["after"]["id"] = k
                ev["payload"]["after"]["note"] = note
                ev["payload"]["op"] = "c" if expected.get(k) is None else "u"
                expected[k] = note
            records.append((json.dumps(key), json.dumps(ev)))
            if ev["payload"]["op"] == "d":
                records.append((json.dumps(key), None))  # tombstone
        produce_records(config.kafka.bootstrap_servers, topic, records)

    produce_round()
    stop = threading.Event()
    errors: list[BaseException] = []
    batches = []

    def ingest() -> None:
        try:
            run_pipeline(config, spark=spark, stop=stop, on_batch=batches.append)
        except BaseException as exc:  # noqa: BLE001 — surfaced by the assertion below
            errors.append(exc)

    actions = []

    def maintain() -> None:
        while not stop.is_set():
            try:
                if spark.catalog.tableExists(table):
                    actions.extend(maintain_tables(spark, config, [f"mconc.items_{topic[:7]}"]))
            except BaseException as exc:  # noqa: BLE001 — surfaced by the assertion on `errors`
                errors.append(exc)
                return
            stop.wait(0.5)

    threads = [threading.Thread(target=ingest, name="ingest"), threading.Thread(target=maintain, name="maintain")]
    for t in threads:
        t.start()
    try:
        # Keep the load going until maintenance has compacted at least once (a round takes longer
        # on a loaded machine), so compaction really runs beside ingestion.
        rounds = 1
        while rounds < ROUNDS or (rounds < 4 * ROUNDS and not errors and not any(_rewrote(a) for a in list(actions))):
            time.sleep(1.0)
            produce_round()
            rounds += 1
        # Wait until the engine has consumed everything produced.
        caught_up = False
        deadline = time.time() + 420
        while time.time() < deadline and not errors:
            if batches and batches[-1].lag == 0 and spark.catalog.tableExists(table):
                offsets = decode_offsets(
                    spark.sql(
                        f"SELECT summary['{OFFSETS_PROPERTY}'] FROM {table}.snapshots "
                        f"WHERE summary['{OFFSETS_PROPERTY}'] IS NOT NULL ORDER BY committed_at DESC LIMIT 1"
                    ).collect()[0][0]
                )
                # The last message may be a tombstone; the table's offset passes it once read.
                if offsets.get(TP(topic, 0), 0) >= total_messages(config, topic) - 1:
                    caught_up = True
                    break
            time.sleep(1.0)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=300)
    assert not errors, errors
    assert caught_up, f"the engine did not catch up within the deadline ({len(batches)} batches)"

    done = {a.action for a in actions if a.status in ("ok", "partial")}
    assert "compact" in done, [a.describe() for a in actions][:20]
    assert "expire_snapshots" in done
    expiries = [a for a in actions if a.action == "expire_snapshots" and a.status == "ok"]
    assert all(a.detail.get("method") == "line" for a in expiries), [a.detail for a in expiries]
    # Expiry beside the batches deleted nothing a kept snapshot still names (a DV's Puffin file included).
    referenced = {r[0] for r in spark.sql(f"SELECT file_path FROM {table}.all_files").collect()}
    assert referenced and all(Path(urlparse(p).path).exists() for p in referenced)
    # Compaction committed files beside the batches. Iceberg's procedure counts them; the replace snapshot
    # itself may already be expired (the policy keeps the last 3 snapshots), so the snapshots table is no proof.
    rewrites = [a for a in actions if _rewrote(a)]
    assert rewrites, [a.describe() for a in actions if a.action == "compact"][:20]
    assert all(a.detail["added_data_files"] >= 1 for a in rewrites), [a.detail for a in rewrites]

    rows = spark.sql(f"SELECT id, note FROM {table}").collect()
    ids = [r.id for r in rows]
    assert len(ids) == len(set(ids)), "duplicate keys in the lake"
    want = {k: v for k, v in expected.items() if v is not None}
    assert {r.id: r.note for r in rows} == want


def _rewrote(action) -> bool:
    """A compaction that committed: Iceberg's rewrite_data_files reported data files rewritten."""
    return (
        action.action == "compact"
        and action.status in ("ok", "partial")
        and action.detail.get("rewritten_data_files", 0) >= 1
    )


def total_messages(config, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": config.kafka.bootstrap_servers, "group.id": "probe"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    finally:
        consumer.close()
