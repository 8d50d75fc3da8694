"""Stateful rules over each key's recent history → alerts.

A rule set watches a table the pipeline appends to (usually a transform's output, whose rows carry
_topic, _kafka_partition, _kafka_offset). After the write job, the driver reads the rows the batch wrote for
that table (the data files, not yet committed), evaluates every check for every new event against
the key's history (kept in memory, rebuilt from the table itself after a restart: the lake is the
state), and returns the alerts. Alert ids are deterministic (rule set, check, event id), so a
re-evaluation after a crash produces the same alerts.
"""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakestream.config import RuleCheck, RuleSet
from lakestream.errors import ConfigError
from lakestream.identifiers import ansi_string, quote_ansi_column, quote_column
from lakestream.transform.apply import duckdb_connection

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

ALERT_COLUMNS = [
    ("alert_id", "string"),
    ("rule_set", "string"),
    ("check_name", "string"),
    ("key", "string"),
    ("event_id", "string"),
    ("event_time", "timestamp"),
    ("value", "double"),
    ("detail", "string"),
    ("source_ts_ms", "bigint"),
    ("alerted_at", "timestamp"),
    ("latency_ms", "bigint"),
    ("source_topic", "string"),
    ("source_partition", "int"),
    ("source_offset", "bigint"),
]
_POSITION = ["_topic", "_kafka_partition", "_kafka_offset"]


def alert_id(rule_set: str, check: str, event_id: Any) -> str:
    """The same alert after any number of re-evaluations: a hash of what raised it."""
    return hashlib.sha1(f"{rule_set}\x1f{check}\x1f{event_id}".encode()).hexdigest()[:24]


def _fields(rules: RuleSet) -> list[str]:
    fields = [rules.key, rules.event_time, rules.event_id]
    fields += [c.field for c in rules.checks if c.field and c.field not in fields]
    return fields


def _ts_expr(rules: RuleSet, arrow_type: pa.DataType) -> str:
    col = quote_ansi_column(rules.event_time)
    if pa.types.is_timestamp(arrow_type):
        return f"epoch_ms({col})"  # a cast of a zoned timestamp would apply DuckDB's local time zone
    if pa.types.is_date(arrow_type):
        return f"epoch_ms(CAST({col} AS TIMESTAMP))"
    if pa.types.is_integer(arrow_type):
        return f"CAST({col} AS BIGINT)"  # epoch milliseconds
    raise ConfigError(
        f"rule set {rules.name}: event_time column {rules.event_time!r} is {arrow_type}; it must be a "
        f"timestamp or epoch milliseconds"
    )


def _field(check: RuleCheck) -> str:
    assert check.field is not None, "RuleCheck's validation gives sum and change checks a field"
    return check.field


def _above(check: RuleCheck) -> float:
    assert check.above is not None, "RuleCheck's validation gives count and sum checks a threshold"
    return check.above


def _check_expr(check: RuleCheck, key: str) -> str:
    """A DuckDB expression, over the events ordered per key, that is the check's value (NULL: no alert)."""
    window = (
        f"PARTITION BY {key} ORDER BY _ts RANGE BETWEEN {int(check.window_s * 1000) if check.window_s else 0} "
        f"PRECEDING AND CURRENT ROW"
    )
    if check.kind == "count":
        return f"CASE WHEN count(*) OVER ({window}) > {float(_above(check))} THEN count(*) OVER ({window}) END"
    if check.kind == "sum":
        f = quote_ansi_column(_field(check))
        return f"CASE WHEN sum({f}) OVER ({window}) > {float(_above(check))} THEN sum({f}) OVER ({window}) END"
    if check.kind == "change":
        f = quote_ansi_column(_field(check))
        prev = f"lag({f}) OVER (PARTITION BY {key} ORDER BY _ts, _topic, _kafka_partition, _kafka_offset)"
        return f"CASE WHEN {prev} IS NOT NULL AND {f} IS NOT NULL AND {prev} <> {f} THEN 1 END"
    return f"CASE WHEN ({check.sql}) THEN 1 END"


def _detail_expr(check: RuleCheck, key: str) -> str:
    if check.kind == "count":
        return f"'count > {check.above:g} within {check.window_s:g}s'"
    if check.kind == "sum":
        return f"'sum of {check.field} > {check.above:g} within {check.window_s:g}s'"
    if check.kind == "change":
        f = quote_ansi_column(_field(check))
        prev = f"lag({f}) OVER (PARTITION BY {key} ORDER BY _ts, _topic, _kafka_partition, _kafka_offset)"
        return f"{ansi_string(_field(check) + ': ')} || CAST({prev} AS VARCHAR) || ' → ' || CAST({f} AS VARCHAR)"
    return ansi_string(check.sql or "")


class RuleEvaluator:
    """One rule set: the keys' recent history and the evaluation of new events against it."""

    def __init__(self, rules: RuleSet):
        self.rules = rules
        # The rule's fields + _topic, _kafka_partition, _kafka_offset, _ts (epoch ms).
        self.history: pa.Table | None = None

    def load_history(self, spark: SparkSession, catalog: str) -> None:
        """The history that matters, from the committed source table (after a start or a restart)."""
        from lakestream.identifiers import quote_table

        ns, tbl = self.rules.source.split(".")
        if not spark.catalog.tableExists(f"{catalog}.{ns}.{tbl}"):
            self.history = None
            return
        ident = quote_table(catalog, ns, tbl)
        cols = ", ".join(quote_column(c) for c in _fields(self.rules) + _POSITION)
        ts, key = quote_column(self.rules.event_time), quote_column(self.rules.key)
        window = int(self.rules.history_s) + 1
        integral = spark.table(f"{catalog}.{ns}.{tbl}").schema[self.rules.event_time].dataType.typeName() in (
            "long",
            "integer",
            "short",
            "byte",
        )
        back = f"{window * 1000}" if integral else f"make_dt_interval(0, 0, 0, {window})"
        sql = (
            f"SELECT {cols} FROM {ident} WHERE {ts} >= (SELECT max({ts}) FROM {ident}) - {back} "
            f"UNION SELECT {cols} FROM (SELECT {cols}, row_number() OVER "
            f"(PARTITION BY {key} ORDER BY {ts} DESC, `_kafka_offset` DESC) AS `_rn` FROM {ident}) WHERE `_rn` = 1"
        )
        batches = spark.sql(sql)._collect_as_arrow()
        table = pa.Table.from_batches(batches) if batches else None
        self.history = self._with_ts(table) if table is not None and table.num_rows else None
        log.info(
            "rule set %s: %d history row(s) loaded from %s",
            self.rules.name,
            0 if self.history is None else self.history.num_rows,
            self.rules.source,
        )

    def _with_ts(self, table: pa.Table) -> pa.Table:
        con = duckdb_connection()
        con.register("t", table)
        try:
            cols = ", ".join(quote_ansi_column(c) for c in _fields(self.rules) + _POSITION)
            out = con.execute(
                f"SELECT {cols}, {_ts_expr(self.rules, table.schema.field(self.rules.event_time).type)} AS _ts FROM t"
            ).to_arrow_table()
        finally:
            con.unregister("t")
        return out

    def evaluate(self, new: pa.Table) -> pa.Table:
        """Alerts (key, event, check, value, detail, position) raised by the ``new`` events."""
        rules = self.rules
        missing = [c for c in _fields(rules) + _POSITION if c not in new.column_names]
        if missing:
            raise ConfigError(
                f"rule set {rules.name}: source {rules.source} has no column(s) {missing} — fix: "
                f"select them in the transform that writes it"
            )
        events = self._with_ts(new)
        con = duckdb_connection()
        con.register("new_events", events)
        history = self.history
        if history is not None:
            con.register("old_events", history)
        try:
            union = "SELECT *, true AS _new FROM new_events"
            if history is not None:
                union += " UNION ALL BY NAME SELECT *, false AS _new FROM old_events"
            key = quote_ansi_column(rules.key)
            checks = ", ".join(
                f"{_check_expr(c, key)} AS {quote_ansi_column('v_' + c.name)}, "
                f"{_detail_expr(c, key)} AS {quote_ansi_column('d_' + c.name)}"
                for c in rules.checks
            )
            scored = con.execute(f"SELECT * FROM (SELECT *, {checks} FROM ({union})) WHERE _new").to_arrow_table()
            parts = []
            for c in rules.checks:
                v, d = quote_ansi_column("v_" + c.name), quote_ansi_column("d_" + c.name)
                parts.append(
                    f"SELECT {ansi_string(c.name)} AS check_name, CAST({key} AS VARCHAR) AS key, "
                    f"CAST({quote_ansi_column(rules.event_id)} AS VARCHAR) AS event_id, _ts, "
                    f"CAST({v} AS DOUBLE) AS value, {d} AS detail, _topic, _kafka_partition, _kafka_offset "
                    f"FROM scored WHERE {v} IS NOT NULL"
                )
            con.register("scored", scored)
            order = " ORDER BY _ts, _topic, _kafka_partition, _kafka_offset, check_name"
            alerts = con.execute(" UNION ALL ".join(parts) + order).to_arrow_table()
            con.unregister("scored")
            merged = "SELECT * FROM new_events"
            if history is not None:
                merged += " UNION ALL BY NAME SELECT * FROM old_events"
            self.history = con.execute(
                f"WITH merged AS ({merged}) SELECT * EXCLUDE (_rn) FROM (SELECT *, row_number() OVER (PARTITION BY "
                f"{key} ORDER BY _ts DESC, _topic DESC, _kafka_partition DESC, _kafka_offset DESC) AS _rn FROM merged) "
                f"WHERE _rn = 1 OR _ts >= (SELECT max(_ts) FROM merged) - {int(rules.history_s * 1000) + 1000}"
            ).to_arrow_table()
        finally:
            con.unregister("new_events")
            if history is not None:
                con.unregister("old_events")
        return alerts
