"""Lakestream: streaming CDC from PostgreSQL through Kafka into Apache Iceberg, on Spark."""

__version__ = "0.1.0"
