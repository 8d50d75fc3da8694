"""MariaDB through Debezium's MariaDB connector: its snapshot, then the binary log (row events, full row images,
GTIDs), with the schema history kept durably.

The binlog carries rows without column names or types: the connector replays the DDL it has seen (the schema
history) to interpret them, so the history must survive as long as the offsets do. The embedded engine keeps both
in the state dir, side by side (``<slot_name>.offsets``, ``<slot_name>.schema-history``: Debezium's
FileSchemaHistory): they are lost or kept together, and the history needs no Kafka client settings of its own (a
Kafka topic would need the capture's librdkafka settings, SASL and TLS included, rewritten as Java client
settings). A Kafka Connect worker keeps its offsets in Kafka, so its connector gets Debezium's default, a Kafka
topic (KafkaSchemaHistory).

The start check (`MariaDB.prepare`) stops capture before Debezium starts, naming the setting or the GRANT to run:
the binary log on, ``binlog_format=ROW``, ``binlog_row_image=FULL``, the user's REPLICATION SLAVE, BINLOG MONITOR
(REPLICATION CLIENT), SELECT on every captured table and, when Debezium's snapshot reads rows, RELOAD or LOCK
TABLES; every table must exist and be a base table.
"""

from __future__ import annotations

import logging
import re
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lakestream.capture.mariadb_connection import source_connection
from lakestream.config import CaptureSettings, KafkaSettings
from lakestream.errors import CaptureError
from lakestream.identifiers import SourceTableName

if TYPE_CHECKING:
    from lakestream.capture.columns import CatalogColumn

log = logging.getLogger(__name__)

CONNECTOR_CLASS = "io.debezium.connector.mariadb.MariaDbConnector"
# TINYINT(1) and BOOLEAN (which MariaDB stores as TINYINT(1)) as Connect booleans, not INT16.
BOOLEAN_CONVERTER = "io.debezium.connector.binlog.converters.TinyIntOneToBooleanConverter"
FILE_SCHEMA_HISTORY = "io.debezium.storage.file.history.FileSchemaHistory"
ZERO_DATE_CONVERTER = "lakestream.capture.ZeroDateConverter"
KAFKA_SCHEMA_HISTORY = "io.debezium.storage.kafka.history.KafkaSchemaHistory"
# Snapshot modes in which Debezium reads the tables' rows (and so locks them briefly).
_DATA_SNAPSHOT_MODES = {"initial", "initial_only", "when_needed", "always", "recovery"}


def schema_history_file(state_dir: Path, capture: CaptureSettings) -> Path:
    """Where the embedded engine keeps the connector's schema history, beside its offsets."""
    return Path(state_dir) / "capture" / f"{capture.slot_name}.schema-history"


def schema_history_topic(capture: CaptureSettings) -> str:
    """The schema history topic of a connector on a Kafka Connect worker (outside the tables' topic names)."""
    return f"__lakestream-schema-history.{capture.topic_prefix}"


def default_server_id(capture: CaptureSettings) -> int:
    """A replica id derived from the topic prefix (so two pipelines on one server differ), in 100000..4194303999."""
    return 100_000 + zlib.crc32(capture.topic_prefix.encode()) % 4_194_204_000


class MariaDB:
    """`CaptureDatabase` for ``kind: mariadb``."""

    kind = "mariadb"
    jar_group = "debezium-mariadb"
    metrics_domain = "debezium.mariadb"

    def connector_name(self, capture: CaptureSettings) -> str:
        return f"{capture.topic_prefix}-mariadb"

    def stream_name(self, capture: CaptureSettings) -> str:
        return "the binlog"

    def debezium_settings(self, capture: CaptureSettings) -> dict[str, str]:
        db = capture.database
        tables = capture.source_tables
        props = {
            "connector.class": CONNECTOR_CLASS,
            "database.hostname": db.host,
            "database.port": str(db.port),
            "database.user": db.user,
            "database.password": db.password.get_secret_value() if db.password else "",
            "database.server.id": str(db.server_id or default_server_id(capture)),
            "topic.prefix": capture.topic_prefix,
            # The history then holds the DDL of the captured databases only.
            "database.include.list": ",".join(sorted({t.schema_include_pattern() for t in tables})),
            "table.include.list": ",".join(t.include_pattern() for t in tables),
            "snapshot.mode": capture.snapshot_mode,
            "skipped.operations": capture.skipped_operations,
            "tombstones.on.delete": "true",
            # Schema changes stay in the history; as events they would go to a topic named after the prefix.
            "include.schema.changes": "false",
            "decimal.handling.mode": "precise",
            # BIGINT UNSIGNED as decimal(20,0): above 2^63 a long would wrap to a negative number.
            "bigint.unsigned.handling.mode": "precise",
            "converters": "lakestreamBoolean",
            "lakestreamBoolean.type": BOOLEAN_CONVERTER,
            # Heartbeats let an idle connector record its binlog position (other databases' writes move it on).
            "heartbeat.interval.ms": "10000",
        }
        if db.zero_dates != "debezium":
            # NOT NULL date columns taken over by lakestream's converter (the capture jar): a zero date becomes NULL
            # or a dead letter instead of 1970-01-01.
            props["converters"] += ",lakestreamZeroDate"
            props["lakestreamZeroDate.type"] = ZERO_DATE_CONVERTER
            props["lakestreamZeroDate.mode"] = db.zero_dates
        if not db.password:
            del props["database.password"]
        return props

    def embedded_settings(self, capture: CaptureSettings, state_dir: Path) -> dict[str, str]:
        return {
            "schema.history.internal": FILE_SCHEMA_HISTORY,
            "schema.history.internal.file.filename": str(schema_history_file(state_dir, capture).resolve()),
        }

    def connect_settings(self, capture: CaptureSettings, kafka: KafkaSettings | None) -> dict[str, str]:
        if capture.database.zero_dates != "debezium":
            raise CaptureError(
                f"capture.database.zero_dates: {capture.database.zero_dates} runs lakestream's converter "
                "class, which a Kafka Connect worker does not have — fix: remove zero_dates for a "
                "connector on Connect (Debezium's rule then applies), or run `lakestream capture`"
            )
        if capture.snapshot == "parallel":
            raise CaptureError(
                "snapshot: parallel hands a MariaDB source over to the binlog through the embedded "
                "engine's offsets and a schema recovery at its first start, which a connector on Kafka "
                "Connect is not given — fix: run `lakestream capture` (after `lakestream snapshot`), or "
                "set snapshot: debezium for a connector on Connect"
            )
        if kafka is None:
            raise CaptureError(
                "a MariaDB connector on Kafka Connect keeps its schema history in a Kafka topic: pass "
                "the pipeline's kafka settings (connect_json(capture, kafka=config.kafka))"
            )
        return {
            "schema.history.internal": KAFKA_SCHEMA_HISTORY,
            "schema.history.internal.kafka.bootstrap.servers": kafka.bootstrap_servers,
            "schema.history.internal.kafka.topic": schema_history_topic(capture),
        }

    def state_files(self, capture: CaptureSettings, state_dir: Path) -> list[Path]:
        return [schema_history_file(state_dir, capture)]

    def prepare(self, capture: CaptureSettings, resuming: bool = False) -> list[str]:
        conn = source_connection(capture)
        try:
            return check_source(conn, capture, resuming)
        finally:
            conn.close()

    def source_connection(self, capture: CaptureSettings) -> Any:
        return source_connection(capture)

    def read_columns(self, conn: Any, tables: list[SourceTableName]) -> dict[str, tuple[CatalogColumn, ...]]:
        from lakestream.capture.columns import CatalogColumn, default_wire_value, mariadb_default_literal
        from lakestream.capture.source_columns import UnsupportedColumn, mariadb_source_column

        pairs = ", ".join(["(%s, %s)"] * len(tables))
        with conn.cursor() as cur:
            cur.execute(
                "SELECT TABLE_SCHEMA, TABLE_NAME, COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, NUMERIC_PRECISION, "
                "NUMERIC_SCALE, COLUMN_DEFAULT, IS_NULLABLE FROM information_schema.COLUMNS "
                f"WHERE (TABLE_SCHEMA, TABLE_NAME) IN ({pairs}) "
                "ORDER BY TABLE_SCHEMA, TABLE_NAME, ORDINAL_POSITION",
                [part for t in tables for part in (t.schema, t.table)],
            )
            rows = cur.fetchall()
        found: dict[str, list[CatalogColumn]] = {}
        for schema, table, name, data_type, column_type, precision, scale, default, nullable in rows:
            columns = found.setdefault(str(SourceTableName(schema, table)), [])
            try:
                ddl = mariadb_source_column(name, data_type, column_type, precision, scale).ddl
            except UnsupportedColumn:
                continue  # its type arrives with the table's next row
            literal = mariadb_default_literal(
                default, nullable == "YES", str(data_type).lower(), str(column_type).lower(), ddl
            )
            columns.append(CatalogColumn(name, ddl, default_wire_value(ddl, literal)))
        return {table: tuple(columns) for table, columns in found.items()}


def table_signature(cur: Any, database: str, table: str) -> list[list[str]]:
    """The table's columns as [name, full type] in order: what the parallel snapshot records at its handover and
    capture compares before Debezium records the schemas (a change since the handover would misread the binlog
    written before it, `lakestream.capture.handover.check_unchanged_since_handover`)."""
    cur.execute(
        "SELECT COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND "
        "TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
        (database, table),
    )
    return [[str(n), str(t)] for n, t in cur.fetchall()]


def check_source(conn: Any, capture: CaptureSettings, resuming: bool = False) -> list[str]:
    """CaptureError naming every setting, grant or table that would keep changes of ``capture.tables`` from
    reaching Kafka; the captured tables without a primary key otherwise.

    A captured table that is missing when capture resumes (``resuming``: it has offsets) was dropped or renamed
    while capture streamed: a warning, so one table gone does not stop the others. On a first start it is an
    error (a misspelt name would otherwise capture nothing, silently)."""
    problems: list[str] = []
    with conn.cursor() as cur:
        cur.execute("SELECT @@log_bin, @@binlog_format, @@binlog_row_image")
        log_bin, binlog_format, row_image = cur.fetchone()
        if not int(log_bin):
            problems.append(
                "the binary log is off (log_bin = OFF) — fix: start MariaDB with log-bin (e.g. "
                "log-bin=binlog and server-id=1 in the [mariadb] section of its config) and restart it"
            )
        if str(binlog_format).upper() != "ROW":
            problems.append(
                f"binlog_format is {binlog_format}, and Debezium reads row events only — fix: SET GLOBAL "
                "binlog_format = 'ROW' (and binlog_format=ROW in the server's config, so a restart keeps "
                "it); sessions opened before keep their format until they reconnect"
            )
        if str(row_image).upper() != "FULL":
            problems.append(
                f"binlog_row_image is {row_image}: updates and deletes would carry only some columns, "
                "and the mirror would lose the others — fix: SET GLOBAL binlog_row_image = 'FULL' (and "
                "binlog_row_image=FULL in the server's config)"
            )
        tables = capture.source_tables
        keyless = _check_tables(cur, tables, problems, resuming)
        _check_grants(cur, capture, tables, problems)
        if capture.database.zero_dates == "debezium":
            _warn_zero_dates(cur, tables)
    if problems:
        raise CaptureError("capture cannot start:\n  " + "\n  ".join(problems))
    return keyless


def _check_tables(cur: Any, tables: list[SourceTableName], problems: list[str], resuming: bool) -> list[str]:
    keyless: list[str] = []
    for name in tables:
        cur.execute(
            "SELECT TABLE_TYPE FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
            (name.schema, name.table),
        )
        row = cur.fetchone()
        if row is None and resuming:
            log.warning(
                "capture: %s no longer exists (dropped or renamed while capture streamed); its mirror stays "
                "as it was, and a table created again under this name continues it — fix: remove it from "
                "capture.tables if it is gone for good",
                name,
            )
            continue
        if row is None:
            problems.append(
                f"{name} does not exist in the source database (or the user cannot see it) — fix: "
                "create it before capture starts, GRANT SELECT on it, or remove it from capture.tables "
                "(write tables as <database>.<table>, case included)"
            )
            continue
        if row[0] != "BASE TABLE":
            problems.append(
                f"{name} is a {str(row[0]).lower()}, which writes no row events — fix: capture the "
                "tables it reads from instead"
            )
            continue
        # STATISTICS, not TABLE_CONSTRAINTS: MariaDB hides constraints from a user who may only SELECT.
        cur.execute(
            "SELECT 1 FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s "
            "AND INDEX_NAME = 'PRIMARY' LIMIT 1",
            (name.schema, name.table),
        )
        if cur.fetchone() is None:
            keyless.append(str(name))
    return keyless


# What keeps zero dates ('0000-00-00', '2024-00-10') out of a server's tables.
_NO_ZERO_DATES = {"NO_ZERO_DATE", "NO_ZERO_IN_DATE"}
_STRICT = {"STRICT_TRANS_TABLES", "STRICT_ALL_TABLES", "TRADITIONAL"}


def _warn_zero_dates(cur: Any, tables: list[SourceTableName]) -> list[str]:
    """Warn about NOT NULL DATE/DATETIME/TIMESTAMP columns when the server's sql_mode lets zero dates in: Debezium
    reads a zero date as NULL, and a column that may not be NULL gets the epoch (1970-01-01) instead, which
    nothing downstream can tell from a real 1970-01-01. Returns the columns warned about (``db.table.column``)."""
    cur.execute("SELECT @@GLOBAL.sql_mode")
    modes = set(str(cur.fetchone()[0]).upper().split(","))
    if _NO_ZERO_DATES <= modes and modes & _STRICT:
        return []
    exposed: list[str] = []
    for name in tables:
        cur.execute(
            "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s "
            "AND IS_NULLABLE = 'NO' AND DATA_TYPE IN ('date', 'datetime', 'timestamp') "
            "ORDER BY ORDINAL_POSITION",
            (name.schema, name.table),
        )
        exposed += [f"{name}.{column}" for (column,) in cur.fetchall()]
    if exposed:
        log.warning(
            "capture: the server's sql_mode admits zero dates, and Debezium turns a zero date in a NOT NULL "
            "column into 1970-01-01 (a nullable column gets NULL): %s — fix: SET GLOBAL sql_mode to include "
            "NO_ZERO_DATE,NO_ZERO_IN_DATE and STRICT_TRANS_TABLES (so no zero date is written), or set "
            "capture.database.zero_dates: null or dead_letter",
            ", ".join(exposed),
        )
    return exposed


# `SHOW GRANTS` lines: GRANT <privileges> ON <scope> TO <user> (role grants have no ON and are skipped).
_GRANT = re.compile(r"^GRANT (?P<privileges>.+?) ON (?P<scope>(?:\*|`(?:[^`]|``)*`)\.(?:\*|`(?:[^`]|``)*`)) TO ")
_PART = re.compile(r"\*|`((?:[^`]|``)*)`")
# MariaDB 10.5+ reports REPLICATION CLIENT as BINLOG MONITOR, and may report REPLICATION SLAVE as REPLICATION
# REPLICA.
_ALIASES = {"REPLICATION CLIENT": "BINLOG MONITOR", "REPLICATION REPLICA": "REPLICATION SLAVE"}


def _grants(cur: Any) -> list[tuple[set[str], str | None, str | None]]:
    """(privileges, database or None for *, table or None for *) of every grant of the current user and its
    enabled roles (MariaDB's `SHOW GRANTS` lists the grants of the default role a connection starts with too)."""
    cur.execute("SHOW GRANTS")
    out = []
    for (line,) in cur.fetchall():
        match = _GRANT.match(line)
        if match is None:
            continue
        privileges = set()
        depth, current = 0, ""
        for char in match["privileges"] + ",":
            depth += char == "("
            depth -= char == ")"
            if char == "," and depth == 0:
                privilege = re.sub(r"\s*\(.*\)$", "", current.strip()).upper()  # column grants count as table grants
                privileges.add(_ALIASES.get(privilege, privilege))
                current = ""
            else:
                current += char
        database, table = [
            None if p.group(0) == "*" else p.group(1).replace("``", "`") for p in _PART.finditer(match["scope"])
        ][:2]
        out.append((privileges, database, table))
    return out


def _has(
    grants: list[tuple[set[str], str | None, str | None]],
    privilege: str,
    database: str | None = None,
    table: str | None = None,
) -> bool:
    for privileges, db, tb in grants:
        if not (privilege in privileges or "ALL PRIVILEGES" in privileges or "ALL" in privileges):
            continue
        if db is None or (db == database and (tb is None or tb == table)):
            return True
    return False


def _check_grants(cur: Any, capture: CaptureSettings, tables: list[SourceTableName], problems: list[str]) -> None:
    grants = _grants(cur)
    cur.execute("SELECT CURRENT_USER()")
    user, _, host = str(cur.fetchone()[0]).rpartition("@")
    account = f"'{user}'@'{host}'"
    if not _has(grants, "REPLICATION SLAVE"):
        problems.append(f"{account} may not read the binary log — fix: GRANT REPLICATION SLAVE ON *.* TO {account}")
    if not _has(grants, "BINLOG MONITOR"):
        problems.append(
            f"{account} may not ask for the binlog position (SHOW MASTER STATUS) — fix: GRANT "
            f"REPLICATION CLIENT ON *.* TO {account}"
        )
    for name in tables:
        if not _has(grants, "SELECT", name.schema, name.table):
            problems.append(
                f"{account} may not read {name} — fix: GRANT SELECT ON `{name.schema}`.`{name.table}` TO {account}"
            )
    locking = capture.connector.get("snapshot.locking.mode", "minimal")
    if capture.snapshot_mode in _DATA_SNAPSHOT_MODES and locking != "none" and not _has(grants, "RELOAD"):
        unlocked = [n for n in tables if not _has(grants, "LOCK TABLES", n.schema, n.table)]
        if unlocked:
            problems.append(
                f"Debezium's snapshot locks the tables while it reads their schema and binlog position, "
                f"and {account} may neither FLUSH TABLES WITH READ LOCK nor LOCK TABLES "
                f"{', '.join(map(str, unlocked))} — fix: GRANT RELOAD ON *.* TO {account} (or GRANT LOCK "
                "TABLES on their databases)"
            )
