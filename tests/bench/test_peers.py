"""Every configuration of `make bench-peers` still runs its whole path at a few seconds of data (bench/peers/): the
writer starts on the bench's own input, drains a base and a backlog (the end seen on every partition), the table is
exact, its own system compacts it, exact again, and Spark and DuckDB read it. The bench itself is hours long; this
keeps its configurations from rotting between its runs. The Flink configurations need .venv-peers (`make
setup-peers`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path[:0] = [str(BENCH / "peers"), str(BENCH)]

from _common import pipeline_data, to_config, write_pipeline_yaml  # noqa: E402
from compare import ConfigRun, run_order  # noqa: E402
from configs import CONFIGS  # noqa: E402
from workload import INPUTS, zipf_key  # noqa: E402


def smoke_args(tmp_path: Path, reader: dict) -> argparse.Namespace:
    return argparse.Namespace(
        base_rows=300,
        backlog=200,
        commit_interval_s=2.0,
        steady_s=0.0,
        rate=100.0,
        memory_cap=None,
        timeout=300.0,
        read_repeats=1,
        read_timeout=120.0,
        reader_yaml=write_pipeline_yaml(tmp_path / "reader.yaml", reader),
    )


@pytest.mark.bench
@pytest.mark.parametrize(
    ("config", "input_name"),
    [(name, "json-schemas") for name in CONFIGS]
    + [(name, "json-plain") for name in ("lakestream", "flink-changelog", "spark-merge-hash")]
    + [("lakestream", "json-schemas-zipf")],
)
def test_a_configuration_drains_compacts_and_reads_exactly(stack, spark, tmp_path, monkeypatch, config, input_name):
    # Flink's post-commit RewriteDataFiles after every 2 commits, the table looked at every second (the bench: 10
    # commits, 60 s): a few seconds of data see one.
    monkeypatch.setenv("LAKESTREAM_PEERS_FLINK_MAINTENANCE_FAST", "1")
    reader = pipeline_data(stack, tmp_path, "peers-reader", [{"topics": ["x"]}])
    args = smoke_args(tmp_path, reader)
    run_index = abs(hash(tmp_path.name)) % 1000  # topics and tables of their own in the session's stack
    result = ConfigRun(config, input_name, run_index, stack, tmp_path, spark, to_config(reader), args).run()
    assert "error" not in result, result.get("error")
    assert result["exact"]["exact"], result["exact"]
    assert result["exact_after_compaction"]["exact"], result["exact_after_compaction"]
    assert result["compaction"]["exit"] == 0, result["compaction"]
    assert result["backlog"]["changes_per_cpu_s"] and result["writer"]["peak_rss_mb"] > 0
    assert all(result["backlog"]["end_offsets"].values())  # both partitions had records to drain
    assert result["reads"]["spark_full_aggregate_s"] is not None and result["reads"]["duckdb_full_aggregate_s"]
    if CONFIGS[config].system == "flink":
        assert result["rewrites_while_running"] >= 1, "Flink's post-commit maintenance committed no rewrite"


def test_the_order_alternates_and_the_inputs_are_named():
    names = list(CONFIGS)
    assert run_order(names, 0) == names and run_order(names, 1) == names[::-1] and run_order(names, 2) == names
    assert set(INPUTS) == {"json-schemas", "json-plain", "json-schemas-zipf"}


def test_zipf_keys_favour_the_lowest_ids_and_stay_in_range():
    import random

    rng = random.Random(1)
    keys = [zipf_key(rng.random(), 1_000_000) for _ in range(20_000)]
    assert min(keys) >= 1 and max(keys) <= 1_000_000
    assert sum(k <= 1000 for k in keys) / len(keys) > 0.3  # uniform would give 0.001
