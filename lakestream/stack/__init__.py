"""The local development stack: PostgreSQL (source + Iceberg catalog) and a Kafka-protocol broker."""

from lakestream.stack.models import ServiceStatus, StackInfo, StackSettings
from lakestream.stack.stack import Stack

__all__ = ["Stack", "StackInfo", "StackSettings", "ServiceStatus"]
