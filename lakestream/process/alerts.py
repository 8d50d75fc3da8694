"""The alert stage of a micro-batch: between the write job and the commits, evaluate each rule set
over the rows the batch wrote for its source table, send the alerts to Kafka (idempotent producer,
keyed by alert id), and add a data file of them to the batch for the alerts table.

Exactly once: the alerts table commits before every other table of the batch, with the offsets of
the records that fed its source. After a crash the source table (the rule state) has not committed
those records yet, so they are written and evaluated again, and the alerts table skips the alerts
of records it already holds. Kafka gets alerts at least once (produced before the commit) with the
same ids, so consumers de-duplicate by key.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import orjson
import pyarrow as pa

from lakestream.config import StreamSettings
from lakestream.errors import KafkaAccessError, LakestreamError
from lakestream.kafka_access import check_access, denied_on_topic, refusals_raised
from lakestream.process.rules import ALERT_COLUMNS, RuleEvaluator, alert_id
from lakestream.sink.report import BatchReport, DataFileWritten, NewShape
from lakestream.sink.write.files import read_data_files, write_driver_files
from lakestream.source.kafka import TP

if TYPE_CHECKING:
    from lakestream.process.stage import StageContext

log = logging.getLogger(__name__)


class AlertStage:
    """Every rule set of a pipeline, with its evaluator and its Kafka producer."""

    # stages the alerts' data file; the alerts table commits before its source
    when: Literal["before_commits", "after_commits"] = "before_commits"

    def __init__(self, ctx: StageContext):
        self.ctx = ctx
        self.rule_sets = list(ctx.config.rules)
        self.evaluators = {r.name: RuleEvaluator(r) for r in self.rule_sets}
        self._loaded: set[str] = set()
        self._producer: Any = None
        self._producer_conf: dict[str, Any] = {}

    @property
    def tables(self) -> set[str]:
        return {r.alerts_table for r in self.rule_sets}

    def reads(self) -> dict[str, set[str]]:
        return {r.alerts_table: {r.source} for r in self.rule_sets}

    def idle(self) -> None:
        pass

    def _producer_for(self) -> Any:
        if self._producer is None:
            from confluent_kafka import Producer

            kafka = self.ctx.config.kafka
            conf = {
                str(k): v
                for k, v in kafka.client.items()
                if not str(k).startswith(("session.", "group.", "auto.offset"))
            }
            conf.update({"bootstrap.servers": kafka.bootstrap_servers, "enable.idempotence": True, "linger.ms": 5})
            self._producer_conf = conf
            self._producer = Producer(refusals_raised(conf))
            check_access(self._producer)
        return self._producer

    def run(self, report: BatchReport, isolated: bool = False) -> None:
        """Evaluate, produce and stage the alerts of this batch."""
        for rules in self.rule_sets:
            source = report.tables.get(rules.source)
            if source is None or not source.files:
                continue
            evaluator = self.evaluators[rules.name]
            if rules.name not in self._loaded:
                evaluator.load_history(self.ctx.spark, self.ctx.config.catalog.name)
                self._loaded.add(rules.name)
            new = read_data_files([f.path for f in source.files])
            if "_source_ts_ms" not in new.column_names:
                new = new.append_column("_source_ts_ms", pa.nulls(new.num_rows, pa.int64()))
            found = evaluator.evaluate(new)
            self._stage(rules, new, found, report)

    def _stage(self, rules: Any, new: pa.Table, found: pa.Table, report: BatchReport) -> int:
        from lakestream.sink.write.task import change_stats

        ctx = self.ctx
        name = rules.alerts_table
        ns, tbl = name.split(".")
        if name not in ctx.registry.specs:
            ctx.tables.ensure_namespace(ns)
            shape = NewShape(name, rules.source, "alerts-v1", list(ALERT_COLUMNS), [], False)
            ctx.registry.prepare_table(
                name, [shape], StreamSettings(topics=[rules.source], mode="append", namespace=ns, table=tbl)
            )
        spec = ctx.registry.specs[name]
        topics = new.column("_topic").to_pylist()
        partitions = np.asarray(new.column("_kafka_partition").to_numpy(zero_copy_only=False), np.int64)
        offsets = np.asarray(new.column("_kafka_offset").to_numpy(zero_copy_only=False), np.int64)
        source_ts = np.asarray(new.column("_source_ts_ms").to_numpy(zero_copy_only=False), np.float64)
        fresh = np.array(
            [o >= spec.committed.get(TP(t, int(p)), -1) for t, p, o in zip(topics, partitions, offsets, strict=True)],
            dtype=bool,
        )
        if not fresh.any():
            return 0
        keep = np.flatnonzero(fresh)
        report.table(name).stats.extend(
            change_stats(name, [topics[i] for i in keep], partitions[keep], offsets[keep], source_ts[keep])
        )
        source_ts_of = {
            (t, int(p), int(o)): (None if np.isnan(s) else int(s))
            for t, p, o, s in zip(topics, partitions, offsets, source_ts, strict=True)
        }
        rows = []
        for a in found.to_pylist():
            if a["_kafka_offset"] < spec.committed.get(TP(a["_topic"], a["_kafka_partition"]), -1):
                continue  # the alerts table holds it already (a replay after a crash)
            rows.append(a)
        if not rows:
            return 0
        now_ms = int(time.time() * 1000)
        out = []
        for a in rows:
            src = source_ts_of.get((a["_topic"], a["_kafka_partition"], a["_kafka_offset"]))
            out.append(
                {
                    "alert_id": alert_id(rules.name, a["check_name"], a["event_id"]),
                    "rule_set": rules.name,
                    "check_name": a["check_name"],
                    "key": a["key"],
                    "event_id": a["event_id"],
                    "event_time": a["_ts"] * 1000,
                    "value": a["value"],
                    "detail": a["detail"],
                    "source_ts_ms": src,
                    "alerted_at": now_ms * 1000,
                    "latency_ms": None if src is None else now_ms - src,
                    "source_topic": a["_topic"],
                    "source_partition": a["_kafka_partition"],
                    "source_offset": a["_kafka_offset"],
                }
            )
        schema = spec.arrow_schema()
        table = pa.Table.from_pylist(out, schema=schema)
        if rules.alerts_topic:
            self._produce(rules.alerts_topic, out)
        for i, written in enumerate(write_driver_files(table, spec, f"alerts-{ctx.batch_id}-{now_ms}")):
            report.table(name).files.append(
                DataFileWritten(
                    name,
                    written["path"],
                    written["file_size"],
                    written["record_count"],
                    written["partition"],
                    "driver",
                    i,
                )
            )
        log.info("rule set %s: %d alert(s)", rules.name, len(out))
        return len(out)

    def _produce(self, topic: str, alerts: list[dict[str, Any]]) -> None:
        producer = self._producer_for()
        errors: list[str] = []
        denied: list[KafkaAccessError] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(str(err))
                refusal = denied_on_topic(err, self._producer_conf, "WRITE", topic)
                if refusal is not None:
                    denied.append(refusal)

        for a in alerts:
            value = {k: v for k, v in a.items() if k not in ("event_time", "alerted_at")}
            value["event_time_ms"], value["alerted_at_ms"] = a["event_time"] // 1000, a["alerted_at"] // 1000
            producer.produce(topic, key=a["alert_id"].encode(), value=orjson.dumps(value), on_delivery=delivered)
        remaining = producer.flush(30)
        if denied:
            raise denied[0]
        if remaining or errors:
            raise LakestreamError(f"alerts to topic {topic}: {remaining} undelivered, errors {errors[:3]}")

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(10)
