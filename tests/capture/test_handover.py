"""Starting Debezium at the parallel snapshot's handover point: the offsets seeded for the embedded
engine and the Kafka Connect form (pure units; the real handover is tests/snapshot)."""

from __future__ import annotations

import orjson
import pytest

from lakestream.capture.connector import connect_json, connect_offsets_json, connector_properties
from lakestream.capture.handover import handover_properties, offset_key, streaming_offset, write_handover
from lakestream.config import parse_config
from lakestream.errors import CaptureError


def _config(tmp_path, snapshot="parallel"):
    return parse_config(
        {
            "kafka": {"bootstrap_servers": "x:1"},
            "catalog": {"warehouse": "file:///tmp/w", "type": "hadoop"},
            "streams": [{"topics": ["a"]}],
            "state_dir": str(tmp_path),
            "capture": {
                "database": {"dbname": "d", "user": "u"},
                "tables": ["public.t", "public.u"],
                "topic_prefix": "shop",
                "snapshot": snapshot,
            },
        }
    )


def test_seeded_offset_is_debeziums_key_and_a_streaming_position(tmp_path):
    config = _config(tmp_path)
    props = connector_properties(config.capture, tmp_path)
    # The key Kafka Connect's JsonConverter writes for the connector (see a real offsets file).
    assert offset_key(props) == b'["shop-postgres",{"server":"shop"}]'
    offset = orjson.loads(streaming_offset(123))
    assert offset["lsn"] == 123 and "snapshot" not in offset and "last_snapshot_record" not in offset


def test_capture_needs_a_finished_snapshot_of_every_table(tmp_path):
    config = _config(tmp_path)
    props = connector_properties(config.capture, tmp_path)
    with pytest.raises(CaptureError, match="no snapshot finished.*lakestream snapshot"):
        handover_properties(config, props)
    write_handover(tmp_path, config.capture, ["public.t"], {"lsn": 4242, "lsn_text": "0/1092"})
    with pytest.raises(CaptureError, match=r"did not load \['public.u'\]"):
        handover_properties(config, props)
    write_handover(tmp_path, config.capture, ["public.t", "public.u"], {"lsn": 4242, "lsn_text": "0/1092"})
    seeded, offset = handover_properties(config, props)
    assert orjson.loads(offset)["lsn"] == 4242 and seeded["snapshot.mode"] == "no_data"
    offsets = tmp_path / "capture" / f"{config.capture.slot_name}.offsets"
    offsets.write_bytes(b"not empty")  # Debezium streamed before: its own position wins
    assert handover_properties(config, props)[1] is None


def test_connect_json_for_a_parallel_snapshot_starts_stopped(tmp_path):
    doc = connect_json(_config(tmp_path).capture)
    assert doc["initial_state"] == "STOPPED" and doc["config"]["snapshot.mode"] == "no_data"
    assert connect_offsets_json(_config(tmp_path).capture, 7) == {
        "offsets": [{"partition": {"server": "shop"}, "offset": {"lsn": 7}}]
    }
    assert "initial_state" not in connect_json(_config(tmp_path, "debezium").capture)
