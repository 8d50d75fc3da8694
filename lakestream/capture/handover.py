"""Starting Debezium's stream at the parallel snapshot's handover point.

`lakestream snapshot` created the slot and loaded the tables as of its consistent point. Debezium
must neither snapshot again nor start later than that point (left to itself on a slot it did not
create, it would start at the current WAL position and skip what was written since). So before its
first start, the embedded engine's offset store is seeded with the handover LSN as a streaming
position, the form Debezium itself stores once its own snapshot is done, and the connector runs
with ``snapshot.mode=no_data``.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import orjson

from lakestream.config import PipelineConfig
from lakestream.errors import CaptureError

log = logging.getLogger(__name__)


def offset_key(properties: dict[str, str]) -> bytes:
    """The offset store's key of a PostgreSQL connector: Kafka Connect's JSON of [engine name, partition]."""
    return orjson.dumps([properties["name"], {"server": properties["topic.prefix"]}])


def streaming_offset(lsn: int) -> bytes:
    return orjson.dumps({"lsn": lsn, "ts_usec": int(time.time() * 1_000_000)})


def seed_offsets(path: Path, properties: dict[str, str], lsn: int) -> None:
    """Write a FileOffsetBackingStore file (a Java-serialized ``HashMap<byte[], byte[]>``) holding the
    connector's streaming position ``lsn``. Needs the JVM (JPype) running."""
    import jpype

    java_map = jpype.JClass("java.util.HashMap")()
    as_bytes = jpype.JArray(jpype.JByte)
    java_map.put(as_bytes(offset_key(properties)), as_bytes(streaming_offset(lsn)))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    out = jpype.JClass("java.io.ObjectOutputStream")(jpype.JClass("java.io.FileOutputStream")(str(tmp)))
    try:
        out.writeObject(java_map)
    finally:
        out.close()
    tmp.replace(path)


def handover_properties(config: PipelineConfig, properties: dict[str, str]) -> tuple[dict[str, str], int | None]:
    """The connector properties for a capture whose tables came from the parallel snapshot, and the LSN
    to seed the offsets with (None when Debezium has offsets already, i.e. it streamed before)."""
    from lakestream.capture.connector import offsets_file
    from lakestream.snapshot.slot import read_handover

    capture = config.capture
    handover = read_handover(config.state_dir, capture)
    if handover is None:
        raise CaptureError(f"capture.snapshot is parallel but no snapshot finished for slot {capture.slot_name} — fix: "
                           "run `lakestream snapshot <pipeline.yaml>` first")
    missing = sorted(set(capture.tables) - set(handover["tables"]))
    if missing:
        raise CaptureError(f"the parallel snapshot did not load {missing} — fix: run `lakestream snapshot "
                           f"<pipeline.yaml> {' '.join(missing)}` before capturing them")
    props = dict(properties)
    props["snapshot.mode"] = "no_data"
    store = offsets_file(Path(config.state_dir), capture)
    if store.exists() and store.stat().st_size > 0:
        return props, None
    log.info("capture: streaming from the snapshot's handover point %s (slot %s)", handover["lsn_text"],
             capture.slot_name)
    return props, int(handover["lsn"])
