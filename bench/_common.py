"""Shared helpers for the benchmarks: a private stack, pipeline configs, Debezium-shaped change events,
base tables filled through the sink's write path, process memory, machine load and freshness percentiles.

Benchmarks start their own PostgreSQL + broker on free ports under a fresh state directory, so they
never collide with tests or a developer's `.lakestream/`, and remove it all at the end.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# Child processes (a `lakestream run` the bench starts, Spark's Python workers) import this checkout too, not
# the one the venv was installed from: a bench run from a git worktree measures the worktree's code.
os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])

from lakestream.config import PipelineConfig, parse_config  # noqa: E402
from lakestream.stack import Stack, StackSettings  # noqa: E402
from lakestream.stack.models import StackInfo  # noqa: E402
from lakestream.stack.process import free_ports, stop_pid  # noqa: E402

# -- machine --------------------------------------------------------------------------------------


def machine_load() -> dict[str, Any]:
    """The load average (1, 5, 15 min) and core count, so readers can judge the figures."""
    one, five, fifteen = os.getloadavg()
    return {
        "loadavg_1m": round(one, 2),
        "loadavg_5m": round(five, 2),
        "loadavg_15m": round(fifteen, 2),
        "cpus": os.cpu_count(),
    }


def rss_bytes(pid: int | str = "self") -> int | None:
    """Resident set size of a process from /proc (None if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def driver_memory(spark) -> dict[str, Any]:
    """RSS of the Spark driver JVM and of this Python process, plus the JVM heap in use."""
    jvm = spark.sparkContext._jvm
    jvm_pid = int(jvm.java.lang.ProcessHandle.current().pid())
    heap = jvm.java.lang.management.ManagementFactory.getMemoryMXBean().getHeapMemoryUsage()
    return {
        "jvm_pid": jvm_pid,
        "jvm_rss_mb": _mb(rss_bytes(jvm_pid)),
        "jvm_heap_used_mb": _mb(heap.getUsed()),
        "jvm_heap_committed_mb": _mb(heap.getCommitted()),
        "python_rss_mb": _mb(rss_bytes()),
    }


def _mb(value: int | None) -> float | None:
    return None if value is None else round(value / 2**20, 1)


# -- the private stack ----------------------------------------------------------------------------


@contextlib.contextmanager
def private_stack(
    prefix: str,
    keep: bool = False,
    storage: str = "local",
    catalog: str = "jdbc",
    state_dir: Path | None = None,
    discard_topics: bool = False,
    source: str = "postgresql",
) -> Iterator[tuple[StackInfo, Path]]:
    """A PostgreSQL + Apache Kafka stack on free ports in a fresh state dir (with ``storage="s3"`` a local
    S3-compatible store holds the warehouse, with ``catalog="rest"`` a local REST catalog serves it);
    stopped (and removed) on exit.

    ``state_dir`` starts the stack in that directory instead (created if missing, its catalog and tables
    reused if not) and never removes it. ``discard_topics`` ends the broker with SIGKILL and removes its
    topics: a run's millions of records that nobody reads again. ``source="mariadb"``: a MariaDB source server too."""
    created = state_dir is None
    if state_dir is None:
        state_dir = Path(tempfile.mkdtemp(prefix=f"lakestream-{prefix}-"))
    else:
        state_dir = state_dir.resolve()
        state_dir.mkdir(parents=True, exist_ok=True)
    state_dir.chmod(0o711)  # PostgreSQL runs as another user and must reach its data dir
    pg_port, kafka_port, s3_port, rest_port, mariadb_port = free_ports(5)
    stack = Stack(
        StackSettings(
            state_dir=state_dir,
            pg_port=pg_port,
            kafka_port=kafka_port,
            storage=storage,
            s3_port=s3_port,
            catalog=catalog,
            rest_port=rest_port,
            source=source,
            mariadb_port=mariadb_port,
        )
    )
    try:
        info = stack.up()
        os.environ.update(info.storage_env())  # the config names these variables
        yield info, state_dir
    finally:
        if discard_topics:
            pid = stack.broker.pid()
            if pid is not None:
                stop_pid(pid, sig=signal.SIGKILL, timeout=10)
            shutil.rmtree(state_dir / "kafka", ignore_errors=True)
        stack.down()
        if created and not keep:
            shutil.rmtree(state_dir, ignore_errors=True)


def pipeline_data(
    info: StackInfo,
    state_dir: Path,
    name: str,
    streams: list[dict[str, Any]],
    engine: dict[str, Any] | None = None,
    capture: dict[str, Any] | None = None,
    driver_memory: str = "2g",
) -> dict[str, Any]:
    """A pipeline config mapping for the private stack (real passwords: write it 0600)."""
    data: dict[str, Any] = {
        "name": name,
        "state_dir": str(state_dir / "pipeline"),
        "kafka": {"bootstrap_servers": info.bootstrap_servers, "group_id": f"bench-{name}"},
        "catalog": info.catalog_config("lake"),
        **({"storage": info.storage_config()} if info.storage_config() else {}),
        "streams": streams,
        "engine": {"commit_interval_s": 0, "idle_poll_s": 0.2, **(engine or {})},
        "spark": {"master": "local[2]", "driver_memory": driver_memory},
    }
    if capture is not None:
        data["capture"] = capture
    return data


def to_config(data: dict[str, Any]) -> PipelineConfig:
    return parse_config(data, "<bench>")


def write_pipeline_yaml(path: Path, data: dict[str, Any]) -> Path:
    """Write a pipeline YAML readable by its owner only (it holds the stack's password)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        yaml.safe_dump(data, fh, sort_keys=False)
    return path


# -- Debezium-shaped change events ----------------------------------------------------------------

# The columns of the benchmark table, as PostgreSQL DDL and as Debezium (schemas on) describes them.
# Debezium's JsonConverter writes Kafka Connect FLOAT64 as "double" (FLOAT32 as "float").
ORDERS_DDL = """
    id integer PRIMARY KEY,
    customer_id bigint NOT NULL,
    status text,
    amount numeric(12,2),
    qty integer,
    price {price_type},
    express boolean,
    version integer NOT NULL,
    created_day date,
    created_at timestamp,
    updated_at timestamptz,
    note text
"""
_VALUE_FIELDS = [
    {"type": "int32", "optional": False, "field": "id"},
    {"type": "int64", "optional": False, "field": "customer_id"},
    {"type": "string", "optional": True, "field": "status"},
    {
        "type": "bytes",
        "optional": True,
        "name": "org.apache.kafka.connect.data.Decimal",
        "version": 1,
        "parameters": {"scale": "2", "connect.decimal.precision": "12"},
        "field": "amount",
    },
    {"type": "int32", "optional": True, "field": "qty"},
    {"type": "double", "optional": True, "field": "price"},  # JsonConverter names FLOAT64 "double"
    {"type": "boolean", "optional": True, "field": "express"},
    {"type": "int32", "optional": False, "field": "version"},
    {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "version": 1, "field": "created_day"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp", "version": 1, "field": "created_at"},
    {
        "type": "string",
        "optional": True,
        "name": "io.debezium.time.ZonedTimestamp",
        "version": 1,
        "field": "updated_at",
    },
    {"type": "string", "optional": True, "field": "note"},
]
_SOURCE_FIELDS = [
    {"type": "string", "optional": False, "field": "version"},
    {"type": "string", "optional": False, "field": "connector"},
    {"type": "string", "optional": False, "field": "name"},
    {"type": "int64", "optional": False, "field": "ts_ms"},
    {
        "type": "string",
        "optional": True,
        "name": "io.debezium.data.Enum",
        "version": 1,
        "parameters": {"allowed": "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"},
        "default": "false",
        "field": "snapshot",
    },
    {"type": "string", "optional": False, "field": "db"},
    {"type": "string", "optional": True, "field": "sequence"},
    {"type": "int64", "optional": True, "field": "ts_us"},
    {"type": "int64", "optional": True, "field": "ts_ns"},
    {"type": "string", "optional": False, "field": "schema"},
    {"type": "string", "optional": False, "field": "table"},
    {"type": "int64", "optional": True, "field": "txId"},
    {"type": "int64", "optional": True, "field": "lsn"},
    {"type": "int64", "optional": True, "field": "xmin"},
    {"type": "string", "optional": True, "field": "origin"},
    {"type": "int64", "optional": True, "field": "origin_lsn"},
]
STATUSES = ("new", "paid", "packed", "shipped", "delivered", "returned")


def _decimal_bytes(unscaled: int) -> str:
    """Kafka Connect Decimal: base64 of the big-endian two's-complement unscaled value."""
    length = max(1, (unscaled.bit_length() + 8) // 8)
    return base64.b64encode(unscaled.to_bytes(length, "big", signed=True)).decode()


@dataclass
class OrderRow:
    id: int
    customer_id: int
    qty: int
    version: int


class DebeziumEvents:
    """Schemas-on Debezium JSON events (key, value) for ``<prefix>.public.<table>``, shaped like the
    PostgreSQL connector's (pgoutput, REPLICA IDENTITY DEFAULT: updates without ``before``, deletes
    with only the key in ``before``, a tombstone after each delete)."""

    def __init__(self, prefix: str, table: str, schemas: bool = True):
        self.schemas = schemas
        self.topic = f"{prefix}.public.{table}"
        self.prefix, self.table = prefix, table
        row_struct = {"type": "struct", "fields": _VALUE_FIELDS, "optional": True, "name": f"{self.topic}.Value"}
        envelope = {
            "type": "struct",
            "optional": False,
            "name": f"{self.topic}.Envelope",
            "version": 2,
            "fields": [
                {**row_struct, "field": "before"},
                {**row_struct, "field": "after"},
                {
                    "type": "struct",
                    "fields": _SOURCE_FIELDS,
                    "optional": False,
                    "name": "io.debezium.connector.postgresql.Source",
                    "version": 1,
                    "field": "source",
                },
                {
                    "type": "struct",
                    "optional": True,
                    "name": "event.block",
                    "version": 1,
                    "field": "transaction",
                    "fields": [
                        {"type": "string", "optional": False, "field": "id"},
                        {"type": "int64", "optional": False, "field": "total_order"},
                        {"type": "int64", "optional": False, "field": "data_collection_order"},
                    ],
                },
                {"type": "string", "optional": False, "field": "op"},
                {"type": "int64", "optional": True, "field": "ts_ms"},
                {"type": "int64", "optional": True, "field": "ts_us"},
                {"type": "int64", "optional": True, "field": "ts_ns"},
            ],
        }
        key_schema = {
            "type": "struct",
            "optional": False,
            "name": f"{self.topic}.Key",
            "fields": [{"type": "int32", "optional": False, "field": "id"}],
        }
        # The schema part never changes: serialize it once and splice payloads in.
        self._value_head = b'{"schema":' + orjson.dumps(envelope) + b',"payload":' if schemas else b""
        self._key_head = b'{"schema":' + orjson.dumps(key_schema) + b',"payload":' if schemas else b""
        self._tail = b"}" if schemas else b""
        self._lsn = 30_000_000
        self._tx = 700

    def key(self, row_id: int) -> bytes:
        return self._key_head + b'{"id":' + str(row_id).encode() + b"}" + self._tail

    @staticmethod
    def row(r: OrderRow, ts_ms: int) -> dict[str, Any]:
        return {
            "id": r.id,
            "customer_id": r.customer_id,
            "status": STATUSES[r.version % len(STATUSES)],
            "amount": _decimal_bytes(r.qty * 1999 + r.version),
            "qty": r.qty,
            "price": r.qty * 19.99,
            "express": r.id % 3 == 0,
            "version": r.version,
            "created_day": 19_800 + r.id % 365,
            "created_at": (ts_ms - r.id % 86_400_000) * 1000,
            "updated_at": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts_ms / 1000)) + f".{ts_ms % 1000:03d}000Z",
            "note": f"order {r.id} v{r.version} " + "x" * (r.id % 40),
        }

    def _value(self, op: str, before: dict[str, Any] | None, after: dict[str, Any] | None, ts_ms: int) -> bytes:
        self._lsn += 232
        self._tx += 1
        payload = {
            "before": before,
            "after": after,
            "source": {
                "version": "3.6.3.Final",
                "connector": "postgresql",
                "name": self.prefix,
                "ts_ms": ts_ms,
                "snapshot": "false",
                "db": "shop",
                "sequence": f'["{self._lsn - 40}","{self._lsn}"]',
                "ts_us": ts_ms * 1000,
                "ts_ns": ts_ms * 1_000_000,
                "schema": "public",
                "table": self.table,
                "txId": self._tx,
                "lsn": self._lsn,
                "xmin": None,
                "origin": None,
                "origin_lsn": None,
            },
            "transaction": None,
            "op": op,
            "ts_ms": ts_ms + 40,
            "ts_us": (ts_ms + 40) * 1000,
            "ts_ns": (ts_ms + 40) * 1_000_000,
        }
        return self._value_head + orjson.dumps(payload) + self._tail

    def upsert(self, r: OrderRow, op: str, ts_ms: int) -> tuple[bytes, bytes]:
        """A create (``c``) or update (``u``) event."""
        return self.key(r.id), self._value(op, None, self.row(r, ts_ms), ts_ms)

    def delete(self, row_id: int, ts_ms: int) -> list[tuple[bytes, bytes | None]]:
        """A delete event (``before`` holds the key, defaults elsewhere) and its tombstone."""
        before = {f["field"]: None for f in _VALUE_FIELDS}
        before.update({"id": row_id, "customer_id": 0, "version": 0})
        key = self.key(row_id)
        return [(key, self._value("d", before, None, ts_ms)), (key, None)]


class FastProducer:
    """A confluent-kafka producer tuned for pre-filling topics; raises if any delivery failed.

    ``on_delivered(msg)`` is called for every record the broker acknowledged (its partition, offset and
    timestamp), from `send`'s polls and `flush`."""

    def __init__(self, bootstrap: str, on_delivered: Callable[[Any], None] | None = None):
        from confluent_kafka import Producer

        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": 20,
                "batch.size": 1_000_000,
                "queue.buffering.max.messages": 200_000,
                "queue.buffering.max.kbytes": 512_000,
                "enable.idempotence": True,
                "compression.type": "lz4",
            }
        )  # as capture produces
        self.failures: list[str] = []
        self.sent = 0
        self._on_delivered = on_delivered

    def _on_delivery(self, err, msg) -> None:
        if err is not None:
            self.failures.append(str(err))
        elif self._on_delivered is not None:
            self._on_delivered(msg)

    def send(self, topic: str, key: bytes | None, value: bytes | None, timestamp_ms: int | None = None) -> None:
        """Queue one record (``timestamp_ms``: its CreateTime, default now)."""
        extra = {} if timestamp_ms is None else {"timestamp": timestamp_ms}
        while True:
            try:
                self._producer.produce(topic, key=key, value=value, on_delivery=self._on_delivery, **extra)
                break
            except BufferError:
                self._producer.poll(0.05)
        self.sent += 1
        if self.sent % 1000 == 0:
            self._producer.poll(0)

    def poll(self) -> None:
        """Serve delivery reports now."""
        self._producer.poll(0)

    def flush(self) -> None:
        remaining = self._producer.flush(120)
        if remaining or self.failures:
            raise RuntimeError(f"{remaining} undelivered, {len(self.failures)} failed: {self.failures[:3]}")


# -- results --------------------------------------------------------------------------------------


def freshness(results: list[Any], since_ms: int = 0) -> dict[str, Any]:
    """Source commit → visible in Iceberg over the benchmark's batches (see lakestream.engine.freshness)."""
    from lakestream.engine.freshness import freshness_of_batches

    found = freshness_of_batches(
        (
            {"source_ts_quantiles": r.source_ts_quantiles, "commit_ts_ms": r.commit_ts_ms, "records": r.records}
            for r in results
        ),
        since_ms,
    )
    if found is None:
        return {"freshness_p50_s": None, "freshness_p99_s": None, "freshness_batches": 0}
    return {
        "freshness_p50_s": round(found.p50_s, 2),
        "freshness_p99_s": round(found.p99_s, 2),
        "freshness_batches": found.batches,
    }


def quiet_logs() -> None:
    """Warnings only, and SIGTERM unwinds like Ctrl-C so the private stack is always stopped."""
    import logging
    import signal

    def on_sigterm(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt("SIGTERM")

    signal.signal(signal.SIGTERM, on_sigterm)

    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    logging.getLogger("py4j").setLevel(logging.ERROR)


def say(text: str) -> None:
    print(text, flush=True)


def bulk_fill(spark, table: str, first: int, last: int) -> None:
    """INSERT rows ``first`` ≤ id < ``last`` into an orders table by Spark SQL, typed by the table's own schema
    (schemas-on and schemas-off tables differ), with id, customer_id, qty and version as `OrderRow` has them."""
    fixed = {"id": "id", "customer_id": "id % 50000", "qty": "id % 19 + 1", "version": "1"}
    exprs = []
    for field in spark.table(table).schema.fields:
        t = field.dataType.simpleString()
        if field.name in fixed:
            expr = fixed[field.name]
        elif t == "string":
            expr = "concat('v', id)"
        elif t == "boolean":
            expr = "id % 3 = 0"
        elif t == "date":
            expr = "date_add(DATE'2024-03-17', CAST(id % 365 AS int))"
        elif t.startswith("timestamp"):
            expr = "TIMESTAMP'2024-01-01 00:00:00'"
        elif t == "binary":
            expr = "'x'"
        else:
            expr = "id % 1000"
        exprs.append(f"CAST({expr} AS {t})")
    parts = max(2, (last - first) // 2_000_000)
    spark.sql(f"INSERT INTO {table} SELECT {', '.join(exprs)} FROM range({first}, {last}, 1, {parts})")


# -- base tables filled through the sink's write path ---------------------------------------------


def _fill_files(spec_json: str, first: int, last: int, rows_per_file: int, like_events: bool = False):
    """A Spark task: rows ``first`` ≤ id < ``last`` as data files written by the sink's writer. With ``like_events``
    the columns of a schemas-off orders table hold what `DebeziumEvents.row` sends for the row (version 1), so the
    files weigh what the pipeline's own files weigh per row; else short placeholders."""
    # Computed here, not in the task: the task must not refer to this module, which the executors cannot import.
    amounts = [_decimal_bytes((qty + 1) * 1999 + 1) for qty in range(19)]  # by id % 19 (qty = id % 19 + 1)
    status = STATUSES[1]
    updated_at = "2026-11-20T08:00:00.000000Z"

    def event_like(name: str, ids, t):
        import numpy as np
        import pyarrow as pa

        if name == "status" and pa.types.is_string(t):
            return pa.array(np.full(len(ids), status, dtype=object), t)
        if name == "amount" and pa.types.is_string(t):
            return pa.array(np.array(amounts, dtype=object)[ids % 19], t)
        if name == "price" and pa.types.is_floating(t):
            return pa.array((ids % 19 + 1) * 19.99).cast(t)
        if name == "created_day" and pa.types.is_integer(t):
            return pa.array(19_800 + ids % 365).cast(t)
        if name == "created_at" and pa.types.is_integer(t):
            return pa.array((1_795_000_000_000 - ids % 86_400_000) * 1000).cast(t)
        if name == "updated_at" and pa.types.is_string(t):
            return pa.array(np.full(len(ids), updated_at, dtype=object), t)
        if name == "note" and pa.types.is_string(t):
            return pa.array([f"order {x} v1 " + "x" * (x % 40) for x in ids.tolist()], t)
        return None

    def run(indexes):
        import numpy as np
        import pyarrow as pa

        from lakestream.sink.types import arrow_schema
        from lakestream.sink.write.files import write_data_file

        spec = json.loads(spec_json)
        schema = arrow_schema(spec["schema"])
        for i in indexes:
            lo = first + i * rows_per_file
            hi = min(last, lo + rows_per_file)
            ids = np.arange(lo, hi, dtype=np.int64)
            columns = {}
            for f in schema:
                t, n = f.type, f.name
                if n == "id":
                    v = pa.array(ids).cast(t)
                elif n == "customer_id":
                    v = pa.array(ids % 50000).cast(t)
                elif n == "qty":
                    v = pa.array(ids % 19 + 1).cast(t)
                elif n == "version":
                    v = pa.array(np.ones(len(ids), np.int64)).cast(t)
                elif like_events and (like := event_like(n, ids, t)) is not None:
                    v = like
                elif pa.types.is_string(t):
                    v = pa.array([f"v{x}" for x in ids.tolist()], t)
                elif pa.types.is_boolean(t):
                    v = pa.array(ids % 3 == 0)
                elif pa.types.is_date(t):
                    v = pa.array((19_800 + ids % 365).astype(np.int32)).cast(pa.int32()).cast(t)
                elif pa.types.is_timestamp(t):
                    v = pa.array(np.full(len(ids), 1_704_067_200_000_000, np.int64)).cast(pa.timestamp("us")).cast(t)
                elif pa.types.is_decimal(t):
                    v = pa.array([None] * len(ids), t)
                elif pa.types.is_floating(t):
                    v = pa.array((ids % 1000).astype(np.float64)).cast(t)
                else:
                    v = pa.array(ids % 1000).cast(t)
                columns[n] = v
            written = write_data_file(pa.table(columns, schema=schema), spec["data_location"], schema, "bulk")
            yield json.dumps(
                {
                    "path": written["path"],
                    "file_size": written["file_size"],
                    "record_count": written["record_count"],
                    "partition": [],
                }
            )

    return run


def fill_through_sql(spark, name: str, first: int, last: int, rows_per_insert: int, files_per_insert: int) -> int:
    """Rows ``first`` ≤ id < ``last`` added by Spark SQL ``INSERT INTO ... SELECT ... FROM range(...)`` statements of
    ``rows_per_insert`` rows, each written by ``files_per_insert`` tasks (a file each): the table grown by another
    writer, as a backfill or a migration grows it. The columns hold what `_fill_files` (``like_events``) writes, so
    the rows are the ones a schemas-off orders table gets from the events. Returns the number of statements."""
    from lakestream.identifiers import TableName, quote_column, quote_table

    table = TableName.parse(name)
    qualified = quote_table("lake", table.namespace, table.table)
    amounts = ", ".join(f"'{_decimal_bytes((qty + 1) * 1999 + 1)}'" for qty in range(19))
    by_name = {
        "id": "id",
        "customer_id": "id % 50000",
        "qty": "id % 19 + 1",
        "version": "1",
        "status": f"'{STATUSES[1]}'",
        "amount": f"element_at(array({amounts}), CAST(id % 19 + 1 AS INT))",
        "price": "(id % 19 + 1) * 19.99",
        "created_day": "19800 + id % 365",
        "created_at": "(1795000000000 - id % 86400000) * 1000",
        "updated_at": "'2026-11-20T08:00:00.000000Z'",
        "note": "concat('order ', id, ' v1 ', repeat('x', CAST(id % 40 AS INT)))",
    }
    fields = spark.table(qualified).schema.fields
    select = ", ".join(
        f"CAST({by_name.get(f.name, 'NULL')} AS {f.dataType.simpleString()}) AS {quote_column(f.name)}" for f in fields
    )
    statements = 0
    for lo in range(first, last, rows_per_insert):
        hi = min(last, lo + rows_per_insert)
        spark.sql(f"INSERT INTO {qualified} SELECT {select} FROM range({lo}, {hi}, 1, {files_per_insert})")
        statements += 1
    return statements


def fill_through_write_path(
    spark, config, name: str, first: int, last: int, rows_per_file: int, like_events: bool = False
) -> int:
    """Rows ``first`` ≤ id < ``last`` as data files of ``rows_per_file`` rows, committed in chunks by the sink's
    commit; returns the number of files. ``like_events``: rows as the events would carry them (`_fill_files`)."""
    from lakestream.identifiers import TableName
    from lakestream.sink.catalog.sink import commit_files, table_info

    table = TableName.parse(name)
    info = table_info(spark, config.catalog.name, table.namespace, table.table)
    spec_json = json.dumps({"schema": info["schema"], "data_location": info["data_location"]})
    files = (last - first + rows_per_file - 1) // rows_per_file
    written = [
        json.loads(x)
        for x in spark.sparkContext.parallelize(range(files), max(2, files // 250))
        .mapPartitions(_fill_files(spec_json, first, last, rows_per_file, like_events))
        .collect()
    ]
    for i in range(0, len(written), 500):
        commit_files(
            spark,
            config.catalog.name,
            table.namespace,
            table.table,
            {"data_files": written[i : i + 500], "deletes": [], "properties": {}},
        )
    return len(written)
