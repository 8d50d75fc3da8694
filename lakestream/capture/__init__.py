"""Capture: Debezium reads PostgreSQL's replication slot or MariaDB's binlog and publishes change events to Kafka.

`runner.run_capture` runs Debezium's embedded engine (its properties from `connector`; what differs by source kind
in `databases`, one module per kind) and `publisher` sends its batches to Kafka; `columns` publishes column
records, `process` runs capture as a child process. Capture sits below the parallel snapshot, which takes what the
two share from here: the handover file the snapshot leaves and Debezium starts at (`handover`), the lake type of
each source column type (`source_columns`), the source connections and PostgreSQL's publication (`publication`,
`mariadb_connection`), the engine's offsets file (`connector`).
"""

from lakestream.capture.connector import connect_json, connector_properties, prepared_connect_json
from lakestream.capture.process import CaptureProcess
from lakestream.capture.publisher import KafkaPublishingHandler
from lakestream.capture.runner import CaptureProgress, run_capture

__all__ = [
    "CaptureProcess",
    "CaptureProgress",
    "KafkaPublishingHandler",
    "connect_json",
    "connector_properties",
    "prepared_connect_json",
    "run_capture",
]
