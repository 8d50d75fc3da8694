"""The parallel snapshot's handover point: the file a finished `lakestream snapshot` leaves, and Debezium's
stream started at that point.

`lakestream snapshot` created the slot and loaded the tables as of its consistent point. Debezium
must neither snapshot again nor start later than that point (left to itself on a slot it did not
create, it would start at the current WAL position and skip what was written since). So before its
first start, the embedded engine's offset store is seeded with the handover LSN as a streaming
position, the form Debezium itself stores once its own snapshot is done, and the connector runs
with ``snapshot.mode=no_data``.

A MariaDB source is handed over at a binlog position the same way: the offsets hold its file, position and GTID
state, and the first start runs ``snapshot.mode=recovery`` (the tables' schemas into Debezium's history, no rows),
after checking that no table's columns changed since the handover (`check_unchanged_since_handover`).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import orjson

from lakestream.capture.connector import offsets_file
from lakestream.capture.databases.mariadb import schema_history_file, table_signature
from lakestream.capture.mariadb_connection import source_connection
from lakestream.config import CaptureSettings, PipelineConfig
from lakestream.errors import CaptureError
from lakestream.identifiers import SourceTableName

log = logging.getLogger(__name__)


def handover_path(state_dir: str | Path, capture: CaptureSettings) -> Path:
    """Where a finished snapshot leaves the handover point for ``lakestream capture``."""
    return Path(state_dir) / "capture" / f"{capture.slot_name}.handover.json"


def write_handover(state_dir: str | Path, capture: CaptureSettings, tables: list[str], point: dict[str, Any]) -> Path:
    """Leave the handover point for ``lakestream capture``: the tables the snapshot loaded and ``point``, where
    the stream starts (PostgreSQL's ``lsn``; MariaDB's ``binlog`` position, with ``kind`` and the tables'
    ``columns`` then, `check_unchanged_since_handover`) and ``lsn_text``, that position for messages."""
    path = handover_path(state_dir, capture)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(
        orjson.dumps({"slot": capture.slot_name, **point, "tables": sorted(tables), "finished_at": time.time()})
    )
    os.replace(tmp, path)
    return path


def read_handover(state_dir: str | Path, capture: CaptureSettings) -> dict[str, Any] | None:
    """The handover point a finished snapshot left (`write_handover`); None when no snapshot finished."""
    path = handover_path(state_dir, capture)
    if not path.exists():
        return None
    handover: dict[str, Any] = orjson.loads(path.read_bytes())
    return handover


def offset_key(properties: dict[str, str]) -> bytes:
    """The offset store's key of a PostgreSQL connector: Kafka Connect's JSON of [engine name, partition]."""
    return orjson.dumps([properties["name"], {"server": properties["topic.prefix"]}])


def streaming_offset(lsn: int) -> bytes:
    return orjson.dumps({"lsn": lsn, "ts_usec": int(time.time() * 1_000_000)})


def binlog_offset(file: str, pos: int, gtids: str) -> bytes:
    """A MariaDB connector's streaming position: the binlog file and the position of the next event to read (a
    transaction boundary, so no rows or events within it to skip), and the GTID state there (the connector asks
    the server for the transactions after it)."""
    offset: dict[str, object] = {"file": file, "pos": pos, "ts_sec": int(time.time())}
    if gtids:
        offset["gtids"] = gtids
    return orjson.dumps(offset)


def seed_offsets(path: Path, properties: dict[str, str], offset: bytes) -> None:
    """Write a FileOffsetBackingStore file (a Java-serialized ``HashMap<byte[], byte[]>``) holding the
    connector's streaming position ``offset`` (`streaming_offset`, `binlog_offset`). Needs the JVM (JPype)
    running."""
    import jpype

    java_map = jpype.JClass("java.util.HashMap")()
    as_bytes = jpype.JArray(jpype.JByte)
    java_map.put(as_bytes(offset_key(properties)), as_bytes(offset))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    out = jpype.JClass("java.io.ObjectOutputStream")(jpype.JClass("java.io.FileOutputStream")(str(tmp)))
    try:
        out.writeObject(java_map)
    finally:
        out.close()
    tmp.replace(path)


def handover_properties(config: PipelineConfig, properties: dict[str, str]) -> tuple[dict[str, str], bytes | None]:
    """The connector properties for a capture whose tables came from the parallel snapshot, and the offset
    to seed the offsets with (None when Debezium has offsets already, i.e. it streamed before).

    A MariaDB connector also needs the tables' schemas in its history before it reads the binlog: its first start
    runs ``snapshot.mode=recovery`` (schemas only, no rows), after checking that no table changed since the
    handover (`check_unchanged_since_handover`)."""
    capture = config.capture
    if capture is None:
        raise CaptureError(
            "the pipeline config has no `capture:` section — fix: add capture.database and capture.tables"
        )
    handover = read_handover(config.state_dir, capture)
    if handover is None:
        raise CaptureError(
            f"capture.snapshot is parallel but no snapshot finished for slot {capture.slot_name} — fix: "
            "run `lakestream snapshot <pipeline.yaml>` first"
        )
    missing = sorted(set(capture.tables) - set(handover["tables"]))
    if missing:
        raise CaptureError(
            f"the parallel snapshot did not load {missing} — fix: run `lakestream snapshot "
            f"<pipeline.yaml> {' '.join(missing)}` before capturing them"
        )
    props = dict(properties)
    props["snapshot.mode"] = "no_data"
    store = offsets_file(Path(config.state_dir), capture)
    if store.exists() and store.stat().st_size > 0:
        if capture.database.kind == "mariadb":
            history = schema_history_file(Path(config.state_dir), capture)
            if not history.exists() or history.stat().st_size == 0:
                # the first start stopped before Debezium recorded the schemas: record them now
                props["snapshot.mode"] = "recovery"
        return props, None
    log.info(
        "capture: streaming from the snapshot's handover point %s (slot %s)", handover["lsn_text"], capture.slot_name
    )
    if capture.database.kind == "mariadb":
        check_unchanged_since_handover(config.state_dir, capture, handover)
        props["snapshot.mode"] = "recovery"
        binlog = handover["binlog"]
        return props, binlog_offset(binlog["file"], int(binlog["pos"]), binlog.get("gtids", ""))
    return props, streaming_offset(int(handover["lsn"]))


def check_unchanged_since_handover(state_dir: str | Path, capture: CaptureSettings, handover: dict[str, Any]) -> None:
    """CaptureError when a captured MariaDB table's columns differ from those the snapshot recorded at its handover:
    Debezium would record today's schema and misread the binlog written before the change."""
    conn = source_connection(capture)
    changed = []
    try:
        with conn.cursor() as cur:
            for name, columns in sorted(handover.get("columns", {}).items()):
                parsed = SourceTableName.parse(name)
                if table_signature(cur, parsed.schema, parsed.table) != columns:
                    changed.append(name)
    finally:
        conn.close()
    if changed:
        raise CaptureError(
            f"{', '.join(changed)} changed (DDL) since the parallel snapshot's handover point, before "
            "capture first started: Debezium would read the binlog written before the change with "
            "the new columns — fix: start over (drop the lake tables, delete "
            f"{handover_path(state_dir, capture)}, run `lakestream snapshot` again), or "
            "load with capture.snapshot: debezium"
        )
