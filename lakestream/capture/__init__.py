"""Capture: Debezium reads PostgreSQL's replication slot or MariaDB's binlog and publishes change events to Kafka."""

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
