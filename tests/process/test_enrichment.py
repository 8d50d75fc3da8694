"""Enrichment: a SQL transform joins a reference Iceberg table shipped to the write tasks; the table is
read again only when its snapshot changes, and a new reference column reaches the output table."""

from __future__ import annotations

import json
import uuid

import pytest
from conftest import produce_records

from lakestream.config import TransformSettings
from lakestream.engine.pipeline import Pipeline
from lakestream.errors import ConfigError


def _drain(pipeline: Pipeline) -> None:
    while pipeline.run_batch() is not None:
        pass


def _orders(start: int, stop: int) -> list[tuple[None, str]]:
    return [(None, json.dumps({"id": i, "sku": f"s{i % 4}", "qty": i % 3 + 1})) for i in range(start, stop)]


def test_reference_join_cached_by_snapshot(stack, spark, pipeline_config_factory):
    uid = uuid.uuid4().hex[:6]
    topic, ns, ref_ns = f"ord_{uid}", f"en_{uid}", f"ref_{uid}"
    products = f"lake.{ref_ns}.products"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS lake.{ref_ns}")
    spark.sql(f"CREATE TABLE {products} (sku string, name string, price decimal(10,2)) USING iceberg")
    spark.sql(f"INSERT INTO {products} VALUES ('s0', 'pen', 1.50), ('s1', 'ink', 4.00), ('s2', 'pad', 2.25)")
    config = pipeline_config_factory(
        [
            {
                "topics": [topic],
                "mode": "append",
                "namespace": ns,
                "table": "orders",
                "transforms": [
                    {
                        "name": "enriched",
                        "table": "orders_enriched",
                        "reference": {"name": "products", "table": products},
                        "sql": "SELECT b.id, b.qty * p.price AS total, p.* FROM batch b "
                        "LEFT JOIN products p ON p.sku = b.sku",
                    }
                ],
            }
        ],
        name=f"en{uid}",
    )
    pipeline = Pipeline(config, spark)
    try:
        produce_records(stack.bootstrap_servers, topic, _orders(0, 20))
        _drain(pipeline)
        produce_records(stack.bootstrap_servers, topic, _orders(20, 40))
        _drain(pipeline)
        assert pipeline.references.reads[products] == 1  # two batches, one read: the snapshot did not change

        spark.sql(f"ALTER TABLE {products} ADD COLUMN category string")
        spark.sql(f"UPDATE {products} SET name = 'pen v2', category = 'office' WHERE sku = 's0'")
        spark.sql(f"INSERT INTO {products} VALUES ('s3', 'cap', 9.00, 'hats')")
        produce_records(stack.bootstrap_servers, topic, _orders(40, 60))
        _drain(pipeline)
        assert pipeline.references.reads[products] == 2
    finally:
        pipeline.close()

    rows = {r["id"]: r for r in spark.table(f"lake.{ns}.orders_enriched").collect()}
    assert sorted(rows) == list(range(60))
    old = {"s0": ("pen", 1.5), "s1": ("ink", 4.0), "s2": ("pad", 2.25), "s3": (None, None)}
    new = old | {"s0": ("pen v2", 1.5), "s3": ("cap", 9.0)}
    for i, r in rows.items():
        name, price = (old if i < 40 else new)[f"s{i % 4}"]
        assert r["name"] == name, i
        assert (None if r["total"] is None else float(r["total"])) == (None if price is None else price * (i % 3 + 1))
        assert r["category"] == ({"s0": "office", "s3": "hats"}.get(f"s{i % 4}") if i >= 40 else None)


def test_reference_limits_and_names(stack, spark, pipeline_config_factory):
    with pytest.raises(ValueError, match="batch"):
        TransformSettings.model_validate(
            {"name": "t", "table": "o", "sql": "SELECT 1", "references": [{"name": "batch", "table": "a.b"}]}
        )
    with pytest.raises(ValueError, match="Python transform"):
        TransformSettings.model_validate(
            {"name": "t", "table": "o", "python": "m:f", "reference": {"name": "p", "table": "a.b"}}
        )
    with pytest.raises(ValueError, match="not a valid identifier"):
        TransformSettings.model_validate(
            {"name": "t", "table": "o", "sql": "SELECT 1", "reference": {"name": "p", "table": "a.b;drop"}}
        )
    uid = uuid.uuid4().hex[:6]
    ref = f"lake.ref_{uid}.big"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS lake.ref_{uid}")
    spark.sql(f"CREATE TABLE {ref} USING iceberg AS SELECT id FROM range(5)")
    config = pipeline_config_factory(
        [
            {
                "topics": [f"lim_{uid}"],
                "mode": "append",
                "namespace": f"lim_{uid}",
                "table": "ev",
                "transforms": [
                    {
                        "name": "t",
                        "table": "out",
                        "sql": "SELECT b.* FROM batch b JOIN big USING (id)",
                        "reference": {"name": "big", "table": ref, "max_rows": 3},
                    }
                ],
            }
        ],
        name=f"l{uid}",
    )
    pipeline = Pipeline(config, spark)
    try:
        with pytest.raises(ConfigError, match=r"streams\[0\]\.transforms\[0\]\.references\[0\].*5 rows.*max_rows=3"):
            pipeline.refresh_references()
    finally:
        pipeline.close()
