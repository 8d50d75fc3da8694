"""`lakestream stack up --trino` and `lakestream sql --engine trino` on it (`make test-engines`, marker ``engines``).

A stack of its own in a fresh state directory, started and stopped by the real CLI: its Trino node opens the stack's
catalog as `lake`, Trino writes a table through it, and DuckDB, which knows nothing of Trino, reads the same rows
from the same catalog.
"""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import run_lakestream

from lakestream.stack import Stack, StackSettings
from lakestream.stack.process import free_ports

pytestmark = pytest.mark.engines


def test_stack_up_trino_serves_the_stack_catalog_to_lakestream_sql(service_dir_factory, tmp_path):
    state = service_dir_factory("trstack")
    pg_port, kafka_port, trino_port = free_ports(3)
    settings = StackSettings(state_dir=state, pg_port=pg_port, kafka_port=kafka_port, trino=True, trino_port=trino_port)
    options = ["--state-dir", str(state), "--pg-port", str(pg_port), "--kafka-port", str(kafka_port)]
    trino_options = ["--trino", "--trino-port", str(trino_port)]
    info = Stack(settings).info()
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(
        yaml.safe_dump(
            {
                "name": "trstack",
                "kafka": {"bootstrap_servers": info.bootstrap_servers, "group_id": "trstack"},
                "catalog": info.catalog_config(),
                "streams": [{"topics": ["trstack.public.t"], "namespace": "demo", "table": "t"}],
                "state_dir": str(tmp_path / "state"),
            }
        )
    )
    try:
        up = run_lakestream("stack", "up", *options, *trino_options, timeout=600)
        assert up.returncode == 0, up.stderr
        assert f"trino              http://127.0.0.1:{trino_port} (catalog lake)" in up.stdout

        status = run_lakestream("stack", "status", *options, *trino_options)
        line = next(line for line in status.stdout.splitlines() if line.startswith("trino "))
        assert " running " in line and " yes " in line and "Trino 483, catalogs lake" in line, status.stdout

        def trino_sql(query: str) -> list[dict]:
            out = run_lakestream(
                "sql",
                str(pipeline),
                query,
                "--engine",
                "trino",
                "--trino-uri",
                info.trino_uri or "",
                "--format",
                "json",
            )
            assert out.returncode == 0, out.stderr
            return json.loads(out.stdout)

        trino_sql("CREATE SCHEMA lake.demo")
        trino_sql(
            "CREATE TABLE lake.demo.t WITH (format_version = 3) AS "
            "SELECT n AS id, 'row ' || CAST(n AS varchar) AS note FROM UNNEST(sequence(1, 50)) AS s(n)"
        )
        trino_sql("DELETE FROM lake.demo.t WHERE id % 10 = 0")
        query = "SELECT id, note FROM lake.demo.t WHERE id > 40 ORDER BY id"
        from_trino = trino_sql(query)
        assert from_trino == [{"id": i, "note": f"row {i}"} for i in range(41, 50)]
        duck = run_lakestream("sql", str(pipeline), query, "--engine", "duckdb", "--format", "json")
        assert duck.returncode == 0, duck.stderr
        assert json.loads(duck.stdout) == from_trino
    finally:
        down = run_lakestream("stack", "down", *options, *trino_options)
    assert down.returncode == 0, down.stderr
    assert Stack(settings).trino.pid() is None
