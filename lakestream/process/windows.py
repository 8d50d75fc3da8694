"""Event-time windows per key: tumbling or hopping, with a watermark and allowed lateness.

Between the write job and the commits, the driver reads the rows the batch wrote for the window's
source table, aggregates them into partial windows (DuckDB) and MERGEs those into the windows table
by (key, window_start): counts and sums add up, minima and maxima combine, so a late event within
the allowed lateness updates its window row and the output stays exact. An event whose last window
ended more than the allowed lateness before the watermark is a dead letter with the reason "late".

Exactly once: the MERGE's snapshot carries the offsets of the records it consumed and the
watermark, and commits before the source table; a replay skips records the windows table holds.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Literal

import orjson
import pyarrow as pa

from lakestream.config import WindowSettings
from lakestream.errors import ConfigError
from lakestream.identifiers import quote_ansi_column, quote_column, quote_table
from lakestream.sink.catalog.schema import DEFAULT_TABLE_PROPERTIES
from lakestream.sink.report import BatchReport, DeadLetter
from lakestream.sink.write.files import read_data_files
from lakestream.source.kafka import TP
from lakestream.transform.apply import duckdb_connection

if TYPE_CHECKING:
    from lakestream.process.stage import StageContext

log = logging.getLogger(__name__)

WATERMARK_PROPERTY = "lakestream.watermark-ms"
_AGGREGATES = ("count", "sum", "min", "max", "avg")


def window_columns(w: WindowSettings) -> list[tuple[str, str]]:
    """The windows table's columns (name, Spark DDL)."""
    cols = [(w.key, "string"), ("window_start", "timestamp"), ("window_end", "timestamp"), ("count", "bigint")]
    for f in w.fields:
        cols += [(f"{f}_count", "bigint")] + [(f"{f}_{a}", "double") for a in ("sum", "min", "max", "avg")]
    return cols


def partial_windows(rows: pa.Table, w: WindowSettings, watermark_ms: int | None) -> tuple[pa.Table, list[int]]:
    """The windows of ``rows`` aggregated (one row per key and window start), and the row numbers
    of the events too late for the watermark."""
    ts_type = rows.schema.field(w.event_time).type
    col = quote_ansi_column(w.event_time)
    ts = f"epoch_ms({col})" if pa.types.is_timestamp(ts_type) else f"CAST({col} AS BIGINT)"
    size, slide, lateness = w.size_s * 1000, w.slide * 1000, int(w.allowed_lateness_s * 1000)
    last_start = f"CAST(floor(_ts / {slide}) * {slide} AS BIGINT)"
    late = "false" if watermark_ms is None else f"{last_start} + {size + lateness} <= {int(watermark_ms)}"
    key = quote_ansi_column(w.key)
    fields = "".join(
        f", count({quote_ansi_column(f)}) AS {quote_ansi_column(f + '_count')}"
        f", sum(CAST({quote_ansi_column(f)} AS DOUBLE)) AS {quote_ansi_column(f + '_sum')}"
        f", min(CAST({quote_ansi_column(f)} AS DOUBLE)) AS {quote_ansi_column(f + '_min')}"
        f", max(CAST({quote_ansi_column(f)} AS DOUBLE)) AS {quote_ansi_column(f + '_max')}"
        f", sum(CAST({quote_ansi_column(f)} AS DOUBLE)) / nullif(count({quote_ansi_column(f)}), 0) "
        f"AS {quote_ansi_column(f + '_avg')}"
        for f in w.fields
    )
    con = duckdb_connection()
    con.register("window_rows", rows)
    try:
        flagged = (
            f"SELECT *, ({late}) AS _late FROM (SELECT *, {ts} AS _ts, row_number() OVER () - 1 AS _row "
            f"FROM window_rows)"
        )
        late_rows = [r[0] for r in con.execute(f"SELECT _row FROM ({flagged}) WHERE _late ORDER BY _row").fetchall()]
        partials = con.execute(
            f"SELECT CAST({key} AS VARCHAR) AS {key}, to_timestamp(_ws / 1000) AS window_start, "
            f"to_timestamp((_ws + {size}) / 1000) AS window_end, count(*) AS count{fields} "
            f"FROM (SELECT *, unnest(range({last_start} - {size - slide}, {last_start} + {slide}, {slide})) AS _ws "
            f"FROM ({flagged}) WHERE NOT _late) GROUP BY ALL ORDER BY 1, 2"
        ).to_arrow_table()
    finally:
        con.unregister("window_rows")
    return partials, late_rows


def _merge_sql(w: WindowSettings, target: str, view: str) -> str:
    k = quote_column(w.key)
    sets = ["t.`count` = t.`count` + s.`count`"]
    for f in w.fields:
        c, s_, mn, mx, avg = (quote_column(f"{f}_{a}") for a in _AGGREGATES)
        total = f"coalesce(t.{s_} + s.{s_}, t.{s_}, s.{s_})"
        sets += [
            f"t.{c} = t.{c} + s.{c}",
            f"t.{s_} = {total}",
            f"t.{mn} = least(t.{mn}, s.{mn})",
            f"t.{mx} = greatest(t.{mx}, s.{mx})",
            f"t.{avg} = {total} / nullif(t.{c} + s.{c}, 0)",
        ]
    return (
        f"MERGE INTO {target} t USING {view} s ON t.{k} = s.{k} AND t.window_start = s.window_start "
        f"WHEN MATCHED THEN UPDATE SET {', '.join(sets)} WHEN NOT MATCHED THEN INSERT *"
    )


class WindowStage:
    """Every window definition of a pipeline, with its watermark."""

    # MERGEs (commits) the windows tables before their sources commit
    when: Literal["before_commits", "after_commits"] = "before_commits"

    def __init__(self, ctx: StageContext):
        self.ctx = ctx
        self.windows = list(ctx.config.windows)
        self.watermarks: dict[str, int | None] = {}

    def reads(self) -> dict[str, set[str]]:
        return {w.table: {w.source} for w in self.windows}

    def idle(self) -> None:
        pass

    def close(self) -> None:
        pass

    def _ident(self, w: WindowSettings) -> str:
        ns, tbl = w.table.split(".")
        return quote_table(self.ctx.config.catalog.name, ns, tbl)

    def _ensure_table(self, w: WindowSettings) -> None:
        from lakestream.sink.catalog.sink import create_table

        ns, tbl = w.table.split(".")
        ctx = self.ctx
        if ctx.tables.exists(ns, tbl):
            return
        part = f"bucket({w.key_buckets}, {quote_column(w.key)})" if w.key_buckets else quote_column(w.key)
        create_table(
            ctx.spark,
            ctx.config.catalog.name,
            ns,
            tbl,
            {
                "columns": [{"name": n, "type": t} for n, t in window_columns(w)],
                "partition_by": ["days(window_start)", part],
                "properties": dict(DEFAULT_TABLE_PROPERTIES),
            },
        )
        ctx.tables.schema(ns, tbl, refresh=True)
        log.info("created windows table %s", w.table)

    def run(self, report: BatchReport, isolated: bool = False) -> None:
        from lakestream.runtime.spark import jvm_helper

        ctx = self.ctx
        for w in self.windows:
            source = report.tables.get(w.source)
            if source is None or not source.files:
                continue
            self._ensure_table(w)
            ident = self._ident(w)
            helper = jvm_helper(ctx.spark)
            if w.name not in self.watermarks:
                raw = helper.latestSummaryValue(ctx.spark._jsparkSession, ident, WATERMARK_PROPERTY)
                self.watermarks[w.name] = int(raw) if raw else None
            committed = ctx.offsets.load(ident)
            rows = read_data_files([f.path for f in source.files])
            missing = [
                c
                for c in (w.key, w.event_time, *w.fields, "_topic", "_kafka_partition", "_kafka_offset")
                if c not in rows.column_names
            ]
            if missing:
                raise ConfigError(
                    f"window {w.name}: source {w.source} has no column(s) {missing} — fix: select them "
                    f"in the transform that writes it"
                )
            positions = list(
                zip(
                    rows.column("_topic").to_pylist(),
                    rows.column("_kafka_partition").to_pylist(),
                    rows.column("_kafka_offset").to_pylist(),
                    strict=True,
                )
            )
            fresh = [i for i, (t, p, o) in enumerate(positions) if o >= committed.get(TP(t, p), -1)]
            if not fresh:
                continue
            rows = rows.take(pa.array(fresh, pa.int64()))
            positions = [positions[i] for i in fresh]
            watermark = self.watermarks[w.name]
            partials, late = partial_windows(rows, w, watermark)
            for i in late:
                t, p, o = positions[i]
                row = {k: v for k, v in rows.slice(i, 1).to_pylist()[0].items() if not k.startswith("_")}
                report.dead_letters.append(
                    DeadLetter(
                        TP(t, p),
                        o,
                        None,
                        f"late: window {w.name}: event time {row.get(w.event_time)} is more than "
                        f"allowed_lateness_s={w.allowed_lateness_s:g} behind the watermark "
                        f"{watermark} ms (its last window had ended)",
                        None,
                        orjson.dumps(row, default=str),
                        w.table,
                        "late",
                    )
                )
            newest = _max_event_ms(rows, w)
            if newest is not None:
                candidate = newest - int(w.watermark_delay_s * 1000)
                self.watermarks[w.name] = candidate if watermark is None else max(watermark, candidate)
            consumed = {TP(t, p): report.ends[TP(t, p)].next_offset for t, p, _ in positions if TP(t, p) in report.ends}
            merged = ctx.offsets.merged_after_commit(ident, consumed)
            props = ctx.commit_properties(merged, None, **{WATERMARK_PROPERTY: str(self.watermarks[w.name])})
            if partials.num_rows:
                view = f"lakestream_windows_{w.name}"
                ctx.spark.createDataFrame(partials.to_pandas()).createOrReplaceTempView(view)
                helper.sqlWithCommitProperties(ctx.spark._jsparkSession, _merge_sql(w, ident, view), props)
                ctx.offsets.record(ident, merged)
            log.info(
                "window %s: %d window row(s) upserted, %d late event(s), watermark %s",
                w.name,
                partials.num_rows,
                len(late),
                self.watermarks[w.name],
            )


def _max_event_ms(rows: pa.Table, w: WindowSettings) -> int | None:
    column = rows.column(w.event_time)
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.timestamp("ms", tz=column.type.tz), safe=False).cast(pa.int64())
    import pyarrow.compute as pc

    value: Any = pc.max(column).as_py()
    return None if value is None else int(value)
